"""Economics: the reference scorecard's arithmetic, the zero-accepted rule, the rate card."""
import pytest

from ratchet.evaluation import economics as ec

pytestmark = pytest.mark.evaluation

# The reference scorecard (400 tasks x 3 seeds): variable cost per accepted and accepted
# counts; training investment SFT $420, RL $1,180 (+$420 warm start).
BASE = ec.PolicyCost("prompted-baseline", "", 1200, 246, 1.48 * 246)
SFT = ec.PolicyCost("sft", "1", 1200, 272, 1.21 * 272, training_usd=420.0)
RL = ec.PolicyCost("rl", "3", 1200, 310, 0.94 * 310, training_usd=1180.0, warm_start_usd=420.0)


def test_break_even_reproduces_spec_2186():
    # 1,180 / (1.48 - 0.94) = 2,185.19 -> the 2,186th accepted run is the first one in profit.
    assert ec.break_even_runs(RL, BASE) == 2186
    # counting the warm start too: 1,600 / 0.54 = 2,962.96 -> 2,963
    assert ec.break_even_runs(RL, BASE, include_warm_start=True) == 2963
    # SFT: 420 / 0.27 = 1,555.6 -> 1,556
    assert ec.break_even_runs(SFT, BASE) == 1556


def test_spec_amortised_views():
    rl, sft, base = (ec.economics_row(p, BASE) for p in (RL, SFT, BASE))
    assert base["variable_per_accepted"] == "$1.48" and base["sample_amortised"] == "$1.48"
    assert base["production_amortised"] == "$1.48" and base["break_even"] == "baseline"
    assert sft["sample_amortised"] == "$2.75" and sft["production_amortised"] == "$1.25"   # 1.21 + 420/272; + 420/10k
    assert rl["sample_amortised"] == "$4.75" and rl["production_amortised"] == "$1.06"     # 0.94 + 1180/310; + 1180/10k
    assert rl["break_even_runs"] == 2186 and rl["break_even"] == "2,186 runs"
    assert rl["training_investment"] == "$1,180.00 (+$420.00 warm start)"
    assert ec.economics_row(RL, BASE, production_n=1000)["production_amortised"] == "$2.12"  # 0.94 + 1.18


def test_zero_accepted_is_not_computable_everywhere():
    zero = ec.PolicyCost("harness:random", "", 1200, 0, 3.5, training_usd=10.0)
    row = ec.economics_row(zero, BASE)
    for k in ("variable_per_accepted", "sample_amortised", "production_amortised", "break_even"):
        assert row[k] == "not computable", k
    for k in ("variable_per_accepted_usd", "sample_amortised_usd", "production_amortised_usd", "break_even_runs"):
        assert row[k] is None, k
    assert row["computable"] is False
    # a baseline with nothing accepted makes every candidate's break-even not computable
    assert ec.break_even_runs(RL, ec.PolicyCost("b", "", 10, 0, 1.0)) == "not computable"
    assert "$0.00" not in " ".join(str(v) for v in row.values() if isinstance(v, str))


def test_never_and_free_break_even():
    dearer = ec.PolicyCost("c", "", 10, 5, 5 * 2.0, training_usd=100.0)
    assert ec.break_even_runs(dearer, BASE) == "never"
    free_and_cheaper = ec.PolicyCost("h", "", 10, 5, 5 * 1.0)
    assert ec.break_even_runs(free_and_cheaper, BASE) == 0
    assert ec.break_even_runs(ec.PolicyCost("x", "", 4, 2, 2 * 0.5, training_usd=1000.0),
                              ec.PolicyCost("y", "", 4, 2, 2 * 1.0)) == 2000   # exact quotient, not 2001


def test_money_never_shows_zero_for_a_small_cost():
    assert ec.money(0.000412) == "$0.000412"
    assert ec.money(0.0) == "$0.00" and ec.money(1234.5) == "$1,234.50"
    assert ec.money(None) == "not computable"


def test_rate_card_applies_to_measured_quantities(tmp_path):
    p = tmp_path / "card.yaml"
    p.write_text("name: test\ncpu_hour_usd: 3.6\ngpu_hour_usd: 36\nsandbox_cpu_s_usd: 0.01\n"
                 "verifier_run_usd: 0.5\ndevices: {embedded: gpu}\n"
                 "token_prices: {openai: {input_per_mtok: 2.0, output_per_mtok: 8.0}}\n")
    card = ec.RateCard.from_yaml(p)
    # API model: tokens priced, policy seconds not: 1e6 * 2/1e6 + 5e5 * 8/1e6 + 10 * 0.01 + 0.5
    assert ec.episode_cost(card, policy_id="openai:gpt-x", tokens_in=10**6, tokens_out=5 * 10**5,
                           policy_s=100.0, sandbox_s=10.0) == pytest.approx(2 + 4 + 0.1 + 0.5)
    # self-hosted on GPU: 100 s at $36/h = $1
    assert ec.episode_cost(card, policy_id="embedded:rl", tokens_in=999, tokens_out=999, policy_s=100.0,
                           sandbox_s=0.0) == pytest.approx(1.0 + 0.5)
    # harness on CPU: 100 s at $3.6/h = $0.1
    assert ec.episode_cost(card, policy_id="harness:sbfl", tokens_in=0, tokens_out=0, policy_s=100.0,
                           sandbox_s=1.0) == pytest.approx(0.1 + 0.01 + 0.5)
    assert ec.training_investment(card, cpu_s=3600, gpu_s=1800) == pytest.approx(3.6 + 18)
    with pytest.raises(ValueError, match="unknown keys"):
        ec.RateCard.from_dict({"cpu_hours": 1})
    with pytest.raises(ValueError, match="non-negative"):
        ec.RateCard(gpu_hour_usd=-1)


def test_policy_costs_from_rows():
    card = ec.RateCard(cpu_hour_usd=3.6, sandbox_cpu_s_usd=0.0, verifier_run_usd=0.0)
    rows = [{"policy_id": "harness:sbfl", "checkpoint_version": "", "outcome": o, "tokens_in": 0, "tokens_out": 0,
             "policy_s": 1.0, "sandbox_s": 1.0, "cost_usd": None} for o in ("pass", "fail", "infra_failure", "pass")]
    (pc,) = ec.policy_costs(rows, card, training={"harness:sbfl": {"cpu_s": 3600}})
    assert (pc.episodes, pc.accepted) == (4, 2)
    assert pc.variable_usd == pytest.approx(4 * 0.001)       # infra failure paid too
    assert pc.training_usd == pytest.approx(3.6)


def test_training_investment_from_measured_checkpoint_compute(tmp_path):
    import json

    card = ec.RateCard(cpu_hour_usd=3.6, gpu_hour_usd=36.0)
    (tmp_path / "sft").mkdir()
    (tmp_path / "sft" / ec.CHECKPOINT_META).write_text(json.dumps(
        {"stage": "sft", "parent": str(tmp_path / "base"), "cpu_s": 1000.0}))
    (tmp_path / "rl").mkdir()
    (tmp_path / "rl" / ec.CHECKPOINT_META).write_text(json.dumps(
        {"stage": "grpo", "parent": str(tmp_path / "sft"), "cpu_s": 2000.0, "gpu_s": 100.0}))
    rl = ec.checkpoint_investment(card, tmp_path / "rl")
    assert rl["usd"] == pytest.approx(2.0 + 1.0) and rl["warm_start_usd"] == pytest.approx(1.0)
    assert ec.checkpoint_investment(card, tmp_path / "base")["usd"] == 0.0     # a base model: no training
