"""The FT stream reader's side of Redis: one source's channel streams, read through its FTLayer.

:class:`FTStreamsReader` is the part of :class:`runtime.spark.ft_source.FTStreamReader` that
talks to the channel streams: the process's ``FTLayer`` of the source (created on first use in
the process that uses it, never pickled), every channel stream of every shard and its offset
key (:func:`channel_key`), the tails in one round trip, the exact trims up to a committed
offset, and the check that an offset from the checkpoint names exactly this source's streams.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ftlayer.errors import ConfigError
from ftlayer.facade.ft_layer import FTLayer
from runtime.spark.channel_source import ChannelStreamReader
from runtime.spark.ft_batch_ends import Offset, stream_name, text
from runtime.spark.ft_offsets import START_ID, parse_id
from runtime.spark.ft_options import FTSourceOptions

__all__ = ["FTStreamsReader", "channel_key"]


def channel_key(channel: int, shard: int = 0, num_shards: int = 1) -> str:
    """The offset key of a channel stream: ``"ch<c>"``, or ``"ch<c>s<shard>"`` for a source with
    several shards (each shard has its own stream per channel)."""
    return f"ch{channel}" if num_shards == 1 else f"ch{channel}s{shard}"


class FTStreamsReader(ChannelStreamReader):
    """The FT stream reader's side of Redis: its FTLayer, channel streams, tails, trims, offset checks."""

    opts: FTSourceOptions

    def __init__(self, options: FTSourceOptions) -> None:
        super().__init__(options)
        self._layer: FTLayer | None = None
        self._checked = False

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["_layer"] = None  # rebuilt (and reconnected) in the process that unpickles
        state["_checked"] = False
        return state

    # --- Redis access ------------------------------------------------------------
    @property
    def layer(self) -> FTLayer:
        """This process's FTLayer of the source (client created on first use)."""
        if self._layer is None:
            o = self.opts
            # every command waits out a Redis outage: an error in latestOffset kills the query at once
            self._layer = FTLayer(o.config(), o.topology, o.source, num_channels=o.num_channels,
                                  outage_budget_s=o.outage_budget_s)
        return self._layer

    @property
    def streams(self) -> list[tuple[int, int, str]]:
        """Every channel stream of every shard: ``(channel, shard, offset key)``."""
        n = self.layer.num_shards
        return [(c, k, channel_key(c, k, n)) for c in self.channels for k in range(n)]

    def _stream_name(self, channel: int, shard: int) -> str:
        return stream_name(self.layer, channel, shard)

    def _check_once(self) -> None:
        if not self._checked:
            self.layer.check_channels()
            self._checked = True

    def tails(self, *, trim_upto: Mapping[str, str] | None = None) -> Offset:
        """Every channel's last generated stream id (``"0-0"`` if none), in one round trip.

        With ``trim_upto`` (an offset), the same round trip first trims every
        channel stream up to it (see :meth:`commit`).
        """
        layer = self.layer
        streams = self.streams
        pipe = layer.client.pipeline(transaction=False)
        if trim_upto is not None:
            self._queue_trims(pipe, trim_upto)
        for c, k, _ in streams:
            pipe.xinfo_stream(self._stream_name(c, k))
        replies = pipe.execute(raise_on_error=False)
        out: Offset = {}
        for reply in replies[: len(replies) - len(streams)]:
            if isinstance(reply, Exception):
                raise reply
        for (_, _, key), reply in zip(streams, replies[-len(streams) :], strict=True):
            if isinstance(reply, Exception):
                if "no such key" not in str(reply).lower():
                    raise reply
                out[key] = START_ID
            else:
                out[key] = text(reply.get("last-generated-id", START_ID))
        return out

    def _queue_trims(self, pipe: Any, upto: Mapping[str, str]) -> None:
        """Queue on ``pipe`` an exact ``XTRIM MINID`` of every channel stream to just after ``upto``
        (to just before its entry when ``upto`` ends inside an entry: the rest is still to read)."""
        for c, k, key in self.streams:
            last = upto[key]
            if last != START_ID:
                ms, seq = parse_id(last)
                minid = f"{ms}-{seq + 1}" if "@" not in last else f"{ms}-{seq}"
                pipe.xtrim(self._stream_name(c, k), minid=minid, approximate=False)

    def _check_offset(self, offset: Mapping[str, Any], what: str) -> None:
        expected = {key for _, _, key in self.streams}
        if "feed" in offset:
            msg = (f"the {what} offset in the checkpoint was written by an FT-off run (the feed source), not by "
                   f"FT source '{self.opts.topology}/{self.opts.source}': give this run its own checkpoint "
                   "location (a topology's FT-on and FT-off runs cannot share one)")
            raise ConfigError(msg)
        if set(offset) != expected:
            o = self.opts
            msg = (
                f"the {what} offset of FT source '{o.topology}/{o.source}' has channel streams "
                f"{sorted(offset)} but the source is read with num_channels={o.num_channels} and "
                f"num_shards={self.layer.num_shards}; a checkpoint cannot change either count"
            )
            raise ConfigError(msg)
