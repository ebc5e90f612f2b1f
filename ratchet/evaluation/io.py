"""Read -> compute -> write for each evaluation asset, over a `ratchet.warehouse.Warehouse`. The
asset bodies (assets/evaluation.py) and the CLI call these; the table I/O itself is in
`tables`, the logic in the other modules.
"""
from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import Mapping, Sequence

from ratchet.evaluation import tables


def _current_holdout(con, manifest_path) -> tuple[str, int]:
    """(sha256, task count) of the verified, locked holdout."""
    from ratchet.governance.holdout import holdout_state
    from ratchet.governance.manifest import ManifestError

    state = holdout_state(con, manifest_path)
    if not state.locked:
        raise ManifestError(f"no locked holdout at {manifest_path}: nothing to summarise")
    return state.manifest.sha256, len(state.manifest.task_ids)


def split_policy(policy_id: str) -> str:
    """The checkpoint version in a policy id "<engine>:<name>@<version>" ("" without one)."""
    return policy_id.rsplit("@", 1)[1] if "@" in policy_id else ""


def run_holdout_eval(wh, manifest_path, policy_id: str, seed: int, *, workers: int | None = None,
                     task_limit: int | None = None, judge: dict | None = None, rate_card=None,
                     policy_kwargs: dict | None = None, retry_infra: bool = False, run_tag: str = "",
                     chunk: int | None = None, concurrency: int | None = None, test_cache: bool = True,
                     max_turns: int | None = None) -> dict:
    """Verify the manifest, run the policy on every holdout task for one seed (resuming), and
    report this seed's figures over all its stored rows. `test_cache`: reuse sandbox test results
    that an exact repeat of a run would give (`sandboxes.result_cache`, `runner.test_cache_file`).
    `max_turns`: the turn budget (`runner.with_turn_budget`; None: each task's own limit); the
    seed's figures count only rows under this budget's digests."""
    from ratchet.evaluation.runner import evaluate, holdout_plan, test_cache_file
    from ratchet.evaluation.stats import task_outcomes
    from ratchet.evaluation.summary import display

    with wh.connect() as con:
        tables.ensure(con)
        plan = holdout_plan(con, manifest_path, task_limit=task_limit, max_turns=max_turns)   # ManifestError: refuse

    def done(ids):
        with wh.connect() as con:
            return tables.done_eval_ids(con, ids, retry_infra=retry_infra)

    def sink(rows):
        with wh.connect() as con:
            tables.write_episodes(con, rows)

    version = split_policy(policy_id)
    run = evaluate(plan, policy_id, version, seeds=[seed], done=done, sink=sink, workers=workers, judge=judge,
                   rate_card=rate_card, policy_kwargs=policy_kwargs, chunk=chunk,
                   **({"concurrency": concurrency} if concurrency else {}),
                   test_cache=test_cache_file() if test_cache else None,
                   eval_run_id=f"{run_tag}:{policy_id}:{seed}" if run_tag else None)
    digests = plan.task_digests()
    with wh.connect() as con:
        rows = [r for r in tables.episode_rows(con, policy_id, "seed = ? AND holdout_sha256 = ?",
                                               [seed, plan.holdout_sha256])
                if digests.get(r["task_id"]) == r["environment_digest"]]
    out = task_outcomes(rows)
    scored = [v for v in out.values() if v is not None]
    return {"checkpoint_version": version, "episodes": len(rows), "passed": sum(scored),
            "infra": sum(r["outcome"] == "infra_failure" for r in rows),
            "pass_rate": sum(scored) / len(scored) if scored else None,
            "display": display(sum(scored), len(scored), len(out) - len(scored)),
            "ran": len(run.rows), "skipped": run.skipped, "wall_s": run.wall_s, "workers": run.workers,
            "holdout_sha256": plan.holdout_sha256, "eval_run_id": run.eval_run_id,
            "max_turns": plan.max_turns or 0}


