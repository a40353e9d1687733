"""A TokenCounter backed by the target server's ``POST /tokenize`` (vLLM's shape).

vLLM answers ``{"model", "prompt"}`` (completions) or ``{"model", "messages"}`` (chat,
with the chat template applied) with ``{"count", "max_model_len", "tokens"}``. The
counter sends the prompt text in the same shape as the requests the load generator
will send, so the count includes whatever the server adds (BOS, template tokens).

``tokenize_counter`` probes once and returns None when the server has no /tokenize
(404/405, or an answer without ``count``): the caller then falls back to the
words-per-token estimate. Headers (an API key) are sent but never logged or stored.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from loadlab.errors import TargetError

PROBE_TEXT = "the"


class HttpTokenCounter:
    """Counts tokens of a completions prompt or a one-user-message chat on the server."""

    def __init__(self, client: httpx.Client, base_url: str, model: str, chat: bool) -> None:
        self.client = client
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.chat = chat

    def body(self, text: str) -> dict[str, object]:
        if self.chat:
            return {"model": self.model, "messages": [{"role": "user", "content": text}]}
        return {"model": self.model, "prompt": text}

    def __call__(self, text: str) -> int:
        resp = self.client.post(self.url, json=self.body(text))
        if resp.status_code != 200:
            raise TargetError(
                f"POST {self.url} answered HTTP {resp.status_code}: {resp.text[:200]}"
            )
        return int(resp.json()["count"])


def tokenize_counter(
    base_url: str,
    model: str,
    *,
    chat: bool = False,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 30.0,
    client: httpx.Client | None = None,
) -> HttpTokenCounter | None:
    """A counter for this server and request shape, or None when it has no usable /tokenize."""
    client = client or httpx.Client(headers=dict(headers or {}), timeout=timeout_s)
    counter = HttpTokenCounter(client, base_url, model, chat)
    try:
        resp = client.post(counter.url, json=counter.body(PROBE_TEXT))
    except httpx.TransportError as exc:
        raise TargetError(f"cannot reach {counter.url}: {exc}") from None
    if resp.status_code != 200:
        return None
    try:
        int(resp.json()["count"])
    except (ValueError, KeyError, TypeError):
        return None
    return counter
