"""``ftlayer ingest ... --webhook [HOST:]PORT``: an HTTP receiver persisted into a source.

::

    ftlayer ingest clicks events --webhook 0.0.0.0:8080 --key user
    FTLAYER_INGEST_WEBHOOK_TOKEN=s3cret ftlayer ingest clicks events --webhook 8443 \\
        --webhook-tls-cert cert.pem --webhook-tls-key key.pem

What it promises is :mod:`runtime.driver.webhook`'s: a request is answered 200 only once its records
are persisted; 503 with Retry-After while ingest waits (backpressure, Redis unreachable) or the
process is ending. ``GET /readyz`` also PINGs Redis. SIGINT or SIGTERM stops taking requests (503),
persists and confirms what was taken, and exits 0.

Options are checked before Redis is touched: a webhook option without ``--webhook``, a TLS key
without its certificate, or files that do not load end in one ``ftlayer: error:`` line, exit 2.
"""

from __future__ import annotations

import argparse
import signal
import ssl
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.common import CLIError
from runtime.cli.env import ingest_option
from runtime.driver.ingest import Ingestor

# the options that only mean something with --webhook, and the value each has when not given
WEBHOOK_ONLY: dict[str, Any] = {"webhook_token": None, "webhook_hmac_secret": None, "webhook_tls_cert": None,
                                "webhook_tls_key": None, "max_body_bytes": 1 << 20, "webhook_reply_timeout_s": 30.0}



def check_no_webhook_options(args: argparse.Namespace) -> None:
    """Refuse a webhook-only option (given, or set by its variable) without ``--webhook``."""
    for dest, unset in WEBHOOK_ONLY.items():
        if getattr(args, dest) != unset:
            opt = ingest_option(dest)
            msg = (f"{opt.flag} is a webhook option: it needs --webhook [HOST:]PORT (or unset {opt.env} if it "
                   "comes from there)")
            raise CLIError(msg)


def parse_listen(text: str) -> tuple[str, int]:
    """``[HOST:]PORT`` as ``(host, port)``; the host defaults to 127.0.0.1 (``[::1]:PORT`` for IPv6)."""
    host, sep, port = text.rpartition(":")
    try:
        number = int(port)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        msg = f"--webhook {text!r}: expected [HOST:]PORT with a port in 0..65535"
        raise CLIError(msg)
    return (host.strip("[]") if sep and host else "127.0.0.1"), number


def check_webhook_options(args: argparse.Namespace) -> tuple[str, int, ssl.SSLContext | None]:
    """``(host, port, TLS context or None)`` of the ``--webhook`` options; CLIError (or WebhookError for
    TLS files that do not load) if they are bad. Called before Redis is touched (see the module notes)."""
    from runtime.driver.webhook import tls_context

    host, port = parse_listen(args.webhook)
    for dest in ("webhook_token", "webhook_hmac_secret"):
        if getattr(args, dest) == "":  # an empty variable (a secret never filled in) must not open the door
            opt = ingest_option(dest)
            msg = f"{opt.flag} is empty: give the credential, or unset {opt.env} for none"
            raise CLIError(msg)
    if args.webhook_tls_key and not args.webhook_tls_cert:
        msg = "--webhook-tls-key needs --webhook-tls-cert (the certificate it belongs to)"
        raise CLIError(msg)
    tls = tls_context(args.webhook_tls_cert, args.webhook_tls_key) if args.webhook_tls_cert else None
    return host, port, tls


def webhook_source(args: argparse.Namespace, ready_check: Callable[[], object] | None = None,
                   checked: tuple[str, int, ssl.SSLContext | None] | None = None) -> Any:
    """The :class:`~runtime.driver.webhook.WebhookSource` the options describe (``checked``: what
    :func:`check_webhook_options` returned for them), listening; CLIError if not."""
    from runtime.driver.webhook import WebhookSource

    host, port, tls = checked if checked is not None else check_webhook_options(args)
    try:
        return WebhookSource(host, port, token=args.webhook_token, hmac_secret=args.webhook_hmac_secret, tls=tls,
                             max_body_bytes=args.max_body_bytes, reply_timeout_s=args.webhook_reply_timeout_s,
                             ready_check=ready_check)
    except OSError as exc:
        msg = f"--webhook {args.webhook}: cannot listen on {host}:{port}: {exc}"
        raise CLIError(msg) from exc


def run_webhook(args: argparse.Namespace, layer: FTLayer, key: Any, *, run: Callable[..., int],
                checked: tuple[str, int, ssl.SSLContext | None] | None = None, check: Any = None) -> int:
    """Listen, then ingest until SIGINT/SIGTERM; ``run`` is ``ftlayer ingest``'s loop with progress lines."""
    hooks = webhook_source(args, ready_check=layer.client.ping, checked=checked)
    guard = " (Bearer token required)" if args.webhook_token else ""
    guard += " (HMAC signature required)" if args.webhook_hmac_secret else ""
    print(f"ftlayer ingest: {layer.keys.prefix} listening on {hooks.url} (POST one JSON record, POST "
          f"{hooks.url}batch a JSON array, either as application/x-ndjson lines){guard}; Ctrl-C or SIGTERM "
          "ends it", flush=True)

    ending = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        ending.set()  # ingest waiting (backpressure, Redis down) is then stopped too: ftlayer ingest's _run
        hooks.end()  # take no more; the source ends once what it took is persisted

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)
    try:
        return run(Ingestor(layer, hooks, key=key, check=check), ending=ending, failed=lambda: hooks.front_failure,
                   source_label="webhook", resumed={})
    finally:
        hooks.close()
        answers = ", ".join(f"{status}: {n}" for status, n in sorted(hooks.answers.items()))
        print(f"ftlayer ingest: webhook: confirmed {hooks.confirmed} records; requests answered {answers or 'none'}",
              flush=True)
