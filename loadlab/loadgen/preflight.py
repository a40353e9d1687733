"""Before any load starts: is the target usable with this run's URL, key and model?

Steps of :func:`preflight` (one request, httpx, from :func:`loadlab.experiment.point.run_point`
before the load starts):

1. :func:`check_url`: ``http(s)://host[:port][/prefix]``. An https target's certificate
   is checked here first, as the load generator and the collector will check it
   (:class:`loadlab.spec.tls.TlsSettings`: the system trust store, ``--ca-bundle``, or
   nothing with ``--insecure``), so a refused certificate is one line before any load:
   the URL, the reason (``self-signed certificate``, a hostname mismatch) and the fix.
2. :func:`api_key`: the key from the named environment variable, refused if it holds
   control or non-ASCII characters (a CR/LF would end the header and inject others).
3. ``GET {base}/v1/models`` with the key. vLLM protects every ``/v1`` route with
   ``--api-key`` but not ``/tokenize``, which prompt calibration uses, so without this
   check a wrong key shows up only as a run of 401s. Outcomes:

   - no connection (refused, unknown host, timeout): InputError, check ``--target``;
   - a certificate that does not verify: InputError naming ``--ca-bundle``;
   - 401/403: InputError, the key is missing or wrong (the variable is named, the key
     never printed);
   - 404, or a body that is not an OpenAI model list: InputError, no OpenAI API there;
   - another status: TargetError (exit 1), the server is up but failing;
   - ``--model`` not among the served ids: InputError listing them.

:func:`split_address` checks ``--master-bind`` / ``--join`` the same way (a port number,
a host that resolves) before any process starts.

Returns :class:`TargetInfo`: the served model ids and the model's ``max_model_len``
(vLLM reports it per model; None when the server does not say).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from loadlab.errors import InputError, TargetError
from loadlab.spec.tls import FIX as TLS_FIX
from loadlab.spec.tls import TlsSettings, verify_failure

TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TargetInfo:
    """What the target said about itself before the run."""

    models: list[str]
    max_model_len: int | None


def check_url(url: str, flag: str = "--target") -> str:
    """The base URL without a trailing slash, or InputError saying what is wrong with it."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
        raise InputError(f"{url!r} is not an http(s)://HOST:PORT URL", field=flag,
                         fix="e.g. --target http://127.0.0.1:8000")
    return url.rstrip("/")


def split_address(
    text: str, flag: str = "--master-bind", need_port: bool = False
) -> tuple[str, int]:
    """``host:port`` -> (host, port); a missing port is 0 (pick one). InputError names ``flag``
    when the port is not a number, is missing where ``need_port``, or the host does not resolve."""
    host, sep, port_text = text.rpartition(":")
    if not sep:
        host, port_text = text, ""
    host = host or "127.0.0.1"
    if (
        (need_port and not port_text)
        or (port_text and not port_text.isdigit())
        or int(port_text or 0) > 65535
    ):
        raise InputError(f"{text!r} is not HOST:PORT", field=flag, fix="e.g. 127.0.0.1:5557")
    if host not in ("*", "0.0.0.0"):
        try:
            socket.getaddrinfo(host, None)
        except (socket.gaierror, UnicodeError):
            raise InputError(f"host {host!r} does not resolve", field=flag,
                             fix="give a host name or IP address this machine can reach") from None
    return host, int(port_text or 0)


def api_key(env_var: str) -> str | None:
    """The API key in ``env_var`` (None when unset or empty); InputError if it cannot be a
    header."""
    key = os.environ.get(env_var)
    if not key:
        return None
    if any(not (0x20 <= ord(ch) < 0x7F) for ch in key):
        raise InputError(
            f"the API key in ${env_var} holds control or non-ASCII characters "
            "(a line break from a file?)",
            field=env_var,
            fix=f"set {env_var} to the key alone, "
            f"e.g. export {env_var}=\"$(tr -d '\\r\\n' < keyfile)\"",
        )
    return key


def preflight(base_url: str, model: str | None, api_key_env: str,
              tls: TlsSettings | None = None) -> TargetInfo:
    """Ask ``base_url`` for its models with the run's key; see the module docstring."""
    import httpx

    key = api_key(api_key_env)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    url = f"{base_url}/v1/models"
    verify = (tls or TlsSettings()).context() if base_url.startswith("https://") else True
    try:
        resp = httpx.get(url, headers=headers, timeout=TIMEOUT_S, verify=verify)
    except httpx.HTTPError as exc:
        reason = verify_failure(exc)
        if reason is not None:
            raise InputError(f"the TLS certificate of {base_url} is refused: {reason}",
                             field="--ca-bundle", fix=TLS_FIX) from None
        raise InputError(f"cannot reach {base_url} ({type(exc).__name__}: {exc})", field="--target",
                         fix="start the server, or check the host and port") from None
    if resp.status_code in (401, 403):
        if key is None:
            raise InputError(
                f"{resp.status_code} from {url}: the target wants an API key and "
                f"${api_key_env} is not set",
                field=api_key_env,
                fix=f"export {api_key_env}=KEY (or name another variable with --api-key-env)",
            )
        raise InputError(
            f"{resp.status_code} from {url}: the target refuses the key in ${api_key_env}",
            field=api_key_env,
            fix="check the key (or --api-key-env names the right variable)",
        )
    if resp.status_code == 404:
        raise InputError(f"404 from {url}: no OpenAI-compatible API there", field="--target",
                         fix="give the server's base URL without /v1, e.g. http://127.0.0.1:8000")
    if resp.status_code != 200:
        raise TargetError(f"{url} answered HTTP {resp.status_code}; the server is up but failing")
    try:
        entries = [e for e in resp.json()["data"] if isinstance(e, dict) and "id" in e]
    except (ValueError, KeyError, TypeError):
        raise InputError(f"{url} did not answer with an OpenAI model list", field="--target",
                         fix="point --target at a vLLM or OpenAI-compatible server") from None
    served = [str(e["id"]) for e in entries]
    if model is not None and model not in served:
        raise InputError(
            f"model {model!r} is not served by {base_url}; "
            f"it serves: {', '.join(served) or 'none'}",
            field="--model",
            fix=f"use --model {served[0]}" if served else None,
        )
    chosen = next((e for e in entries if model is None or e["id"] == model), None)
    length = chosen.get("max_model_len") if chosen else None
    return TargetInfo(served, int(length) if isinstance(length, int) and length > 0 else None)
