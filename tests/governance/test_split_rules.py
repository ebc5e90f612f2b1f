"""Split arithmetic that the larger split tests pass through without pinning."""
import pytest

from ratchet.governance.splits import split_targets

pytestmark = pytest.mark.governance


def test_the_reference_targets_set_the_proportional_split():
    # 208 of 1160: raw 107.59 / 28.69 / 71.72 -> 107 / 28 / 71, then the two left over go to the
    # largest remainders (holdout .72, val .69); a train reference of 601 would give val's to train
    assert split_targets(208) == {"train": 107, "val": 29, "holdout": 72}


def test_a_split_the_targets_leave_out_gets_nothing_when_scaled_down():
    # 5 of 6: 2.5 / 2.5 -> 2 / 2 and the one left over to train (ties go in split order);
    # holdout is not named, so it gets none of it
    assert split_targets(5, {"train": 3, "val": 3}) == {"train": 3, "val": 2, "holdout": 0}


def test_a_target_of_one_is_met():
    from collections import Counter

    from ratchet.governance.splits import assign_splits

    items = [{"id": f"t{i}", "cluster_id": f"c{i}", "slice": "s"} for i in range(5)]
    rows = assign_splits(items, targets={"train": 3, "val": 1, "holdout": 1}).to_pylist()
    assert Counter(r["split"] for r in rows) == {"train": 3, "val": 1, "holdout": 1}
