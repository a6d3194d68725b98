"""ftlayer's listeners get each event from the JVM in one Py4J call (runtime.driver.json_listener)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runtime.driver.json_listener import JsonEventListener

pytestmark = pytest.mark.spark


class _Recorder(JsonEventListener):
    def __init__(self) -> None:
        self.started: list[Any] = []
        self.progress: list[Any] = []
        self.terminated: list[Any] = []
        self.threads: set[int] = set()

    def onQueryStarted(self, event: Any) -> None:
        self.started.append(event)

    def onQueryProgress(self, event: Any) -> None:
        self.threads.add(threading.get_ident())
        self.progress.append(event.progress)

    def onQueryIdle(self, event: Any) -> None:
        return None

    def onQueryTerminated(self, event: Any) -> None:
        self.terminated.append(event)


class _CallCounter:
    """Counts Python -> JVM Py4J commands per thread (the gateway client's send_command)."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.original = client.send_command
        self.calls: dict[int, int] = {}

    def __enter__(self) -> _CallCounter:
        def counting(*args: Any, **kwargs: Any) -> Any:
            ident = threading.get_ident()
            self.calls[ident] = self.calls.get(ident, 0) + 1
            return self.original(*args, **kwargs)

        self.client.send_command = counting
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.send_command = self.original


def test_events_arrive_whole_in_one_call_each(spark: Any) -> None:
    from pyspark import SparkContext

    listener = _Recorder()
    spark.streams.addListener(listener)
    gateway: Any = SparkContext._gateway
    try:
        with _CallCounter(gateway._gateway_client) as counter:
            query = (spark.readStream.format("rate").option("rowsPerSecond", 200).load()
                     .writeStream.format("noop").queryName("json-listener-test")
                     .trigger(processingTime="200 milliseconds").start())
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and sum(p.numInputRows for p in listener.progress) < 100:
                time.sleep(0.1)
            query.stop()
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and not listener.terminated:
                time.sleep(0.05)
    finally:
        spark.streams.removeListener(listener)

    mine = [p for p in listener.progress if p.name == "json-listener-test"]
    assert len(mine) >= 2, "progress events reach the listener"
    assert [p.batchId for p in mine] == sorted(p.batchId for p in mine)
    assert all(str(p.id) == str(query.id) and p.sources and p.sink for p in mine)
    assert sum(p.numInputRows for p in mine) >= 100
    assert any(str(e.id) == str(query.id) and e.name == "json-listener-test" for e in listener.started)
    assert any(str(e.id) == str(query.id) for e in listener.terminated)
    # the conversion's own calls: PySpark's getter-by-getter path makes about 35 per progress event
    on_callback = sum(counter.calls.get(t, 0) for t in listener.threads)
    assert on_callback <= 2 * len(listener.progress) + 4, (on_callback, len(listener.progress))