def current_episodes(con, manifest_path) -> tuple[list[dict], int]:
    """eval_episodes rows of the currently locked holdout (other holdout versions are not mixed)
    and the holdout's size."""
    tables.ensure(con)
    sha, n = _current_holdout(con, manifest_path)
    rows = tables.episode_rows(con, where="holdout_sha256 = ?", params=[sha])
    # per policy x checkpoint x task, the newest evaluation only: rows under an older environment
    # digest or judge (another reward) are history, not more seeds
    newest: dict = {}
    for r in sorted(rows, key=lambda r: (r["finished_at"] is not None, r["finished_at"] or 0)):
        newest[(r["policy_id"], r["checkpoint_version"] or "", r["task_id"])] = tables.grading(r)
    return [r for r in rows
            if newest[(r["policy_id"], r["checkpoint_version"] or "", r["task_id"])] == tables.grading(r)], n


def build_summary(wh, manifest_path, *, baseline_policy_id: str | None, n_boot: int = 2000, ci_seed: int = 0,
                  run_id: str | None = None) -> list[dict]:
    from ratchet.evaluation.summary import summary_rows

    with wh.connect() as con:
        eps, n_holdout = current_episodes(con, manifest_path)
    rows = summary_rows(eps, baseline_policy_id=baseline_policy_id, n_boot=n_boot, ci_seed=ci_seed,
                        run_id=run_id, holdout_tasks=n_holdout)
    with wh.connect() as con:
        tables.replace_rows(con, "eval_summary", rows)        # recomputed whole from eval_episodes
    return rows


def build_economics(wh, manifest_path, card, *, baseline_policy_id: str | None, production_n: int = 10_000,
                    include_warm_start: bool = False, training: Mapping | None = None,
                    checkpoints: Mapping[str, str] | None = None, run_id: str | None = None) -> list[dict]:
    """`checkpoints`: policy id -> checkpoint folder; its measured training compute (and its
    warm-start chain) is priced by the card. `training` entries (usd / cpu_s / gpu_s) win."""
    import json

    from ratchet.evaluation.economics import checkpoint_investment, economics_row, policy_costs

    with wh.connect() as con:
        eps, _ = current_episodes(con, manifest_path)
    measured = {pid: checkpoint_investment(card, folder) for pid, folder in (checkpoints or {}).items()}
    costs = policy_costs(eps, card, {**measured, **(training or {})})
    base = next((c for c in costs if c.policy_id == baseline_policy_id), None)
    now = datetime.now(timezone.utc)
    rows = [{**economics_row(c, base, production_n=production_n, include_warm_start=include_warm_start),
             "computed_at": now, "dagster_run_id": run_id, "rate_card": card.name,
             "rate_card_json": json.dumps(card.to_dict(), sort_keys=True, default=str)} for c in costs]
    with wh.connect() as con:
        tables.replace_rows(con, "economics", rows)
    return rows


def _bundles(con) -> dict:
    import json

    from sandboxes.bundle import TaskBundle

    rows = tables.fetch(con, "SELECT task_id, bundle FROM tasks ORDER BY task_id")
    return {r["task_id"]: TaskBundle.from_dict(json.loads(r["bundle"]) if isinstance(r["bundle"], str) else r["bundle"])
            for r in rows}


def run_judge_calibration(wh, judge_cfg: dict, *, human_labels_csv: str | None = None, max_items: int = 600,
                          include_transcripts: bool = True, n_boot: int = 2000, seed: int = 0,
                          run_id: str | None = None) -> dict:
    from ratchet.evaluation import judge_calibration as jc
    from sandboxes.verifiers.judge import make_judge

    with wh.connect() as con:
        tables.ensure(con)
        bundles = _bundles(con)
    problems: list[str] = []
    if human_labels_csv:
        items, problems = jc.load_human_labels(human_labels_csv)
        source = f"human:{Path(human_labels_csv).name}"
        unknown = sorted({i.task_id for i in items} - set(bundles))
        if unknown:
            problems.append(f"{len(unknown)} labelled task(s) not in the tasks table, left out (e.g. {unknown[:3]})")
    else:
        items, source = jc.embedded_items(bundles.values(), seed=seed, max_items=max_items), "embedded:ground_truth"
        if include_transcripts:
            with wh.connect() as con:
                recs = tables.fetch(con, "SELECT task_id, messages, patch, agent_id FROM trajectories "
                                         "WHERE task_id IN (SELECT task_id FROM tasks) ORDER BY record_id")
            logged = jc.transcript_items(recs, bundles)
            if logged:
                items, source = items + logged, f"embedded:ground_truth+{len(logged)} transcripts"
    row, _ = jc.calibrate(make_judge(judge_cfg), items, bundles, gold_source=source, n_boot=n_boot, seed=seed)
    row.update(computed_at=datetime.now(timezone.utc), dagster_run_id=run_id)
    with wh.connect() as con:
        tables.append_rows(con, "judge_calibration", [row])
    return {**row, "problems": problems}


