"""Verifiers and reward composition (plain data in, plain data out; no runtime dependency).

    reward = compose_reward(bundle, outcomes={"test_solution.py::test_check_00": "passed", ...},
                            diff=patch, explanation=text)
"""
from sandboxes.verifiers.blast import BlastRadius, blast_radius, blast_score
from sandboxes.verifiers.diffs import DiffError, apply_diff, make_diff, touched_paths
from sandboxes.verifiers.hygiene import HygieneResult, forbidden_touched, r_hygiene
from sandboxes.verifiers.judge import Judge, JudgeResult, RubricJudge, cohen_kappa
from sandboxes.verifiers.reward import Reward, RewardWeights, compose_reward
from sandboxes.verifiers.secret_scan import SecretFinding, scan_diff
from sandboxes.verifiers.tests import TestsResult, r_tests

__all__ = ["BlastRadius", "DiffError", "HygieneResult", "Judge", "JudgeResult", "Reward",
           "RewardWeights", "RubricJudge", "SecretFinding", "TestsResult", "apply_diff",
           "blast_radius", "blast_score", "cohen_kappa", "compose_reward", "forbidden_touched",
           "make_diff", "r_hygiene", "r_tests", "scan_diff", "touched_paths"]
