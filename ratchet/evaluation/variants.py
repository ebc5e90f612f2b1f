"""Harness variants: configuration changes of the SBFL-guided baseline, evaluated as policies.

A variant is a policy id like any other ("harness:sbfl-top3"), made by the policy layer's harness
engine and run through the same turn loop, sandbox, tools and verifiers, so a configuration
change sits in eval_summary beside the baseline and the trained checkpoints with its own row:

    register_variants()                      # idempotent; get_policy calls it in every process
    evaluate(plan, "harness:sbfl-top3", "")  # or a holdout_eval partition "harness:sbfl-top3"

How ids resolve: `make_policy("harness:<name>")` makes `HarnessPolicy(<name>)`, which runs the
agent program registered under <name> in `sandboxes.agents` (`register_agent`, public). The
variants register their programs there; nothing in ratchet/policy or sandboxes/agents changes.
Ids use "-" (not "@": "@<version>" is the checkpoint version in every policy id).

Axes (one change each against the baseline `harness:sbfl`: localize top 10, ochiai, the
structured quick-fix tools, k = 4 attempts):
* retrieval: how many ranked lines it considers (`sbfl-top1`, `sbfl-top3`);
* localisation formula (`sbfl-tarantula`, `sbfl-dstar`);
* tool schema (`sbfl-free-edit`): no propose_edits / apply_edit; the same single-token fixes
  are written as free text replacements through `edit` (the tool an LLM without the
  structured tools has), reverted the same way;
* prompt (`sbfl-issue`): reads the function named in the issue text of its prompt and ranks only
  lines inside it (the issue as retrieval context).
The variant's program is deterministic per (task, conversation), as the baseline's is.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

BASELINE = "harness:sbfl"


@dataclass(frozen=True)
class Variant:
    name: str                   # the agent name; the policy id is "harness:<name>"
    axis: str                   # retrieval | formula | tool schema | prompt
    description: str
    top: int = 10               # localize lines considered
    formula: str = "ochiai"     # localize formula
    tools: str = "structured"   # structured (propose_edits/apply_edit) | free_edit (edit text)
    issue_scope: bool = False   # keep only ranked lines inside the function the issue names
    k: int = 4                  # attempt budget

    @property
    def policy_id(self) -> str:
        return f"harness:{self.name}"

    def agent_id(self) -> str:
        return f"baseline-{self.name}@v1"

    def to_dict(self) -> dict:
        return {**asdict(self), "policy_id": self.policy_id, "baseline": BASELINE}


VARIANTS: dict[str, Variant] = {v.policy_id: v for v in (
    Variant("sbfl-top1", "retrieval", "only the single most suspicious line", top=1),
    Variant("sbfl-top3", "retrieval", "the 3 most suspicious lines", top=3),
    Variant("sbfl-tarantula", "formula", "localize with Tarantula instead of Ochiai", formula="tarantula"),
    Variant("sbfl-dstar", "formula", "localize with D* (star 2) instead of Ochiai", formula="dstar"),
    Variant("sbfl-free-edit", "tool schema", "no structured quick-fix tools: the same fixes as free "
            "`edit` text replacements", tools="free_edit"),
    Variant("sbfl-issue", "prompt", "ranks only lines inside the function the issue names",
            issue_scope=True),
)}


def variant(policy_id: str) -> Variant | None:
    """The variant behind a policy id (a checkpoint suffix "@..." is ignored), else None."""
    return VARIANTS.get(policy_id.split("@", 1)[0])


# --------------------------------------------------------------------------- the agent program
def run_variant(env, rng, *, spec: Variant, k: int | None = None) -> object:
    """The SBFL-guided baseline (`sandboxes.agents.baselines.run_sbfl`) with `spec`'s changes."""
    from sandboxes.agents.base import Session, function_lines, issue_function
    from sandboxes.agents.baselines import _give_up, try_ranked
    from sandboxes.observations import parse_localize, parse_source

    k = spec.k if k is None else k
    s = Session(env, spec.agent_id())
    issue = s.messages[-1]["content"]
    # the issue scope filters the ranking, so ask for enough lines that the top survive it
    ranked = parse_localize(s.call("localize", {"top": max(spec.top, 20) if spec.issue_scope else spec.top,
                                                "formula": spec.formula}, "Ranking suspicious lines."))
    if not ranked:
        return _give_up(s)
    path = ranked[0][0]
    source = parse_source(s.call("read_file", {"path": path}, f"Reading {path}."))
    if spec.issue_scope:
        name = issue_function(issue, source)
        inside = set(function_lines(source, name)) if name else set()
        ranked = [r for r in ranked if r[0] != path or not inside or r[1] in inside]
    ranked = ranked[:spec.top]
    if spec.tools == "free_edit":
        return _free_edit(s, path, source, ranked, k)
    return try_ranked(s, path, source, ranked, k)


def _free_edit(s, path: str, source: str, ranked, k: int):
    """The same candidates, written as `edit` old/new text (the smallest unique window of lines),
    tested, and undone with the inverse `edit`."""
    from sandboxes.agents.base import enclosing_function, unique_window
    from sandboxes.agents.baselines import _give_up
    from sandboxes.agents.expert import explain
    from sandboxes.candidates import propose_edits
    from sandboxes.observations import tests_all_passed

    for file, line, _ in ranked:
        if file != path:
            continue
        for c in propose_edits(source, line):
            if s.attempts >= k or s.done:
                return _give_up(s)
            s.attempts += 1
            edited = c.apply(source)
            win = unique_window(source, edited, line)
            if win is None:
                continue
            if s.call("edit", {"path": path, "old": win[0], "new": win[1]},
                      f"Attempt {s.attempts}: {c.description} on line {line}.").startswith("error:"):
                continue
            if tests_all_passed(s.call("run_tests", {}, "Running the tests.")):
                s.fixed_at = s.attempts
                s.submit(explain(enclosing_function(source, line), path, line, c.description,
                                 source.splitlines()[line - 1]))
                return s.finish()
            back = unique_window(edited, source, line)
            if back is None or s.call("edit", {"path": path, "old": back[0], "new": back[1]},
                                      "That did not fix it; reverting.").startswith("error:"):
                return _give_up(s)
    return _give_up(s)


# --------------------------------------------------------------------------- registration
_REGISTERED = False


def register_variants() -> list[str]:
    """Register every variant's program with sandboxes.agents (idempotent, per process); returns
    the policy ids. Called by `ratchet.evaluation.episodes.get_policy` before a policy is made."""
    global _REGISTERED
    if not _REGISTERED:
        from sandboxes.agents import register_agent

        for spec in VARIANTS.values():
            try:
                register_agent(spec.name, lambda env, rng, _spec=spec, **kw: run_variant(env, rng, spec=_spec, **kw))
            except ValueError:      # registered already (e.g. by an earlier import of a copy)
                pass
        _REGISTERED = True
    return list(VARIANTS)
