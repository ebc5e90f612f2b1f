"""Rank-relative actions, a view setting (`chat.make_view(..., rank=True)`: `view["actions"] ==
"rank"`): the embedded policy names the k-th line localize listed and the k-th row of a candidate
list as its view shows it, instead of the environment's line number and candidate index.

    ranks = Ranks.of(messages, view)                            # from the observations so far
    ranks.to_env("apply_edit", {"path": "solution.py", "line": 1, "index": 1})
    # -> {"path": "solution.py", "line": 12, "index": 3}         (what the environment gets)

Policy side only, like the rest of the view: the environment, its schemas and every logged
trajectory keep the environment's numbers. Four places meet here: `chat.prepare` renders logged
calls as ranks (so SFT trains on, and every prompt shows, the numbers the policy writes),
`chat.policy_view` labels the observations with ranks, `action_mask.narrow` offers ranks, and the
transformers engine turns a generated call back into the environment's numbers before the episode
runner sees it. Lines are ranked by localize's last answer; rows by the line's list that describes
the file as it reads now, tracked by the mask's own tracker (`action_mask.ListValidity`): a
list shown on the clean file is valid again whenever the file is clean again (after an undo), one
shown after an edit until the next edit. So after a failed attempt and its undo, rank 2 is the
second row of the list the first attempt came from, not of the list the undo was read from.

Why: with the view in the prior's order, "apply the first listed row" IS the prior harness, and
SFT trained on 55 demonstrations of exactly that rule did not learn it on 164 problems (SFT 0.211,
first try 0.111, against the prior's 0.517 / 0.433; measured by bench/learning.py, see
docs/experiments/). The call named the row by its environment index, so the rule was "copy the
number on the first row of the last list", a pointer operation; on 20 problems the model could
instead recall per problem which index had been right, which did not carry to new problems. In
ranks the rule is one constant token.
"""
from __future__ import annotations

import copy
import functools
import json

RANK = "rank"
FOLLOW_NOTES = "notes"
FOLLOW = 0      # the rank that names what the notes name (`Ranks.followed`)
NUMBERED = ("propose_edits", "apply_edit")      # the calls whose numbers are ranks


def rank_actions(view: dict | None) -> bool:
    return bool(view) and view.get("actions") == RANK


@functools.lru_cache(maxsize=1024)
def _localized(obs: str) -> tuple:
    """Localize's (path, line) rows in its order, each once."""
    from sandboxes.observations import parse_localize

    out: list = []
    for f, ln, _ in parse_localize(obs):
        if (f, ln) not in out:
            out.append((f, ln))
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def _tiers(obs: str) -> tuple:
    """((path, line), tier) per localize row, the tier its row is labelled with in the policy's
    view (`chat._tiers`: 1 for the top score, +1 at each change of score), so the progress note
    and the labels never disagree."""
    from ratchet.policy.embedded.chat import _LOC_ROW, _tiers as row_tiers

    out: dict = {}
    for row, t in row_tiers(obs).items():
        m = _LOC_ROW.match(row)
        out.setdefault((m.group(2), int(m.group(3))), t)
    return tuple(out.items())


@functools.lru_cache(maxsize=4096)
def _rows(obs: str, view_key: str) -> tuple:
    """A candidate list's environment indices in the order the view lists them."""
    from ratchet.policy.embedded.chat import order_candidates
    from sandboxes.observations import parse_candidates

    return tuple(i for i, _ in order_candidates(parse_candidates(obs), json.loads(view_key) if view_key else None))


@functools.lru_cache(maxsize=4096)
def _candidates(obs: str) -> tuple:
    from sandboxes.observations import parse_candidates

    return tuple(parse_candidates(obs))


