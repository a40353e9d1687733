"""The simulator's HTTP front over real HTTP on port 0: SSE framing, usage, errors, auth,
/metrics, /tokenize, disconnects. The server runs in a thread of the test process
(``running_sim_in_thread``); one test starts it as a subprocess like users do."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from loadlab.sim.engine.config import SimConfig
from loadlab.sim.serve.testing import running_sim, running_sim_in_thread

MODEL = "sim"
MAX_LEN = 512
# One client for the module: building an httpx client (TLS context included) per call
# costs ~0.1 s on a busy host.
HTTP = httpx.Client(timeout=30)


@pytest.fixture(scope="module", autouse=True)
def _close_client():
    yield
    HTTP.close()


def config(**overrides) -> SimConfig:
    base = {"served_model_name": MODEL, "max_model_len": MAX_LEN, "time_scale": 20.0,
            "num_gpu_blocks_override": 400, "max_num_seqs": 32}
    return SimConfig(**{**base, **overrides})


@pytest.fixture(scope="module")
def url():
    with running_sim_in_thread(config()) as base:
        yield base


def sse_events(response: httpx.Response) -> list[str]:
    """The data payloads of an SSE body, asserting vLLM's framing on the raw text."""
    raw = response.read().decode()
    assert raw.endswith("data: [DONE]\n\n")
    events = raw.split("\n\n")
    assert events[-1] == ""
    payloads = []
    for event in events[:-1]:
        assert event.startswith("data: ") and "\n" not in event
        payloads.append(event[len("data: "):])
    return payloads


