"""A Redis URL as it may be shown: its password masked, for logs, errors and reprs."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit

__all__ = ["mask_url", "masked"]


def mask_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (safe for logs and errors)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable redis url>"
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{user}:***@{host}{port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def masked(url: str) -> str:
    """``url`` with any password masked, also when it is too malformed for urlsplit to find the password."""
    shown = mask_url(url)
    if "@" in shown and "***" not in shown:
        head, _, tail = shown.rpartition("@")
        scheme, sep, _ = head.partition("://")
        shown = f"{scheme}{sep}***@{tail}" if sep else f"***@{tail}"
    return shown
