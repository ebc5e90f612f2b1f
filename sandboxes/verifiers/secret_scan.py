"""Secret scanning of the lines a diff adds (detect-secrets)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SecretFinding:
    file: str
    line: int
    type: str


def scan_diff(diff: str) -> list[SecretFinding]:
    """Secrets on added lines. The `is_invalid_file` filter is disabled: it drops every finding
    whose file is not on disk, and a diff's files are not."""
    if not diff.strip():
        return []
    from detect_secrets import SecretsCollection
    from detect_secrets.settings import default_settings

    with default_settings() as settings:
        settings.disable_filters("detect_secrets.filters.common.is_invalid_file")
        found = SecretsCollection()
        found.scan_diff(diff)
    out = [SecretFinding(f, s.line_number, s.type) for f, s in found]
    return sorted(set(out), key=lambda s: (s.file, s.line, s.type))
