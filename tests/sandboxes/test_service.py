"""The environment service (`sandboxes.service`) over real HTTP (uvicorn on a free port) and real
bubblewrap sandboxes, driven through its client (`sandboxes.service_client`)."""
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from sandboxes.env import RepairEnv
from sandboxes.service import EpisodePool, TaskSuiteError, create_app, load_tasks, reward_payload
from sandboxes.service_client import EnvClient, ServiceBusy, ServiceRequestError

pytestmark = pytest.mark.evaluation

IDLE_S = 1.0
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from sandboxes.humaneval import build_suite

    suite = build_suite(seed=0, limit=2, per_problem=1, processes=1, cache_dir=tmp_path_factory.mktemp("suite"))
    return {b.task_id: b for b in suite.tasks}


@pytest.fixture(scope="module")
def service(runtime, tasks):
    """A real server: uvicorn in a thread of this process (so the test can see the pool's
    sandboxes), on a free port, at most 2 episodes, idle timeout IDLE_S."""
    import uvicorn

    pool = EpisodePool(tasks, runtime=runtime, max_episodes=2, idle_timeout_s=IDLE_S)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(pool), log_level="warning", lifespan="on"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert th.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    yield url, pool
    server.should_exit = True
    th.join(10)
    sock.close()


@pytest.fixture
def client(service):
    with EnvClient(service[0], busy_wait_s=0) as c:
        yield c
    assert service[1].stats()["open_episodes"] == 0, "a test left an episode open"


def _script(bundle) -> list[tuple[str, dict]]:
    fix = bundle.metadata
    return [("run_tests", {}), ("apply_patch", {"patch": fix["fix_diff"]}), ("run_tests", {}),
            ("submit", {"explanation": f"{fix['entry_point']} line {fix['fix']['line']}: "
                                       f"{fix['fix']['old']} should be {fix['fix']['new']}"})]


def test_an_episode_over_http_is_the_in_process_episode(client, runtime, tasks):
    task = sorted(tasks.values(), key=lambda b: b.task_id)[0]
    with RepairEnv(task, runtime=runtime) as env:
        first = env.reset()
        local = [env.step(t, a) for t, a in _script(task)]
        want = env.reward.to_dict()
    assert want["value"] > 0.5 and want["components"]["tests"] == 1.0       # a true fix

    assert {t["task_id"] for t in client.tasks()} == set(tasks)
    assert [s["function"]["name"] for s in client.tools()][0] == "view_issue"
    with client.episode(task.task_id, seed=7) as ep:
        assert ep.messages == first == client.task(task.task_id)["messages"] and ep.seed == 7
        assert {s["function"]["name"] for s in ep.tools} == set(task.tool_allowlist)
        remote = [ep.step(t, a) for t, a in _script(task)]
        assert ep.done and ep.turns == len(remote) and ep.last["reward"] == want["value"]
        got = ep.reward()
    assert remote == local
    assert (got["reward"], got["status"], got["components"], got["weights"]) == \
        (want["value"], want["status"], want["components"], want["weights"])
    assert got["infra_failure"] is False and got["infra_reason"] is None
    assert got["details"]["fail_to_pass"] == json.loads(json.dumps(want["details"]["fail_to_pass"]))
    # close is idempotent, and the reward outlives it
    again = ep.close()
    assert again["closed"] and again["already_closed"]
    assert ep.reward()["reward"] == want["value"]
    with pytest.raises(ServiceRequestError) as e:
        ep.step("run_tests", {})
    assert e.value.status == 410 and "closed" in e.value.message
    # the OpenAPI description comes from FastAPI
    openapi = httpx.get(client.base_url + "/openapi.json").json()
    assert {"/episodes", "/episodes/{episode_id}/step", "/episodes/{episode_id}/reward",
            "/episodes/{episode_id}", "/tools", "/tasks"} <= set(openapi["paths"])
    assert httpx.get(client.base_url + "/docs").status_code == 200


