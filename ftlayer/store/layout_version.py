"""The version of a source's Redis layout: this ftlayer reads format 3 and refuses any other.

``meta.format`` names the layout a source's keys were written with (see
:mod:`ftlayer.keyspace.keys`):

- **1** and **2**: layouts of ftlayer's first days (a list per timeout bucket
  generation; then one ``pend`` hash entry per record), never released. This
  ftlayer does not migrate them (the migrations were removed with issue 29: no
  released version wrote them, so no installation can hold them).
- **3** (current): records in chunks (``ftlayer.records.chunks``): one ``ck``/``ci``/``cf``
  entry per chunk, ids that name their chunk, bucket and stream entries that
  list chunk ids.

Contract of :func:`ensure_layout`:
- A source at the current format, or not registered yet, costs one HGET and
  is left as it is.
- Any other format raises :class:`ConfigError` naming the format found and
  what to do, and changes nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ftlayer.errors import ConfigError
from ftlayer.keyspace.keys import FORMAT_VERSION

if TYPE_CHECKING:
    from ftlayer.store.source_store import SourceStore


def ensure_layout(store: SourceStore) -> int:
    """Check that ``store``'s source is at :data:`FORMAT_VERSION`; returns the format it has (0: none)."""
    k = store.keys
    raw = store.client.hget(k.meta, "format")
    if raw is None:
        return 0
    found = int(raw)
    if found == FORMAT_VERSION:
        return found
    name = f"{k.topology}/{k.source}"
    if found > FORMAT_VERSION:
        msg = (
            f"source {name} was written with layout format {found}; this ftlayer "
            f"knows formats up to {FORMAT_VERSION}: upgrade ftlayer (nothing was changed)"
        )
    else:
        msg = (
            f"source {name} was written with layout format {found}, by an unreleased ftlayer from before "
            f"chunks; this ftlayer reads only format {FORMAT_VERSION} and no longer migrates older layouts "
            f"(nothing was changed). Drain the source with the ftlayer that wrote it, or delete its keys "
            f"with 'ftlayer sources reset {k.topology} {k.source} --force' (its pending records are lost)"
        )
    raise ConfigError(msg)
