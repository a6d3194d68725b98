"""The Spark Connect pieces without Spark: telling sessions apart, batch tokens, the acking point's
Connect flow on stand-in sessions and a real Redis, the query id lookup, pickling, the server helper.

The end-to-end tests on a real Connect server are in ``test_connect.py``.
"""

from __future__ import annotations

import pickle
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from ftlayer.acker.batch_acks import batch_tags, token_tags
from ftlayer.config import FTConfig
from ftlayer.errors import ConfigError, ConnectServerError, FTLayerError, SparkConnectUnsupportedError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import token_batch_key
from runtime.dataframe import batch_context, session_state, sources
from runtime.dataframe.acking import acking, settle_batch
from runtime.driver.listener_removal import remove_listener
from runtime.spark.connect import batch_job_tag, check_server_reaches, is_connect, refuse_connect, token_from_job_tags
from runtime.spark.connect_server import SERVER_CLASS, LocalConnectServer
from serialization.serializers import make_record


class ConnectSession:
    """Stands in for pyspark.sql.connect.session.SparkSession (told apart by its class's module)."""

    __module__ = "pyspark.sql.connect.session"

    def __init__(self, session_id: str, host: str = "localhost", queries: list[Any] | None = None) -> None:
        self.session_id = session_id
        self.tags: set[str] = set()
        self.client = type("Client", (), {"host": host})()
        self.streams = type("Streams", (), {"active": queries or []})()

    def addTag(self, tag: str) -> None:
        self.tags.add(tag)

    def removeTag(self, tag: str) -> None:
        self.tags.discard(tag)


class ConnectFrame:
    __module__ = "pyspark.sql.connect.dataframe"

    def __init__(self, session: ConnectSession) -> None:
        self.sparkSession = session


class Query:
    def __init__(self, qid: str, active: bool, last: int | None, stateful: bool = False) -> None:
        self.id = qid
        self.status = {"message": "", "isDataAvailable": True, "isTriggerActive": active}
        self.lastProgress = None if last is None else {"batchId": last, "stateOperators": [{}] if stateful else []}


def _layer(cfg: FTConfig, n: int) -> tuple[FTLayer, list[int]]:
    layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
    records = [make_record(layer, i, key=f"k{i}") for i in range(n)]
    layer.persist(records)
    return layer, [r.record_id.source_record_id for r in records]


def _read_task(layer: FTLayer, session: ConnectSession, tag: str, sids: list[int]) -> None:
    """What a read task of the batch does on Spark Connect: file its ids under the token of its job tag."""
    token = next(t for t in (token_from_job_tags(tag) for tag in session.tags) if t)
    layer.record_batch_reads(tag, sids, None, token)


def test_the_batch_token_is_found_among_a_tasks_job_tags() -> None:
    token = "0123456789abcdef0123456789abcdef"
    tags = ("SparkConnect_OperationTag_User__Session_s1_Operation_o1,"
            f"SparkConnect_SessionTag_User_bob_Session_s1_Tag_{batch_job_tag(token)},spark-session-x-execution-root-id-1")
    assert token_from_job_tags(tags) == token
    assert token_from_job_tags(batch_job_tag(token)) == token  # a classic session's job tag is the tag itself
    assert token_from_job_tags(None) is None
    assert token_from_job_tags("") is None
    assert token_from_job_tags("SparkConnect_SessionTag_User__Session_s1_Tag_ftlayer-batch-nothex") is None
    assert token_from_job_tags(f"SparkConnect_SessionTag_User__Session_s1_Tag_x{batch_job_tag(token)}") is None


def test_connect_objects_are_told_by_their_module() -> None:
    session = ConnectSession("s1")
    assert is_connect(session) and is_connect(ConnectFrame(session))
    assert not is_connect(object()) and not is_connect(None)


def test_the_topology_api_refuses_a_connect_session_by_name() -> None:
    from ftlayer import JsonLinesSink, Topology

    refuse_connect(object(), "x", "y")  # a classic session passes
    topo = Topology("connect", FTConfig(redis_url="redis://127.0.0.1:1/0"))
    topo.source("events", [1, 2]).sink(JsonLinesSink("/nonexistent"))
    with pytest.raises(SparkConnectUnsupportedError, match=r"Topology\('connect'\)\.start needs a classic "
                       r"SparkSession .*Spark Connect session.*ftlayer\.read_stream") as info:
        topo.start(ConnectSession("s1"))
    assert isinstance(info.value, FTLayerError)


