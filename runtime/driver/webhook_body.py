"""What the webhook receiver checks before a request's records reach ingest: credentials and the body.

Pure functions on headers and bytes (no server, no I/O), so every refusal is tested on its own and
answered the same way by any HTTP front end (:mod:`runtime.driver.webhook_http`).

Credentials (:class:`WebhookAuth`; a check is on only when configured, and every configured check
must pass):

- **Bearer token**: ``Authorization: Bearer <token>``.
- **HMAC signature**: ``X-Hub-Signature-256: sha256=<hex>``, the lowercase or uppercase hex
  HMAC-SHA256 of the **raw request body** (the exact bytes sent, before any decoding) keyed with
  the shared secret: GitHub's webhook signature, so a GitHub webhook can post here directly.

Both are compared in constant time (:func:`hmac.compare_digest`). A missing or wrong credential is
a 401; the answer never says which part was wrong beyond "missing" or "does not match".

Bodies (:func:`parse_records`), by ``Content-Type`` (parameters such as ``charset`` ignored):

- ``application/json``, any ``application/<x>+json``, ``text/plain``, no Content-Type, or
  ``application/x-www-form-urlencoded`` (what ``curl -d`` and ``urllib`` send when told nothing;
  the receiver before this one ignored the type, so such clients keep working): JSON (a form body
  ``payload=<url-encoded JSON>``, GitHub's "application/x-www-form-urlencoded" delivery, is read as
  that JSON). On the records
  route it is one record (an array is one record too); on the batch route it must be an array,
  one record per element.
- ``application/x-ndjson`` (also ``application/ndjson``, ``application/jsonl``,
  ``application/x-jsonlines``, ``application/jsonlines``): one JSON record per line, on either route;
  blank lines are skipped.
- anything else: 415 (:class:`BodyError` with ``status`` 415).

A body that is not UTF-8 JSON, a batch that is not an array, a bad NDJSON line (named by its
number, from 1) or a JSON ``null`` anywhere as a record is a 400: ingest reads None as "nothing
yet", so a null taken in would shift every later confirmation by one. Nothing of a refused body
is taken.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from ftlayer.errors import FTLayerError

__all__ = ["JSON_TYPES", "NDJSON_TYPES", "SIGNATURE_HEADER", "BodyError", "WebhookAuth", "WebhookError",
           "parse_records", "sign"]

SIGNATURE_HEADER = "X-Hub-Signature-256"
SIGNATURE_PREFIX = "sha256="
JSON_TYPES = ("application/json", "text/plain", "application/x-www-form-urlencoded")
NDJSON_TYPES = ("application/x-ndjson", "application/ndjson", "application/jsonl", "application/x-jsonlines",
                "application/jsonlines")


class WebhookError(FTLayerError):
    """The webhook receiver cannot run (aiohttp missing, a bad TLS file, a port it cannot listen on)."""


class BodyError(WebhookError, ValueError):
    """A request the receiver refuses: ``status`` is 400 (bad body), 415 (unsupported type), and from the
    HTTP side also 401 (credentials) or 413 (too large)."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def sign(secret: str | bytes, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value of ``body``: ``sha256=`` and the hex HMAC-SHA256 keyed with ``secret``
    (a str is taken as its UTF-8 bytes, as ``WebhookSource(hmac_secret=...)`` and ``--webhook-hmac-secret`` take it)."""
    key = secret.encode() if isinstance(secret, str) else secret
    return SIGNATURE_PREFIX + hmac.new(key, body, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class WebhookAuth:
    """The credentials a request must carry (none configured: every request passes)."""

    token: str | None = None
    hmac_secret: bytes | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.token) or bool(self.hmac_secret)

    def check_token(self, headers: Mapping[str, str]) -> str | None:
        """Why the bearer token is refused, or None (no token configured, or it matches)."""
        if not self.token:
            return None
        scheme, _, given = (headers.get("Authorization") or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            return "missing credentials: send Authorization: Bearer <token>"
        if not hmac.compare_digest(given.strip().encode(), self.token.encode()):
            return "the bearer token does not match"
        return None

    def check_signature(self, headers: Mapping[str, str], body: bytes) -> str | None:
        """Why the HMAC signature is refused, or None (no secret configured, or it matches ``body``)."""
        if not self.hmac_secret:
            return None
        given = (headers.get(SIGNATURE_HEADER) or "").strip()
        if not given.lower().startswith(SIGNATURE_PREFIX):
            return f"missing credentials: send {SIGNATURE_HEADER}: sha256=<hex HMAC-SHA256 of the body>"
        expected = sign(self.hmac_secret, body)
        if not hmac.compare_digest(SIGNATURE_PREFIX + given[len(SIGNATURE_PREFIX):].lower(), expected):
            return f"the {SIGNATURE_HEADER} signature does not match the body"
        return None


def body_kind(content_type: str | None) -> str:
    """``"json"`` or ``"ndjson"`` for a Content-Type; BodyError(415) for any other."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if not mime or mime in JSON_TYPES or (mime.startswith("application/") and mime.endswith("+json")):
        return "json"
    if mime in NDJSON_TYPES:
        return "ndjson"
    msg = (f"Content-Type {mime!r} is not supported: send application/json (one record; a JSON array to the "
           f"batch route) or application/x-ndjson (one record per line)")
    raise BodyError(msg, 415)


