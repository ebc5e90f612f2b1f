"""Task sources beside the HumanEval suite: Harbor task folders and SWE-bench-style instances
as checked TaskBundles, and every task a source could not turn into one (`task_rejections`).

A user's task is accepted only when its own tests say it is a task, under the pristine
verification that scores episodes (`sandboxes.verify`), in the sandbox:

* before the reference fix the required tests fail (SWE-bench: every FAIL_TO_PASS test, as the
  SWE-bench harness validates instances; Harbor, whose tests are all required: at least one),
* after it every required test (FAIL_TO_PASS and PASS_TO_PASS) passes.

The reference fix is the instance's `patch` (SWE-bench) or the task's `solution/` (Harbor:
`solve.sh` run by bash from the repository root inside the sandbox, or a single `*.patch` /
`*.diff`). Everything else becomes a `Rejection` with a reason from REASONS and a detail.

A Harbor task whose `environment/` has a Dockerfile is checked, and later run, in its own image
built locally from it (`sandboxes.docker_task_image`); a Dockerfile that does not build here is
the task's rejection (`image_build_failed`). Every other task runs in bubblewrap.

Verdicts are cached by environment digest, image and reference fix (`cache_dir`): a re-run of
the `tasks` asset checks only what changed. Sandbox failures are never cached.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Iterable

KINDS = ("humaneval", "harbor", "swebench")
CHECK_VERSION = "task-check/v1"       # bump when the acceptance rule changes: cached verdicts expire
REASONS = {
    "unreadable": "the file or folder could not be read or parsed",
    "malformed": "the record is not a task (the importer says why)",
    "missing_repo": "no local repository for the instance's repo under the source's `repos` folder",
    "missing_commit": "the instance's base_commit is not in that repository",
    "no_reference_fix": "no reference fix to check the tests against (require_reference: false accepts it)",
    "reference_fix_failed": "the reference fix does not apply or its script fails",
    "tests_pass_before_fix": "the required tests already pass on the unfixed code",
    "tests_fail_after_fix": "required tests do not pass with the reference fix",
    "image_build_failed": "the task's environment/Dockerfile does not build here (offline, local base images only)",
    "infra_error": "the sandbox failed while checking the task (not the task's fault; run again)",
    "duplicate_task_id": "another source already has a task with this id",
    "problem_dropped": "a HumanEval problem with no verified mutant",
}


class SourceError(ValueError):
    """A source configuration that cannot be used as given (nothing is written)."""


@dataclass(frozen=True)
class SourceSpec:
    kind: str                          # humaneval | harbor | swebench
    path: str | None = None            # harbor: a folder of task folders (or one); swebench: the JSONL
    repos: str | None = None           # swebench: folder of local git repositories
    limit: int | None = None           # first N tasks of this source (folders / lines in order)
    require_reference: bool = True     # False: a task without a reference fix is accepted unchecked after
    name: str | None = None            # label in task_rejections and the metadata (default: kind)
    limits: dict | None = None         # swebench: `Limits` fields for every instance (Harbor: task.toml)

    @property
    def label(self) -> str:
        return self.name or self.kind


@dataclass
class Rejection:
    source: str
    task: str                          # task id, or the folder / line that never became one
    reason: str
    detail: str
    source_path: str | None = None

    def __post_init__(self):
        if self.reason not in REASONS:
            raise ValueError(f"unknown rejection reason {self.reason!r}; known: {sorted(REASONS)}")


@dataclass
class Loaded:
    """One source's outcome."""
    spec: SourceSpec
    bundles: list = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    cached_checks: int = 0

    @property
    def suite_key(self) -> str:
        digests = sorted(b.environment_digest for b in self.bundles)
        return f"{self.spec.kind}:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()[:16]