@functools.lru_cache(maxsize=64)
def _prior(view_key: str):
    """The view's prior (None without one), for the pick note's order."""
    from sandboxes.agents.prior import as_prior

    counts = ((json.loads(view_key) if view_key else {}).get("prior") or {}).get("counts")
    return as_prior({"counts": counts}) if counts else None


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class Ranks:
    """What ranks mean at one point of an episode: localize's lines and each line's valid list."""

    def __init__(self, view: dict | None = None):
        from ratchet.policy.action_mask import ListValidity

        self.view_key = json.dumps(view) if view else ""
        # rank 0 names what the notes name (view["follow"] == "notes"): see `followed`
        self.follow = bool(view) and view.get("follow") == FOLLOW_NOTES
        self.lines: tuple = ()
        self._lists: dict = {}      # ((path, line), tag) -> env indices in view order
        self._valid = ListValidity()  # the mask's own tracker: which list a row number refers to
        self._tag = self._valid.tag
        self.tiers: dict = {}       # (path, line) -> SBFL tier on localize's last answer
        self.listed: set = set()    # (path, line) the episode has proposed edits for
        self.tried: set = set()     # (path, line, index): attempts (an edit of the clean file)
        self._cands: dict = {}      # (path, line) -> its clean-file list [(env index, description)]

    @property
    def rows(self) -> dict:
        """(path, line) -> env indices in view order, for the lists that describe the file now."""
        tag = self._tag()
        return {key: rows for (key, t), rows in self._lists.items() if t == tag}

    @classmethod
    def of(cls, messages: list[dict], view: dict | None = None) -> "Ranks":
        from ratchet.policy.action_mask import _observations

        r = cls(view)
        for name, args, obs in _observations(messages):
            r.observe(name, args, obs)
        return r

    def observe(self, name: str, args: dict, obs: str) -> None:
        """One answered call (its arguments as the environment got them)."""
        from sandboxes.observations import is_error, parse_applied

        if is_error(obs):
            return
        if name == "localize":
            self.lines = _localized(obs)
            self.tiers = dict(_tiers(obs))
            self._valid.localized(obs)
        elif name == "propose_edits":
            key = (args.get("path"), _int(args.get("line")))
            if None not in key:
                self._lists[(key, self._tag())] = _rows(obs, self.view_key)
                self.listed.add(key)
                if self._valid.clean:
                    self._cands[key] = _candidates(obs)
        elif name == "apply_edit":
            a = parse_applied(obs)
            if a is not None:
                was_clean = self._valid.clean
                self._valid.applied(a)
                if was_clean and not self._valid.clean:
                    self.tried.add((a.path, a.line, a.index))

    def progress(self) -> str:
        """The view's tier-progress note (`view["progress"] == "tier"`, read after localize's and
        each propose_edits answer): `next to list: k.`, the rank of the first line not yet
        proposed in the tiers begun so far (tier 1 before anything is proposed), or `tier t
        listed.` once every line of those tiers has its list. The demonstrator lists a whole tier,
        then attempts; SFT did not learn where a tier ends (teacher-forced on its own
        demonstrations it listed another line at 43 of 68 "now attempt" turns, measured by
        bench/imitation.py): a comparison of tier labels across the whole localize answer, made
        one local phrase here. Empty before localize has answered."""
        if not self.lines:
            return ""
        k = self.next_to_list()
        return f"next to list: {k}." if k else f"tier {self._top()} listed."

    def _top(self) -> int:
        return max((self.tiers.get(k, 1) for k in self.listed), default=1)

    def next_to_list(self) -> int | None:
        """The rank the progress note names (`next to list: k.`), None when it says `listed`."""
        top = self._top()
        for k, key in enumerate(self.lines, 1):
            if self.tiers.get(key, top + 1) <= top and key not in self.listed:
                return k
        return None

    @property
    def clean(self) -> bool:
        return self._valid.clean

    def pick(self) -> str:
        """The view's pick note (`view["pick"] == "prior"`, read on the clean file after each list
        and each undo): `best untried: line k, index i.`, the untried row the structured
        demonstrator attempts next among the lists that describe the file now, by its own order
        (`sandboxes.agents.prior.ranked_candidates`: SBFL tier, the prior's line score, SBFL rank,
        then the view's row order); empty when nothing listed is left untried or off the clean
        file. Why: with the tier boundary learnt (the progress note and 10 SFT epochs), the policy's
        next error was this cross-list choice (11 of 11 validation tasks lost to the demonstrator:
        another line first; measured by bench/imitation.py): comparing prior counts across 2-4 lists
        in earlier messages, made one local phrase here, in the tokens of the call."""
        best = self.best_untried()
        return "" if best is None else f"best untried: line {best[0]}, index {best[1]}."

    def best_untried(self) -> tuple | None:
        """(line rank, row rank) the pick note names; None when it says nothing."""
        from sandboxes.agents.prior import ranked_candidates

        prior = _prior(self.view_key)
        if not self.lines or not self._valid.clean or prior is None:
            return None
        # the demonstrator's own order (ranked_candidates), over the valid lists, tier by tier
        valid = sorted((self.tiers.get(key, 99), self.line_rank(*key), key) for key in self.rows if key in self._cands)
        tiers: dict = {}
        for t, _, key in valid:
            tiers.setdefault(t, []).append((key, self._cands[key]))
        for t in sorted(tiers):
            for key, i, _ in ranked_candidates([tiers[t]], prior):
                if (*key, i) not in self.tried:
                    return self.line_rank(*key), self.index_rank(*key, i)
        return None

    def followed(self, name: str) -> dict | None:
        """What rank 0 names (view["follow"] == "notes"), as ranks: for propose_edits the line the
        progress note names, for apply_edit the row the pick note names; None when the notes name
        nothing (or off the clean file). Why: with both notes in its view and 10 SFT epochs, the
        policy called the demonstrator's tool at 0.985 of its "now attempt" turns but wrote the
        note's numbers at only 0.691 (validation 0.531): copying two numbers from a note is a
        pointer operation a 1M-parameter model did not learn from 68 examples; "do what the note
        says" in ranks is one constant token, as "the first listed row" is (see the module's Why)."""
        if not (self.follow and self._valid.clean):
            return None
        if name == "propose_edits":
            k = self.next_to_list()
            return None if k is None else {"path": self.lines[k - 1][0], "line": k}
        if name == "apply_edit":
            b = self.best_untried()
            return None if b is None else {"path": self.lines[b[0] - 1][0], "line": b[0], "index": b[1]}
        return None

    def line_rank(self, path, line) -> int | None:
        try:
            return self.lines.index((path, line)) + 1
        except ValueError:
            return None

    def _listed(self, key) -> tuple:
        return self._lists.get((key, self._tag()), ())

    def index_rank(self, path, line, index) -> int | None:
        rows = self._listed((path, line))
        return rows.index(index) + 1 if index in rows else None

    def to_rank(self, name: str, args: dict) -> dict | None:
        """The environment's arguments -> the policy's; None when a number was never listed."""
        if name not in NUMBERED or not isinstance(args, dict):
            return args
        path, line = args.get("path"), _int(args.get("line"))
        k = self.line_rank(path, line)
        if k is None:
            return None
        out = {**args, "line": k}
        if name == "apply_edit":
            i = self.index_rank(path, line, _int(args.get("index")))
            if i is None:
                return None
            out["index"] = i
        f = self.followed(name)
        if f is not None and all(out.get(key) == v for key, v in f.items()):
            out = {**out, "line": FOLLOW, **({"index": FOLLOW} if name == "apply_edit" else {})}
        return out

    def to_env(self, name: str, args: dict) -> dict | None:
        """The policy's arguments -> the environment's; None when a rank names nothing listed."""
        if name not in NUMBERED or not isinstance(args, dict):
            return args
        k, path = _int(args.get("line")), args.get("path")
        if k == FOLLOW and self.follow:
            f = self.followed(name)
            if f is None or f["path"] != path or (name == "apply_edit" and _int(args.get("index")) != FOLLOW):
                return None
            return self.to_env(name, {**args, **f})
        if k is None or not 1 <= k <= len(self.lines) or self.lines[k - 1][0] != path:
            return None
        line = self.lines[k - 1][1]
        out = {**args, "line": line}
        if name == "apply_edit":
            i, rows = _int(args.get("index")), self._listed((path, line))
            if i is None or not 1 <= i <= len(rows):
                return None
            out["index"] = rows[i - 1]
        return out


