"""Bug-report text for a planted mutant: what a user would file (symptom, not the fix)."""
from __future__ import annotations

TITLES = (
    "`{fn}` returns the wrong result for {short}",
    "Wrong output from `{fn}` on {short}",
    "`{fn}` gives an incorrect answer ({short})",
)
NO_EXAMPLE_TITLES = (
    "`{fn}` fails its regression tests",
    "`{fn}` is broken: {n_fail} test(s) fail",
)


def _short(call: str, fn: str) -> str:
    args = call[len(fn):] if call.startswith(fn) else call
    return args if len(args) <= 60 else args[:57] + "...)"


def write_issue(fn: str, *, failing: list[str], n_tests: int, actual: dict | None,
                assert_text: str, error: str | None, pick: int) -> tuple[str, str]:
    """Return (title, body). `pick` (from the task hash) varies the wording deterministically."""
    n_fail = len(failing)
    if actual:
        title = TITLES[pick % len(TITLES)].format(fn=fn, short=_short(actual["call"], fn))
        body = (
            f"`{fn}` in `solution.py` gives a wrong answer.\n\n"
            f"Steps to reproduce:\n\n"
            f"    >>> {actual['call']}\n    {actual['got']}\n\n"
            f"Expected: `{actual['expected']}`\n\n"
        )
    else:
        title = NO_EXAMPLE_TITLES[pick % len(NO_EXAMPLE_TITLES)].format(fn=fn, n_fail=n_fail)
        body = f"`{fn}` in `solution.py` misbehaves. This check no longer holds:\n\n    {assert_text}\n\n"
        if error:
            body += f"It fails with `{error.splitlines()[0][:200]}`.\n\n"
    body += (f"{n_fail} of {n_tests} tests in `test_solution.py` fail "
             f"(first: `{failing[0]}`). The tests are correct; please fix the function.\n")
    return title, body