def parse_sources(raw: Iterable[dict] | None) -> list[SourceSpec]:
    """Source specs from config dicts; None or empty: the HumanEval suite alone. Every problem is
    reported at once (SourceError) before anything runs."""
    if not raw:
        return [SourceSpec("humaneval")]
    specs, errors = [], []
    for i, d in enumerate(raw):
        d = {k: v for k, v in dict(d).items() if v is not None}
        unknown = sorted(set(d) - {"kind", "path", "repos", "limit", "require_reference", "name", "limits"})
        if unknown:
            errors.append(f"source {i + 1}: unknown keys {unknown}")
            continue
        kind = d.get("kind")
        if kind not in KINDS:
            errors.append(f"source {i + 1}: kind {kind!r} is not one of {list(KINDS)}")
            continue
        spec = SourceSpec(**d)
        if kind == "humaneval" and (spec.path or spec.repos or spec.limit is not None or not spec.require_reference):
            errors.append(f"source {i + 1} (humaneval): takes no path, repos, limit or require_reference; size "
                          f"it with the tasks asset's own seed / limit / per_problem")
        if kind in ("harbor", "swebench"):
            if not spec.path:
                errors.append(f"source {i + 1} ({kind}): `path` is required")
            elif not Path(spec.path).expanduser().exists():
                errors.append(f"source {i + 1} ({kind}): {spec.path} does not exist")
        if kind == "harbor" and spec.path and Path(spec.path).expanduser().is_file():
            errors.append(f"source {i + 1} (harbor): {spec.path} is a file; give a folder of task folders")
        if kind == "swebench":
            if spec.path and Path(spec.path).expanduser().is_dir():
                errors.append(f"source {i + 1} (swebench): {spec.path} is a folder; give the instances' JSONL")
            if not spec.repos:
                errors.append(f"source {i + 1} (swebench): `repos` (a folder of local git repositories) is required")
            elif not Path(spec.repos).expanduser().is_dir():
                errors.append(f"source {i + 1} (swebench): repos folder {spec.repos} does not exist")
        if spec.limits is not None:
            if kind != "swebench":
                errors.append(f"source {i + 1} ({kind}): `limits` is for swebench sources (Harbor: task.toml)")
            else:
                try:
                    spec = replace(spec, limits=limits_dict(spec.limits))
                except (TypeError, ValueError) as e:
                    errors.append(f"source {i + 1} (swebench): bad limits: {e}")
        if spec.limit is not None and spec.limit < 0:
            errors.append(f"source {i + 1}: limit must be >= 0")
        # absolute, so task_rejections and the metadata say which folder was read
        spec = replace(spec, **{k: str(Path(getattr(spec, k)).expanduser().resolve())
                                for k in ("path", "repos") if getattr(spec, k)})
        specs.append(spec)
    labels = [s.label for s in specs]
    for label in sorted({x for x in labels if labels.count(x) > 1}):
        errors.append(f"{labels.count(label)} sources are labelled {label!r}: give each a distinct `name`")
    if errors:
        raise SourceError("task sources: " + "; ".join(errors))
    return specs


def sources_from_path(path: str | Path, *, humaneval: bool = True) -> list[dict]:
    """Source configs for one folder laid out as the guide shows (for a command line's
    `--tasks-from PATH`): PATH/harbor/ (Harbor task folders), PATH/*.jsonl with PATH/repos/
    (SWE-bench instances), or PATH itself a folder of Harbor task folders, or a JSONL file with
    a repos/ folder beside it. The HumanEval suite first unless `humaneval` is False."""
    p = Path(path).expanduser().resolve()
    out: list[dict] = [{"kind": "humaneval"}] if humaneval else []
    if p.is_file():
        jsonls, root = [p], p.parent
    elif p.is_dir():
        jsonls, root = sorted(p.glob("*.jsonl")), p
    else:
        raise SourceError(f"{path} does not exist")
    found = []
    if (root / "harbor").is_dir() and not p.is_file():
        found.append({"kind": "harbor", "path": str(root / "harbor")})
    elif p.is_dir() and not jsonls and ((p / "instruction.md").is_file()
                                        or any((c / "instruction.md").is_file() for c in p.iterdir() if c.is_dir())):
        found.append({"kind": "harbor", "path": str(p)})
    for j in jsonls:
        if not (root / "repos").is_dir():
            raise SourceError(f"{j} needs a repos/ folder of local git repositories beside it ({root / 'repos'})")
        found.append({"kind": "swebench", "path": str(j), "repos": str(root / "repos"),
                      **({"name": f"swebench:{j.stem}"} if len(jsonls) > 1 else {})})
    if not found:
        raise SourceError(f"{path}: no Harbor task folders (harbor/, or folders with instruction.md) and no "
                          f"*.jsonl of SWE-bench instances")
    return out + found


