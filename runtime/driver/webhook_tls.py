"""TLS contexts for the webhook receiver that its HTTP front process can rebuild.

The front (:mod:`runtime.driver.webhook_front`) is another process: an :class:`ssl.SSLContext` cannot be
handed to it, only the files it was loaded from. :func:`tls_context` builds a server context from PEM
files and remembers them (:data:`TLS_FILES`) with the settings it was built with (:data:`TLS_SETTINGS`);
:func:`tls_unpassable` says why a context cannot be rebuilt over there (not built by
:func:`tls_context`, or changed since), in which case the receiver keeps its HTTP side in a thread of
the ingest process (``front="auto"``) or refuses (``front="process"``).
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from runtime.driver.webhook_body import WebhookError

TLS_FILES = "ftlayer_tls_files"  # tls_context(): the (cert, key) paths a context was loaded from
TLS_SETTINGS = "ftlayer_tls_settings"  # tls_context(): its settings as built (see _tls_settings)


def tls_context(cert: str, key: str | None = None) -> ssl.SSLContext:
    """A server TLS context from a PEM certificate (chain) and its private key (``key`` None: in ``cert``);
    :class:`WebhookError` naming the files if they cannot be loaded. The context remembers its files
    (:data:`TLS_FILES`) and its settings (:data:`TLS_SETTINGS`), so the HTTP front process can load the
    same files, as long as the context was not changed since (see :func:`tls_unpassable`)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        msg = f"cannot load the TLS certificate {cert}" + (f" and key {key}" if key else "") + f": {exc}"
        raise WebhookError(msg) from exc
    setattr(context, TLS_FILES, (os.path.abspath(cert), os.path.abspath(key) if key else None))
    setattr(context, TLS_SETTINGS, _tls_settings(context))
    return context


def _tls_settings(context: ssl.SSLContext) -> tuple[Any, ...]:
    """What can be seen of a context's settings: client certificates (``verify_mode``, the CAs loaded),
    TLS versions, options, ciphers, callbacks. A front process rebuilds its context from the files
    alone, so a context changed after :func:`tls_context` must not be handed over as if it were not
    (a ``verify_mode = CERT_REQUIRED`` dropped would let in clients without a certificate)."""
    return (context.verify_mode, context.verify_flags, context.options, context.minimum_version,
            context.maximum_version, context.check_hostname, context.post_handshake_auth, context.sni_callback,
            context.num_tickets, context.keylog_filename, tuple(c["name"] for c in context.get_ciphers()),
            tuple(sorted(context.cert_store_stats().items())), tuple(context.get_ca_certs(binary_form=True)))


def tls_unpassable(context: ssl.SSLContext | None) -> str | None:
    """Why ``context`` cannot be rebuilt in the HTTP front process, or None (no TLS, or a context
    :func:`tls_context` built and nobody changed since)."""
    if context is None:
        return None
    if getattr(context, TLS_FILES, None) is None:
        return "tls_context(cert, key) did not build it"
    if getattr(context, TLS_SETTINGS, None) != _tls_settings(context):
        return ("it was changed after tls_context(cert, key) built it (client certificates, TLS versions, "
                "options or ciphers), and the HTTP process could only load its files")
    return None
