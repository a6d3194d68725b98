"""The DataFrame path on a Spark Connect session: a real Connect server (a process of its own,
``conftest.connect_server``) and client programs of their own (``connect_app``), as a user runs them.

What each test shows:

- the README's DataFrame tour delivers every record once, acked (or dead-lettered by the rule the
  session's ``spark.ftlayer.*`` conf set), on the embedded server that the defaults give;
- ``map_in_pandas`` into the per-task ``acking_sink``: every record written or dead-lettered;
- a stateless ``foreachBatch`` write that gives up is replayed record by record while the query
  goes on: the acking point found its query and that it keeps no state;
- the commit listener (client side) acks a committed batch, from the index the acking point wrote;
- the chaos harness's ``batch-fails`` scenario on Connect: nothing lost, nothing leaked;
- the Topology API says clearly that it needs a classic session.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.servers.ports import free_port
from runtime.spark.connect_server import LocalConnectServer
from tests.runtime.connect.conftest import run_client

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def test_the_readme_tour_on_spark_connect(connect_server: LocalConnectServer, tmp_path: Path) -> None:
    n = 2000
    result = run_client(connect_server, "tour", tmp_path, "--records", str(n), "--metrics-port", str(free_port()))
    stats = result["stats"]
    poison = sum(1 for i in range(n) if i % 13 == 0)  # parse raises on /page/0, every time
    filtered = sum(1 for i in range(n) if i % 13 == 12)  # /page/12: filtered out, acked
    assert stats["persisted"] == n and stats["pending"] == 0 and stats["failed_timeout"] == 0, stats
    assert stats["acked"] == n - poison and stats["dead_lettered"] == poison, stats
    assert result["counted"] == n - poison - filtered  # each record in the counts once, replays included
    assert "/PAGE/0" not in result["sections"] and "/PAGE/12" not in result["sections"]
    # spark.ftlayer.* set on the Connect session: one replay, then the dead-letter queue
    assert result["max_replays"] == 1 and result["dead_replays"] == [1]
    assert result["dead_reasons"] == ["udf parse: ValueError: upstream said no"]
    # durable defaults: the embedded server on the topology's state directory, in the client's cwd
    assert result["redis_url"].startswith("redis://127.0.0.1:")
    assert (tmp_path / ".ftlayer" / "clicks" / "redis").is_dir()
    assert result["metrics"] and result["metrics"][0].endswith(f" {float(n - poison)}")


def test_map_in_pandas_into_the_acking_sink_on_spark_connect(connect_server: LocalConnectServer, tmp_path: Path,
                                                             ft_config: FTConfig) -> None:
    n = 800
    result = run_client(connect_server, "sink", tmp_path, "--records", str(n), "--redis-url", ft_config.redis_url,
                        "--namespace", ft_config.namespace)
    poison = {i for i in range(n) if i % 100 == 7}
    assert result["written"] == sorted(set(range(n)) - poison)
    assert result["stats"]["dead_lettered"] == len(poison) and result["stats"]["acked"] == n - len(poison)


def test_a_stateless_write_that_gives_up_replays_its_records_on_spark_connect(
        connect_server: LocalConnectServer, tmp_path: Path, ft_config: FTConfig) -> None:
    n = 800
    result = run_client(connect_server, "replay", tmp_path, "--records", str(n), "--redis-url", ft_config.redis_url,
                        "--namespace", ft_config.namespace)
    failed = set(result["failed"])
    assert failed, result  # one batch's write failed for good
    assert result["delivered"] == list(range(n))  # its records came back as replays; the query went on
    assert result["stats"]["replayed"] == len(failed) and result["stats"]["failed_explicit"] == len(failed)


def test_the_commit_listener_acks_a_committed_batch_on_spark_connect(
        connect_server: LocalConnectServer, tmp_path: Path, ft_config: FTConfig) -> None:
    n = 600
    result = run_client(connect_server, "listener", tmp_path, "--records", str(n), "--redis-url",
                        ft_config.redis_url, "--namespace", ft_config.namespace)
    assert result["delivered"] == n and result["batches"] == 1, result
    # after the once query ended: nothing but the listener acks (the FT source is not asked again)
    assert result["stats"]["acked"] == n and result["stats"]["pending"] == 0, result


def test_chaos_batch_fails_on_spark_connect(connect_server: LocalConnectServer, tmp_path: Path,
                                            ft_config: FTConfig) -> None:
    result = run_client(connect_server, "chaos", tmp_path, "--scenario", "batch-fails", "--records", "1200",
                        "--redis-url", ft_config.redis_url, "--namespace", ft_config.namespace,
                        "--workdir", str(tmp_path / "work"))
    print(result["summary"])
    assert result["lost"] == 0 and result["leaked"] == [], result["summary"]
    assert all(held for _, held in result["expectations"]), result["summary"]
    assert result["ok"] and result["delivered"] == 1200, result["summary"]


def test_the_topology_api_says_it_needs_a_classic_session(connect_server: LocalConnectServer, tmp_path: Path,
                                                          ft_config: FTConfig) -> None:
    result = run_client(connect_server, "topology", tmp_path, "--redis-url", ft_config.redis_url,
                        "--namespace", ft_config.namespace)
    assert result["error"] == "SparkConnectUnsupportedError" and "FTLayerError" in result["mro"], result
    assert "Topology('connect').start needs a classic SparkSession" in result["message"]
    assert "ftlayer.read_stream" in result["message"]  # and says what runs on Connect
