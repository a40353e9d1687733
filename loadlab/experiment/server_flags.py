"""Server flag lists in vLLM's own vocabulary: parse them, read knobs.

A flag list is what a user would type after ``vllm serve MODEL`` (``--max-num-seqs 4``,
``--block-size=32``, ``--enable-prefix-caching``, ``--no-enable-chunked-prefill``).
The same list configures the built-in simulator. Parsing rules:

1. ``--name=value`` and ``--name value`` give ``name`` (dashes -> underscores) = value;
   a value that reads as an int or float becomes one.
2. A flag in ``BOOLEAN_FLAGS`` (or any flag followed by another flag / nothing) is True;
   ``--no-<name>`` sets ``name`` to False.
3. Tokens before the first flag are positional (vLLM's MODEL).

What of a flag list is recorded or shown goes through :mod:`loadlab.spec.secrets` first.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loadlab.errors import InputError
from loadlab.spec.fields import number_or_word

# vLLM boolean switches loadlab users are likely to pass (each also has a --no- form).
BOOLEAN_FLAGS = frozenset(
    {
        "enable_prefix_caching",
        "enable_chunked_prefill",
        "enforce_eager",
        "disable_log_requests",
        "disable_log_stats",
        "enable_log_requests",
        "trust_remote_code",
        "disable_frontend_multiprocessing",
        "async_scheduling",
        "scheduler_reserve_full_isl",
    }
)


@dataclass
class ParsedFlags:
    """A flag list split into positionals and a name -> value mapping."""

    positional: list[str] = field(default_factory=list)
    values: dict[str, Any] = field(default_factory=dict)


def parse_flags(flags: list[str]) -> ParsedFlags:
    """Parse a vLLM-style flag list (see module docstring for the rules)."""
    parsed = ParsedFlags()
    i = 0
    while i < len(flags):
        token = flags[i]
        if not token.startswith("--"):
            if parsed.values:
                raise InputError(
                    f"unexpected value {token!r} after {flags[i - 1]!r}",
                    source="server flags",
                    fix="write each flag as --name value or --name=value",
                )
            parsed.positional.append(token)
            i += 1
            continue
        name, eq, inline = token[2:].partition("=")
        key = name.replace("-", "_")
        if eq:
            parsed.values[key] = number_or_word(inline)
            i += 1
        elif key.startswith("no_") and (i + 1 == len(flags) or flags[i + 1].startswith("--")):
            parsed.values[key[3:]] = False
            i += 1
        elif key in BOOLEAN_FLAGS or i + 1 == len(flags) or flags[i + 1].startswith("--"):
            parsed.values[key] = True
            i += 1
        else:
            parsed.values[key] = number_or_word(flags[i + 1])
            i += 2
    return parsed


def to_argv(flags: dict[str, Any]) -> list[str]:
    """{'max_num_seqs': 4, 'enforce_eager': True, 'enable_prefix_caching': False} -> argv
    (the inverse of :func:`parse_flags`; True is the bare flag, False its ``--no-`` form)."""
    argv: list[str] = []
    for key, value in flags.items():
        name = key.replace("_", "-")
        if value is True:
            argv.append(f"--{name}")
        elif value is False:
            argv.append(f"--no-{name}")
        else:
            argv += [f"--{name}", str(value)]
    return argv


def flag_value(flags: list[str], name: str) -> Any:
    """The value of one flag (``name`` with underscores), or None when absent."""
    return parse_flags(flags).values.get(name)