def _form_payload(body: bytes, content_type: str | None) -> bytes | None:
    """The ``payload`` field of a form body ``payload=<url-encoded JSON>`` (how GitHub posts a webhook
    whose content type is set to ``application/x-www-form-urlencoded``, its default); None for any
    other body (a JSON body never starts with ``payload=``)."""
    mime = (content_type or "").split(";", 1)[0].strip().lower()
    if mime != "application/x-www-form-urlencoded" or not body.startswith(b"payload="):
        return None
    try:
        fields = parse_qs(body.decode("ascii"), keep_blank_values=True, strict_parsing=True)
    except ValueError:  # UnicodeDecodeError too
        return None
    values = fields.get("payload", [])
    return values[0].encode() if list(fields) == ["payload"] and len(values) == 1 else None


def _decode(data: bytes | str, where: str) -> Any:
    """One JSON value of a body or line. Bytes must be UTF-8 (a leading byte order mark is skipped):
    ``json.loads`` would also take UTF-16 and UTF-32, guessing from the first bytes, which the
    receiver's contract (UTF-8 JSON, RFC 8259 section 8.1) does not."""
    try:
        if isinstance(data, bytes):
            data = data.decode("utf-8-sig")
        return json.loads(data)
    except UnicodeDecodeError as exc:
        msg = f"{where} is not UTF-8 JSON: {exc}"
        raise BodyError(msg) from exc
    except ValueError as exc:  # JSONDecodeError
        msg = f"{where} is not JSON: {exc}"
        raise BodyError(msg) from exc


def parse_records(body: bytes, content_type: str | None, *, batch: bool) -> list[Any]:
    """The records of a request body (see the module notes); BodyError naming what is wrong."""
    kind = body_kind(content_type)
    if kind == "ndjson":
        values: list[Any] = []
        for number, line in enumerate(body.split(b"\n"), 1):
            if not line.strip():
                continue
            value = _decode(line, f"line {number}")
            if value is None:
                msg = f"line {number}: null is not a record"
                raise BodyError(msg)
            values.append(value)
        return values
    value = _decode(_form_payload(body, content_type) or body, "the body")
    if not batch:
        values = [value]
    elif isinstance(value, list):
        values = value
    else:
        msg = f"a batch body must be a JSON array (or application/x-ndjson lines), not {type(value).__name__}"
        raise BodyError(msg)
    for index, item in enumerate(values):
        if item is None:
            msg = "null is not a record" + (f" (element {index} of the array)" if batch else "")
            raise BodyError(msg)
    return values