def env_calls(calls: list, messages: list[dict], view: dict | None) -> list:
    """A generated turn's ToolCalls with their ranks turned into the environment's numbers. A rank
    that names nothing listed (only possible without the mask) is never sent as a number, which
    the environment would read as a real line or index: it goes wrapped under `unlisted_rank`, an
    argument the environment rejects with an error, so the turn is spent and nothing is edited."""
    from ratchet.policy.base import ToolCall

    if not rank_actions(view) or not any(c.name in NUMBERED for c in calls):
        return calls
    ranks = Ranks.of(messages, view)
    out = []
    for c in calls:
        if c.name not in NUMBERED or c.arguments is None:
            out.append(c)
            continue
        env = ranks.to_env(c.name, c.arguments)
        out.append(ToolCall.from_raw(c.name, json.dumps(env if env is not None else {"unlisted_rank": c.arguments}), c.id))
    return out


def rank_schemas(schemas: list[dict], ranks: Ranks) -> list[dict]:
    """The action mask's schemas (environment numbers) with every `line` / `index` enum turned into
    ranks; a branch left with nothing to choose is dropped, and so is a tool left with no branch."""
    out = []
    for t in schemas:
        fn = t.get("function") or t
        if fn["name"] not in NUMBERED:
            out.append(t)
            continue
        params = fn["parameters"]
        branches = [b for b in (params.get("anyOf") or [params]) for b in _rank_branch(fn["name"], b, ranks)]
        f = ranks.followed(fn["name"])
        if f is not None and any(_offers(b, f) for b in branches):
            props = {key: {"type": "string" if key == "path" else "integer",
                           "enum": [f["path"] if key == "path" else FOLLOW]} for key in f}
            branches = [{**branches[0], "properties": props, "required": list(f)}] + branches
        if branches:
            t = copy.deepcopy(t)
            (t.get("function") or t)["parameters"] = branches[0] if len(branches) == 1 else {"anyOf": branches}
            out.append(t)
    return out


