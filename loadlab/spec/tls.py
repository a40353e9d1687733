"""How loadlab's clients trust an https target: one settings value, one context built from it.

The load generator's transport, the preflight and the collector all reach the same server,
so they verify it the same way: :class:`TlsSettings` travels with the run (plain data, JSON
to remote workers) and :meth:`TlsSettings.context` is the one place an
:class:`ssl.SSLContext` is made from it. By default the system trust store
(``ssl.create_default_context()``, which also reads ``SSL_CERT_FILE`` / ``SSL_CERT_DIR``
through OpenSSL's default verify paths); ``ca_bundle`` trusts that PEM file instead (a
private CA, a self-signed test server); ``insecure`` verifies nothing, which the run warns
about and records in its manifest.

The context is built where it is used, not imported once: under Locust the ``ssl`` module is
gevent's, and a context made after the patch wraps cooperative sockets.
"""

from __future__ import annotations

import ssl
from dataclasses import asdict, dataclass
from typing import Any

from loadlab.errors import InputError

INSECURE_WARNING = ("TLS certificate verification is OFF (--insecure): the target's identity "
                    "is not checked")
FIX = "give the CA that signed it with --ca-bundle FILE (scenario: target.ca_bundle), or " \
      "--insecure to skip verification"


@dataclass(frozen=True)
class TlsSettings:
    """Which certificates an https target may present (http targets ignore it)."""

    ca_bundle: str | None = None   # PEM file of trusted CAs, instead of the system store
    insecure: bool = False         # verify nothing

    def context(self) -> ssl.SSLContext:
        """A client context: verified against the system store or ``ca_bundle``, or not at all.

        Raises OSError / ssl.SSLError for a ``ca_bundle`` that cannot be read as PEM
        (:func:`check_ca_bundle` says that first, as an input error)."""
        ctx = ssl.create_default_context(cafile=self.ca_bundle)
        if self.insecure:
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def manifest_entry(self) -> dict[str, Any]:
        """The manifest's ``target.tls`` block: how the target's certificate was checked."""
        return {"verify": not self.insecure, "ca_bundle": self.ca_bundle}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> TlsSettings:
        return cls(**(data or {}))


def tls_from_flags(ca_bundle: str | None, insecure: bool) -> TlsSettings:
    """``--ca-bundle`` / ``--insecure`` checked (InputError naming the flag), as settings."""
    if ca_bundle is not None and insecure:
        raise InputError("--insecure skips the verification --ca-bundle is for",
                         field="--ca-bundle/--insecure", fix="keep one of them")
    problem = None if ca_bundle is None else check_ca_bundle(ca_bundle)
    if problem is not None:
        raise InputError(f"CA bundle: {problem}", field="--ca-bundle",
                         fix="give a readable PEM file of the CA certificates that signed the "
                         "server's")
    return TlsSettings(ca_bundle=ca_bundle, insecure=insecure)


def check_ca_bundle(path: str) -> str | None:
    """Why ``path`` cannot be a CA bundle (missing, unreadable, no PEM certificate), or None."""
    try:
        ssl.create_default_context(cafile=path)
    except FileNotFoundError:
        return f"no file {path!r}"
    except IsADirectoryError:
        return f"{path!r} is a folder, not a PEM file"
    except ssl.SSLError:   # an OSError too: first
        return f"{path!r} holds no PEM certificate"
    except OSError as exc:
        return f"cannot read {path!r} ({exc.strerror or exc})"
    return None


def verify_failure(exc: BaseException) -> str | None:
    """The reason a certificate was refused (``self-signed certificate``, a hostname
    mismatch), when ``exc`` or an exception it came from is a verification failure."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, ssl.SSLCertVerificationError):
            return str(cur.verify_message or cur.reason or cur)
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None
