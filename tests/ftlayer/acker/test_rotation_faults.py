"""The timeout bound under faults (issue 13, item 8), with the injected clock and a real server.

Faults are injected into a real client talking to the real server: a script
call raises ``redis.ConnectionError`` either before it is sent (the request is
lost) or after the server ran it (the reply is lost).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.facade.service import FTService
from ftlayer.scripting import lua_source
from serialization.serializers import make_record
from tests.ftlayer.conftest import FakeClock, hand_out


def pack(sids: list[int]) -> list[bytes]:
    return [struct.pack(">q", s) for s in sids]

_SHA_NAMES = {
    lua_source.load(name).sha: name
    for name in ("ROTATE", "EXPIRE", "LEASE", "REPLAY", "TRIM_DONE")
}


class FaultyRedis(redis.Redis):
    """A real client whose next call of a named script fails: ``before`` (lost request) or ``after``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.faults: dict[str, list[str]] = {}

    def arm(self, script: str, mode: str, times: int = 1) -> None:
        self.faults.setdefault(script, []).extend([mode] * times)

    def execute_command(self, *args: Any, **options: Any) -> Any:
        if args and args[0] == "EVALSHA":
            queue = self.faults.get(_SHA_NAMES.get(str(args[1]), ""))
            if queue:
                mode = queue.pop(0)
                if mode == "before":
                    msg = "injected: connection lost before the request"
                    raise redis.ConnectionError(msg)
                try:
                    super().execute_command(*args, **options)
                except redis.exceptions.NoScriptError:
                    # The server's script cache lost the script (another test on this worker
                    # restarted or refilled the shared server): redis-py loads it and sends the
                    # EVALSHA again, and that call, which runs, is the one the fault is for.
                    queue.insert(0, mode)
                    raise
                msg = "injected: connection lost before the reply"
                raise redis.ConnectionError(msg)
        return super().execute_command(*args, **options)


def run_once(service: FTService) -> bool:
    """One tick as the service thread runs it: a Redis error is counted, not raised."""
    try:
        service.tick()
    except (FTLayerError, redis.RedisError):
        return False
    return True


def build(ft_config: FTConfig, clock: FakeClock, **overrides: Any) -> tuple[FTLayer, FaultyRedis]:
    client = FaultyRedis.from_url(ft_config.redis_url or "")
    cfg = ft_config.replace(**overrides)
    source = "s" + uuid.uuid4().hex[:8]
    return FTLayer(cfg, "topo", source, num_channels=2, client=client, clock=clock).open(), client


def gen(layer: FTLayer) -> int:
    return layer.buckets.current_gen()


@pytest.fixture
def cleanup(redis_client: redis.Redis) -> Iterator[None]:
    yield  # redis_client deletes the test's namespace afterwards


@pytest.mark.parametrize("mode", ["before", "after"])
def test_a_failed_scan_never_causes_a_second_rotation_in_the_interval(
    ft_config: FTConfig, clock: FakeClock, cleanup: None, mode: str
) -> None:
    layer, client = build(ft_config, clock, timeout_s=10.0, num_buckets=2, max_replays=0)  # interval 10 s
    expired: list[int] = []
    layer.buckets.on_expired = expired.extend
    service = FTService([layer], clock=clock)
    assert run_once(service)
    recs = [make_record(layer, i) for i in range(50)]
    layer.persist(recs)
    hand_out(layer)  # only records a task has read time out (unread ones are re-filed)
    clock.advance(10.0)
    assert run_once(service) and gen(layer) == 1  # rotation 1: nothing expires yet
    clock.advance(10.0)
    client.arm("EXPIRE", mode)  # rotation 2 happens, its scan raises a redis ConnectionError
    assert not run_once(service)
    assert gen(layer) == 2
    for _ in range(39):  # the rest of the interval, tick by tick
        clock.advance(0.25)
        assert run_once(service)
        assert gen(layer) == 2, "a failed scan made the service rotate again inside the interval"
    # each record failed once; with a lost reply the server failed them but the ids never came back
    assert layer.stats()["failed_timeout"] == 50 and layer.pending_count() == 0
    assert len(expired) == len(set(expired)) == (50 if mode == "before" else 0)
    clock.advance(0.25)
    assert run_once(service) and gen(layer) == 3  # the next rotation is on schedule


def test_a_rotation_whose_reply_was_lost_is_not_repeated(
    ft_config: FTConfig, clock: FakeClock, cleanup: None
) -> None:
    layer, client = build(ft_config, clock, timeout_s=10.0, num_buckets=2)
    service = FTService([layer], clock=clock)
    assert run_once(service)
    clock.advance(10.0)
    client.arm("ROTATE", "after")
    assert not run_once(service)
    assert gen(layer) == 1  # the server rotated; the client never heard
    clock.advance(0.25)
    assert run_once(service)
    assert gen(layer) == 1, "the retry rotated a second time inside the interval"


