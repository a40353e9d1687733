"""Start the server under test, wait until it is healthy, and always stop it again.

``launch_target(kind, flags, run_dir)`` is a context manager yielding a
:class:`LaunchedTarget` (base URL, served model name, parsed flags, pid, log path).

Kinds:
- ``"sim"``: the built-in simulator, ``<python> -P -m loadlab sim serve <flags> --host H --port P``
  (:mod:`loadlab.pystart`: no working directory on its path).
- ``"vllm"``: a real ``vllm serve MODEL <flags> --host H --port P``; MODEL is the first
  positional in ``flags`` or the ``model`` argument. The binary is ``$LOADLAB_VLLM_BIN``,
  else ``.vllm-venv/bin/vllm`` (made by ``tools/install_vllm.sh``) in the checkout loadlab
  runs from (not in an installed package) or in the current folder, else ``vllm`` on PATH.

Steps:
1. Pick a free loopback port (bind port 0, read it, close) unless ``--port`` is in flags.
2. Start the argv (never through a shell) behind a guardian process
   (:mod:`loadlab.experiment.guardian`): the server runs in its own process group
   (vLLM's engine-core children share it), stdout+stderr appended to
   ``<run_dir>/<kind>-server.log``. The guardian holds a pipe from this process;
   when this process ends, however it ends (SIGKILL included), the pipe closes and
   the guardian clears the server's whole group. So no server outlives its launcher.
3. Poll ``GET /health`` every ``poll_s`` (0.25 s) until 200 or ``startup_timeout_s``
   (vllm 300 s, sim 60 s); the pause between polls waits on the guardian, which exits
   when the server does, so a server that dies is noticed at once. Death ->
   ``TargetError`` quoting the log's root-cause line (:mod:`loadlab.experiment.log_cause`),
   or ``InputError`` (exit 2) for a server that refused its flags; deadline ->
   ``TargetError`` carrying the log tail.
4. Ask ``GET /v1/models`` for the served model name (falls back to the flags).
   With ``server_cpus`` the server (and its guardian) start on those CPUs and, once
   healthy, every thread of the server's process tree is narrowed to them
   (:mod:`loadlab.experiment.cpus`).
5. On exit (normal, exception, Ctrl-C): close the pipe; the guardian sends SIGTERM to
   the process group, waits ``stop_timeout_s`` (20 s) for all of it, then SIGKILL, and
   returns once the group is empty. ``LaunchedTarget.exit_reason()`` says whether (and
   how) the server ended while in use.

With ``probe`` (vllm only) the server also loads loadlab's scheduler probe
(:mod:`loadlab.probe`): its folder goes first on the server's PYTHONPATH,
``--scheduler-cls loadlab_probe.ProbeScheduler`` is added to its flags and
``LOADLAB_PROBE_PORT`` names a second free port, where the engine-core process serves the
``loadlab:`` series; ``LaunchedTarget.metrics_endpoints`` lists that endpoint for the
scraper.

The argv and flags are recorded with secrets (``--api-key``, a key in the environment)
redacted by :mod:`loadlab.spec.secrets` (``manifest_entry``); the server gets them as given. The
analyzer needs ``max_num_seqs``, which vLLM's /metrics never exposes, so the flags are
the manifest's source for it.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loadlab.errors import InputError, TargetError
from loadlab.experiment.cpus import CpuSet, check_omp_bind, inherited_affinity, pin_tree
from loadlab.experiment.log_cause import root_cause, usage_error
from loadlab.experiment.server_flags import parse_flags
from loadlab.probe import PORT_ENV, SCHEDULER_CLS, probe_dir
from loadlab.pystart import module_argv
from loadlab.runstore.layout import server_log
from loadlab.spec.datafiles import checkout_root
from loadlab.spec.secrets import redactor

KINDS = ("sim", "vllm")
DEFAULT_STARTUP_TIMEOUT_S = {"sim": 60.0, "vllm": 300.0}
LOG_TAIL_LINES = 40
GUARDIAN = Path(__file__).with_name("guardian.py")   # run as a script: standard library only
# Scheduler/cache knobs the analyzer reads from the manifest's ``server`` block; vLLM's
# /metrics never shows max_num_seqs or the token budget, so the launch flags are the source.
SERVER_KNOBS = (
    "max_num_seqs", "max_num_batched_tokens", "block_size", "max_model_len",
    "gpu_memory_utilization", "num_gpu_blocks_override", "enable_prefix_caching",
    "enable_chunked_prefill", "long_prefill_token_threshold", "kv_cache_dtype",
)
# Harmless everywhere, and keeps a test or CI run from phoning home.
VLLM_BASE_ENV = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass
class LaunchedTarget:
    """A running server, as the load generator and the manifest need it."""

    kind: str
    base_url: str
    model: str
    flags: dict[str, Any]          # parsed, redacted (vLLM names with underscores)
    argv: list[str]                # redacted
    pid: int
    log_path: Path
    startup_s: float
    extra: dict[str, Any] = field(default_factory=dict)
    metrics_endpoints: list[str] = field(default_factory=list)  # beside base_url: the probe's
    proc: GuardedServer | None = field(default=None, repr=False, compare=False)

    def exit_reason(self) -> str | None:
        """Why the server is gone (its process exited), or None while it runs."""
        code = self.proc.poll() if self.proc is not None else None
        if code is None:
            return None
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"the launched {self.kind} server {how} (log {self.log_path})"

    def manifest_entry(self) -> dict[str, Any]:
        """The ``target.launch`` block of manifest.json (no secrets)."""
        return {
            "kind": self.kind,
            "argv": self.argv,
            "flags": self.flags,
            "pid": self.pid,
            "log": str(self.log_path),
            "startup_s": round(self.startup_s, 3),
            **({"probe": self.metrics_endpoints[0]} if self.metrics_endpoints else {}),
        }

    def server_settings(self) -> dict[str, Any]:
        """The manifest's ``server`` block: the knobs set by flags (absent = server default)."""
        return {k: self.flags[k] for k in SERVER_KNOBS if k in self.flags}


