"""The membership test: a program the model was trained on stands out against itself renamed."""
import pytest

SNIPPET = ("def running_peak(series):\n    peak = None\n    out = []\n    for item in series:\n"
           "        if peak is None or item > peak:\n            peak = item\n        out.append(peak)\n    return out\n")


def test_rename_keeps_structure_and_drops_only_names():
    from ratchet.evaluation.membership import normalise, rename_identifiers

    code = 'import math\n\ndef area(radius):\n    """area(2) is 12.56"""\n    r2 = radius ** 2\n    return math.pi * r2\n'
    renamed = rename_identifiers(code)
    assert renamed == "import math\n\ndef f0(v0):\n    v1 = v0 ** 2\n    return math.pi * v1\n"
    assert normalise(code) == "import math\n\ndef area(radius):\n    r2 = radius ** 2\n    return math.pi * r2\n"


@pytest.fixture(scope="module")
def tiny():
    from tests.policy.conftest import tiny_model

    return tiny_model()


def test_a_memorised_program_stands_out_and_an_unseen_one_does_not(tiny):
    """Train the tiny model on SNIPPET until it recalls it: its name gap (Min-K% as written minus
    renamed) rises far above the gap of a program it never saw, which training leaves alone."""
    import copy

    import torch

    from ratchet.evaluation.membership import CONTROL_PROGRAMS, contamination_report, name_gaps, normalise
    from ratchet.policy.lm_score import HEADER, LMScorer

    model, tok = tiny
    model = copy.deepcopy(model).train()
    unseen = CONTROL_PROGRAMS[:3]
    before = LMScorer(model=model, tokenizer=tok)
    gap_before = name_gaps(before, [SNIPPET])[0]
    ids = torch.tensor([tok(HEADER + normalise(SNIPPET), add_special_tokens=False)["input_ids"]])
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    for _ in range(60):
        loss = model(ids, labels=ids).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = LMScorer(model=model.eval(), tokenizer=tok)
    assert name_gaps(after, [SNIPPET])[0] > gap_before + 2.0
    report = contamination_report(after, [SNIPPET] * 4, unseen)
    assert report["likely_seen"] and report["excess_gap"] > 2.0
    fresh = contamination_report(before, unseen[:1] * 4, unseen[1:])
    assert fresh["excess_gap"] < report["excess_gap"] - 2.0


def test_min_k_takes_the_least_likely_tokens():
    from ratchet.evaluation.membership import min_k

    assert min_k([-1.0, -5.0, -0.1, -0.2, -3.0], k=0.4) == pytest.approx(-4.0)
    with pytest.raises(ValueError):
        min_k([])


def test_the_two_sample_interval_covers_a_known_difference_and_excludes_none():
    from ratchet.evaluation.stats import bootstrap_diff_ci

    ci = bootstrap_diff_ci([1.0, 1.2, 0.8, 1.1, 0.9] * 4, [0.0, 0.1, -0.1, 0.05, -0.05] * 4)
    assert ci.estimate == pytest.approx(1.0) and 0.8 < ci.lo < 1.0 < ci.hi < 1.2 and ci.n == 20
    same = bootstrap_diff_ci([0.0, 1.0] * 10, [1.0, 0.0] * 10)
    assert same.lo < 0 < same.hi
    assert bootstrap_diff_ci([], [1.0]).estimate is None
