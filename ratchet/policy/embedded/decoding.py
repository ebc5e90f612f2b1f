"""How a checkpoint is decoded, saved beside its weights so any resolver makes the same policy.

    write_decoding(ckpt, action_mask="structured", bounds=Bounds(thought_chars=0, max_string=32))
    make_policy("embedded:rl", path=ckpt)       # reads ratchet_decoding.json: same mask and bounds

A policy trained under the structured action mask and calls-only bounds must be evaluated under
them: the evaluation resolves a checkpoint with `make_policy("embedded:<name>", path=...)` only.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

DECODING_FILE = "ratchet_decoding.json"


def write_decoding(path, *, action_mask: str | None, bounds=None) -> Path:
    p = Path(path) / DECODING_FILE
    p.write_text(json.dumps({"action_mask": action_mask, "bounds": asdict(bounds) if bounds else None},
                            indent=1, sort_keys=True))
    return p


def read_decoding(path) -> dict:
    """TransformersPolicy kwargs (`action_mask`, `grammar={"bounds": Bounds}`) or {} if none saved."""
    from ratchet.policy.grammar import Bounds

    p = Path(path) / DECODING_FILE
    if not p.exists():
        return {}
    d = json.loads(p.read_text())
    out = {"action_mask": d.get("action_mask")}
    if d.get("bounds"):
        out["grammar"] = {"bounds": Bounds(**d["bounds"])}
    return out