def test_an_embedded_server_is_refused_for_a_connect_server_on_another_host(tmp_path: Path) -> None:
    cfg = FTConfig(state_dir=str(tmp_path / "state"), namespace="remote")
    check_server_reaches(ConnectSession("s1", host="127.0.0.1"), cfg)
    check_server_reaches(ConnectSession("s1", host="spark.example.com"), cfg.replace(redis_url="redis://r:6379/0"))

    class Conf:
        def get(self, key: str, default: Any = None) -> Any:
            return "local[2]" if key == "spark.master" else default

        getAll: dict[str, str] = {}  # noqa: RUF012 - a Connect client's getAll is a property

    remote = ConnectSession("s1", host="spark.example.com")
    remote.conf = Conf()  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match=r"redis_url is empty but the Spark Connect server is 'spark.example.com'"):
        sources.source("remote", "events", config=cfg, spark=remote)
    assert not (tmp_path / "state").exists()  # no embedded server was started


def test_read_tasks_file_under_a_token_and_settling_the_tokens_tags_fails_them(ft_config: FTConfig) -> None:
    layer, sids = _layer(ft_config, 40)
    layer.record_batch_reads("tagA", sids[:30], None, "a" * 32)
    layer.record_batch_reads("tagA", sids[30:], None, "a" * 32)
    client = layer.store.client
    assert token_tags(client, ft_config.namespace, "a" * 32) == [("topo/src", "tagA")]
    assert batch_tags(client, ft_config.namespace, "q", 0) == []  # no query index without a query id
    assert client.pttl(token_batch_key(ft_config.namespace, "a" * 32)) > 0


def test_acking_on_connect_fails_what_the_batch_read_when_the_write_gives_up(ft_config: FTConfig) -> None:
    cfg = ft_config.replace(sink_retry_budget_s=0.0)
    layer, sids = _layer(cfg, 50)
    session = ConnectSession("cloned-1")
    seen: list[set[str]] = []

    def write(df: Any, batch_id: int) -> None:
        seen.append(set(df.sparkSession.tags))
        _read_task(layer, df.sparkSession, "tagB", sids)
        raise OSError("the sink is down")

    acking(write, config=cfg, on_error="replay")(ConnectFrame(session), 3)
    assert len(seen) == 1 and len(seen[0]) == 1  # the job tag was set while the function ran
    assert session.tags == set()  # and dropped after
    stats = layer.stats()
    assert stats["failed_explicit"] == 50 and stats["pending"] == 0
    assert list(layer.store.client.scan_iter(f"{cfg.namespace}:dfk:*")) == []  # the token index went too


def test_acking_on_connect_raises_when_it_cannot_tell_whether_the_plan_keeps_state(ft_config: FTConfig) -> None:
    cfg = ft_config.replace(sink_retry_budget_s=0.0)
    layer, sids = _layer(cfg, 10)

    def write(df: Any, batch_id: int) -> None:
        _read_task(layer, df.sparkSession, "tagC", sids)
        raise OSError("the sink is down")

    # no root session (not in a Connect server's worker): no query id, so the safe answer, stateful
    with pytest.raises(OSError, match="the sink is down"):
        acking(write, config=cfg)(ConnectFrame(ConnectSession("cloned-2")), 1)
    assert layer.stats()["failed_explicit"] == 0 and layer.pending_count() == 10  # re-run on restart


def test_acking_on_connect_finds_the_query_and_indexes_the_batch_for_the_commit_listener(
        ft_config: FTConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    layer, sids = _layer(ft_config, 20)
    root = ConnectSession("root", queries=[Query("q-other", active=False, last=6), Query("q-ours", True, 6)])
    monkeypatch.setattr(batch_context, "root_session", lambda rid: root if rid == "root" else None)
    found: list[str | None] = []

    def write(df: Any, batch_id: int) -> None:
        found.append(batch_context.current_query_id(df))
        _read_task(layer, df.sparkSession, "tagD", sids)

    fn = acking(write, config=ft_config)
    fn.root = "root"
    fn(ConnectFrame(ConnectSession("cloned-3")), 7)
    assert found == ["q-ours"]
    assert batch_tags(layer.store.client, ft_config.namespace, "q-ours", 7) == [("topo/src", "tagD")]
    assert settle_batch(ft_config, "q-ours", 7, "ack") == 20  # what the listener does once Spark committed
    assert layer.stats()["acked"] == 20


def test_the_query_id_is_told_only_when_one_query_can_be_running_the_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_context, "_queries", {})
    pick = batch_context._connect_query_id
    one = ConnectSession("root", queries=[Query("a", True, 4), Query("b", True, 9), Query("c", False, None)])
    assert pick(ConnectSession("s1"), one, 5) == "a"
    assert pick(ConnectSession("s1"), None, 99) == "a"  # kept for the cloned session (one query run)
    fresh = ConnectSession("root", queries=[Query("a", True, None), Query("b", True, None)])
    assert pick(ConnectSession("s2"), fresh, 0) is None  # two new queries: not told
    assert pick(ConnectSession("s3"), ConnectSession("root", queries=[Query("a", True, None)]), 12) == "a"
    assert pick(ConnectSession("s4"), None, 1) is None  # no root session to ask


