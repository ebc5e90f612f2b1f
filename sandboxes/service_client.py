"""A small Python client of the environment service (`sandboxes.service`), with the lifecycle of
the in-process `RepairEnv`:

    from sandboxes.service_client import EnvClient

    with EnvClient("http://127.0.0.1:8765") as client:
        with client.episode("humaneval-000-70de850271", seed=3) as ep:  # POST /episodes
            ep.messages, ep.tools                       # [system, user], the tool schemas
            obs = ep.step("run_tests", {})              # the observation text
            ep.step("submit", {"explanation": "..."})
            ep.done, ep.reward()                        # {"reward", "status", "components", ...}
        # leaving the block closes the episode (DELETE, idempotent)

A full server answers 429; `episode()` waits as its Retry-After says, up to `busy_wait_s`,
then raises `ServiceBusy`. Every other refusal raises `ServiceRequestError` with the server's
message and status. One client is thread-safe (httpx connection pool); give each thread its
own episodes.
"""
from __future__ import annotations

import time


class ServiceRequestError(Exception):
    """The service refused a request (4xx/5xx): `status` and the server's `message`."""

    def __init__(self, status: int, message: str, headers=None):
        super().__init__(f"{status}: {message}")
        self.status, self.message, self.headers = status, message, dict(headers or {})


class ServiceBusy(ServiceRequestError):
    """Every episode slot stayed taken for as long as the client was willing to wait."""


class EnvClient:
    def __init__(self, base_url: str, *, timeout: float = 600.0, busy_wait_s: float = 300.0,
                 max_connections: int = 64):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.busy_wait_s = busy_wait_s
        # a step may run the task's tests (up to its verify_s), so reads wait that long
        self._http = httpx.Client(base_url=self.base_url, timeout=httpx.Timeout(timeout, connect=10.0),
                                  limits=httpx.Limits(max_connections=max_connections,
                                                      max_keepalive_connections=max_connections))

    # ------------------------------------------------------------------ plumbing
    def _call(self, method: str, path: str, **kw) -> dict:
        r = self._http.request(method, path, **kw)
        if r.status_code >= 400:
            try:
                msg = r.json().get("detail", r.text)
            except ValueError:
                msg = r.text
            cls = ServiceBusy if r.status_code == 429 else ServiceRequestError
            raise cls(r.status_code, msg if isinstance(msg, str) else str(msg), r.headers)
        return r.json()

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> "EnvClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ service-wide
    def health(self) -> dict:
        return self._call("GET", "/health")

    def tools(self) -> list[dict]:
        return self._call("GET", "/tools")["tools"]

    def tasks(self) -> list[dict]:
        return self._call("GET", "/tasks")["tasks"]

    def task(self, task_id: str) -> dict:
        return self._call("GET", f"/tasks/{task_id}")

    # ------------------------------------------------------------------ episodes
    def episode(self, task_id: str | None = None, seed: int | None = None, *,
                busy_wait_s: float | None = None) -> "RemoteEpisode":
        """Open an episode; while the server is full, wait as Retry-After says (up to busy_wait_s)."""
        deadline = time.monotonic() + (self.busy_wait_s if busy_wait_s is None else busy_wait_s)
        while True:
            try:
                return RemoteEpisode(self, self._call("POST", "/episodes", json={"task_id": task_id, "seed": seed}))
            except ServiceBusy as e:
                try:
                    wait = float(e.headers.get("retry-after", 1))
                except ValueError:
                    wait = 1.0
                if time.monotonic() + wait > deadline:
                    raise
                time.sleep(wait)


class RemoteEpisode:
    """One episode on the server; `step` returns the observation text like `RepairEnv.step`."""

    def __init__(self, client: EnvClient, created: dict):
        self.client = client
        self.id: str = created["episode_id"]
        self.task_id: str = created["task_id"]
        self.seed = created.get("seed")
        self.messages: list[dict] = created["messages"]
        self.tools: list[dict] = created["tools"]
        self.max_turns: int = created["max_turns"]
        self.done = False
        self.turns = 0
        self.last: dict | None = None          # the last step's full answer (error flag, reward when done)
        self.closed = False

    def step(self, tool: str, arguments: dict | str | None = None) -> str:
        out = self.client._call("POST", f"/episodes/{self.id}/step", json={"tool": tool, "arguments": arguments})
        self.last, self.done, self.turns = out, out["done"], out["turn"]
        return out["observation"]

    def reward(self) -> dict:
        """The reward and the verifier breakdown (409 until the episode is finished)."""
        return self.client._call("GET", f"/episodes/{self.id}/reward")

    def close(self) -> dict:
        out = self.client._call("DELETE", f"/episodes/{self.id}")
        self.closed = True
        return out

    def __enter__(self) -> "RemoteEpisode":
        return self

    def __exit__(self, *exc) -> None:
        if not self.closed:
            try:
                self.close()
            except Exception:  # noqa: BLE001 - the server's reaper closes it after the idle timeout
                pass
