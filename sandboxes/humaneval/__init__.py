"""HumanEval repair suite: seeded single-token mutants of canonical solutions as TaskBundles.

    from sandboxes.humaneval import build_suite
    suite = build_suite(seed=0)            # ~1,000 verified tasks, cached on disk
    suite.tasks[0].files["solution.py"]
"""
from sandboxes.humaneval.build import ENVIRONMENT_ID, GENERATOR_VERSION
from sandboxes.humaneval.operators import Edit, all_edits
from sandboxes.humaneval.suite import Suite, build_suite, load_suite, write_suite

__all__ = ["ENVIRONMENT_ID", "GENERATOR_VERSION", "Edit", "Suite", "all_edits", "build_suite",
           "load_suite", "write_suite"]