def find_vllm() -> Path | None:
    """Where the ``vllm`` command is, or None when vLLM is not installed."""
    override = os.environ.get("LOADLAB_VLLM_BIN")
    if override:
        return Path(override) if Path(override).exists() else None
    roots = [root for root in (checkout_root(), Path.cwd()) if root is not None]
    for candidate in (root / ".vllm-venv/bin/vllm" for root in roots):
        if candidate.exists():
            return candidate
    from shutil import which

    found = which("vllm")
    return Path(found) if found else None


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def port_outside_ephemeral(host: str = "127.0.0.1") -> int:
    """A free port below the kernel's ephemeral range, for a server that binds it late.

    The probe binds its port in the engine core, after vLLM has opened its own sockets on
    ports the kernel hands out (port 0: ZMQ, torch distributed); a free ephemeral port
    picked before the launch can be one of them by then (a CI run: "Address already in
    use", and no probe series). Below the range nothing that binds port 0 lands. The
    4,096 ports tried stop 4,096 short of the range, clear of torch's default 29500."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    first = max(1024, low - 8192)
    span = max(1, min(4096, low - 4096 - first))
    start = random.randrange(span)
    for i in range(span):
        port = first + (start + i) % span
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    return free_port(host)


def build_argv(kind: str, flags: list[str], host: str, port: int, model: str | None) -> list[str]:
    """The command line for one kind of target (flags already stripped of host/port)."""
    if kind == "sim":
        return module_argv("loadlab", "sim", "serve", *flags, "--host", host, "--port", str(port))
    vllm = find_vllm()
    if vllm is None:
        raise InputError(
            "vLLM is not installed", source="--launch vllm",
            fix="run `bash tools/install_vllm.sh` or set LOADLAB_VLLM_BIN to a vllm command",
        )
    parsed = parse_flags(flags)
    if model is None and not parsed.positional:
        raise InputError("no model given for vllm serve", source="--launch vllm",
                         fix="put the model path or name first in the flags")
    head = [] if parsed.positional else [str(model)]
    return [str(vllm), "serve", *head, *flags, "--host", host, "--port", str(port)]


def _split_host_port(flags: list[str]) -> tuple[list[str], str | None, int | None]:
    """Remove --host/--port from flags: the launcher owns them."""
    rest: list[str] = []
    host: str | None = None
    port: int | None = None
    i = 0
    while i < len(flags):
        name, eq, inline = flags[i].partition("=")
        if name in ("--host", "--port"):
            value = inline if eq else (flags[i + 1] if i + 1 < len(flags) else "")
            i += 1 if eq else 2
            if name == "--host":
                host = value
            else:
                try:
                    port = int(value)
                except ValueError:
                    raise InputError(
                        f"--port {value!r} is not a number",
                        source="server flags",
                        field="--port",
                        fix="give a port number or leave it out",
                    ) from None
            continue
        rest.append(flags[i])
        i += 1
    return rest, host, port


def _with_probe(kind: str, flags: list[str], host: str,
                env: dict[str, str]) -> tuple[list[str], dict[str, str], str]:
    """The flags, environment and /metrics endpoint of a server that loads the probe."""
    if kind != "vllm":
        raise InputError("the scheduler probe loads into vLLM", field="--probe",
                         fix="use it with --launch vllm (the simulator exports the loadlab: "
                         "series itself)")
    if "scheduler_cls" in parse_flags(flags).values:
        raise InputError("--scheduler-cls is taken by the probe", field="--probe",
                         fix="leave --scheduler-cls out of the server flags, or drop --probe")
    port = port_outside_ephemeral(host)
    path = os.pathsep.join(p for p in (str(probe_dir()), env.get("PYTHONPATH")) if p)
    return ([*flags, "--scheduler-cls", SCHEDULER_CLS],
            {**env, "PYTHONPATH": path, PORT_ENV: str(port)}, f"http://{host}:{port}")


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


class GuardedServer:
    """A server started behind :mod:`loadlab.experiment.guardian` (see the module docstring)."""

    def __init__(
        self, argv: list[str], log_path: Path, env: dict[str, str], stop_timeout_s: float
    ) -> None:
        self.stop_timeout_s = stop_timeout_s
        self.code: int | None = None
        with open(log_path, "ab") as log:
            self.guard = subprocess.Popen(
                [
                    sys.executable,
                    str(GUARDIAN),
                    "--stop-timeout",
                    str(stop_timeout_s),
                    str(log_path),
                    "--",
                    *argv,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,
                text=True,
            )
        line = self.guard.stdout.readline() if self.guard.stdout else ""
        if not line.startswith("PID "):
            self.guard.wait()
            raise TargetError(f"could not start the server; log {log_path}:\n{log_tail(log_path)}")
        self.pid = int(line.split()[1])

    def poll(self) -> int | None:
        """The server's exit status once it has ended (negative: the signal that killed it)."""
        if self.code is None and self.guard.poll() is not None:
            for line in (self.guard.stdout.read() if self.guard.stdout else "").splitlines():
                if line.startswith("EXIT "):
                    self.code = int(line.split()[1])
            if self.code is None:  # the guardian itself was killed
                self.code = self.guard.returncode
        return self.code

    def wait(self, timeout_s: float) -> int | None:
        try:
            self.guard.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None
        return self.poll()

    def stop(self) -> None:
        """Close the guardian's pipe and wait until it has cleared the server's group."""
        if self.guard.stdin is not None and not self.guard.stdin.closed:
            self.guard.stdin.close()
        if self.wait(2 * self.stop_timeout_s + 30) is None:  # a stuck guardian: do its job
            self.guard.kill()
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.guard.wait()


