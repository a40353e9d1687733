"""The simulator's HTTP front: the slice of ``vllm serve``'s API that load tests touch.

Routes (shapes in :mod:`loadlab.sim.serve.protocol`):

- ``POST /v1/completions``, ``POST /v1/chat/completions``: streaming (SSE) and not.
- ``POST /tokenize``: ``{"prompt"}`` or ``{"messages"}`` -> ``{"count", "max_model_len",
  "tokens", "token_strs"}``.
- ``GET /v1/models``; ``GET /health`` (200, empty; 503 if the engine loop died);
  ``GET /metrics`` (Prometheus text from :class:`loadlab.sim.engine.metrics.EngineMetrics`);
  ``GET /version``.
- ``GET /replica/<i>/metrics`` (a fleet, ``--replicas N``): replica i's own page;
  ``/metrics`` then serves replica 0's, so a scraper of one server still reads one
  vLLM-shaped page. A fleet's pools may differ in config (histogram buckets, cache
  info), so their pages are not summed; scrape each replica's path for the fleet.
- ``GET /sim/stats`` (simulator only, not vLLM): the live driver's modelled vs measured
  step periods (:class:`loadlab.sim.serve.live.StepPeriods`), for benchmarks and debugging.
- ``GET /sim/requests?prefix=P`` (simulator only): per ``X-Request-Id`` starting with P,
  ``[arrived, first_token]`` in unix seconds: when the handler got the request and when
  its first token was written to the socket (:class:`RequestTimeline`, the last
  ``TIMELINE_KEEP`` requests). A client's own share of its TTFT is its TTFT minus
  ``first_token - arrived``, exact per request (benchmarks/bench_loadgen.py).

With ``--api-key`` every ``/v1`` route needs ``Authorization: Bearer <key>`` (as vLLM:
other routes stay open); a missing or wrong key gets 401 ``{"error": "Unauthorized"}``.
The key is compared in constant time and never logged or echoed.

Client disconnects cancel the handler (aiohttp ``handler_cancellation``); the handler
then aborts the request in the engine, freeing its KV blocks as vLLM does. Any error
in one request is answered and the server keeps serving.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable

from aiohttp import HttpVersion11, web

from loadlab.errors import InputError
from loadlab.sim.engine.config import SimConfig
from loadlab.sim.engine.hardware import ResolvedConfig, resolve
from loadlab.sim.engine.metrics import EngineMetrics
from loadlab.sim.fleet.config import FleetConfig
from loadlab.sim.serve import protocol, tokenizer
from loadlab.sim.serve.fleet_driver import FleetDriver
from loadlab.sim.serve.live import LiveDriver, RequestStream
from loadlab.sim.serve.protocol import GenerationRequest, ProtocolError
from loadlab.version import __version__

DRIVER = web.AppKey("driver", LiveDriver)
FLEET = web.AppKey("fleet", FleetDriver)
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_PIECES = tokenizer.OUTPUT_PIECES
_output_token = tokenizer.output_token
TIMELINE_KEEP = 500_000


class RequestTimeline:
    """Server-side times of the last ``keep`` requests that carried an ``X-Request-Id``."""

    def __init__(self, keep: int = TIMELINE_KEEP) -> None:
        self.keep = keep
        self.times: dict[str, list[float | None]] = {}   # id -> [arrived, first_token]

    def arrived(self, request_id: str) -> list[float | None]:
        """Stamp an arrival; the returned entry's second item is for the first token."""
        entry: list[float | None] = [time.time(), None]
        self.times[request_id] = entry
        if len(self.times) > self.keep:
            del self.times[next(iter(self.times))]   # dicts keep insertion order: the oldest
        return entry

    def select(self, prefix: str) -> dict[str, list[float | None]]:
        return {k: v for k, v in self.times.items() if k.startswith(prefix)}


def _json(status: int, body: bytes) -> web.Response:
    return web.Response(status=status, body=body, content_type="application/json")


def _text_of(stream: RequestStream, start: int, count: int) -> str:
    seed = stream.seed
    if count == 1:                       # the common case at stream interval 1
        return _PIECES[_output_token(seed, start)]
    return "".join(_PIECES[_output_token(seed, p)] for p in range(start, start + count))


