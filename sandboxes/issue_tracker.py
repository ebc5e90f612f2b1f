"""Mock issue-tracker API: a tiny HTTP server on 127.0.0.1, outside every sandbox.

The sandboxed process has no network, so it cannot reach this server; only the environment
(host side) fetches issues, exactly as a harness would call a real tracker's REST API.

    tracker = IssueTracker.shared()                 # one per process, started lazily
    ns = tracker.register(bundle)                   # per-episode namespace (unguessable token)
    fetch_issue(tracker.url, ns, bundle.issue_id)   # -> dict, via urllib
    tracker.unregister(ns)

`GET /<ns>/issues/<issue_id>` answers the issue as JSON; anything else is 404. Namespacing keeps
one episode from reading another task's issue through the shared server.
"""
from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import quote, unquote


class IssueNotFound(LookupError):
    pass


def issue_payload(bundle) -> dict:
    """The tracker's view of a bundle's issue (what a user filed, never the ground truth)."""
    return {"id": bundle.issue_id or bundle.task_id, "repo": bundle.repo, "title": bundle.issue_title,
            "body": bundle.issue_body, "state": "open", "labels": ["bug"],
            "reporter": "user@" + (bundle.repo.split("/")[0] or "example") if bundle.repo else "user"}


class _Handler(BaseHTTPRequestHandler):
    server_version = "MockTracker/1"

    def do_GET(self):  # noqa: N802 (http.server naming)
        parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/")]
        issue = None
        if len(parts) == 3 and parts[1] == "issues":
            issue = self.server.issues.get(parts[0], {}).get(parts[2])
        body = json.dumps(issue if issue else {"error": "not found"}).encode()
        self.send_response(200 if issue else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # keep test and generator output clean
        pass


class IssueTracker:
    _shared: "IssueTracker | None" = None
    _lock = threading.Lock()

    def __init__(self):
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.issues = {}
        self._thread = threading.Thread(target=self._server.serve_forever, name="issue-tracker", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @classmethod
    def shared(cls) -> "IssueTracker":
        with cls._lock:
            if cls._shared is None:
                cls._shared = cls()
            return cls._shared

    def register(self, bundle) -> str:
        ns = secrets.token_hex(8)
        issue = issue_payload(bundle)
        self._server.issues[ns] = {issue["id"]: issue}
        return ns

    def unregister(self, ns: str) -> None:
        self._server.issues.pop(ns, None)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def fetch_issue(url: str, ns: str, issue_id: str, timeout: float = 5.0) -> dict:
    """GET the issue over HTTP; IssueNotFound on 404 (other failures raise OSError)."""
    import urllib.error
    import urllib.request

    req = f"{url}/{quote(ns, safe='')}/issues/{quote(str(issue_id), safe='')}"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via a proxy
    try:
        with opener.open(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise IssueNotFound(issue_id) from None
        raise