def limits_dict(raw: dict) -> dict:
    """`Limits` fields with their declared types (YAML gives 5.0 for an int field; the
    environment digest must not depend on how a number was written), checked by `Limits`."""
    from dataclasses import fields

    from sandboxes.bundle import Limits

    types = {f.name: f.type for f in fields(Limits)}
    unknown = sorted(set(raw) - set(types))
    if unknown:
        raise ValueError(f"unknown fields {unknown}; known: {sorted(types)}")
    out = {}
    for k, v in raw.items():
        if types[k] in ("int", int) and not float(v).is_integer():
            raise ValueError(f"{k} must be a whole number, not {v}")
        out[k] = int(v) if types[k] in ("int", int) else float(v)
    Limits(**out)
    return out


def source_tasks(spec: SourceSpec) -> list:
    """A Harbor or SWE-bench source's records as (bundle, Reference) pairs, unchecked, and a
    Rejection for each record that is no task at all (what `load_source` checks next)."""
    return [build() for build in _candidates(spec, "source_tasks")]


def _candidates(spec: SourceSpec, caller: str) -> list:
    """The source's record builders, the first `spec.limit` of them when it is set."""
    if spec.kind == "harbor":
        candidates = _harbor_candidates(spec)
    elif spec.kind == "swebench":
        candidates = _swebench_candidates(spec)
    else:
        raise SourceError(f"{caller}: {spec.kind} is not a user source")
    return candidates[:spec.limit] if spec.limit is not None else candidates


def load_source(spec: SourceSpec, runtime_factory, *, cache_dir: str | Path | None = None) -> Loaded:
    """A Harbor or SWE-bench source as checked bundles and rejections. `runtime_factory()` gives
    the sandbox runtime (called only when some task needs checking)."""
    out = Loaded(spec)
    runtime = None
    for build in _candidates(spec, "load_source"):
        item = build()
        if isinstance(item, Rejection):
            out.rejections.append(item)
            continue
        bundle, reference = item
        try:
            bundle = _in_own_image(bundle)
        except ValueError as e:         # ImageBuildError: the Dockerfile does not build here
            out.rejections.append(Rejection(spec.label, bundle.task_id, "image_build_failed", str(e), spec.path))
            continue
        verdict = _cached(cache_dir, bundle, reference, spec.require_reference)
        if verdict is _MISS:
            if runtime is None:
                runtime = runtime_factory()
            try:
                verdict = check_task(runtime, bundle, reference, require_reference=spec.require_reference,
                                     rule="all" if spec.kind == "swebench" else "any")
            except Exception as e:  # noqa: BLE001 - one task the sandbox could not open: record it, go on
                verdict = ("infra_error", f"the check could not run: {type(e).__name__}: {e}")
            _store(cache_dir, bundle, reference, spec.require_reference, verdict)
        else:
            out.cached_checks += 1
            verdict = None if verdict is _OK else verdict
        if verdict:
            out.rejections.append(Rejection(spec.label, bundle.task_id, *verdict, source_path=spec.path))
        else:
            out.bundles.append(bundle)
    return out


def _in_own_image(bundle):
    """A task with a Dockerfile (Harbor's environment/) runs in its own image, built here;
    every other task in bubblewrap (`sandboxes.docker_task_image`)."""
    if not (bundle.metadata or {}).get("dockerfile"):
        return bundle
    from sandboxes.docker_task_image import prepare

    return prepare(bundle)


@dataclass(frozen=True)
class Reference:
    """The reference fix: a unified diff, or a script run by bash from the repository root."""
    patch: str = ""
    script: str = ""

    @property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps([self.patch, self.script]).encode()).hexdigest()

    def __bool__(self) -> bool:
        return bool(self.patch or self.script)