def metrics(base: str) -> dict[tuple[str, tuple], float]:
    text = HTTP.get(f"{base}/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def metric(values: dict, name: str, **labels) -> float:
    return sum(v for (n, lab), v in values.items()
               if n == name and all((k, val) in lab for k, val in labels.items()))


def wait_for(predicate, timeout_s: float = 10.0):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, "condition not met before the deadline"
        time.sleep(0.01)          # poll pause; the deadline bounds the wait


def test_completion_stream_framing_and_usage(url):
    body = {"model": MODEL, "prompt": "one two three four", "max_tokens": 7, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    with HTTP.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        payloads = sse_events(r)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    text_chunks, usage_chunk = chunks[:-1], chunks[-1]
    assert len(text_chunks) == 7                       # one event per token at interval 1
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    for c in text_chunks[:-1]:
        assert c["object"] == "text_completion" and c["model"] == MODEL
        assert c["choices"][0]["finish_reason"] is None and c["choices"][0]["text"]
    assert text_chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == {"prompt_tokens": 4, "total_tokens": 11, "completion_tokens": 7}
    text = "".join(c["choices"][0]["text"] for c in text_chunks)
    assert len(text.split()) == 7


def test_chat_stream_role_chunk_then_content_then_usage(url):
    body = {"messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": "hello there"}],
            "max_completion_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with HTTP.stream("POST", f"{url}/v1/chat/completions", json=body) as r:
        chunks = [json.loads(p) for p in sse_events(r)[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = chunks[1:-1]
    assert len(content) == 5
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 4 + ["length"]
    assert chunks[-1]["usage"] == {"prompt_tokens": 9, "total_tokens": 14, "completion_tokens": 5}


def test_stream_without_usage_ends_with_done(url):
    body = {"prompt": "a b", "max_tokens": 3, "ignore_eos": True, "stream": True}
    with HTTP.stream("POST", f"{url}/v1/completions", json=body) as r:
        payloads = sse_events(r)
    assert len(payloads) == 4 and "usage" not in json.loads(payloads[-2])


def test_non_streaming_responses(url):
    r = HTTP.post(f"{url}/v1/completions", json={"prompt": "a b c", "max_tokens": 6,
                                                  "ignore_eos": True})
    body = r.json()
    assert r.status_code == 200 and body["object"] == "text_completion"
    assert len(body["choices"][0]["text"].split()) == 6
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 9, "completion_tokens": 6,
                             "prompt_tokens_details": None, "completion_tokens_details": None}
    r = HTTP.post(f"{url}/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                         "ignore_eos": True})
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert r.json()["usage"]["completion_tokens"] == 2


def test_output_length_without_ignore_eos_respects_bounds(url):
    for _ in range(5):
        body = HTTP.post(f"{url}/v1/completions",
                          json={"prompt": "x", "max_tokens": 40, "min_tokens": 3}).json()
        n = body["usage"]["completion_tokens"]
        assert 3 <= n <= 40
        assert body["choices"][0]["finish_reason"] == ("length" if n == 40 else "stop")


def test_tokenize_count_equals_usage_prompt_tokens(url):
    prompt = "the same words are counted the same way " * 5
    tok = HTTP.post(f"{url}/tokenize", json={"prompt": prompt}).json()
    assert tok["max_model_len"] == MAX_LEN and tok["count"] == len(tok["tokens"])
    usage = HTTP.post(f"{url}/v1/completions",
                       json={"prompt": prompt, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == tok["count"]
    messages = [{"role": "user", "content": prompt}]
    tok = HTTP.post(f"{url}/tokenize", json={"messages": messages}).json()
    usage = HTTP.post(f"{url}/v1/chat/completions",
                       json={"messages": messages, "max_tokens": 1}).json()["usage"]
    assert usage["prompt_tokens"] == tok["count"]


def test_over_long_prompt_is_400_json_and_server_keeps_serving(url):
    body = {"prompt": " ".join(["w"] * 600), "max_tokens": 50, "stream": True}
    r = HTTP.post(f"{url}/v1/completions", json=body)
    assert r.status_code == 400 and r.headers["content-type"].startswith("application/json")
    err = r.json()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400
    assert err["message"].startswith(f"This model's maximum context length is {MAX_LEN} tokens")
    assert HTTP.get(f"{url}/health").status_code == 200


@pytest.mark.parametrize("path, payload, field", [
    ("/v1/completions", b"{\"prompt\": ", "body"),
    ("/v1/completions", b"{\"max_tokens\": 5}", "prompt"),
    ("/v1/chat/completions", b"{\"model\": \"sim\"}", "body.messages"),
    ("/v1/completions", b"{\"prompt\": \"a\", \"max_tokens\": \"9\"}", "body.max_tokens"),
    ("/tokenize", b"[]", "body"),
])
def test_bad_requests_name_the_field_and_server_keeps_serving(url, path, payload, field):
    r = HTTP.post(f"{url}{path}", content=payload, headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field
    ok = HTTP.post(f"{url}/v1/completions", json={"prompt": "still here", "max_tokens": 1})
    assert ok.status_code == 200


def test_unknown_model_route_and_method(url):
    r = HTTP.post(f"{url}/v1/completions", json={"model": "gpt-4", "prompt": "a"})
    assert r.status_code == 404 and r.json()["error"]["type"] == "NotFoundError"
    assert HTTP.get(f"{url}/v1/nothing").status_code == 404
    assert HTTP.get(f"{url}/v1/completions").status_code == 405


def test_models_health_version(url):
    models = HTTP.get(f"{url}/v1/models").json()
    assert models["object"] == "list"
    card = models["data"][0]
    assert card["id"] == MODEL and card["max_model_len"] == MAX_LEN and card["object"] == "model"
    r = HTTP.get(f"{url}/health")
    assert r.status_code == 200 and r.content == b""
    assert "version" in HTTP.get(f"{url}/version").json()


def test_api_key_is_required_on_v1_routes():
    with running_sim_in_thread(config(api_key="s3cret")) as base:
        body = {"prompt": "a", "max_tokens": 1}
        missing = HTTP.post(f"{base}/v1/completions", json=body)
        wrong = HTTP.post(f"{base}/v1/completions", json=body,
                           headers={"Authorization": "Bearer nope"})
        right = HTTP.post(f"{base}/v1/completions", json=body,
                           headers={"Authorization": "Bearer s3cret"})
        assert missing.status_code == 401 and wrong.status_code == 401
        assert missing.json() == {"error": "Unauthorized"}
        assert "s3cret" not in wrong.text
        assert right.status_code == 200
        assert HTTP.get(f"{base}/health").status_code == 200
        assert HTTP.get(f"{base}/v1/models").status_code == 401


def test_metrics_parse_and_gauges_move_under_load():
    with running_sim_in_thread(config(time_scale=1.0, max_num_seqs=8)) as base:
        idle = metrics(base)
        assert metric(idle, "vllm:num_requests_running") == 0

        async def load() -> list[int]:
            async with httpx.AsyncClient(base_url=base, timeout=30) as client:
                async def one(i: int) -> int:
                    body = {"prompt": f"request {i} " + "pad " * 20, "max_tokens": 100,
                            "ignore_eos": True, "stream": True,
                            "stream_options": {"include_usage": True}}
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        last = None
                        async for line in r.aiter_lines():
                            if line.startswith("data: {"):
                                last = json.loads(line[6:])
                    return last["usage"]["completion_tokens"]

                return await asyncio.gather(*(one(i) for i in range(16)))

        seen: dict[str, float] = {}

        def watch():
            values = metrics(base)
            seen["running"] = max(
                seen.get("running", 0), metric(values, "vllm:num_requests_running")
            )
            seen["waiting"] = max(
                seen.get("waiting", 0), metric(values, "vllm:num_requests_waiting")
            )
            seen["kv"] = max(seen.get("kv", 0), metric(values, "vllm:kv_cache_usage_perc"))
            return seen["running"] == 8 and seen["waiting"] > 0

        import threading
        result: list[list[int]] = []
        worker = threading.Thread(target=lambda: result.append(asyncio.run(load())))
        worker.start()
        wait_for(watch)
        worker.join(timeout=60)
        assert result and result[0] == [100] * 16
        assert seen["kv"] > 0
        after = metrics(base)
        assert metric(after, "vllm:generation_tokens_total") == 16 * 100
        assert metric(after, "vllm:request_success_total", finished_reason="length") == 16
        assert metric(after, "vllm:num_requests_running") == 0


def test_client_disconnect_aborts_the_request():
    with running_sim_in_thread(config(time_scale=1.0)) as base:
        body = {"prompt": "long one", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with HTTP.stream("POST", f"{base}/v1/completions", json=body) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    break                        # got the first token; hang up
        wait_for(lambda: metric(metrics(base), "vllm:request_success_total",
                                finished_reason="abort") == 1)
        assert metric(metrics(base), "vllm:num_requests_running") == 0


def test_stream_interval_batches_tokens_like_vllm():
    with running_sim_in_thread(config(stream_interval=4)) as base:
        body = {"prompt": "a", "max_tokens": 10, "ignore_eos": True, "stream": True}
        with HTTP.stream("POST", f"{base}/v1/completions", json=body) as r:
            chunks = [json.loads(p) for p in sse_events(r)[:-1]]
    sizes = [len(c["choices"][0]["text"].split()) for c in chunks]
    assert sizes == [1, 4, 4, 1]                 # first at once, then every 4, the rest at finish


def test_subprocess_server_via_running_sim():
    with running_sim(served_model_name=MODEL, max_model_len=256, time_scale=50,
                     enable_prefix_caching=False) as base:
        assert base.startswith("http://127.0.0.1:")
        r = HTTP.post(f"{base}/v1/completions", json={"prompt": "hi", "max_tokens": 3,
                                                      "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 3
        info = metric(metrics(base), "vllm:cache_config_info", enable_prefix_caching="False")
        assert info == 1


def test_http_1_0_clients_get_the_same_events_unchunked(url):
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    body = json.dumps({"prompt": "a b", "max_tokens": 3, "ignore_eos": True, "stream": True,
                       "stream_options": {"include_usage": True}}).encode()
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        raw = b""
        while chunk := sock.recv(65536):
            raw += chunk
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200") and b"chunked" not in head.lower()
    events = payload.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    assert len(events) == 3 + 1 + 2              # 3 tokens, usage, [DONE], trailing ""


def test_request_timeline_brackets_the_first_token_by_request_id(url):
    """/sim/requests: arrival and first-token write lie between the client's call and its
    first read; requests without an X-Request-Id, or of another prefix, are not listed."""
    body = {"prompt": "a b c", "max_tokens": 4, "ignore_eos": True, "stream": True}
    t_call = time.time()
    with HTTP.stream("POST", f"{url}/v1/completions", json=body,
                     headers={"X-Request-Id": "tl-stream-1"}) as r:
        lines = r.iter_lines()
        first_line = next(lines)
        t_first_read = time.time()
        rest = list(lines)
    assert first_line.startswith("data: ") and "data: [DONE]" in rest
    HTTP.post(f"{url}/v1/completions", json={**body, "stream": False},
              headers={"X-Request-Id": "tl-plain-1"})
    HTTP.post(f"{url}/v1/completions", json=body)  # no id: not listed
    HTTP.post(f"{url}/v1/completions", json=body, headers={"X-Request-Id": "other-1"})
    seen = HTTP.get(f"{url}/sim/requests", params={"prefix": "tl-"}).json()
    assert set(seen) == {"tl-stream-1", "tl-plain-1"}
    arrived, first = seen["tl-stream-1"]
    assert t_call <= arrived <= first <= t_first_read
    assert seen["tl-plain-1"][0] <= seen["tl-plain-1"][1]


def test_request_timeline_keeps_the_newest():
    from loadlab.sim.serve.server import RequestTimeline

    timeline = RequestTimeline(keep=3)
    for i in range(5):
        timeline.arrived(f"r{i}")[1] = float(i)
    assert list(timeline.select("r")) == ["r2", "r3", "r4"]
    assert [v[1] for v in timeline.select("r").values()] == [2.0, 3.0, 4.0]
