"""OpenAI-compatible chat-completions engine (vLLM, SGLang, a hosted API): prompted baselines and
judges served elsewhere.

    policy = make_policy("openai:Qwen2.5-7B-Instruct", base_url="http://127.0.0.1:8000/v1",
                         price_in_per_mtok=0.2, price_out_per_mtok=0.6)

Stdlib only (urllib): one POST per request, requests of one `generate` call sent concurrently
(`max_concurrency` threads). Retries with exponential backoff on 408/409/429/5xx, connection errors
and timeouts, honouring `Retry-After`; other 4xx fail at once (a bad request will not get better).
A request that still fails comes back as `Completion.failed` (that episode is an infra failure,
the rest of the batch goes on). Tokens come from the response's `usage`; cost from `usage.cost`
when the server reports one, else from the configured per-million-token prices, else None.
With `n > 1` the request's usage is shared out over its choices (prompt tokens to each, completion
tokens and cost split so that the sums are exact).
"""
from __future__ import annotations

import json
import os
import random
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

from ratchet.policy.base import Completion, GenerationRequest, PolicyError, ToolCall

RETRY_STATUS = frozenset({408, 409, 429, 500, 502, 503, 504})


class OpenAIPolicy:
    def __init__(self, model: str, *, policy_id: str | None = None, base_url: str | None = None,
                 api_key: str | None = None, api_key_env: str = "OPENAI_API_KEY", timeout_s: float = 60.0,
                 max_retries: int = 4, backoff_s: float = 0.5, max_backoff_s: float = 30.0,
                 max_concurrency: int = 8, price_in_per_mtok: float | None = None,
                 price_out_per_mtok: float | None = None, logprobs: bool = False, extra_body: dict | None = None):
        self.model = model
        self.policy_id = policy_id or f"openai:{model}"
        self.base_url = (base_url or os.environ.get("OPENAI_BASE_URL") or "https://api.openai.com/v1").rstrip("/")
        self._key = api_key if api_key is not None else os.environ.get(api_key_env, "")
        self.timeout_s, self.max_retries = timeout_s, max_retries
        self.backoff_s, self.max_backoff_s = backoff_s, max_backoff_s
        self.max_concurrency = max_concurrency
        self.price_in, self.price_out = price_in_per_mtok, price_out_per_mtok
        self.logprobs, self.extra_body = logprobs, dict(extra_body or {})
        self.attempts = 0                    # HTTP attempts made (retries included), for accounting
        self.spec = {"policy_id": self.policy_id, "engine": "openai_http",
                     "config": {"model": model, "base_url": self.base_url, "timeout_s": timeout_s,
                                "max_retries": max_retries, "price_in_per_mtok": price_in_per_mtok,
                                "price_out_per_mtok": price_out_per_mtok, "logprobs": logprobs,
                                **({"extra_body": self.extra_body} if self.extra_body else {})}}

    # ------------------------------------------------------------------ public
    def generate(self, requests: list[GenerationRequest]) -> list[list[Completion]]:
        if len(requests) <= 1 or self.max_concurrency <= 1:
            return [self._one(r) for r in requests]
        with ThreadPoolExecutor(min(self.max_concurrency, len(requests))) as pool:
            return list(pool.map(self._one, requests))

    def _one(self, r: GenerationRequest) -> list[Completion]:
        t0 = time.monotonic()
        try:
            body = self.post("/chat/completions", self.payload(r))
            return self.completions(body, r.n, time.monotonic() - t0)
        except PolicyError as e:
            return [Completion.failed(str(e), time.monotonic() - t0)] * r.n

    def payload(self, r: GenerationRequest) -> dict:
        body = {"model": self.model, "messages": r.messages, "n": r.n, "temperature": r.temperature,
                "top_p": r.top_p, "seed": r.seed, "max_tokens": r.max_tokens, **self.extra_body}
        if r.tools:
            body["tools"] = r.tools
        if r.stop:
            body["stop"] = list(r.stop)
        if self.logprobs:
            body["logprobs"] = True
        return body

    # ------------------------------------------------------------------ HTTP with retries
    def post(self, path: str, payload: dict) -> dict:
        data = json.dumps(payload).encode()
        headers = {"Content-Type": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        last = "no attempt"
        for attempt in range(self.max_retries + 1):
            self.attempts += 1
            wait = None
            req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                    return json.loads(resp.read().decode())
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:300]
                last = f"HTTP {e.code} from {self.base_url}{path}: {detail}"
                if e.code not in RETRY_STATUS:
                    raise PolicyError(last) from None
                wait = _retry_after(e.headers.get("Retry-After"))
            except (urllib.error.URLError, socket.timeout, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = f"{type(reason).__name__} talking to {self.base_url}{path}: {reason}"
            except json.JSONDecodeError as e:
                last = f"the server answered with invalid JSON: {e}"
            if attempt < self.max_retries:
                time.sleep(min(self.max_backoff_s, wait if wait is not None else self._backoff(attempt)))
        raise PolicyError(f"{last} (after {self.max_retries + 1} attempts)")

    def _backoff(self, attempt: int) -> float:
        # full jitter keeps concurrent episodes from retrying in lockstep against a busy server
        return random.uniform(0.5, 1.0) * self.backoff_s * 2 ** attempt

    # ------------------------------------------------------------------ response
    def completions(self, body: dict, n: int, latency_s: float) -> list[Completion]:
        choices = sorted(body.get("choices") or [], key=lambda c: c.get("index", 0))
        if not choices:
            raise PolicyError(f"the server returned no choices: {json.dumps(body)[:300]}")
        usage = body.get("usage") or {}
        p_tok = int(usage.get("prompt_tokens") or 0)
        c_tok = int(usage.get("completion_tokens") or 0)
        cost = usage.get("cost")
        if cost is None and self.price_in is not None and self.price_out is not None:
            cost = (p_tok * self.price_in + c_tok * self.price_out) / 1e6
        k = len(choices)
        out = []
        for i, ch in enumerate(choices):
            msg = ch.get("message") or {}
            calls = [ToolCall.from_raw((c.get("function") or {}).get("name", ""),
                                       (c.get("function") or {}).get("arguments", ""), c.get("id", ""))
                     for c in msg.get("tool_calls") or ()]
            lps = [t.get("logprob") for t in ((ch.get("logprobs") or {}).get("content") or ())] or None
            share = c_tok // k + (1 if i < c_tok % k else 0)
            out.append(Completion(
                text=msg.get("content") or "", tool_calls=calls, finish_reason=ch.get("finish_reason") or "stop",
                prompt_tokens=p_tok, completion_tokens=share, latency_s=latency_s, logprobs=lps,
                cost_usd=None if cost is None else float(cost) / k))
        return out


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None