class _SseEvents:
    """The SSE bytes of one streamed request's emissions, vLLM's event sequence."""

    def __init__(self, req: GenerationRequest) -> None:
        self.enc = protocol.StreamEncoder(req)
        self.chat = req.kind == "chat"
        self.usage_prompt = len(req.prompt_token_ids) if req.include_usage else None

    def render(self, stream: RequestStream, start: int, count: int,
               finish: str | None) -> bytes:
        enc = self.enc
        event = enc.chunk(_text_of(stream, start, count), finish)
        if start == 0 and self.chat:
            event = enc.role_chunk() + event
        if finish is not None:
            if self.usage_prompt is not None:
                event += enc.usage_chunk(self.usage_prompt, stream.generated)
            event += "data: [DONE]\n\n"
        return event.encode()


class SimServer:
    """Request handlers bound to one driver and its config."""

    def __init__(self, cfg: SimConfig, resolved: ResolvedConfig,
                 driver: LiveDriver | FleetDriver, metrics: EngineMetrics) -> None:
        self.cfg = cfg
        self.resolved = resolved
        self.driver = driver
        self.metrics = metrics
        self.model = resolved.served_model_name
        self.max_model_len = resolved.max_model_len
        self.timeline = RequestTimeline()

    # ------------------------------------------------------------ generation
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, protocol.parse_completion)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, protocol.parse_chat)

    async def _generate(self, request: web.Request,
                        parse: Callable[[bytes, str, int], GenerationRequest]
                        ) -> web.StreamResponse:
        rid = request.headers.get("X-Request-Id")
        mark = self.timeline.arrived(rid) if rid else None
        try:
            req = parse(await request.read(), self.model, self.max_model_len)
        except ProtocolError as exc:
            return _json(exc.status, exc.body())
        stream = self.driver.submit(req.request_id, req.prompt_token_ids, req.max_tokens,
                                    req.min_tokens, req.ignore_eos, streaming=req.stream)
        try:
            if req.stream:
                return await self._stream(request, req, stream, mark)
            _, count, finish = await stream.next()
            if mark is not None:
                mark[1] = time.time()
            body = protocol.full_response(req, _text_of(stream, 0, count), finish or "stop",
                                          count)
            return _json(200, json.dumps(body).encode())
        finally:
            if not stream.finished:
                self.driver.abort(stream)

    async def _stream(self, request: web.Request, req: GenerationRequest,
                      stream: RequestStream, mark: list[float | None] | None) -> web.StreamResponse:
        """SSE body. Fast path (HTTP/1.1): the driver calls a sink that writes each due
        event straight to the socket as a chunk, so a step's events to all clients go out
        in one pass with no coroutine woken per token; the handler only waits for the end.
        ``prepare()`` has sent the headers, and ``write_eof()`` adds the last chunk.
        ``mark`` (the timeline entry) gets the time the first token is written."""
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8",
                                           "Cache-Control": "no-cache"})
        transport = request.transport
        fast = request.version >= HttpVersion11 and transport is not None
        if fast:
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        events = _SseEvents(req)
        if fast and transport is not None:
            def sink(s: RequestStream) -> None:
                data = events.render(s, *s.take())
                if mark is not None and mark[1] is None:
                    mark[1] = time.time()
                if not transport.is_closing():
                    try:
                        transport.write(b"%x\r\n%b\r\n" % (len(data), data))
                    except (OSError, RuntimeError):
                        pass          # client gone: the cancelled handler aborts the request

            stream.sink = sink
            if stream.ready():            # tokens that came out while the headers went
                sink(stream)
            await stream.wait_finished()
        else:
            finish = None
            while finish is None:
                start, count, finish = await stream.next()
                if mark is not None and mark[1] is None:
                    mark[1] = time.time()
                await resp.write(events.render(stream, start, count, finish))
        await resp.write_eof()
        return resp

    # ------------------------------------------------------------ the rest
    async def tokenize(self, request: web.Request) -> web.Response:
        try:
            ids = protocol.parse_tokenize(await request.read(), self.model)
        except ProtocolError as exc:
            return _json(exc.status, exc.body())
        return web.json_response({"count": len(ids), "max_model_len": self.max_model_len,
                                  "tokens": ids, "token_strs": None})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response(protocol.models_list(self.model, self.max_model_len,
                                                      self.resolved.model.hf_name))

    async def health(self, request: web.Request) -> web.Response:
        """200 while the engine loop runs; 503 if it died, as vLLM's dead engine."""
        return web.Response(status=200 if self.driver.alive else 503)

    async def metrics_text(self, request: web.Request) -> web.Response:
        resp = web.Response(body=self.metrics.render().encode())
        resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
        return resp

    async def stats(self, request: web.Request) -> web.Response:
        p = self.driver.periods
        return web.json_response(
            {
                **dataclasses.asdict(p),
                "ratio": p.ratio if p.modelled_s else None,
                "open_streams": self.driver.num_streams,
            }
        )

    async def requests(self, request: web.Request) -> web.Response:
        return web.json_response(self.timeline.select(request.query.get("prefix", "")))

    async def version(self, request: web.Request) -> web.Response:
        return web.json_response({"version": f"{__version__}+loadlab.sim"})


