"""``ftlayer sources list|describe|reset`` against the real server (issue 31)."""

from __future__ import annotations

import json
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import SourceKeys, owner_key, sources_key
from runtime.cli.main import main
from serialization.serializers import make_record


def _sources(capsys: Any, cfg: FTConfig, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["sources", *args, "--redis-url", cfg.redis_url, "--namespace", cfg.namespace])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err, out + err
    return code, out, err


def _source(cfg: FTConfig, name: str, *, pending: int = 0, dead: int = 0, shards: int = 1) -> FTLayer:
    """A source with ``pending`` records pending and ``dead`` dead letters (everything else acked)."""
    layer = FTLayer(cfg.replace(max_replays=0, num_shards=shards), "topo", name, num_channels=2).open()
    recs = [make_record(layer, {"n": i}, key=f"k{i}") for i in range(pending + dead + 3)]
    layer.persist(recs)
    layer.fail([r.record_id.source_record_id for r in recs[:dead]], "FailRecord: poison")
    layer.replay_due()
    layer.ack({r.record_id.source_record_id: r.record_id.current_record_id for r in recs[dead + pending:]})
    return layer


def _keys(client: redis.Redis, namespace: str) -> set[str]:
    return {k.decode() for k in client.scan_iter(match=f"{namespace}:*", count=1000)}


def test_list_shows_every_source_with_its_figures(capsys: Any, ft_config: FTConfig, redis_client: redis.Redis) -> None:
    _source(ft_config, "a", pending=2, dead=1)
    _source(ft_config, "b", shards=4)
    code, out, _ = _sources(capsys, ft_config, "list", "-o", "json")
    assert code == 0
    rows = {r["source"]: r for r in json.loads(out)["sources"]}
    assert (rows["a"]["pending"], rows["a"]["dead_letters"], rows["a"]["num_shards"]) == (2, 1, 1)
    assert (rows["b"]["pending"], rows["b"]["num_shards"], rows["b"]["num_channels"]) == (0, 4, 2)
    assert rows["a"]["format"] == 3 and rows["a"]["created_ms"] > 0 and rows["a"]["service_alive"] is False
    code, out, _ = _sources(capsys, ft_config, "list")
    assert code == 0 and "topo/a" in out and "topo/b" in out and "FAILED WAITING" in out
    code, out, _ = _sources(capsys, ft_config, "list", "--source", "b")
    assert "topo/a" not in out and "topo/b" in out