def check_task(runtime, bundle, reference: Reference, *, require_reference: bool = True,
               rule: str = "all") -> tuple[str, str] | None:
    """None when the task is sound, else (reason, detail). rule "all": every FAIL_TO_PASS test
    must fail before the fix; "any": at least one required test must."""
    from sandboxes.verify import verify

    f2p = list(bundle.fail_to_pass)
    required = f2p + list(bundle.pass_to_pass)
    with runtime.episode(bundle) as ep:
        before = verify(runtime, bundle, ep)
    if before.infra_error:
        return "infra_error", f"before the fix: {before.infra_error}"
    passing = [t for t in f2p if before.outcomes.get(t) == "passed"]
    if (rule == "all" and passing) or (rule == "any" and all(before.outcomes.get(t) == "passed" for t in required)):
        return "tests_pass_before_fix", (f"{len(passing)} of {len(f2p)} FAIL_TO_PASS tests pass on the unfixed "
                                         f"code: {', '.join(passing[:5])}")
    if not reference:
        return None if not require_reference else ("no_reference_fix", _no_reference(bundle))
    with runtime.episode(bundle) as ep:
        if reference.patch:
            r = ep.apply_patch(reference.patch)
            what = "the reference patch does not apply"
        else:
            r = ep.run(["bash", "-s"], stdin=reference.script, timeout=bundle.limits.verify_s)
            what = "solution/solve.sh failed"
        if r.infra_error:
            return "infra_error", f"applying the reference fix: {r.infra_error}"
        if r.timed_out and reference.patch:
            # applying a diff never needs wall_s: a loaded machine, not the task (not cached)
            return "infra_error", f"applying the reference patch timed out after {bundle.limits.wall_s:g} s"
        if r.timed_out or r.returncode != 0:
            tail = (r.stderr or r.stdout or "").strip()[-400:]
            return "reference_fix_failed", f"{what} ({'timed out' if r.timed_out else f'exit {r.returncode}'}): {tail}"
        after = verify(runtime, bundle, ep)
    if after.infra_error:
        return "infra_error", f"after the fix: {after.infra_error}"
    failing = [f"{t} ({after.outcomes.get(t, 'not run')})" for t in required if after.outcomes.get(t) != "passed"]
    if failing:
        extra = f"; left out of the verification: {after.dropped[:3]}" if after.dropped else ""
        timed = " (the test run timed out)" if after.timed_out else ""
        return "tests_fail_after_fix", (f"{len(failing)} of {len(required)} required tests do not pass with the "
                                        f"reference fix{timed}: {', '.join(failing[:5])}{extra}")
    return None


def reference_episodes(runtime, bundle, patch: str | None = None) -> dict:
    """Two episodes through the environment the policies use, scored as theirs are: one that
    submits the code unchanged, one that applies the reference patch (default: the instance's
    `patch`) and submits. {"buggy": Reward, "fixed": Reward}: on a sound task the first is not
    resolved, the second is, and neither is an infrastructure failure (a test that never
    returns is ended by the task's limits and fails: the agent's failure)."""
    from sandboxes.env import RepairEnv

    patch = patch if patch is not None else bundle.metadata.get("gold_patch") or ""
    if not patch:
        raise ValueError(f"{bundle.task_id}: no reference patch")
    out = {}
    for name in ("buggy", "fixed"):
        with RepairEnv(bundle, runtime=runtime) as env:
            env.reset()
            if name == "fixed":
                obs = env.step("apply_patch", {"patch": patch})
                if obs.startswith("error"):
                    raise ValueError(f"{bundle.task_id}: the reference patch does not apply: {obs[:300]}")
            if not env.done:
                env.step("submit", {"explanation": ""})
            out[name] = env.reward
    return out


def _no_reference(bundle) -> str:
    where = "solution/solve.sh or one solution/*.patch" if bundle.metadata.get("source") == "harbor" \
        else "the instance's `patch`"
    return f"no reference fix ({where}); set require_reference: false to accept it after the fails-before check"


# --------------------------------------------------------------------------------------- Harbor

def _harbor_candidates(spec: SourceSpec) -> list:
    root = Path(spec.path).expanduser().resolve()
    if (root / "instruction.md").is_file():
        dirs = [root]
    else:
        try:
            dirs = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
        except OSError as e:
            raise SourceError(f"harbor source {spec.path}: cannot list the folder: {e}") from e
    return [lambda d=d: _harbor_task(spec, d) for d in dirs]


