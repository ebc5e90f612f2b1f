"""Helpers shared by the adapters. An adapter maps what has a place in the contract and keeps
every other key of the source (`rest`, `attach`): top-level keys go to the record (which keeps
unknown ones in `extra`), per-step and per-message keys to the stored message."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ratchet.contract.validate import keep
# orjson's bytes where it can write them (the ids of every record it can write stay as they were),
# msgspec's for integers past 64 bits, which orjson refuses and a log may hold
from ratchet.readers.json_codec import dumps

_SWE_ID = re.compile(r"^(?P<owner>[\w.-]+)__(?P<name>[\w.-]+)-(?P<num>\d+)$")


def instance_from_path(source: Path | None, suffixes: tuple[str, ...]) -> str | None:
    """`astropy__astropy-12907.traj.json` -> `astropy__astropy-12907`."""
    if source is None:
        return None
    name = source.name
    for s in suffixes:
        if name.endswith(s):
            return name[: -len(s)]
    return None


def repo_of(instance_id: str | None) -> str | None:
    """SWE-bench instance ids encode the repository: `django__django-11099` -> `django/django`."""
    m = _SWE_ID.match(instance_id or "")
    return f"{m['owner']}/{m['name']}" if m else None


def stable_id(prefix: str, rec: dict) -> str:
    """Id for a foreign record that carries none: a hash of its content."""
    return f"{prefix}:{hashlib.sha256(dumps(rec, sort_keys=True)).hexdigest()[:16]}"


def tool_call(call_id: str, name: str, arguments) -> dict:
    args = arguments if isinstance(arguments, str) else dumps(arguments if arguments is not None else {}).decode()
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def rest(d: dict, used) -> dict:
    """The keys of `d` an adapter did not map."""
    return {k: v for k, v in d.items() if k not in used}


def attach(target: dict, extras: dict) -> dict:
    """Keep `extras` in `target` (a message, a call, a record's extra): a key already there with
    another value goes to `ratchet_unmapped` instead, never over it (contract.keep)."""
    for k, v in extras.items():
        keep(target, k, v)
    return target
