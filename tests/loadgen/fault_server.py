"""A small OpenAI-style SSE server that misbehaves on purpose, for the load generator's tests.

Run as a subprocess (the test process is gevent-patched by Locust, aiohttp is not
happy there): ``python fault_server.py --pattern ok,429,500,midstream`` prints
``PORT <n>`` once listening on an ephemeral port. Request ``i`` (counting from 0,
in arrival order) behaves as ``pattern[i % len(pattern)]``:

- ``ok``: streams ``max_tokens`` one-word chunks ``--itl-ms`` apart after ``--ttft-ms``,
  then a usage chunk (prompt tokens = whitespace words) and ``[DONE]``
- ``400`` / ``429`` / ``500`` / ``503``: that status with vLLM's JSON error body
- ``401``: vLLM's answer to a missing or wrong API key (``{"error": "Unauthorized"}``)
- ``html404``: a 404 HTML page, as a web server that is not an OpenAI API sends
- ``midstream``: two content chunks, then ``data: {"error": ...}``
- ``hang``: sends headers, then nothing (the client's timeout must fire)
- ``drop``: two content chunks, then closes the connection
- ``html200``: a 200 HTML page (``text/html``), as a proxy's login or error page sends
- ``nodone``: two content chunks, then the response ends cleanly (chunked terminator)
  without ``[DONE]``
- ``reset``: two content chunks, then a TCP RST (``SO_LINGER`` 0), not a clean close
- ``notobject`` / ``badshape`` / ``badjson``: one content chunk, then an event that is not
  an OpenAI chunk (valid JSON that is not an object: ``["x", 1]``; an object whose
  ``choices`` holds a string; JSON cut short), then ``[DONE]``

``POST /tokenize`` call ``j`` behaves as ``--tokenize-pattern[j % len]``: ``ok`` (a count:
whitespace words), a status code (vLLM's JSON error body), or ``drop`` (connection closed).
``GET /v1/models`` lists ``--model`` (default ``m``) with ``--max-model-len``, unprotected.
``GET /metrics`` exposes ``vllm:request_success_total`` (completed ``ok`` streams); scrape
``k`` behaves as ``--metrics-pattern[k % len]``: ``ok``, ``500`` (an error page), ``hang``
(no answer), ``nan`` (the waiting gauge reads ``NaN``, running 2), ``restart`` (the token
counter starts again from a small value: a restarted server). ``GET /metrics`` and
``GET /debug/first_token`` the server-side first-token unix time per request id.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import struct
import time

from aiohttp import web


def _chunk(api: str, text: str) -> bytes:
    if api == "chat":
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
    else:
        choice = {"index": 0, "text": text, "finish_reason": None}
    return b"data: " + json.dumps({"id": "x", "choices": [choice]}).encode() + b"\n\n"


# What each not-an-OpenAI-stream pattern sends after its first content chunk.
BAD_EVENTS = {
    "notobject": b'data: ["x", 1]\n\n',
    "badshape": b'data: {"choices": ["x"]}\n\n',
    "badjson": b'data: {"choices": [\n\n',
}


def make_app(
    pattern: list[str],
    ttft_s: float,
    itl_s: float,
    model: str = "m",
    max_model_len: int = 100_000,
    tokenize_pattern: list[str] | None = None,
    metrics_pattern: list[str] | None = None,
) -> web.Application:
    state = {"n": 0, "success": 0, "first_token": {}, "tokenize": 0, "scrapes": 0}

    async def generate(request: web.Request) -> web.StreamResponse:
        kind = pattern[state["n"] % len(pattern)]
        state["n"] += 1
        body = await request.json()
        api = "chat" if request.path.endswith("chat/completions") else "completions"
        if kind == "401":
            return web.json_response({"error": "Unauthorized"}, status=401)
        if kind == "html404":
            page = (
                "<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head>\n"
                "<body>Not Found</body></html>"
            )
            return web.Response(text=page, status=404, content_type="text/html")
        if kind == "html200":
            return web.Response(text="<!DOCTYPE html>\n<html><body>Sign in</body></html>",
                                content_type="text/html")
        if kind.isdigit():
            err = {"message": f"injected {kind}", "type": "BadRequestError", "code": int(kind)}
            return web.json_response({"error": err}, status=int(kind))
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        if kind == "hang":
            await asyncio.sleep(3600)
        if api == "chat":
            prompt = " ".join(m["content"] for m in body["messages"])
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            await resp.write(b"data: " + json.dumps({"choices": [role]}).encode() + b"\n\n")
        else:
            prompt = body["prompt"]
        n_out = int(body.get("max_tokens", 4))
        await asyncio.sleep(ttft_s)
        for i in range(n_out):
            if i == 0:
                state["first_token"][request.headers.get("X-Request-Id", "")] = time.time()
            await resp.write(_chunk(api, f" w{i}"))
            if i == 0 and kind in BAD_EVENTS:
                await resp.write(BAD_EVENTS[kind] + b"data: [DONE]\n\n")
                await resp.write_eof()
                return resp
            if kind in ("midstream", "drop", "nodone", "reset") and i == 1:
                if kind == "drop":
                    request.transport.close()
                    return resp
                if kind == "nodone":
                    await resp.write_eof()
                    return resp
                if kind == "reset":
                    sock = request.transport.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    request.transport.abort()
                    return resp
                await resp.write(
                    b'data: {"error": {"message": "injected mid-stream failure", "code": 500}}\n\n'
                )
                await resp.write_eof()
                return resp
            await asyncio.sleep(itl_s)
        usage = {
            "prompt_tokens": len(prompt.split()),
            "completion_tokens": n_out,
            "total_tokens": 0,
        }
        await resp.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        state["success"] += 1
        return resp

    async def metrics(_: web.Request) -> web.Response:
        kinds = metrics_pattern or ["ok"]
        k = state["scrapes"]
        kind = kinds[k % len(kinds)]
        state["scrapes"] += 1
        if kind == "500":
            return web.Response(text="<html>Internal Server Error</html>", status=500)
        if kind == "hang":
            await asyncio.sleep(3600)
        tokens = 1000.0 * (k + 1) if kind != "restart" else 5.0
        waiting = "NaN" if kind == "nan" else "0"
        text = (f'vllm:num_requests_running{{model_name="m"}} 2\n'
                f'vllm:num_requests_waiting{{model_name="m"}} {waiting}\n'
                "# TYPE vllm:generation_tokens_total counter\n"
                f'vllm:generation_tokens_total{{model_name="m"}} {tokens}\n'
                f'vllm:request_success_total{{finished_reason="length"}} {state["success"]}\n')
        return web.Response(text=text)

    async def first_token(_: web.Request) -> web.Response:
        return web.json_response(state["first_token"])

    async def tokenize(request: web.Request) -> web.Response:
        kinds = tokenize_pattern or ["ok"]
        kind = kinds[state["tokenize"] % len(kinds)]
        state["tokenize"] += 1
        body = await request.json()
        if kind.isdigit():
            err = {"message": f"injected {kind}", "type": "BadRequestError", "code": int(kind)}
            return web.json_response({"error": err}, status=int(kind))
        if kind == "drop":
            request.transport.close()
        return web.json_response({"count": len(body.get("prompt", "").split())})

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": model, "object": "model", "owned_by": "vllm", "max_model_len": max_model_len}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    app.router.add_post("/v1/completions", generate)
    app.router.add_post("/v1/chat/completions", generate)
    app.router.add_post("/tokenize", tokenize)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/debug/first_token", first_token)
    app.router.add_get("/health", lambda _: web.Response())
    return app


async def _main(args: argparse.Namespace) -> None:
    app = make_app(args.pattern.split(","), args.ttft_ms / 1000, args.itl_ms / 1000, args.model,
                   args.max_model_len, args.tokenize_pattern.split(","),
                   args.metrics_pattern.split(","))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--pattern", default="ok")
    parser.add_argument("--ttft-ms", type=float, default=5.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--model", default="m")
    parser.add_argument("--max-model-len", type=int, default=100_000)
    parser.add_argument("--tokenize-pattern", default="ok")
    parser.add_argument("--metrics-pattern", default="ok")
    asyncio.run(_main(parser.parse_args()))
