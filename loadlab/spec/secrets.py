"""Secrets loadlab never writes: API keys, tokens, passwords become ``***``.

A scenario may carry a server's key among its flags (``flags: {api-key: K}``), the load
generator reads one from the environment, and both end up near text loadlab writes:
manifests, the report, console lines, a launched server's recorded command line. Every
such writer passes what it writes through a :class:`Redactor` (or :func:`redact`), the one
place that decides what is secret, so a new writer cannot forget a rule. The server
itself still gets the real flags; only what is recorded or shown is redacted.

A value is secret when

1. its name says so: a field or flag whose last word is ``key``, ``token``, ``secret``,
   ``password``, ... (``api_key``, ``--api-key``, ``hf_token``; not ``api_key_env``,
   which names a variable, nor ``long_prefill_token_threshold``); in a flag list
   (``--api-key K``, ``--api-key=K``) the value after such a flag; in free text the same
   ``--flag value`` shape;
2. or it is an API key loadlab knows of: the value of the variable the target names
   (``target.api_key_env``, default ``LOADLAB_API_KEY``), of ``VLLM_API_KEY`` (the
   variable ``vllm serve`` reads its key from: vllm/envs.py), or a value found under a
   secret name in what the redactor was built from. Such a value is hidden wherever it
   appears, also inside a longer text (an error message, a log line); a key shorter than
   :data:`MIN_EMBEDDED` characters only where it is the whole value, so ``K=1`` does not
   blank every ``1``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

REDACTED = "***"
KEY_ENVS = ("LOADLAB_API_KEY", "VLLM_API_KEY")
MIN_EMBEDDED = 6
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "secret", "password", "passwd", "credential", "credentials"}
)
_WORD = r"(?:key|apikey|token|secret|password|passwd|credentials?)"
# ``--some-api-key VALUE`` / ``--hf_token=VALUE`` inside a line of text
_FLAG_IN_TEXT = re.compile(
    rf"((?<![\w-])--(?:[A-Za-z0-9]+[-_])*{_WORD})(=|[ \t]+)(?!-)(\S+)", re.I
)


def is_secret_name(name: str) -> bool:
    """Whether a field or flag of this name holds a secret (rule 1 of the module docstring)."""
    words = re.split(r"[-_.\s]+", name.strip("-").lower())
    return words[-1] in _SECRET_WORDS


def _is_flag(item: Any) -> bool:
    return isinstance(item, str) and item.startswith("--")


def env_secrets(api_key_env: str | None = None) -> frozenset[str]:
    """The API keys set in this environment: ``api_key_env``'s and :data:`KEY_ENVS`'."""
    names = (*KEY_ENVS, api_key_env) if api_key_env else KEY_ENVS
    return frozenset(v for v in (os.environ.get(n) for n in names) if v)


def _named_values(value: Any, secret: bool = False) -> Iterator[str]:
    """Every scalar kept under a secret name in ``value`` (dicts, lists, flag lists)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _named_values(v, secret or is_secret_name(str(k)))
    elif isinstance(value, (list, tuple)):
        hide_next = False
        for item in value:
            name, eq, inline = item.partition("=") if _is_flag(item) else ("", "", "")
            if name and is_secret_name(name):
                hide_next = not eq
                yield from [inline] if inline else []
                continue
            yield from _named_values(item, secret or (hide_next and not name))
            hide_next = False
    elif secret and value is not None and not isinstance(value, bool) and str(value):
        yield str(value)


@dataclass(frozen=True)
class Redactor:
    """Replaces secrets with ``***`` in anything loadlab is about to write.

    Dicts, lists and tuples are copied; strings have known keys and ``--secret-flag value``
    hidden; other values pass as they are unless they equal a known key.
    """

    secrets: frozenset[str] = frozenset()

    def __call__(self, value: Any) -> Any:
        return self._redact(value)

    def _redact(self, value: Any) -> Any:
        if isinstance(value, Mapping):
            return {k: self._hide(v) if is_secret_name(str(k)) else self._redact(v)
                    for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._argv(value))
        if isinstance(value, str):
            return self.text(value)
        if value is not None and not isinstance(value, bool) and str(value) in self.secrets:
            return REDACTED
        return value

    def _hide(self, value: Any) -> Any:
        """A value under a secret name: every scalar becomes ``***`` (None and booleans stay)."""
        if isinstance(value, Mapping):
            return {k: self._hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self._hide(v) for v in value)
        return value if value is None or isinstance(value, bool) else REDACTED

    def _argv(self, items: Iterable[Any]) -> Iterator[Any]:
        """A flag list's items: the value after a secret flag hidden, the rest redacted."""
        hide_next = False
        for item in items:
            name, eq, _ = item.partition("=") if _is_flag(item) else ("", "", "")
            if hide_next and not name:
                yield REDACTED
            elif name and is_secret_name(name):
                yield f"{name}={REDACTED}" if eq else item
            else:
                yield self._redact(item)
            hide_next = bool(name) and not eq and is_secret_name(name)

    def text(self, line: str) -> str:
        """``line`` with every known key and every ``--secret-flag value`` hidden."""
        if line in self.secrets:
            return REDACTED
        for secret in sorted(self.secrets, key=len, reverse=True):
            if len(secret) >= MIN_EMBEDDED:
                line = line.replace(secret, REDACTED)
        return _FLAG_IN_TEXT.sub(lambda m: f"{m[1]}{m[2]}{REDACTED}", line)


def redactor(*sources: Any, api_key_env: str | None = None) -> Redactor:
    """A redactor for the keys in the environment and those named in ``sources`` (a
    scenario's dump, a flag list), so a key given only as a flag is hidden everywhere too."""
    named = {v for source in sources for v in _named_values(source)}
    return Redactor(env_secrets(api_key_env) | frozenset(named))


def redact(value: Any, api_key_env: str | None = None) -> Any:
    """``value`` as loadlab may write it: :class:`Redactor` over its own and the
    environment's secrets."""
    return redactor(value, api_key_env=api_key_env)(value)