def _harbor_task(spec: SourceSpec, d: Path):
    from sandboxes.importers import ImportError_, from_harbor

    try:
        bundle = from_harbor(d)
        reference = _harbor_reference(d)
    except ImportError_ as e:
        return Rejection(spec.label, str(d), "malformed", str(e), spec.path)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return Rejection(spec.label, str(d), "unreadable", f"{type(e).__name__}: {e}", spec.path)
    meta = (bundle.metadata.get("harbor") or {}).get("metadata") or {}
    return with_slices(bundle, "harbor", difficulty=meta.get("difficulty"), category=meta.get("category"),
                       fallback="harbor"), reference


def _harbor_reference(d: Path) -> Reference:
    sol = d / "solution"
    if (sol / "solve.sh").is_file():
        return Reference(script=(sol / "solve.sh").read_text())
    diffs = sorted([*sol.glob("*.patch"), *sol.glob("*.diff")]) if sol.is_dir() else []
    if len(diffs) > 1:
        from sandboxes.importers import ImportError_

        raise ImportError_(f"{sol}: {len(diffs)} patch files; keep one reference patch")
    return Reference(patch=diffs[0].read_text()) if diffs else Reference()


# ------------------------------------------------------------------------------------- SWE-bench

def _swebench_candidates(spec: SourceSpec) -> list:
    path = Path(spec.path).expanduser().resolve()
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"swebench source {spec.path}: cannot read it: {e}") from e
    out = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            out.append(lambda n=n, line=line: _swebench_task(spec, n, line))
    return out


def repo_dir(repos: str | Path, repo: str) -> Path | None:
    """The local repository for "owner/name": repos/owner__name, repos/owner/name or repos/name,
    each matched case-insensitively when no exact match exists (as GitHub names are)."""
    base = Path(repos).expanduser().resolve()
    owner, _, name = repo.rpartition("/")
    candidates = [(repo.replace("/", "__"),), *([(owner, name)] if owner else []), (name,)]
    for parts in candidates:
        if base.joinpath(*parts).is_dir():
            return base.joinpath(*parts)
    for parts in candidates:
        p = base
        for part in parts:
            p = _casefold_child(p, part)
            if p is None:
                break
        if p is not None:
            return p
    return None


def _casefold_child(parent: Path, name: str) -> Path | None:
    try:
        return next((p for p in sorted(parent.iterdir()) if p.is_dir() and p.name.casefold() == name.casefold()), None)
    except OSError:
        return None


def _swebench_task(spec: SourceSpec, n: int, line: str):
    from sandboxes.importers import ImportError_, from_swebench

    where = f"{spec.path}:{n}"
    try:
        inst = json.loads(line)
    except ValueError as e:
        return Rejection(spec.label, where, "unreadable", f"line {n} is not JSON: {e}", spec.path)
    if not isinstance(inst, dict):
        return Rejection(spec.label, where, "malformed", f"line {n} is a {type(inst).__name__}, not an instance",
                         spec.path)
    task = str(inst.get("instance_id") or where)
    if not isinstance(inst.get("repo"), str) or not inst.get("repo"):
        return Rejection(spec.label, task, "malformed", "SWE-bench instance missing ['repo']", spec.path)
    path = repo_dir(spec.repos, inst["repo"])
    if path is None:
        owner, _, name = inst["repo"].rpartition("/")
        tried = [inst["repo"].replace("/", "__"), *([f"{owner}/{name}"] if owner else []), name]
        return Rejection(spec.label, task, "missing_repo",
                         f"no repository for {inst['repo']} in {spec.repos} (looked for {', '.join(tried)})",
                         spec.path)
    if not ((path / ".git").exists() or (path / "HEAD").is_file()):
        return Rejection(spec.label, task, "missing_repo", f"{path} is not a git repository", spec.path)
    meta = {k: inst[k] for k in ("difficulty", "category") if isinstance(inst.get(k), str) and inst[k]}
    try:
        bundle = from_swebench(inst, path, metadata=meta, limits=spec.limits)
    except ImportError_ as e:
        reason = "missing_commit" if str(e).startswith("base_commit") else "malformed"
        return Rejection(spec.label, task, reason, str(e), spec.path)
    return (with_slices(bundle, "swebench", difficulty=meta.get("difficulty"), category=meta.get("category"),
                        fallback=bundle.repo), Reference(patch=inst.get("patch") or ""))


