"""R_tests: 1.0 iff every FAIL_TO_PASS and PASS_TO_PASS test passed (from an outcomes dict)."""
from __future__ import annotations

from dataclasses import dataclass, field

from sandboxes.localize import is_pass


@dataclass(frozen=True)
class TestsResult:
    __test__ = False  # not a pytest class

    score: float
    fail_to_pass: dict[str, bool] = field(default_factory=dict)
    pass_to_pass: dict[str, bool] = field(default_factory=dict)
    missing: tuple[str, ...] = ()   # required tests with no outcome (deleted, renamed, not run)

    @property
    def resolved(self) -> bool:
        return self.score == 1.0


def r_tests(outcomes: dict, fail_to_pass, pass_to_pass) -> TestsResult:
    """A required test without an outcome counts as not passing: a patch cannot win by hiding it."""
    f2p = {t: t in outcomes and is_pass(outcomes[t]) for t in fail_to_pass}
    p2p = {t: t in outcomes and is_pass(outcomes[t]) for t in pass_to_pass}
    missing = tuple(t for t in (*fail_to_pass, *pass_to_pass) if t not in outcomes)
    ok = all(f2p.values()) and all(p2p.values())
    return TestsResult(1.0 if ok else 0.0, f2p, p2p, missing)
