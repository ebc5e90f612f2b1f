"""harness:lm: candidate edits ranked by a language model's likelihood of the patched program."""
import pytest

SOURCE = "def count_pos(xs):\n    n = 0\n    for x in xs:\n        if x > 0:\n            n += 1\n    return n\n"


def test_shared_prefix_scores_are_the_whole_program_scores(tiny):
    from ratchet.policy.lm_score import LMScorer
    from sandboxes.candidates import propose_edits

    model, tok = tiny
    scorer = LMScorer(model=model, tokenizer=tok, batch=3)
    cands = propose_edits(SOURCE, 4)
    assert len(cands) >= 4
    patched = [c.apply(SOURCE) for c in cands]
    shared = scorer.edit_scores(SOURCE, 4, patched)
    alone = scorer.edit_scores(SOURCE, 4, patched, share_prefix=False)
    by_tokens = [sum(scorer.token_logprobs(p)) for p in patched]
    assert shared == pytest.approx(alone, abs=1e-3) and shared == pytest.approx(by_tokens, abs=1e-3)
    assert len(set(round(v, 3) for v in shared)) > 1          # the edits are told apart


class _Prefers:
    """A scorer that likes one patched line (what the ranking must follow)."""

    def __init__(self, liked: str):
        self.liked = liked

    def edit_scores(self, source, line, patched):
        return [0.0 if p.splitlines()[line - 1].strip() == self.liked else -1.0 - i for i, p in enumerate(patched)]


def test_the_ranking_follows_the_scorer_across_the_lines_of_a_tier():
    from sandboxes.agents.lm import ranked_by_scorer
    from sandboxes.candidates import propose_edits

    tier = [(line, [(c.index, c.description) for c in propose_edits(SOURCE, line)]) for line in (4, 5)]
    order = ranked_by_scorer(_Prefers("n -= 1"), SOURCE, tier)
    assert order[0][0] == 5 and "n -= 1" in order[0][2]
    assert len(order) == sum(len(c) for _, c in tier)            # every candidate, once
    # the rest keep the scorer's order: line 4's first candidate (-1.0) before line 5's second (-2.0)
    assert (order[1][0], order[1][1]) == (4, 0)


@pytest.mark.timeout(300)
def test_harness_lm_fixes_held_out_tasks_with_the_pretrained_base(pretrained_base, runtime):
    """The base reads code: on these tasks its likelihood ranks the true fix first (the count
    prior's first pick is another edit on most of them)."""
    from ratchet.policy import make_policy, run_episodes
    from sandboxes.humaneval import build_suite

    tasks = sorted(build_suite(seed=0, limit=3).tasks, key=lambda b: b.task_id)[:4]
    policy = make_policy("harness:lm", base=str(pretrained_base))
    assert policy.spec["config"]["base"] == str(pretrained_base)
    recs = run_episodes(policy, [(b, 0) for b in tasks], runtime=runtime)
    assert sum(r.passed for r in recs) >= 3
