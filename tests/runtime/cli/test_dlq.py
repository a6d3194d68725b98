"""`ftlayer dlq list|show|requeue|purge` against the real server."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

import runtime.cli.confirm
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import owner_key
from ftlayer.records.frames import SemiDeserializedRecord, SemiDeserializedSerializer
from runtime.cli.main import main
from serialization.payload import unpack_payload
from serialization.serializers import make_record

TRACE = "Traceback (most recent call last):\n  File \"job.py\", line 3, in parse\nValueError: bad user"


def _dlq(capsys: Any, cfg: FTConfig, *args: str) -> tuple[int, str, str]:
    code = main(["dlq", *args, "--redis-url", cfg.redis_url, "--namespace", cfg.namespace])
    out, err = capsys.readouterr()
    return code, out, err


def _dead(cfg: FTConfig, source: str = "src", n: int = 3) -> tuple[FTLayer, list[SemiDeserializedRecord]]:
    """A source whose first n records were dead-lettered on their first failure."""
    layer = FTLayer(cfg.replace(max_replays=0), "topo", source, num_channels=2).open()
    recs = [make_record(layer, {"user": f"u{i}", "n": i}, key=f"u{i}") for i in range(n)]
    layer.persist(recs)
    layer.fail([recs[0].record_id.source_record_id], TRACE)
    layer.fail([r.record_id.source_record_id for r in recs[1:]], "FailRecord: empty")
    assert layer.replay_due().dead_lettered == n
    return layer, recs


def _entry_ids(layer: FTLayer) -> list[str]:
    return [d.entry_id for d in layer.dead_letters.list()]


def _entry_of(layer: FTLayer, rec: SemiDeserializedRecord) -> str:
    return next(d.entry_id for d in layer.dead_letters.list() if d.origin_id == rec.origin_id)


def _pending(layer: FTLayer) -> list[SemiDeserializedRecord]:
    ser = SemiDeserializedSerializer()
    return [ser.decode(frame) for _sid, frame in layer.persistence.iter_pending()]


def test_list_shows_every_dead_letter(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer, recs = _dead(ft_config)
    other, _ = _dead(ft_config, source="other", n=1)
    code, out, _ = _dlq(capsys, ft_config, "list")
    assert code == 0
    for eid in _entry_ids(layer) + _entry_ids(other):
        assert eid in out
    assert "Traceback (most recent call last):" in out and "FailRecord: empty" in out
    assert str(recs[0].record_id.source_record_id) in out and "topo/other" in out
    code, out, _ = _dlq(capsys, ft_config, "list", "--json", "--source", "src")
    doc = json.loads(out)
    assert code == 0 and doc["version"] == 1
    assert sorted(e["origin_id"] for e in doc["dead_letters"]) == sorted(r.origin_id for r in recs)
    assert {e["replay_count"] for e in doc["dead_letters"]} == {0}
    assert {e["reason"] for e in doc["dead_letters"] if e["origin_id"] == recs[0].origin_id} == {TRACE}
    code, out, _ = _dlq(capsys, ft_config, "list", "--limit", "1", "--source", "src")
    assert "showing 1 of 3" in out


def test_show_decodes_payload_and_full_reason(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer, recs = _dead(ft_config)
    eid = _entry_of(layer, recs[0])
    code, out, _ = _dlq(capsys, ft_config, "show", eid)
    assert code == 0
    assert "{'user': 'u0', 'n': 0}" in out and 'File "job.py", line 3' in out and "ValueError: bad user" in out
    assert str(recs[0].origin_id) in out and str(recs[0].key_hash) in out
    code, out, _ = _dlq(capsys, ft_config, "show", eid, "--json")
    doc = json.loads(out)
    assert doc["payload"] == {"user": "u0", "n": 0} and doc["reason"] == TRACE and doc["channel"] == recs[0].channel
    code, _, err = _dlq(capsys, ft_config, "show", "1-1")
    assert code == 1 and "no dead letter 1-1" in err
    code, _, err = _dlq(capsys, ft_config, "show", "not-an-id")
    assert code == 2 and "invalid dead-letter entry id" in err


def test_requeue_moves_a_dead_letter_back_with_replay_count_zero(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    layer, recs = _dead(ft_config)
    eid = _entry_of(layer, recs[1])
    code, out, _ = _dlq(capsys, ft_config, "requeue", eid)
    assert code == 0 and "requeued 1 of 1" in out
    assert eid not in _entry_ids(layer) and len(_entry_ids(layer)) == 2
    (back,) = _pending(layer)
    old = recs[1]
    assert back.origin_id == old.origin_id and back.payload == old.payload and back.key_hash == old.key_hash
    assert back.replay_count == 0 and back.channel == old.channel
    assert back.record_id.source_record_id != old.record_id.source_record_id
    assert unpack_payload(back.payload) == {"user": "u1", "n": 1}
    # it is in its channel stream, and acking it leaves nothing behind
    assert [r.origin_id for r in layer.persistence.read_channel(back.channel or 0).records()] == [old.origin_id]
    layer.ack({back.record_id.source_record_id: back.record_id.current_record_id})
    stats = layer.stats()
    assert stats["requeued"] == 1 and stats["acked"] == 1 and stats["pending"] == 0
    code, out, _ = _dlq(capsys, ft_config, "requeue", eid)
    assert code == 1 and "not in the dlq" in out


def test_requeue_all_needs_an_ftlayer_namespace_or_force(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    layer, _ = _dead(ft_config)
    redis_client.delete(owner_key(ft_config.namespace))
    code, _, err = _dlq(capsys, ft_config, "requeue", "--all")
    assert code == 2 and "--force" in err and "owner record" in err
    assert len(_entry_ids(layer)) == 3
    redis_client.set(owner_key(ft_config.namespace), json.dumps({"by": "someone-else"}))
    assert _dlq(capsys, ft_config, "requeue", "--all")[0] == 2
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all", "--force", "--yes")
    assert code == 0 and "requeued 3 of 3" in out
    assert _entry_ids(layer) == [] and layer.pending_count() == 3


def test_requeue_all_on_an_ftlayer_namespace(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer, recs = _dead(ft_config)
    ids = _entry_ids(layer)
    # a bulk action: it says what it would do and, without --yes or a terminal, does nothing (issue 31)
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all")
    assert code == 1 and all(i in out for i in ids) and "nothing requeued: pass --yes" in out
    assert _entry_ids(layer) == ids and layer.pending_count() == 0
    code, _, _ = _dlq(capsys, ft_config, "requeue", "--all", "--yes")
    assert code == 0 and _entry_ids(layer) == []
    assert sorted(r.origin_id for r in _pending(layer)) == sorted(r.origin_id for r in recs)
    code, _, err = _dlq(capsys, ft_config, "requeue")
    assert code == 2 and "either ENTRY_ID... or --all" in err


def test_purge_needs_yes(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer, _ = _dead(ft_config)
    ids = _entry_ids(layer)
    code, out, _ = _dlq(capsys, ft_config, "purge", ids[0])
    assert code == 1 and ids[0] in out and "nothing deleted" in out and _entry_ids(layer) == ids
    code, out, _ = _dlq(capsys, ft_config, "purge", "--all")
    assert code == 1 and all(i in out for i in ids) and _entry_ids(layer) == ids
    code, out, _ = _dlq(capsys, ft_config, "purge", ids[0], "--yes")
    assert code == 0 and "deleted 1" in out and _entry_ids(layer) == ids[1:]
    code, out, _ = _dlq(capsys, ft_config, "purge", "--all", "--yes")
    assert code == 0 and "deleted 2" in out and _entry_ids(layer) == []
    assert layer.stats()["pending"] == 0


def test_purge_interactive_confirmation(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, _ = _dead(ft_config)
    ids = _entry_ids(layer)
    monkeypatch.setattr(runtime.cli.confirm, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _prompt: "y")
    assert _dlq(capsys, ft_config, "purge", "--all")[0] == 1 and _entry_ids(layer) == ids
    monkeypatch.setattr("builtins.input", lambda _prompt: "yes")
    code, out, _ = _dlq(capsys, ft_config, "purge", "--all")
    assert code == 0 and "deleted 3" in out and _entry_ids(layer) == []


def test_purge_refuses_a_foreign_namespace_without_force(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    layer, _ = _dead(ft_config)
    ids = _entry_ids(layer)
    redis_client.delete(owner_key(ft_config.namespace))
    code, _, err = _dlq(capsys, ft_config, "purge", "--all", "--yes")
    assert code == 2 and "refusing to purge" in err and _entry_ids(layer) == ids
    code, _, _ = _dlq(capsys, ft_config, "purge", "--all", "--yes", "--force")
    assert code == 0 and _entry_ids(layer) == []


def test_single_source_commands_need_a_unique_source(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    layer, _ = _dead(ft_config)
    _dead(ft_config, source="other", n=1)
    eid = _entry_ids(layer)[0]
    code, _, err = _dlq(capsys, ft_config, "show", eid)
    assert code == 2 and "several sources" in err and "topo/other" in err
    assert _dlq(capsys, ft_config, "show", eid, "--source", "src")[0] == 0
    code, _, err = _dlq(capsys, ft_config, "show", eid, "--source", "nope")
    assert code == 2 and "no registered source" in err


def test_register_writes_the_owner_record_once(ft_config: FTConfig, redis_client: redis.Redis) -> None:
    FTLayer(ft_config, "topo", "a", num_channels=2).open()
    first = redis_client.get(owner_key(ft_config.namespace))
    assert first is not None and json.loads(first)["by"] == "ftlayer"
    FTLayer(ft_config, "topo", "b", num_channels=2).open()
    assert redis_client.get(owner_key(ft_config.namespace)) == first


def test_empty_dlq(ft_config: FTConfig, redis_client: redis.Redis, capsys: Any) -> None:
    layer = FTLayer(ft_config, "topo", "src", num_channels=2).open()
    layer.persist([make_record(layer, 1)])
    code, out, _ = _dlq(capsys, ft_config, "list")
    assert code == 0 and "no dead letters" in out
    assert _dlq(capsys, ft_config, "purge", "--all")[0] == 0


def test_a_sharded_source_lists_and_requeues_by_ids_that_name_their_shard(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    cfg = ft_config.replace(num_shards=4)
    layer, _recs = _dead(cfg, source="sharded", n=12)
    ids = [d.entry_id for d in layer.list_dead_letters()]
    assert len(ids) == 12 and all("@" in eid for eid in ids)
    code, out, _ = _dlq(capsys, ft_config, "list", "--source", "sharded", "--json")  # the CLI's config: 1 shard
    assert code == 0 and sorted(e["entry_id"] for e in json.loads(out)["dead_letters"]) == sorted(ids)
    code, out, _ = _dlq(capsys, ft_config, "show", ids[0], "--source", "sharded")
    assert code == 0 and str(layer.get_dead_letter(ids[0]).source_record_id) in out  # type: ignore[union-attr]
    code, out, _ = _dlq(capsys, ft_config, "requeue", ids[0], ids[1], "--source", "sharded")
    assert code == 0 and layer.dead_letter_count() == 10 and layer.pending_count() == 2


def test_the_one_source_commands_help_says_when_topology_and_source_are_needed(capsys: Any) -> None:
    """show, requeue and purge act on one source: their help must not promise 'default: all' (list does)."""
    from runtime.cli.main import main

    def help_of(*argv: str) -> str:
        with pytest.raises(SystemExit):
            main(["dlq", *argv, "--help"])
        return " ".join(capsys.readouterr().out.split())

    for sub in ("show", "requeue", "purge"):
        text = help_of(sub)
        assert "default: all" not in text, sub
        assert "needed when more than one registered source matches" in text, sub
    assert "only this source (default: all)" in help_of("list")
