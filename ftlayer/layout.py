"""The version of a source's Redis layout, and the migration from older ones.

``meta.format`` names the layout a source's keys were written with (see
:mod:`ftlayer.keys`):

- **1**: one list per timeout bucket generation, ``bkt:<gen>``. Scripts built
  those names inside Lua, which a Redis Cluster refuses (a script may touch
  only the keys it declares).
- **2** (current): one list ``bkt`` for every generation, each element headed
  by its generation (u32), in generation order.

Contract of :func:`ensure_layout`:
- A source at the current format, or not registered yet, costs one HGET and
  is left as it is.
- A format-1 source is migrated in place: each ``bkt:<gen>`` list, oldest
  generation first, is appended to ``bkt`` with its generation in front of each
  element and deleted in the same MULTI (same hash tag, so one slot). A crash
  part-way leaves the rest for the next call, still in generation order:
  nothing pending is lost or filed twice. Then ``format`` becomes 2.
- Stop every process of the older ftlayer first: one that still writes
  ``bkt:<gen>`` after the migration would file records no timeout sees.
- A format newer than this code knows raises :class:`ConfigError` and changes
  nothing.
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING

from ftlayer.errors import ConfigError
from ftlayer.keys import FORMAT_VERSION

if TYPE_CHECKING:
    from ftlayer.store import SourceStore

log = logging.getLogger(__name__)



def ensure_layout(store: SourceStore) -> int:
    """Migrate ``store``'s source to :data:`FORMAT_VERSION`; returns the format it had (0: none)."""
    k = store.keys
    client = store.client
    raw = client.hget(k.meta, "format")
    if raw is None:
        return 0
    found = int(raw)
    if found == FORMAT_VERSION:
        return found
    if found > FORMAT_VERSION:
        msg = (
            f"source {k.topology}/{k.source} was written with layout format {found}; this ftlayer "
            f"knows formats up to {FORMAT_VERSION}: upgrade ftlayer (nothing was changed)"
        )
        raise ConfigError(msg)
    old_prefix = k.key("bkt:")
    gens = sorted(
        int(name[len(old_prefix) :])
        for name in (raw_name.decode() for raw_name in client.scan_iter(match=old_prefix + "*"))
        if name[len(old_prefix) :].isdigit()
    )
    moved = 0
    for gen in gens:
        old = k.key(f"bkt:{gen}")
        elements: list[bytes] = client.lrange(old, 0, -1)  # type: ignore[assignment]
        head = struct.pack(">I", gen)
        pipe = client.pipeline(transaction=True)
        if elements:
            pipe.rpush(k.buckets, *(head + e for e in elements))
        pipe.delete(old)
        pipe.execute()
        moved += len(elements)
    client.hset(k.meta, "format", FORMAT_VERSION)
    log.warning(
        "source %s/%s: migrated its Redis layout from format %d to %d (%d bucket lists, %d elements)",
        k.topology, k.source, found, FORMAT_VERSION, len(gens), moved,
    )
    return found
