"""The options several commands share, declared once so each concept has one spelling.

``--target`` (the server), ``--replica-metrics`` (the replicas behind it), ``--out``
(what a command writes), ``--interval`` (seconds between /metrics scrapes),
``--api-key-env``, ``--ca-bundle`` / ``--insecure`` (an https target's certificate) and
``--json FILE`` mean the same on every command. A spelling that changed stays for one
release as a hidden alias (not in ``--help``): it still works, and using it prints one
line on stderr naming the new spelling, so scripts keep running while their authors are
told what to change.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from loadlab.errors import InputError

DEFAULT_API_KEY_ENV = "LOADLAB_API_KEY"
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def deprecated(old: str, new: str) -> None:
    """The one line an old spelling prints (stderr, so stdout stays parseable)."""
    click.echo(f"loadlab: {old} is deprecated, use {new} "
               "(the old spelling goes in the next release)", err=True)


class DeprecatedAlias(click.Option):
    """A hidden old spelling of an option: fills the new one's parameter, says it is deprecated.

    It parses under a name of its own (under the shared name click could not tell which
    spelling was typed) and, when typed, hands its converted value to the new option's
    parameter as given on the command line, which click then keeps over that option's
    default, whichever of the two it processes first.
    """

    def __init__(self, decls: tuple[str], *, new: str, dest: str, **kwargs: Any) -> None:
        old = decls[0]
        name = "deprecated_" + old.lstrip("-").replace("-", "_")
        super().__init__([old, name], hidden=True, expose_value=False, **kwargs)
        self.new, self.dest = new, dest

    def handle_parse_result(self, ctx: click.Context, opts: Any,
                            args: list[str]) -> tuple[Any, list[str]]:
        value, args = super().handle_parse_result(ctx, opts, args)
        if ctx.get_parameter_source(self.name) == ParameterSource.COMMANDLINE:
            deprecated(self.opts[0], self.new)
            ctx.params[self.dest] = value
            ctx.set_parameter_source(self.dest, ParameterSource.COMMANDLINE)
        return value, args


def option(*decls: str, aliases: tuple[str, ...] = (), cls: type[click.Option] | None = None,
           **kwargs: Any) -> Decorator:
    """``click.option`` plus hidden deprecated ``aliases`` of it (same type, same parameter).

    ``decls`` is the new spelling then the parameter name, e.g. ``("--interval", "interval_s")``.
    """
    name, dest = decls[0], decls[-1] if len(decls) > 1 else decls[0].lstrip("-").replace("-", "_")
    main = click.option(*decls, cls=cls, **kwargs) if cls else click.option(*decls, **kwargs)
    keep = {k: kwargs[k] for k in ("type", "multiple", "is_flag", "flag_value") if k in kwargs}
    olds = [click.option(old, cls=DeprecatedAlias, new=name, dest=dest, **keep) for old in aliases]

    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for old in olds:
            f = old(f)
        return main(f)

    return decorate


def target_option(help: str = "Base URL of the server, e.g. http://127.0.0.1:8000",
                  aliases: tuple[str, ...] = (), **kwargs: Any) -> Decorator:
    return option("--target", "target", aliases=aliases, metavar="URL", help=help, **kwargs)


def replica_metrics_option(help: str) -> Decorator:
    """``--replica-metrics URL[,URL...]``: the replicas behind a gateway, as a tuple."""
    return option("--replica-metrics", "replica_metrics", metavar="URL[,URL...]",
                  callback=_url_list, help=help)


def _url_list(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    return tuple(u.strip() for u in (value or "").split(",") if u.strip())


def out_option(help: str, *, file: bool = False, **kwargs: Any) -> Decorator:
    """``--out``: a folder a command writes into, or (``file=True``) one file it writes."""
    kind = click.Path(dir_okay=not file, file_okay=file, path_type=Path)
    kwargs.setdefault("metavar", "FILE" if file else "DIR")
    return option("--out", "out", type=kind, help=help, **kwargs)


def interval_option(help: str = "Seconds between /metrics scrapes.", default: float = 1.0,
                    aliases: tuple[str, ...] = (), **kwargs: Any) -> Decorator:
    return option("--interval", "interval_s", type=float, default=default, show_default=True,
                  aliases=aliases, help=help, **kwargs)


def api_key_env_option(**kwargs: Any) -> Decorator:
    return option("--api-key-env", "api_key_env", default=DEFAULT_API_KEY_ENV, show_default=True,
                  metavar="VAR", help="Environment variable holding the API key, sent as "
                  "'Authorization: Bearer' (never printed or recorded).", **kwargs)


def tls_options() -> Decorator:
    """``--ca-bundle FILE`` and ``--insecure``: how an https target's certificate is checked
    (by default against the system trust store; ``SSL_CERT_FILE`` replaces that store)."""
    bundle = option("--ca-bundle", "ca_bundle", metavar="FILE", default=None,
                    help="https: trust the CA certificates in this PEM file instead of the "
                    "system store (a private CA, a self-signed server).")
    insecure = option("--insecure", "insecure", is_flag=True, default=False,
                      help="https: do not verify the server's certificate (warned, and "
                      "recorded in the manifest).")
    return lambda f: bundle(insecure(f))


class _BareJson(click.Option):
    """``--json`` that once was a bare flag (print JSON on stdout): bare, it means ``-``."""

    def consume_value(self, ctx: click.Context, opts: Any) -> tuple[Any, ParameterSource]:
        value, source = super().consume_value(ctx, opts)
        if value is _BARE:
            deprecated("--json without a FILE", "--json -")
            value = "-"
        return value, source


_BARE = object()  # the value of a bare --json


def json_option(help: str, *, was_flag: bool = False, **kwargs: Any) -> Decorator:
    """``--json FILE``: also write the command's JSON to FILE; ``-``: only the JSON, on stdout.

    ``was_flag``: the command's ``--json`` was a bare flag; bare, it still works (as ``-``).
    """
    if was_flag:
        kwargs.update(cls=_BareJson, is_flag=False, flag_value=_BARE)
    return option("--json", "json_out", metavar="FILE", help=help, **kwargs)


def write_json(text: str, where: str) -> None:
    """``text`` to the file ``where``, or to stdout for ``-``."""
    if where == "-":
        click.echo(text)
        return
    try:
        Path(where).write_text(text + "\n")
    except OSError as exc:
        raise InputError(f"cannot write the JSON here ({exc.strerror})", source=where,
                         field="--json", fix="give a file in a writable folder, or - for stdout"
                         ) from None
