"""A committed CSV of hand-written labels (fixtures/README.md names its source) ingested through
the judge_calibration path: items, gold source, kappa against hand-computed Cohen's kappa from the
stored confusion counts (and scikit-learn where installed), the row appended to the table."""
from pathlib import Path

import pytest

from ratchet.evaluation import io, tables

pytestmark = pytest.mark.evaluation
CSV = Path(__file__).with_name("fixtures") / "human_labels.csv"


def _kappa_by_hand(conf: dict) -> float:
    n = sum(conf.values())
    a, b = conf.get("gold1_judge1", 0), conf.get("gold1_judge0", 0)
    c, d = conf.get("gold0_judge1", 0), conf.get("gold0_judge0", 0)
    po = (a + d) / n
    pe = ((a + b) / n) * ((a + c) / n) + ((c + d) / n) * ((b + d) / n)
    return (po - pe) / (1 - pe)


@pytest.mark.parametrize("judge", ["rubric", "rubric-v2", "rubric-v1"])
def test_committed_human_label_csv_is_ingested_and_kappa_computed(wh, suite_tasks, judge):
    from ratchet.governance.tasks import task_rows
    from ratchet.store import replace

    with wh.connect() as con:
        replace(con, "tasks", task_rows(suite_tasks, suite_key="test"))
    row = io.run_judge_calibration(wh, {"kind": judge}, human_labels_csv=str(CSV), n_boot=300)
    assert row["problems"] == [] and row["gold_source"] == "human:human_labels.csv"
    assert row["items"] == 12 and row["gold_positive_rate"] == 0.5
    conf = row["confusion"]
    assert sum(conf.values()) == 12
    assert row["kappa"] == pytest.approx(_kappa_by_hand(conf))
    assert row["kappa_ci_lo"] <= row["kappa"] <= row["kappa_ci_hi"]
    assert row["status"] == ("ok" if row["kappa"] >= 0.80 else "blocked" if row["kappa"] >= 0.78 else "drift")
    with wh.connect() as con:
        stored = tables.fetch(con, "SELECT judge_id, gold_source, items, kappa FROM judge_calibration")
    assert [(r["gold_source"], r["items"]) for r in stored] == [("human:human_labels.csv", 12)]
    assert stored[0]["kappa"] == pytest.approx(row["kappa"])
    sk = pytest.importorskip("sklearn.metrics")
    from ratchet.evaluation import judge_calibration as jc
    from sandboxes.verifiers.judge import make_judge

    items, _ = jc.load_human_labels(CSV)
    bundles = {t.task_id: t for t in suite_tasks}
    _, labels = jc.calibrate(make_judge({"kind": judge}), items, bundles, gold_source="x", n_boot=10)
    assert row["kappa"] == pytest.approx(sk.cohen_kappa_score([i.gold for i in items], labels))
