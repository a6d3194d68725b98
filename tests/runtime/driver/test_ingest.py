"""Ingest on a real server: every kind of user source, batching, routing, backpressure."""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.keyhash import key_hash
from runtime.driver import destinations as destinations_module
from runtime.driver import ingest as ingest_module
from runtime.driver.ingest import Ingestor
from tests.waiting import wait_until


def _layer(cfg: FTConfig, **kw: Any) -> FTLayer:
    return FTLayer(cfg.replace(**kw) if kw else cfg, "ing", "src", num_channels=4).open()


class _AckingPoller:
    """A poll source handing out ``polls`` in turn (then None: the end), keeping what ingest acked."""

    def __init__(self, polls: list[list[Any]]) -> None:
        self.polls = polls
        self.acked: list[Any] = []

    def poll(self) -> Any:
        return self.polls.pop(0) if self.polls else None

    def ack(self, got: list[Any]) -> None:
        self.acked += got


def _persisted(layer: FTLayer) -> list[Any]:
    from serialization.payload import unpack_payload

    out = []
    for ch in range(4):
        out += [(ch, r) for r in layer.persistence.read_channel(ch).records()]
    assert all(r.channel == ch for ch, r in out)
    return [unpack_payload(r.payload) for _, r in out]


def test_iterable_source_keyed_routing(ft_config: FTConfig) -> None:
    layer = _layer(ft_config)
    ing = Ingestor(layer, [{"u": f"u{i % 9}", "i": i} for i in range(500)], key=lambda e: e["u"])
    ing.run()
    assert ing.done and ing.ingested == 500 and ing.error is None
    for ch in range(4):
        for rec in layer.persistence.read_channel(ch).records():
            assert rec.channel == rec.key_hash % 4 and rec.replay_count == 0
    assert sorted(v["i"] for v in _persisted(layer)) == list(range(500))
    assert layer.stats()["persisted"] == 500


def test_unkeyed_source_is_round_robin(ft_config: FTConfig) -> None:
    layer = _layer(ft_config)
    Ingestor(layer, range(400)).run()
    counts = Counter(ch for ch in range(4) for _ in layer.persistence.read_channel(ch).frames)
    assert set(counts.values()) == {100}
    rec = layer.persistence.read_channel(0).records()[0]
    assert rec.key_hash == key_hash(None)


def test_callable_and_poll_sources(ft_config: FTConfig) -> None:
    items = iter(range(30))

    def fn() -> Any:
        v = next(items)  # StopIteration ends the source
        return None if v % 7 == 0 else ([v, -v] if v % 5 == 0 else v)

    layer = _layer(ft_config)
    Ingestor(layer, fn).run()
    expected: list[int] = []
    for v in range(30):
        if v % 7 == 0:
            continue  # None: nothing this time
        expected += [v, -v] if v % 5 == 0 else [v]
    assert sorted(_persisted(layer)) == sorted(expected)

    class Poller:
        def __init__(self) -> None:
            self.opened = self.closed = False
            self.calls = 0

        def open(self) -> None:
            self.opened = True

        def poll(self) -> Any:
            self.calls += 1
            return None if self.calls > 4 else [self.calls] * self.calls

        def close(self) -> None:
            self.closed = True

    poller = Poller()
    layer2 = FTLayer(ft_config, "ing", "poll", num_channels=4).open()
    Ingestor(layer2, poller).run()
    assert poller.opened and poller.closed
    assert layer2.stats()["persisted"] == 1 + 2 + 3 + 4


def test_a_poll_is_taken_whole_and_persisted_at_most_batch_size_at_a_time(ft_config: FTConfig) -> None:
    """A poll's records go into the batch together (one step per poll, not per record); a poll
    larger than the batch size is persisted in batches of at most that size, each acked once
    persisted and in order; a None inside a poll is nothing, as from any other source."""
    layer = _layer(ft_config, ingest_batch_records=40)
    sizes: list[int] = []
    real_put = destinations_module.PersistDestination.put

    class Poller:
        def __init__(self) -> None:
            self.polls = [list(range(100)), [], [100, None, 101], []]
            self.acked: list[Any] = []

        def poll(self) -> Any:
            return self.polls.pop(0) if self.polls else None

        def ack(self, values: list[Any]) -> None:
            self.acked += values

    def put(dest: Any, payloads: list[bytes], hashes: list[int], channels: list[int]) -> None:
        sizes.append(len(payloads))
        real_put(dest, payloads, hashes, channels)

    poller = Poller()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(destinations_module.PersistDestination, "put", put)
        ing = Ingestor(layer, poller)
        ing.run()
    assert ing.error is None and ing.ingested == 102
    assert sizes == [40, 40, 20, 2]  # the 100 in slices of the batch size; the 2 at the idle poll
    assert poller.acked == [*range(102)]
    assert sorted(_persisted(layer)) == list(range(102))


