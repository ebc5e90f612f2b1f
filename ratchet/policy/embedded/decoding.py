"""How a checkpoint is decoded, saved beside its weights so any resolver makes the same policy.

    write_decoding(ckpt, action_mask="structured", bounds=Bounds(thought_chars=0, max_string=32),
                   view=make_view(prior, source="train split: 124 tasks"))     # view: optional
    make_policy("embedded:rl", path=ckpt)       # reads ratchet_decoding.json: same mask, bounds, view

A policy trained under the structured action mask and calls-only bounds must be evaluated under
them: the evaluation resolves a checkpoint with `make_policy("embedded:<name>", path=...)` only.
The same holds for the observation view it was trained on (`view`: candidate lists in a train-fit
prior's order, `ratchet.policy.embedded.chat.make_view`). A file without a view (every checkpoint
written before it existed) decodes as before: no `view` key, the environment's order.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

DECODING_FILE = "ratchet_decoding.json"


def write_decoding(path, *, action_mask: str | None, bounds=None, view: dict | None = None) -> Path:
    p = Path(path) / DECODING_FILE
    d = {"action_mask": action_mask, "bounds": asdict(bounds) if bounds else None}
    if view:
        d["view"] = view
    p.write_text(json.dumps(d, indent=1, sort_keys=True))
    return p


def read_decoding(path) -> dict:
    """TransformersPolicy kwargs (`action_mask`, `grammar={"bounds": Bounds}`, and `view` when one
    was saved) or {} if none saved."""
    from ratchet.policy.grammar import Bounds

    p = Path(path) / DECODING_FILE
    if not p.exists():
        return {}
    d = json.loads(p.read_text())
    out = {"action_mask": d.get("action_mask")}
    if d.get("bounds"):
        out["grammar"] = {"bounds": Bounds(**d["bounds"])}
    if d.get("view"):
        out["view"] = d["view"]
    return out


def read_view(path) -> dict | None:
    """The view a checkpoint was trained on (None: the environment's order, or no file)."""
    return read_decoding(path).get("view") if path is not None else None