def test_describe_shows_meta_figures_keys_and_leftovers(
    capsys: Any, ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    _source(ft_config, "a", pending=2, dead=1)
    code, out, _ = _sources(capsys, ft_config, "describe", "topo", "a", "-o", "json")
    assert code == 0
    doc = json.loads(out)
    assert doc["meta"]["num_channels"] == "2" and doc["num_shards"] == 1
    assert doc["status"]["pending"] == 2 and doc["status"]["dead_letters"] == 1
    families = {f["family"]: f for f in doc["key_families"]}
    assert families["dlq"]["entries"] == 1 and families["dlq"]["type"] == "stream"
    assert families["ch"]["keys"] == 2 and "ck" in families and "meta" in families
    assert {k["name"] for k in doc["keys"]} == _keys(redis_client, ft_config.namespace) - {
        owner_key(ft_config.namespace), sources_key(ft_config.namespace)}
    assert all(k["bytes"] > 0 for k in doc["keys"]) and doc["total_bytes"] == sum(k["bytes"] for k in doc["keys"])
    assert "live" in doc["leftovers"]  # records still pending: not what a drained source holds
    code, out, _ = _sources(capsys, ft_config, "describe", "topo", "a")
    assert code == 0 and "dead letters       1" in out and "KEYS" in out and "stream" in out
    code, _, err = _sources(capsys, ft_config, "describe", "topo", "nope")
    assert code == 2 and "no source topo/nope registered" in err


def test_reset_refuses_while_records_are_pending_or_a_service_runs(
    capsys: Any, ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    layer = _source(ft_config, "a", pending=2)
    before = _keys(redis_client, ft_config.namespace)
    code, _, err = _sources(capsys, ft_config, "reset", "topo", "a", "--yes")
    assert code == 2 and "refusing to reset topo/a: 2 record(s) pending" in err and "--force" in err
    # a running query: an FT service holds the rotator lease
    drained = _source(ft_config, "b")
    redis_client.set(drained.keys.lease, "driver-1", px=30_000)
    code, _, err = _sources(capsys, ft_config, "reset", "topo", "b", "--yes")
    assert code == 2 and "an FT service holds the rotator lease (owner driver-1)" in err
    redis_client.delete(owner_key(ft_config.namespace))
    redis_client.delete(drained.keys.lease)
    code, _, err = _sources(capsys, ft_config, "reset", "topo", "b", "--yes")
    assert code == 2 and "has no ftlayer owner record" in err
    now = _keys(redis_client, ft_config.namespace)
    assert before <= now | {owner_key(ft_config.namespace)} and drained.keys.meta in now  # nothing deleted
    # --force deletes anyway, and says what it overrode
    code, out, _ = _sources(capsys, ft_config, "reset", "topo", "a", "--yes", "--force")
    assert code == 0 and "--force: deleting even though 2 record(s) pending" in out
    assert layer.pending_count() == 0


def test_reset_says_what_it_deletes_and_deletes_only_that_source(
    capsys: Any, ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    _source(ft_config, "a", dead=2)
    kept = _source(ft_config, "b", pending=1)
    ns = ft_config.namespace
    mine = {k for k in _keys(redis_client, ns) if "{topo/a}" in k}
    assert len(mine) > 5
    code, out, _ = _sources(capsys, ft_config, "reset", "topo", "a", "--dry-run")
    assert code == 0 and f"would delete source topo/a of namespace '{ns}'" in out
    assert f"{len(mine)} keys" in out and "dead letters 2 (all deleted)" in out and "dry run: nothing deleted" in out
    assert mine <= _keys(redis_client, ns)
    code, out, _ = _sources(capsys, ft_config, "reset", "topo", "a")  # not a terminal, no --yes
    assert code == 1 and "nothing deleted: pass --yes" in out and mine <= _keys(redis_client, ns)
    code, out, _ = _sources(capsys, ft_config, "reset", "topo", "a", "--yes")
    assert code == 0 and f"deleted {len(mine)} keys of topo/a" in out
    left = _keys(redis_client, ns)
    assert not any("{topo/a}" in k for k in left)
    assert redis_client.smembers(sources_key(ns)) == {b"topo/b"} and owner_key(ns) in left
    assert kept.pending_count() == 1
    # the same names start from nothing
    again = FTLayer(ft_config, "topo", "a", num_channels=4).open()
    assert again.stats()["persisted"] == 0 and again.dead_letter_count() == 0 and again.recorded_channels() == 4


def test_reset_of_a_sharded_source_deletes_every_shard(
    capsys: Any, ft_config: FTConfig, redis_client: redis.Redis
) -> None:
    layer = _source(ft_config, "s", dead=3, shards=4)
    tags = {SourceKeys(ft_config.namespace, "topo", "s", k, 4).prefix for k in range(4)}
    assert len(tags) == 4
    assert layer.dead_letter_count() == 3
    # the source's own keys besides meta (the sink breaker) live under its own tag, not a shard's
    breaker = SourceKeys(ft_config.namespace, "topo", "s", 0, 4).breaker
    redis_client.hset(breaker, mapping={"query": "q", "since_ms": 1, "until_ms": 2, "failures": 1, "error": "x"})
    code, out, _ = _sources(capsys, ft_config, "describe", "topo", "s", "-o", "json")
    assert breaker in {k["name"] for k in json.loads(out)["keys"]}
    code, _, _ = _sources(capsys, ft_config, "reset", "topo", "s", "--yes")
    assert code == 0
    assert not [k for k in _keys(redis_client, ft_config.namespace) if any(k.startswith(t) for t in tags)
                or "{topo/s}" in k]