def _rank_branch(name: str, b: dict, ranks: Ranks) -> list[dict]:
    """One object schema (path / line / index enums) -> one per path, in ranks."""
    props = b.get("properties") or {}
    if any("enum" not in props.get(k, {}) for k in ("path", "line", "index")[:3 if name == "apply_edit" else 2]):
        return []                 # numbers the mask left open cannot be offered as ranks
    out = []
    for p in props["path"]["enum"]:
        lines = [(ln, ranks.line_rank(p, ln)) for ln in props["line"]["enum"]]
        lines = [(ln, k) for ln, k in lines if k is not None]
        if not lines:
            continue
        nb = {**b, "properties": {**props, "path": {**props["path"], "enum": [p]},
                                  "line": {**props["line"], "enum": [k for _, k in lines]}}}
        if name == "apply_edit":
            (ln, _), = lines          # the mask offers apply_edit one line per branch
            idx = [ranks.index_rank(p, ln, i) for i in props["index"]["enum"]]
            idx = [i for i in idx if i is not None]
            if not idx:
                continue
            nb["properties"]["index"] = {**props["index"], "enum": idx}
        out.append(nb)
    return out


def _offers(b: dict, args: dict) -> bool:
    """Whether a ranked branch admits these arguments."""
    props = b.get("properties") or {}
    return all(v in (props.get(k) or {}).get("enum", ()) for k, v in args.items())