def latest_calibration(wh, judge_id: str | None = None) -> dict | None:
    with wh.connect() as con:
        tables.ensure(con)
        rows = tables.fetch(con, "SELECT * FROM judge_calibration" + (" WHERE judge_id = ?" if judge_id else "")
                            + " ORDER BY computed_at DESC LIMIT 1", [judge_id] if judge_id else [])
    return rows[0] if rows else None


def write_scorecard(wh, *, order: Sequence[str] = (), slice_dimension: str = "family", tag: str = "") -> dict:
    """The scorecard from the stored eval_summary and economics: Markdown under RATCHET_HOME
    (scorecard.md) and a PNG under RATCHET_HOME/artifacts."""
    import json

    from ratchet.evaluation.scorecard import policy_label, scorecard_markdown, scorecard_png, slice_markdown

    with wh.connect() as con:
        tables.ensure(con)
        summary = tables.fetch(con, "SELECT * FROM eval_summary ORDER BY policy_id, checkpoint_version, dimension, "
                                    "slice_value")
        eco = tables.fetch(con, "SELECT * FROM economics")
        membership = tables.fetch(con, "SELECT * FROM base_membership ORDER BY checked_at DESC LIMIT 1")
    for r in summary:
        if isinstance(r.get("seed_pass_rates"), str):
            r["seed_pass_rates"] = json.loads(r["seed_pass_rates"])
    root = Path(wh.path).parent
    md = scorecard_markdown(summary, eco, order=order) if summary else "No evaluation yet: materialise holdout_eval."
    if membership:
        md += "\n\n" + membership_note(membership[0])
    md_path = root / "scorecard.md"
    md_path.write_text(md + "\n")
    png = scorecard_png(summary, root / "artifacts" / f"scorecard-{tag or 'latest'}.png",
                        slice_dimension=slice_dimension) if summary else None
    alls = [r for r in summary if r["dimension"] == "all"]
    dims = sorted({r["dimension"] for r in summary} - {"all"})
    return {"markdown": md, "md_path": md_path, "png_path": png, "policies": len(alls),
            "slices": "\n\n".join(f"**{d}**\n\n{slice_markdown(summary, d)}" for d in dims) or "none",
            "pass_rates": {policy_label(r).replace(":", "_").replace("@", "_").replace(" ", "_"): r["pass_rate"]
                           for r in alls}}


def membership_note(m: dict) -> str:
    """The scorecard's line on the pretrained base's membership test (a `base_membership` row)."""
    gap = f"excess name gap {m['excess_gap']:+.3f} [{m['excess_gap_ci_lo']:+.3f}, {m['excess_gap_ci_hi']:+.3f}]"
    if m["likely_seen"]:
        return (f"**Warning:** the base `{m['base']}` has likely seen this holdout's reference solutions "
                f"(membership test over {m['programs']} programs: {gap}); trained policies' results here measure "
                "recall as well as repair.")
    return f"The base `{m['base']}` shows no sign of having seen this holdout's solutions ({gap})."


def scorecard_text(wh) -> str:
    """What `ratchet scorecard` prints: the stored scorecard Markdown (recomputed from the tables)."""
    return write_scorecard(wh)["markdown"]