def test_bad_requests_get_a_4xx_with_a_clear_message_and_use_no_turn(client, tasks, service):
    url = service[0]

    def refused(fn, *a, **kw):
        with pytest.raises(ServiceRequestError) as e:
            fn(*a, **kw)
        return e.value.status, e.value.message

    status, msg = refused(client.episode, "no-such-task")
    assert status == 404 and "unknown task 'no-such-task'" in msg and "GET /tasks" in msg
    assert refused(client.task, "no-such-task")[0] == 404
    for method, path in (("POST", "/episodes/nope/step"), ("GET", "/episodes/nope/reward"),
                         ("DELETE", "/episodes/nope")):
        r = httpx.request(method, url + path, json={"tool": "run_tests"})
        assert r.status_code == 404 and r.json()["detail"] == "unknown episode 'nope'"
    r = httpx.post(url + "/episodes", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 422                              # FastAPI's own body validation
    assert httpx.post(url + "/episodes", json={}).status_code == 400       # neither task_id nor seed

    with client.episode(next(iter(tasks))) as ep:
        status, msg = refused(ep.step, "rm_rf", {})
        assert status == 400 and "tool 'rm_rf' is unknown" in msg and "run_tests" in msg
        status, msg = refused(ep.step, "read_file", '{"path": ')
        assert status == 400 and msg.startswith("arguments are not valid JSON")
        status, msg = refused(ep.step, "read_file", '["solution.py"]')
        assert status == 400 and msg == "arguments must be a JSON object, got list"
        r = httpx.post(f"{url}/episodes/{ep.id}/step", json={"arguments": {}})
        assert r.status_code == 422 and "tool" in r.text
        status, msg = refused(ep.reward)
        assert status == 409 and "not finished: call the submit tool" in msg
        # a call that fits no schema is the agent's mistake, as in-process: an observation and a turn
        assert ep.step("read_file", {"path": 3}) == "error: argument 'path' of read_file must be string, got int"
        assert ep.turns == 1 and ep.last["error"] is True
        assert "error" not in ep.step("read_file", '{"path": "solution.py", "start_line": 1, "end_line": 1}')
        assert ep.turns == 2
        ep.step("submit", {"explanation": "nothing"})
        status, msg = refused(ep.step, "run_tests", {})
        assert status == 409 and "is over" in msg


def test_a_full_server_answers_429_with_retry_after_until_a_slot_frees(client, tasks):
    ids = sorted(tasks)
    a, b = client.episode(ids[0]), client.episode(ids[1])
    with pytest.raises(ServiceBusy) as e:
        client.episode(ids[0])
    assert e.value.status == 429 and e.value.headers["retry-after"] == "1"
    assert "all 2 episode slots are in use" in e.value.message
    # a waiting client gets the slot a finished episode frees (its sandbox closes at submit)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("ep", client.episode(ids[0], busy_wait_s=20)))
    waiter.start()
    time.sleep(0.3)
    assert "ep" not in got
    a.step("submit", {"explanation": "x"})
    waiter.join(20)
    assert got["ep"].task_id == ids[0]
    for ep in (a, b, got["ep"]):
        ep.close()


def test_sandbox_work_does_not_block_the_event_loop(client, tasks, service):
    with client.episode(next(iter(tasks))) as ep:
        got = {}
        th = threading.Thread(target=lambda: got.setdefault("obs", ep.step("bash", {"command": "sleep 2.5"})))
        th.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        assert httpx.get(service[0] + "/health", timeout=5).json()["open_episodes"] == 1
        assert time.monotonic() - t0 < 1.0          # on the event loop it would wait for the sleep
        th.join()
        # busy for longer than the idle timeout is not idle: the reaper left it open
        assert got["obs"] == "[exit code 0]"
        assert ep.close()["already_closed"] is False


def test_a_client_killed_mid_episode_leaves_no_sandbox_process_or_worktree(client, tasks, service):
    url, pool = service
    from sandboxes.reaper import pids_of_uid

    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
            "from sandboxes.service_client import EnvClient\n"
            f"c = EnvClient({url!r})\n"
            f"ep = c.episode({next(iter(tasks))!r})\n"
            "ep.step('run_tests', {})\n"                       # starts the episode's test worker
            "print(ep.id, flush=True)\n"
            "ep.step('bash', {'command': 'sleep 1'})\n")       # killed while this step runs
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    eid = proc.stdout.readline().strip()
    assert eid, "the client did not start an episode"
    env = pool._episodes[eid].env
    uid, lease = env.episode.uid, env.episode._lease.dir
    worktree = Path(env.episode.workdir)
    assert worktree.is_dir() and lease.is_dir()
    assert not uid or pids_of_uid(uid), "the episode's sandbox processes should be running"
    time.sleep(0.2)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(5)
    # the step in flight finishes; the episode is then idle and the reaper closes it
    deadline = time.monotonic() + 1.5 + IDLE_S + 5
    while time.monotonic() < deadline and (eid in pool._episodes or (uid and pids_of_uid(uid))):
        time.sleep(0.1)
    assert eid not in pool._episodes
    assert not worktree.exists() and not lease.exists()
    if uid:
        assert pids_of_uid(uid) == []
    left = [p for p in os.listdir("/proc") if p.isdigit() and _cwd_in(p, worktree)]
    assert left == []
    r = httpx.delete(f"{url}/episodes/{eid}").json()
    assert r["already_closed"] and r["reason"].startswith("idle for more than")


def _cwd_in(pid: str, folder: Path) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/cwd").startswith(str(folder))
    except OSError:
        return False


def test_an_infra_failure_is_reported_with_its_reason_never_as_zero():
    from sandboxes.bundle import TaskBundle
    from sandboxes.verifiers import compose_reward

    b = TaskBundle(task_id="t", files={"a.py": ""})
    r = reward_payload("e", "t", compose_reward(b, outcomes=None, infra_error="worker did not start"), 3)
    assert r["reward"] is None and r["infra_failure"] is True and r["status"] == "infra_failure"
    assert r["infra_reason"] == "infra failure: worker did not start"


def test_task_suites_load_from_the_formats_the_code_base_writes(tmp_path, tasks):
    from sandboxes.humaneval.suite import Suite, write_suite

    bundles = list(tasks.values())
    write_suite(Suite(tasks=bundles, stats={}), tmp_path / "suite")
    assert load_tasks(tmp_path / "suite") == tasks
    (tmp_path / "bundles").mkdir()
    for b in bundles:
        b.save(tmp_path / "bundles" / f"{b.task_id}.json")
    assert load_tasks(tmp_path / "bundles") == tasks
    assert set(load_tasks(tmp_path / "bundles", limit=1)) == {sorted(tasks)[0]}
    with pytest.raises(TaskSuiteError, match="does not exist"):
        load_tasks(tmp_path / "missing")
    (tmp_path / "bundles" / "junk.json").write_text("{}")
    with pytest.raises(TaskSuiteError, match="junk.json is not a task bundle"):
        load_tasks(tmp_path / "bundles")
    (tmp_path / "suite" / "tasks" / f"{bundles[0].task_id}.json").write_text("{}")
    with pytest.raises(TaskSuiteError, match="sha256 mismatch"):
        load_tasks(tmp_path / "suite")
