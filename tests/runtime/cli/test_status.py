"""`ftlayer status` against the real server: figures, JSON, watch, age, env, secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import redis

import ftlayer.servers.process_server
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from ftlayer.status.read_model import Snapshot, SourceStatus, oldest_pending_age_ms
from runtime.cli.main import main
from runtime.cli.status import rates
from serialization.serializers import make_record

ROOT = Path(__file__).resolve().parents[3]


def _status(capsys: Any, url: str, ns: str, *extra: str) -> tuple[int, str, str]:
    code = main(["status", "--redis-url", url, "--namespace", ns, "--interval", "0", *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _busy_source(cfg: FTConfig) -> FTLayer:
    """A source with acked, explicitly failed, replayed, dead-lettered, waiting and pending records."""
    layer = FTLayer(cfg.replace(max_replays=1), "topo", "src", num_channels=2).open()
    recs = [make_record(layer, {"n": i}, key=f"k{i}") for i in range(8)]
    layer.persist(recs)
    sids = [r.record_id.source_record_id for r in recs]
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs[:3]})
    layer.fail(sids[3:5], "boom")
    assert layer.replay_due().replayed == 2
    pending_ids = [sid for sid, _frame in layer.persistence.iter_pending()]
    replayed_ids = [i for i in pending_ids if i not in sids]
    layer.fail(replayed_ids[:1], "boom again")
    assert layer.replay_due().dead_lettered == 1
    waiting = FTLayer(
        cfg.replace(replay_backoff_initial_s=3600.0, replay_backoff_max_s=3600.0), "topo", "src", num_channels=2
    )
    assert waiting.fail(sids[5:6], "later") == 1
    return layer


def test_status_json_matches_layer_stats(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer = _busy_source(ft_config)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json")
    assert code == 0
    doc = json.loads(out)
    stats = layer.stats()
    assert doc["namespace"] == ft_config.namespace and doc["version"] == 1
    (src,) = doc["sources"]
    assert (src["topology"], src["source"], src["num_channels"]) == ("topo", "src", 2)
    assert src["pending"] == stats["pending"] == 3
    assert src["failed_waiting"] == stats["failed_waiting"] == 1
    assert src["dead_letters"] == stats["dead_letters"] == 1
    assert src["bucket_gen"] == stats["gen"]
    for name in ("persisted", "acked", "failed_explicit", "failed_timeout", "replayed", "dead_lettered", "requeued"):
        assert src["counters"][name] == stats[name], name
    assert src["counters"]["failed"] == stats["failed_explicit"] + stats["failed_timeout"] == 4
    assert (stats["acked"], stats["replayed"], stats["dead_lettered"]) == (3, 2, 1)
    assert src["service"] == {"alive": False, "owner": None, "lease_ttl_s": None}
    assert doc["rate_window_s"] is None and set(src["rates_per_s"].values()) == {None}
    assert 0 <= src["oldest_pending_age_s"] < 30


def test_status_human_table_shows_figures_and_service(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    layer = _busy_source(ft_config)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace)
    assert code == 0
    state, counters = (line.split() for line in out.splitlines() if line.startswith("topo/src"))
    # pending, oldest, failed waiting, in dlq, bucket gen, channels, service
    assert state[1] == "3" and state[3:7] == ["1", "1", "0", "2"] and state[7] == "DOWN"
    # persisted, acked, failed (expl+timeout), replayed, dead-lettered, requeued
    assert counters[1:8] == ["8", "3", "4", "(4+0)", "2", "1", "0"]
    assert "  per second" in out
    assert layer.buckets.acquire_lease(30.0)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace)
    assert f"alive (owner {layer.buckets.owner}, lease " in out and "DOWN" not in out


def test_oldest_pending_age_follows_the_bucket_start_written_by_rotate(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    FTLayer(ft_config, "topo", "src", num_channels=2).open()  # registers gen 0 at the real time
    past = FTLayer(ft_config, "topo", "src", num_channels=2, clock=lambda: time.time() - 100)
    assert past.on_timeout().gen == 1  # gen 1 opened "100 s ago"
    past.persist([make_record(past, "x", key="a")])
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json")
    age = json.loads(out)["sources"][0]["oldest_pending_age_s"]
    assert code == 0 and 99 <= age < 130
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace)
    assert " 1m4" in out  # 1m40s .. 1m49s in the table


def test_gtime_keeps_only_the_live_generations(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    key = layer.store.keys.key("gtime")
    assert redis_client.hkeys(key) == [b"0"]
    for _ in range(10):
        layer.on_timeout()
    gens = sorted(int(g) for g in redis_client.hkeys(key))
    assert gens == list(range(10 - ft_config.num_buckets, 11))
    assert layer.leftovers() == []  # gtime is documented bookkeeping


def test_rotation_survives_a_failed_gtime_write(
    ft_config: FTConfig, redis_client: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    client = layer.store.client

    def broken(*_a: Any, **_k: Any) -> Any:
        raise redis.ConnectionError("gone")

    monkeypatch.setattr(client, "pipeline", broken)
    assert layer.on_timeout().rotated


def test_oldest_age_falls_back_to_an_older_known_bucket_start() -> None:
    assert oldest_pending_age_ms([], {0: 1}, 10) is None
    assert oldest_pending_age_ms([5, 7], {5: 1000, 7: 3000}, 4000) == 3000.0
    assert oldest_pending_age_ms([6], {5: 1000, 7: 3000}, 4000) == 3000.0  # gen 6 unknown: bound by gen 5
    assert oldest_pending_age_ms([4], {5: 1000}, 4000) is None


def test_rates_are_increases_per_second_between_samples() -> None:
    def snap(t: float, acked: int) -> Snapshot:
        counters = dict.fromkeys(("persisted", "acked", "failed", "replayed", "dead_lettered", "requeued"), 0)
        counters["acked"] = acked
        s = SourceStatus("t", "s", 2, 0, 0, 0, 0, None, counters, None, None)
        return Snapshot(int(t * 1000), t, [s])

    assert rates(snap(10.0, 100), snap(12.0, 300))["t/s"]["acked"] == 100.0
    assert rates(snap(10.0, 300), snap(12.0, 100))["t/s"]["acked"] is None  # counters were reset
    assert rates(None, snap(12.0, 100))["t/s"]["acked"] is None


def test_watch_refreshes_count_times_with_rates(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    _busy_source(ft_config)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json", "--watch", "0.05",
                           "--count", "3")
    docs = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(docs) == 3
    assert docs[0]["rate_window_s"] is None and docs[2]["rate_window_s"] > 0
    assert docs[2]["sources"][0]["rates_per_s"]["acked"] == 0.0
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--watch", "0.05", "--count", "2")
    assert code == 0 and out.count("ftlayer status:") == 2


def test_filters_and_unknown_namespace(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    FTLayer(ft_config, "topo", "a", num_channels=2).open()
    FTLayer(ft_config, "other", "b", num_channels=2).open()
    _, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json", "--topology", "other")
    assert [(s["topology"], s["source"]) for s in json.loads(out)["sources"]] == [("other", "b")]
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace + "x")
    assert code == 0 and "no sources registered" in out
    code, _, err = _status(capsys, ft_config.redis_url, ft_config.namespace, "--count", "2")
    assert code == 2 and "--count only applies to --watch" in err


def test_without_a_url_status_refuses_and_starts_no_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    for var in ("FTLAYER_REDIS_URL", "FTLAYER_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    before = ftlayer.servers.process_server._embedded
    assert main(["status", "--namespace", "x", "--interval", "0"]) == 2
    err = capsys.readouterr().err
    assert "--redis-url" in err and "FTLAYER_REDIS_URL" in err and err.startswith("ftlayer: error: ")
    assert ftlayer.servers.process_server._embedded is before


def test_status_json_as_a_subprocess_reads_env(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    layer = _busy_source(ft_config)
    env = {**os.environ, "FTLAYER_REDIS_URL": ft_config.redis_url, "FTLAYER_NAMESPACE": ft_config.namespace}
    env.pop("FTLAYER_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "runtime.cli.main", "status", "--json", "--interval", "0.2"],
        capture_output=True, text=True, timeout=60, env=env, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["namespace"] == ft_config.namespace and 0.1 < doc["rate_window_s"] < 5
    assert doc["sources"][0]["pending"] == layer.stats()["pending"]


def test_password_never_printed(capsys: Any) -> None:
    secret = "s3cret-Pw-4711"
    server = EmbeddedServer(password=secret).start()
    try:
        cfg = FTConfig(redis_url=server.url, namespace="pwtest")
        layer = FTLayer(cfg, "topo", "src", num_channels=2).open()
        layer.persist([make_record(layer, "x", key="a")])
        for extra in ((), ("--json",)):
            code, out, err = _status(capsys, server.url, "pwtest", *extra)
            assert code == 0 and secret not in out + err and "***" in out and "src" in out
        code, out, err = _status(capsys, server.url.replace(secret, secret + "-wrong"), "pwtest")
        assert code == 2 and secret not in out + err and "***" in err
        assert main(["dlq", "list", "--redis-url", server.url, "--namespace", "pwtest"]) == 0
        out, err = capsys.readouterr()
        assert secret not in out + err
    finally:
        server.stop()


def test_status_shows_the_sink_breaker_and_the_running_batches(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any,
) -> None:
    from ftlayer.acker.breaker import SinkBreaker

    layer = FTLayer(ft_config, "topo", "sinky", num_channels=2).open()
    now_ms = int(time.time() * 1000)
    layer.start_hold("batch7", now_ms + 60_000, now_ms - 5_000)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace)
    assert code == 0 and "SINK" in out and "1 batch running (5." in out
    SinkBreaker(layer.client, layer.keys).open("q-1", "ConnectionError: sink unreachable", now_ms, 30.0)
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace)
    assert code == 0 and "OPEN for" in out and "replays paused" in out and "sink unreachable" in out
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json")
    (src,) = json.loads(out)["sources"]
    assert src["sink_breaker"]["query"] == "q-1" and src["sink_breaker"]["failures"] == 1
    assert [b["tag"] for b in src["running_batches"]] == ["batch7"] and src["running_batches"][0]["running_s"] >= 5
    SinkBreaker(layer.client, layer.keys).close()
    layer.end_hold("batch7")
    code, out, _ = _status(capsys, ft_config.redis_url, ft_config.namespace, "--json")
    (src,) = json.loads(out)["sources"]
    assert src["sink_breaker"] is None and src["running_batches"] == []


def test_with_no_url_the_error_points_at_the_embedded_server_a_topology_here_runs(
    capsys: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The README's tour runs with no redis_url; `ftlayer status` beside it must say where its server is."""
    from ftlayer.servers.state_dir import TopologyState

    monkeypatch.chdir(tmp_path)
    for name in ("FTLAYER_REDIS_URL", "FTLAYER_STATE_DIR", "FTLAYER_EMBEDDED_DATA_DIR", "FTLAYER_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert main(["status"]) == 2
    bare = capsys.readouterr().err
    assert "no Redis URL configured" in bare and "redis/url" not in bare  # nothing here: no hint
    state = TopologyState.open(FTConfig(), "tour")
    try:
        server = state.embedded_server(FTConfig())  # what a tour run with the defaults starts
        FTLayer(FTConfig(redis_url=server.url), "tour", "events", num_channels=2).open()
        for argv, says in ((["status"], f"topology 'tour' is running (process {os.getpid()} holds .ftlayer/tour; "
                                        f"its server: {server.url})"),
                           (["ingest", "tour", "events", "-"], f".ftlayer/tour/redis/url says {server.url}")):
            assert main(argv) == 2
            err = capsys.readouterr().err
            assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
            assert says in err, err
        assert main(["status", "--redis-url", server.url, "--interval", "0"]) == 0
        assert "tour/events" in capsys.readouterr().out
    finally:
        state.close()