def _auth_middleware(api_key: str) -> Callable:
    expected = f"Bearer {api_key}".encode()

    @web.middleware
    async def auth(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
        if request.path.startswith("/v1"):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    return auth


@web.middleware
async def _json_errors(request: web.Request,
                       handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                       ) -> web.StreamResponse:
    """Unknown routes and wrong methods get FastAPI's JSON bodies, as from vLLM."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        allow = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        return web.json_response({"detail": exc.reason}, status=exc.status, headers=allow)


def build_app(config: SimConfig | FleetConfig,
              resolved: ResolvedConfig | None = None) -> web.Application:
    """The aiohttp application; the engine loop starts with the app and stops with it."""
    fleet = config if isinstance(config, FleetConfig) else FleetConfig.single(config)
    cfg = fleet.configs[0]
    resolved = resolved or resolve(cfg)
    metrics = EngineMetrics(resolved, names=cfg.metrics_names)
    middlewares = [_json_errors]
    if cfg.api_key:
        middlewares.append(_auth_middleware(cfg.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=64 * 1024 * 1024)

    driver: LiveDriver | FleetDriver
    if fleet.size > 1:
        driver = FleetDriver(fleet)
        metrics = driver.metrics[0]
        app[FLEET] = driver
        app.router.add_get("/replica/{index}/metrics", _replica_metrics)
    else:
        driver = app[DRIVER] = LiveDriver(cfg, resolved, metrics=metrics)
    sim = SimServer(cfg, resolved, driver, metrics)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/tokenize", sim.tokenize)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_get("/health", sim.health)
    app.router.add_get("/metrics", sim.metrics_text)
    app.router.add_get("/version", sim.version)
    app.router.add_get("/sim/stats", sim.stats)
    app.router.add_get("/sim/requests", sim.requests)

    async def lifecycle(app: web.Application):
        driver.start()
        yield
        await driver.stop()

    app.cleanup_ctx.append(lifecycle)
    return app


async def _replica_metrics(request: web.Request) -> web.Response:
    """One replica's page; 404 (JSON, as an unknown route) for an index out of range."""
    fleet = request.app[FLEET]
    index = request.match_info["index"]
    if not index.isdigit() or int(index) >= len(fleet.metrics):
        raise web.HTTPNotFound()
    resp = web.Response(body=fleet.metrics[int(index)].render().encode())
    resp.headers["Content-Type"] = METRICS_CONTENT_TYPE
    return resp


async def start(cfg: SimConfig | FleetConfig, host: str, port: int,
                resolved: ResolvedConfig | None = None,
                tls: ssl.SSLContext | None = None) -> tuple[web.AppRunner, str]:
    """Start serving on ``host:port`` (0 picks a free port), https with ``tls``; return the
    runner and URL."""
    runner = web.AppRunner(build_app(cfg, resolved), handler_cancellation=True,
                           access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=tls)
    try:
        await site.start()
    except OSError as exc:  # address in use, not this machine's, or a name that does not resolve
        await runner.cleanup()
        raise InputError(
            f"cannot listen on {host}:{port} ({exc.strerror or exc})",
            field="--host/--port",
            fix="give an address of this machine and a free port (--port 0 picks one)",
        ) from None
    bound = runner.addresses[0][1]
    shown = f"[{host}]" if ":" in host else host
    return runner, f"{'https' if tls else 'http'}://{shown}:{bound}"


def serve(cfg: SimConfig | FleetConfig, host: str, port: int, resolved: ResolvedConfig,
          announce: Callable[[str], None], tls: ssl.SSLContext | None = None) -> None:
    """Serve until SIGINT/SIGTERM (https with ``tls``); ``announce`` receives the bound URL
    once listening."""

    async def main() -> None:
        runner, url = await start(cfg, host, port, resolved, tls)
        announce(url)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        sys.exit(130)