def write_nothing(df: Any, batch_id: int) -> None:
    """A module-level foreachBatch function (picklable by reference)."""


def test_acking_takes_a_resolved_config_and_the_session_id_along_when_pickled(
        ft_config: FTConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    acking_module = sys.modules["runtime.dataframe.acking"]  # the package's name `acking` is the function
    monkeypatch.setattr(acking_module, "active_session", lambda: ConnectSession("user-session"))
    fn = pickle.loads(pickle.dumps(acking(write_nothing, config=ft_config)))
    assert fn.root == "user-session" and fn.config.redis_url == ft_config.redis_url
    monkeypatch.setattr(session_state, "_last", [])
    with pytest.raises(ConfigError, match="no ftlayer source was opened in this process"):
        pickle.dumps(acking(write_nothing))  # at foreachBatch(), in the user's process: not on the server


def test_the_connect_server_command_and_a_server_that_will_not_start(tmp_path: Path) -> None:
    server = LocalConnectServer(python_path=[tmp_path / "code"], conf={"spark.sql.shuffle.partitions": "2"},
                                log_path=tmp_path / "server.log", start_timeout_s=30)
    line = server.command_line()
    assert line[line.index("--class") + 1] == SERVER_CLASS
    assert "spark.sql.shuffle.partitions=2" in line and "spark.connect.grpc.binding.address=127.0.0.1" in line
    assert server._env()["PYTHONPATH"].split(":")[0] == str(tmp_path / "code")
    # this test is not marked spark: SPARK_HOME's spark-submit refuses (tests/conftest.py)
    with pytest.raises(ConnectServerError, match=r"exited with code 3 before it listened:\n.*not marked spark"):
        server.start()
    assert not server.alive


class _Bus:
    """pyspark 4.3's client-side StreamingQueryListenerBus, reduced to its removal deadlock: the last
    listener's removal joins the event thread under the lock that the thread needs to deliver the
    event that was on its way (a query's termination, right after ``query.stop()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listener_bus: list[Any] = []
        self._execution_thread: threading.Thread | None = None
        self._ended = threading.Event()
        self.delivered: list[str] = []
        self.stuck = False

    def append(self, listener: Any) -> None:
        with self._lock:
            self._listener_bus.append(listener)
            if len(self._listener_bus) == 1:
                self._execution_thread = threading.Thread(target=self._handler, daemon=True)
                self._execution_thread.start()

    def _handler(self) -> None:
        self._ended.wait()  # the server ends the stream, with one event still in flight
        with self._lock:  # post_to_all
            self.delivered += ["terminated" for _ in self._listener_bus]

    def remove(self, listener: Any) -> None:
        with self._lock:
            if listener not in self._listener_bus:
                return
            if len(self._listener_bus) == 1:
                self._ended.set()  # the removal command
                if self._execution_thread is not None:
                    self._execution_thread.join(2.0)  # pyspark waits for ever
                    self.stuck = self._execution_thread.is_alive()
                    self._execution_thread = None
            self._listener_bus.remove(listener)


class _Streams:
    def __init__(self) -> None:
        self._sqlb = _Bus()

    def addListener(self, listener: Any) -> None:
        self._sqlb.append(listener)

    def removeListener(self, listener: Any) -> None:
        self._sqlb.remove(listener)


def test_removing_the_last_listener_of_a_connect_session_does_not_deadlock() -> None:
    plain, safe = ConnectSession("a"), ConnectSession("b")
    for session in (plain, safe):
        session.streams = _Streams()  # type: ignore[assignment]
        session.streams.addListener("commit")
        session.streams.addListener("progress")
    plain.streams.removeListener("commit")
    plain.streams.removeListener("progress")
    assert plain.streams._sqlb.stuck  # what pyspark does: the event thread waits on the removal's lock
    thread = safe.streams._sqlb._execution_thread
    remove_listener(safe, "commit")
    assert thread is not None and thread.is_alive() and safe.streams._sqlb._listener_bus == ["progress"]
    remove_listener(safe, "progress", join_s=5.0)
    assert not safe.streams._sqlb.stuck and not thread.is_alive()
    assert safe.streams._sqlb._listener_bus == []