def test_broken_source_stops_ingest_but_keeps_what_was_read(ft_config: FTConfig) -> None:
    def gen() -> Any:
        yield from range(10)
        msg = "socket closed"
        raise OSError(msg)

    layer = _layer(ft_config)
    ing = Ingestor(layer, gen())
    ing.run()
    assert isinstance(ing.error, OSError) and ing.done
    assert layer.stats()["persisted"] == 10


def test_backpressure_waits_for_room(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, max_pending=50, flush_batch_size=10)
    ing = Ingestor(layer, range(200), linger_s=0.001).start()
    wait_until(lambda: (ing.paused or "").startswith("backpressure"), 20, "ingest to wait for room")
    assert 50 <= layer.pending_count() <= 60 and not ing.done
    # ack everything pending, as a pipeline would, until ingest finishes
    deadline = time.monotonic() + 20
    while not ing.done and time.monotonic() < deadline:
        for ch in range(4):
            batch = layer.persistence.read_channel(ch)
            layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in batch.records()})
        time.sleep(0.01)
    ing.stop()
    assert ing.done and layer.stats()["persisted"] == 200


def test_pending_is_counted_again_only_when_it_could_have_reached_max_pending(
        ft_config: FTConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    """Counting pending records before every batch was a round trip per persist: now the count is
    kept up to date by what this thread persists, and read again only once that bound reaches
    max_pending (or the count is older than PENDING_RECOUNT_S, here made long)."""
    monkeypatch.setattr(ingest_module, "PENDING_RECOUNT_S", 60.0)
    counts: list[int] = []

    def counting(ing: Ingestor) -> None:
        real = ing.destination.pending_count

        def pending_count() -> int:
            counts.append(real())
            return counts[-1]

        ing.destination.pending_count = pending_count  # type: ignore[method-assign]

    roomy = _layer(ft_config, max_pending=1000, flush_batch_size=10)
    ing = Ingestor(roomy, iter(range(500)), linger_s=0.0)
    counting(ing)
    ing.run()
    assert ing.done and roomy.stats()["persisted"] == 500
    assert counts == [0], counts  # 50 batches, counted once: the bound (at most 490) stayed below 1000

    counts.clear()
    tight = FTLayer(ft_config.replace(max_pending=30, flush_batch_size=10), "ing", "tight", num_channels=4).open()
    ing = Ingestor(tight, iter(range(100)), linger_s=0.0)
    counting(ing)
    ing.start()
    wait_until(lambda: (ing.paused or "").startswith("backpressure"), 20, "ingest to wait for room")
    assert tight.pending_count() == 30 and counts[:2] == [0, 30], counts  # counted again at the bound
    ing.stop()


def test_stop_ends_an_endless_source(ft_config: FTConfig) -> None:
    def endless() -> Any:
        return 1

    layer = _layer(ft_config)
    ing = Ingestor(layer, endless).start()
    wait_until(lambda: layer.stats()["persisted"] > 0, 20, "the first records persisted")
    ing.stop()
    assert ing.done and layer.stats()["persisted"] == ing.ingested > 0


def test_a_record_whose_key_raises_or_cannot_be_packed_is_dead_lettered(ft_config: FTConfig) -> None:
    from serialization.payload import unpack_payload

    layer = _layer(ft_config)
    values: list[Any] = [{"u": f"u{i}", "i": i} for i in range(10)]
    values[3] = {"i": 3}  # no "u": the key selector raises KeyError
    values[7] = {"u": "u7", "obj": object()}  # not serializable
    ing = Ingestor(layer, values, key=lambda e: e["u"])
    ing.run()
    assert ing.error is None and ing.ingested == 8 and ing.rejected == 2
    assert sorted(v["i"] for v in _persisted(layer)) == [0, 1, 2, 4, 5, 6, 8, 9]
    letters = layer.dead_letters.list()
    assert len(letters) == 2 and layer.stats()["dead_lettered"] == 2
    reasons = sorted(d.reason for d in letters)
    assert "key selector raised: KeyError" in reasons[0] or "key selector raised: KeyError" in reasons[1]
    assert any("cannot be serialized" in r for r in reasons)
    payloads = [unpack_payload(d.record.payload) for d in letters]
    assert {"i": 3} in payloads  # the value itself when it can be packed
    assert any(isinstance(p, str) and "object object" in p for p in payloads)  # else its repr


def test_a_record_that_does_not_fit_the_checked_schema_is_dead_lettered_at_ingest(ft_config: FTConfig) -> None:
    """``check`` (a schema declared at ingest): the misfits are dead-lettered with the read's reason and
    never persisted, a key that raises still is too, and the source's ack hook sees every value once,
    in order, after the batch it came in."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from runtime.spark.schema_check import SchemaCheck
    from serialization.payload import unpack_payload

    layer = _layer(ft_config, ingest_batch_records=64)
    values: list[Any] = [{"u": f"u{i % 7}", "i": i} for i in range(300)]
    values[10] = {"u": "u3", "i": "ten"}  # a string in the bigint column
    values[150] = ["u", 150]  # not a dict; the key selector raises on it first
    values[151] = {"u": "u1"}  # no i: null in a non-nullable column
    values[299] = {"u": "u2", "i": 299, "extra": {"kept": True}}  # fits: extra keys are ignored

    poller = _AckingPoller([values[:200], [], values[200:], []])
    schema = StructType([StructField("i", LongType(), nullable=False), StructField("u", StringType())])
    ing = Ingestor(layer, poller, key=lambda e: e["u"], check=SchemaCheck(schema))
    ing.run()
    assert ing.error is None and ing.ingested == 297 and ing.rejected == 3
    assert poller.acked == values  # every value, once, in order (the rejected ones after their dead letter)
    assert sorted(v["i"] for v in _persisted(layer)) == [i for i in range(300) if i not in (10, 150, 151)]
    letters = layer.dead_letters.list()
    reasons = sorted(d.reason for d in letters)
    assert layer.stats()["dead_lettered"] == 3 and len(reasons) == 3
    ten = next(d.reason for d in letters if unpack_payload(d.record.payload) == values[10])
    assert ten.startswith("ingest: does not fit the schema: column 'i' (bigint)"), ten
    assert "ingest: does not fit the schema: column 'i' is not nullable and the value is missing" in reasons
    assert any(r.startswith("ingest: key selector raised") for r in reasons), reasons
    assert layer.stats()["replayed"] == 0


def _misfit_values() -> list[Any]:
    values: list[Any] = [{"u": f"u{i % 5}", "i": i} for i in range(40)]
    values[3] = {"u": "u3", "i": "three"}
    values[30] = {"u": "u0", "i": "thirty"}
    values[17] = {"u": "u2", "obj": object()}  # cannot be packed
    return values


def _int_check() -> Any:
    from pyspark.sql.types import LongType, StructField, StructType

    from runtime.spark.schema_check import SchemaCheck

    return SchemaCheck(StructType([StructField("i", LongType())]))


def _stopped_while_down(layer: FTLayer, method: str) -> tuple[Ingestor, list[tuple[Any, ...]]]:
    """Ingest ``_misfit_values()`` while ``PersistDestination.<method>`` ("put" or "reject") always fails
    as an unreachable server does; stop() once it failed twice (grace 0.3 s). The Ingestor, and the
    arguments of every failed call."""
    import redis

    calls: list[tuple[Any, ...]] = []

    def down(_dest: Any, *args: Any, **_columns: Any) -> None:
        calls.append(args)
        raise redis.ConnectionError("the server is down")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(destinations_module.PersistDestination, method, down)
        ing = Ingestor(layer, _misfit_values(), key=lambda e: e["u"], check=_int_check())
        ing.stop_grace_s = 0.3
        ing.start()
        wait_until(lambda: len(calls) >= 2, 20, f"the {method} to fail twice")
        ing.stop(30)
    return ing, calls


def test_stop_during_an_outage_files_each_rejected_record_once(ft_config: FTConfig) -> None:
    """The batch's put keeps failing until stop()'s grace runs out: its final attempt (``_finish``) reuses
    what was prepared, so the 3 records set aside are dead-lettered once, not once per attempt."""
    layer = _layer(ft_config)
    ing, calls = _stopped_while_down(layer, "put")
    puts = [len(args[0]) for args in calls]
    assert ing.done and ing.rejected == 3 and ing.ingested == 0 and ing.abandoned == 37, vars(ing)
    assert set(puts) == {37}  # every attempt sent the same 37 records: the prepared parts, reused
    reasons = sorted(d.reason for d in layer.dead_letters.list())
    assert len(reasons) == 3 and layer.stats()["dead_lettered"] == 3, reasons
    assert sum(r.startswith("ingest: does not fit the schema: column 'i' (bigint)") for r in reasons) == 2
    assert sum("cannot be serialized" in r for r in reasons) == 1


def test_a_dead_letter_that_never_gets_written_is_not_counted_as_rejected(ft_config: FTConfig) -> None:
    layer = _layer(ft_config)
    ing, _ = _stopped_while_down(layer, "reject")
    assert ing.done and ing.rejected == 0 and ing.ingested == 0 and ing.abandoned == 40, vars(ing)
    assert layer.stats()["persisted"] == 0 and layer.dead_letters.list() == []


def test_a_durability_error_stops_ingest_and_sends_nothing_after_it(ft_config: FTConfig) -> None:
    """A WAITAOF that timed out (faked after a real persist of the first 100): ingest stops; the 100 sent
    are persisted once (their rejects dead-lettered once) and not confirmed, the 100 after them are
    neither sent nor confirmed (abandoned), even though they are the same objects in the same order."""
    from ftlayer.errors import DurabilityError

    layer = _layer(ft_config, ingest_batch_records=100)
    real_put = destinations_module.PersistDestination.put
    puts: list[int] = []

    def put_then_timeout(dest: Any, payloads: list[bytes], hashes: Any, channels: Any, columns: Any = None) -> None:
        puts.append(len(payloads))
        real_put(dest, payloads, hashes, channels, columns)
        if len(puts) == 1:
            msg = "WAITAOF timed out (waitaof_timeout_ms)"
            raise DurabilityError(msg)

    good, bad = {"u": "a", "i": 1}, {"u": "b", "i": "one"}
    poller = _AckingPoller([[good, bad] * 100, []])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(destinations_module.PersistDestination, "put", put_then_timeout)
        ing = Ingestor(layer, poller, key=lambda e: e["u"], check=_int_check())
        ing.run()
    assert isinstance(ing.error, DurabilityError)
    assert puts == [50] and poller.acked == [] and ing.abandoned == 100, (puts, ing.abandoned)
    assert layer.stats()["persisted"] == 50 and len(layer.dead_letters.list()) == 50


def _raising_check(calls: list[int], message: str) -> Any:
    """A payload check that notes each batch's size in ``calls``, then raises ValueError(message)."""
    def broken(payloads: Any) -> dict[int, str]:
        calls.append(len(payloads))
        raise ValueError(message)

    return broken


def test_a_check_that_raises_after_the_source_failed_still_ends(ft_config: FTConfig) -> None:
    """The source raised with 3 records held (not yet persisted); the final attempt's check raises: ingest
    ends (the source's error kept), the 3 abandoned, the check run once."""
    from ftlayer.errors import IngestCheckError

    layer = _layer(ft_config)
    calls: list[int] = []
    broken = _raising_check(calls, "broken")

    class Failing:
        def __init__(self) -> None:
            self.polls = 0

        def poll(self) -> Any:
            self.polls += 1
            if self.polls == 1:
                return [{"i": 1}, {"i": 2}, {"i": 3}]  # held: no idle poll, linger not over
            msg = "the source's connection closed"
            raise OSError(msg)

    ing = Ingestor(layer, Failing(), check=broken, linger_s=60.0)
    thread = threading.Thread(target=ing.run, daemon=True)
    thread.start()
    thread.join(20)
    assert ing.done, "ingest did not end"
    assert isinstance(ing.error, OSError) and not isinstance(ing.error, IngestCheckError)
    assert calls == [3] and ing.abandoned == 3 and layer.stats()["persisted"] == 0


@pytest.mark.parametrize("with_unpackable", [False, True], ids=["all-pack", "one-unpackable"])
def test_a_check_that_raises_stops_ingest_with_nothing_persisted_confirmed_or_dead_lettered(
        ft_config: FTConfig, with_unpackable: bool) -> None:
    from ftlayer.errors import IngestCheckError

    layer = _layer(ft_config)
    calls: list[int] = []
    broken = _raising_check(calls, "the schema cannot be built")

    first: list[Any] = [{"i": i} for i in range(10)]
    if with_unpackable:
        first[4] = {"i": object()}
    poller = _AckingPoller([first, []])
    ing = Ingestor(layer, poller, check=broken)
    ing.run()
    assert isinstance(ing.error, IngestCheckError), ing.error
    assert "the check of a batch of" in str(ing.error) and "ValueError: the schema cannot be built" in str(ing.error)
    assert calls == [9 if with_unpackable else 10]  # once: the final attempt does not run it again
    assert poller.acked == [] and ing.abandoned == 10 and ing.rejected == 0
    assert layer.stats()["persisted"] == 0 and layer.dead_letters.list() == []


@pytest.mark.parametrize("schema", ["n long", "struct"], ids=["ddl", "StructType"])
def test_ingest_with_a_schema_through_the_public_api(ft_config: FTConfig, schema: str) -> None:
    """``ftlayer.ingest(..., schema=...)`` checks at ingest, with no SparkSession (this process has no JVM):
    a DDL string or a StructType; a DDL it cannot read is refused with the position, before anything is read."""
    from pyspark.sql.types import LongType, StructField, StructType

    import ftlayer
    from ftlayer.errors import ConfigError
    from runtime.dataframe import sources

    given: Any = StructType([StructField("n", LongType())]) if schema == "struct" else schema
    try:
        ing = ftlayer.ingest("ing", "typed", [{"n": 1}, {"n": "two"}, {"n": 3}], config=ft_config, schema=given)
        wait_until(lambda: ing.done, 20, "ingest to finish")
        handle = sources.source("ing", "typed", config=ft_config)
        assert ing.error is None and ing.ingested == 2 and ing.rejected == 1
        letters = handle.layer.dead_letters.list()
        assert len(letters) == 1
        assert letters[0].reason.startswith("ingest: does not fit the schema: column 'n' (bigint)"), letters[0].reason
        assert handle.stats()["persisted"] == 2 and handle.stats()["dead_lettered"] == 1
        # without a SparkSession ftlayer's own parser says where; with one (an xdist worker that ran Spark
        # tests), Spark's parser does
        with pytest.raises(ConfigError, match=r"'n lng'(?: at position 2: unknown or unsupported type 'lng'.*no "
                                              r"SparkSession|: \[UNSUPPORTED_DATATYPE\])"):
            ftlayer.ingest("ing", "typed", [{"n": 4}], config=ft_config, schema="n lng")
        assert handle.stats()["persisted"] == 2
    finally:
        sources.stop_all()


def test_ft_off_feed_drops_and_counts_a_rejected_record() -> None:
    from runtime.driver.feed import Feed, FeedDestination

    dest = FeedDestination(Feed(2), FTConfig(status="off"))
    ing = Ingestor(dest, [{"u": "a"}, {}, {"u": "b"}], key=lambda e: e["u"])
    ing.run()
    assert ing.ingested == 2 and ing.rejected == 1 and dest.rejected == 1 and dest.feed.pending() == 2


def test_ft_off_feed_takes_a_batch_on_the_fast_path() -> None:
    """The key hashes and channels come as numpy arrays there: the feed's frames get the same values."""
    from runtime.driver.feed import Feed, FeedDestination

    dest = FeedDestination(Feed(2), FTConfig(status="off"))
    values = [{"u": f"user-{i}"} for i in range(50)]
    ing = Ingestor(dest, values, key=lambda e: e["u"])
    ing.run()
    assert ing.ingested == 50 and dest.feed.pending() == 50
    import struct

    from serialization.payload import unpack_payload

    seen = 0
    for ch in range(2):
        for chunk in dest.feed.read(ch, -1, 10**9)[1]:
            hashes = struct.unpack(f"<{chunk.count}q", chunk.hashes)
            offsets = struct.unpack(f"<{chunk.count + 1}i", chunk.offsets)
            for i, h in enumerate(hashes):
                user = unpack_payload(chunk.data[offsets[i]:offsets[i + 1]])["u"]
                assert h == key_hash(user) and key_hash(user) % 2 == ch, (ch, user)
                seen += 1
    assert seen == 50
