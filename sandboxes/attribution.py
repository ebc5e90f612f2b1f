"""Whose fault was it? The failure-attribution rule shared by every runtime.

A test run that fails in a way that looks like the harness's (the pytest worker died, hung,
answered garbage or reported an error) while the agent's code ran in it is the agent's failure,
unless a health probe fails too. The probe runs on the host's side of the fence: a fresh
sandbox with harness-owned files only, the same command path and the same worker code. If it
passes, the harness works and the failure came from the episode's own state (code the agent
wrote or ran); if it fails, the harness is broken and the failure is `infra_error`.
"""
from __future__ import annotations

PROBE_FILES = {"test_ratchet_probe.py": "def test_ok():\n    assert 1 + 1 == 2\n"}
PROBE_TEST = "test_ratchet_probe.py::test_ok"


def health_probe(open_episode, run_command, what: str = "sandbox") -> str | None:
    """None when `open_episode(bundle)` gives a sandbox in which `run_command(ep, argv)` prints
    and the worker passes a trivial test; otherwise the reason."""
    from sandboxes.bundle import TaskBundle
    b = TaskBundle(task_id="ratchet-health-probe", files=PROBE_FILES, fail_to_pass=(PROBE_TEST,))
    try:
        with open_episode(b) as ep:
            r = run_command(ep, ["python", "-c", "print('ok')"])
            if r.infra_error or r.stdout.strip() != "ok":
                return f"probe command failed: {r.infra_error or r.stderr.strip()[:300]}"
            rep = ep._run_tests_raw([PROBE_TEST], False, 60.0)
            if rep.infra_error or rep.outcomes.get(PROBE_TEST) != "passed":
                return f"probe test run failed: {rep.infra_error or rep.outcomes}"
    except Exception as e:  # noqa: BLE001 - any failure to build a sandbox is the harness's
        return f"probe could not start a {what}: {type(e).__name__}: {e}"
    return None


def attribute(rep, test_ids, probe):
    """`rep` failed with `infra_error` while agent code ran: the agent's fault (every requested
    test an error, `agent_fault` saying what happened) unless `probe()` names a harness fault."""
    from sandboxes.runtime import TestReport
    bad = probe()
    if bad is None:
        return TestReport({tid: "error" for tid in (test_ids or ())}, None, rep.duration_s, None,
                          False, None, rep.output, agent_fault=rep.infra_error)
    rep.infra_error = f"{rep.infra_error}; health probe: {bad}"
    return rep


def stop_process(proc) -> None:
    """SIGKILL a helper process's group, reap it and close its pipes (idempotent)."""
    import os
    import signal
    if proc is None:
        return
    if proc.returncode is None:
        from sandboxes.cpu_meter import before_kill
        before_kill(proc.pid)           # nobody waits for what dies under it: count it now
        if getattr(proc, "zygote_pid", None):   # a zygote's worker: its children die unwaited too
            before_kill(proc.worker_pid, parent=proc.zygote_pid)
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    proc.wait()
    for s in (proc.stdin, proc.stdout):
        try:
            if s is not None:
                s.close()
        except OSError:
            pass
