"""A tiny local HTTP server standing in for an OpenAI-compatible chat-completions API (a remote
LLM cannot run here). It answers from a script: each POST takes the next scripted reply."""
from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def chat_reply(content="", tool_calls=(), prompt_tokens=11, completion_tokens=7, cost=None, n=1):
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
             "total_tokens": prompt_tokens + completion_tokens}
    if cost is not None:
        usage["cost"] = cost
    msg = {"role": "assistant", "content": content or None}
    if tool_calls:
        msg["tool_calls"] = [{"id": f"call_{i}", "type": "function",
                              "function": {"name": name, "arguments": args}}
                             for i, (name, args) in enumerate(tool_calls)]
    return {"id": "chatcmpl-standin", "object": "chat.completion", "model": "standin",
            "choices": [{"index": i, "message": msg, "finish_reason": "tool_calls" if tool_calls else "stop"}
                        for i in range(n)], "usage": usage}


class StandinServer:
    """`script`: list of (status, body_dict, headers, delay_s); the last entry repeats."""

    def __init__(self, script):
        self.script, self.requests = list(script), []
        outer = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
                i = min(len(outer.requests) - 1, len(outer.script) - 1)
                status, reply, headers, delay = outer.script[i]
                if delay:
                    time.sleep(delay)
                data = json.dumps(reply).encode()
                try:
                    self.send_response(status)
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass                     # the client timed out and went away

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()