def _wait_healthy(proc: GuardedServer, base_url: str, log_path: Path,
                  timeout_s: float, poll_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while True:
            try:
                if client.get(f"{base_url}/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            code = proc.wait(poll_s)
            if code is not None:
                raise _start_failure(code, log_path)
            if time.monotonic() > deadline:
                raise TargetError(
                    f"server not healthy at {base_url}/health after {timeout_s:.0f} s; "
                    f"log {log_path}:\n{log_tail(log_path)}"
                )


def _start_failure(code: int, log_path: Path) -> InputError | TargetError:
    """Why the server died at start, quoting its log's cause: InputError (exit 2) when it
    refused its flags (a usage error, exit 2, as click and argparse end), else TargetError."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    usage = usage_error(text) if code == 2 else None
    if usage is not None:
        return InputError(f"the server refused its flags: {usage}", source=log_path,
                          field="SERVER_ARGS", fix="correct or drop that flag after '--' "
                          "(the server's --help lists them)")
    cause = root_cause(text)
    if cause is None:
        return TargetError(f"server exited with code {code} before it was healthy; "
                           f"log {log_path}:\n{log_tail(log_path)}")
    return TargetError(f"server exited with code {code} before it was healthy: {cause} "
                       f"(the whole log: {log_path})")


def _served_model(base_url: str, api_key: str | None, fallback: str) -> str:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        data = httpx.get(f"{base_url}/v1/models", headers=headers, timeout=5.0).json()
        return str(data["data"][0]["id"])
    except (httpx.HTTPError, KeyError, IndexError, ValueError, TypeError):
        return fallback


@contextmanager
def launch_target(
    kind: str,
    flags: list[str],
    run_dir: str | Path,
    *,
    model: str | None = None,
    env: dict[str, str] | None = None,
    startup_timeout_s: float | None = None,
    stop_timeout_s: float = 20.0,
    poll_s: float = 0.25,
    server_cpus: CpuSet | None = None,
    probe: bool = False,
) -> Iterator[LaunchedTarget]:
    """Start a target server, yield it once healthy, stop it on the way out.

    ``server_cpus``: the server starts on these CPUs (inherited by all it starts) and,
    once healthy, every thread of its process tree is narrowed to them
    (:mod:`loadlab.experiment.cpus`).
    """
    if kind not in KINDS:
        raise InputError(f"unknown target kind {kind!r}", field="kind",
                         fix=f"use one of: {', '.join(KINDS)}")
    rest, host, port = _split_host_port(list(flags))
    host = host or "127.0.0.1"
    port = port or free_port(host)
    child_env = {**os.environ, **(VLLM_BASE_ENV if kind == "vllm" else {}), **(env or {})}
    probe_urls: list[str] = []
    if probe:
        rest, child_env, probe_url = _with_probe(kind, rest, host, child_env)
        probe_urls.append(probe_url)
    argv = build_argv(kind, rest, host, port, model)
    parsed = parse_flags(rest)
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log_path = run_dir / server_log(kind)
    timeout_s = startup_timeout_s or DEFAULT_STARTUP_TIMEOUT_S[kind]
    base_url = f"http://{host}:{port}"
    if server_cpus is not None and kind == "vllm":
        check_omp_bind(child_env.get("VLLM_CPU_OMP_THREADS_BIND"), server_cpus)
    t0 = time.monotonic()
    with inherited_affinity(server_cpus):
        proc = GuardedServer(argv, log_path, child_env, stop_timeout_s)
    try:
        _wait_healthy(proc, base_url, log_path, timeout_s, poll_s)
        if server_cpus is not None:
            pin_tree(proc.pid, server_cpus)
        api_key = parsed.values.get("api_key")
        hide = redactor(argv)
        fallback = str(parsed.values.get("served_model_name")
                       or (parsed.positional[0] if parsed.positional else model or "sim"))
        yield LaunchedTarget(
            kind=kind,
            base_url=base_url,
            model=_served_model(base_url, api_key if isinstance(api_key, str) else None, fallback),
            flags=hide(parsed.values),
            argv=hide(argv),
            pid=proc.pid,
            log_path=log_path,
            startup_s=time.monotonic() - t0,
            metrics_endpoints=probe_urls,
            proc=proc,
        )
    finally:
        proc.stop()