def test_missed_rotations_are_caught_up_in_order(
    ft_config: FTConfig, clock: FakeClock, cleanup: None
) -> None:
    layer, client = build(ft_config, clock, timeout_s=10.0, num_buckets=3)  # interval 5 s
    order: list[int] = []
    layer.buckets.on_expired = order.extend
    service = FTService([layer], clock=clock)
    assert run_once(service)
    first = [make_record(layer, i) for i in range(20)]
    layer.persist(first)  # gen 0
    hand_out(layer)
    clock.advance(5.0)
    assert run_once(service) and gen(layer) == 1
    second = [make_record(layer, i) for i in range(20)]
    layer.persist(second)  # gen 1
    hand_out(layer)
    # Redis unreachable for the rotator for 3 intervals: every ROTATE call is lost
    client.arm("ROTATE", "before", times=12)
    for _ in range(12):
        clock.advance(1.25)
        assert not run_once(service)
    assert gen(layer) == 1
    clock.advance(1.25)  # 21.25 s after the lease was taken: rotations 2, 3 and 4 are due
    assert run_once(service)
    assert gen(layer) == 4
    assert order == [r.record_id.source_record_id for r in first + second]  # oldest bucket first
    for _ in range(2):
        clock.advance(1.25)
        assert run_once(service) and gen(layer) == 4  # and no rotation before the next due time
    clock.advance(1.25)
    assert run_once(service) and gen(layer) == 5  # 25 s: on schedule


FAULTS = st.sampled_from(
    [None, None, None, ("EXPIRE", "before"), ("EXPIRE", "after"), ("ROTATE", "before"),
     ("ROTATE", "after"), ("LEASE", "before")]
)


@pytest.mark.slow
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    n=st.integers(2, 4),
    steps=st.lists(st.tuples(st.sampled_from([0.25, 0.5, 1.0, 2.5]), FAULTS), min_size=10, max_size=60),
)
def test_timeout_bound_holds_under_scan_and_rotate_faults(
    ft_config: FTConfig, cleanup: None, n: int, steps: list[tuple[float, tuple[str, str] | None]]
) -> None:
    """Random ticks with faults: never ahead of schedule, caught up after, each record fails once in order.

    Bound: a record filed while the rotations were on schedule fails no sooner
    than T after it was filed, and no later than T * (1 + 1/(n-1)) plus the
    ticks lost to faults during its life.
    """
    clock = FakeClock()
    timeout = 10.0
    layer, client = build(ft_config, clock, timeout_s=timeout, num_buckets=n, max_replays=0)
    interval = timeout / (n - 1)
    failed_at: dict[int, float] = {}  # seen by the server: the record is no longer pending
    order: list[int] = []  # reported to on_expired (a lost EXPIRE reply reports nothing)
    layer.buckets.on_expired = order.extend
    service = FTService([layer], clock=clock)
    t0 = clock.now
    assert run_once(service)
    filed: dict[int, tuple[float, int]] = {}  # sid -> (time, gen at filing)
    on_schedule: set[int] = set()
    fault_ticks: list[float] = []
    quiet = [(0.5, None)] * int(4 * timeout / 0.5)  # long enough for everything to expire
    for i, (step, fault) in enumerate(steps + quiet):
        if i < len(steps):  # file one record per tick, then let everything expire
            rec = make_record(layer, clock.now)
            layer.persist([rec])
            hand_out(layer)  # read at once, as a running query does
            sid = rec.record_id.source_record_id
            filed[sid] = (clock.now, gen(layer))
            if gen(layer) == int((clock.now - t0) // interval):
                on_schedule.add(sid)
        clock.advance(step)
        if fault is not None:
            client.arm(*fault)
        ok = run_once(service)
        client.faults.clear()
        if not ok:
            fault_ticks.append(clock.now)
        waiting = [sid for sid in filed if sid not in failed_at] or [0]
        for sid, pending in zip(waiting, layer.pending_of(waiting), strict=True):
            if not pending and sid in filed:
                failed_at[sid] = clock.now
        due = int((clock.now - t0) // interval)
        assert gen(layer) <= due, "a rotation came ahead of its schedule"
        if ok:
            assert gen(layer) == due, "a missed rotation was not caught up"
    assert sorted(failed_at) == sorted(filed)
    assert layer.stats()["failed_timeout"] == len(filed) and len(order) == len(set(order))
    gens = [filed[sid][1] for sid in order]
    assert gens == sorted(gens), "expired buckets were scanned out of order"
    bound = timeout * (1 + 1 / (n - 1))
    for sid, (t, _) in filed.items():
        age = failed_at[sid] - t
        lost = sum(1 for f in fault_ticks if t < f <= failed_at[sid])
        if sid in on_schedule:
            assert age >= timeout, (age, timeout)
        assert age <= bound + 2.5 * (1 + lost), (age, bound, lost)