# ----------------------------------------------------------------------------------- rows, slices

def with_slices(bundle, source: str, *, difficulty=None, category=None, fallback: str):
    """The bundle with its source and slices in metadata (outside the environment digest): slice
    = category, else difficulty, else `fallback` (SWE-bench: the repository; Harbor: "harbor")."""
    slices = {k: v for k, v in (("source", source), ("repo", bundle.repo), ("difficulty", difficulty),
                                ("category", category)) if v}
    meta = {**bundle.metadata, "source": source, "slices": slices, "slice": str(category or difficulty or fallback)}
    meta.update({k: str(v) for k, v in (("difficulty", difficulty), ("category", category)) if v})
    return replace(bundle, metadata=meta)


def source_task_rows(loaded: Loaded, loaded_at=None) -> list[dict]:
    """`tasks` rows for a user source: the suite's rows, with the source's own slice."""
    from ratchet.governance.tasks import task_rows

    rows = task_rows(loaded.bundles, suite_key=loaded.suite_key, loaded_at=loaded_at)
    for r, b in zip(rows, loaded.bundles):
        r["slice"] = b.metadata.get("slice")
    return rows


def humaneval_rejections(stats: dict) -> list[Rejection]:
    """The suite's problems that gave no verified mutant, as rejections."""
    return [Rejection("humaneval", pid, "problem_dropped", str(why))
            for pid, why in sorted((stats.get("problems_dropped") or {}).items())]


def rejection_rows(rejections: Iterable[Rejection], run_id: str | None, at) -> list[dict]:
    return [{"source": r.source, "source_path": r.source_path, "task": r.task, "reason": r.reason,
             "detail": r.detail, "rejected_at": at, "dagster_run_id": run_id} for r in rejections]


def drop_duplicates(ids: set[str], loaded: Loaded, owners: dict[str, str]) -> None:
    """Reject the tasks of `loaded` whose id an earlier source (or this one) already has."""
    keep = []
    for b in loaded.bundles:
        if b.task_id in ids:
            loaded.rejections.append(Rejection(loaded.spec.label, b.task_id, "duplicate_task_id",
                                               f"{owners[b.task_id]} already has a task {b.task_id}",
                                               loaded.spec.path))
            continue
        ids.add(b.task_id)
        owners[b.task_id] = loaded.spec.label
        keep.append(b)
    loaded.bundles = keep


# ----------------------------------------------------------------------------------- check cache

_MISS, _OK = object(), object()


def _cache_file(cache_dir, bundle, reference: Reference, require_reference: bool) -> Path | None:
    if cache_dir is None:
        return None
    # the image is outside the environment digest: a verdict from bubblewrap is not one from the image
    image = [(bundle.metadata or {}).get("image")] if (bundle.metadata or {}).get("runtime") == "docker" else []
    key = hashlib.sha256(json.dumps([CHECK_VERSION, bundle.environment_digest, reference.digest,
                                     require_reference, *image]).encode()).hexdigest()
    return Path(cache_dir) / f"{key}.json"


def _cached(cache_dir, bundle, reference, require_reference):
    """The stored verdict: _OK, (reason, detail), or _MISS."""
    p = _cache_file(cache_dir, bundle, reference, require_reference)
    if p is None or not p.is_file():
        return _MISS
    try:
        d = json.loads(p.read_text())
        return tuple(d["rejected"]) if d["rejected"] else _OK
    except (OSError, ValueError, KeyError, TypeError):
        return _MISS        # a torn or foreign file: check again


def _store(cache_dir, bundle, reference, require_reference, verdict) -> None:
    p = _cache_file(cache_dir, bundle, reference, require_reference)
    if p is None or (verdict and verdict[0] == "infra_error"):
        return
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps({"task_id": bundle.task_id, "rejected": list(verdict) if verdict else None}))
    tmp.replace(p)
