"""A tiny locked holdout in a real warehouse: HumanEval repair tasks (the suite builder the
governance and sandbox tests use), the `tasks` table, and a manifest locked through the
governance store (file + table + log), as the holdout_manifest asset leaves them."""
import pytest

PROBLEMS, PER = 3, 2


@pytest.fixture(scope="session")
def suite_tasks(tmp_path_factory):
    from sandboxes.humaneval import build_suite

    return build_suite(seed=0, limit=PROBLEMS, per_problem=PER,
                       cache_dir=tmp_path_factory.mktemp("suite")).tasks


def lock_holdout(wh, path, tasks):
    from ratchet.governance.holdout import lock_holdout as lock
    from ratchet.governance.tasks import task_rows
    from ratchet.store import replace

    with wh.connect() as con:
        replace(con, "tasks", task_rows(tasks, suite_key="test"))
        return lock(con, path, [t.task_id for t in tasks], locked_by="test")


@pytest.fixture
def holdout(wh, home, suite_tasks):
    """(warehouse, manifest path, the holdout bundles): 4 tasks of 2 problems are held out."""
    tasks = sorted(suite_tasks, key=lambda t: t.task_id)[:4]
    path = home.root / "holdout_manifest.json"
    lock_holdout(wh, path, tasks)
    return wh, path, tasks
