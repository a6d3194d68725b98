"""``ftlayer dlq``: filters by reason and age, --dry-run, and the confirmation of bulk requeues (issue 31),
against the real server."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import redis

import runtime.cli.confirm
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.main import main
from serialization.serializers import make_record

HOUR_S = 3600.0


def _dlq(capsys: Any, cfg: FTConfig, *args: str) -> tuple[int, str, str]:
    try:
        code = main(["dlq", *args, "--redis-url", cfg.redis_url, "--namespace", cfg.namespace])
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def _dead_letters(cfg: FTConfig, reasons: list[str], *, age_s: float = 0.0) -> FTLayer:
    """Source topo/src with one dead letter per reason, dead-lettered ``age_s`` ago (the layer's clock)."""
    layer = FTLayer(cfg.replace(max_replays=0), "topo", "src", num_channels=2,
                    clock=lambda: time.time() - age_s).open()
    recs = [make_record(layer, {"n": i}) for i in range(len(reasons))]
    layer.persist(recs)
    for rec, reason in zip(recs, reasons, strict=True):
        layer.fail([rec.record_id.source_record_id], reason)
    assert layer.replay_due().dead_lettered == len(reasons)
    return layer


def _ids(layer: FTLayer) -> list[str]:
    return [d.entry_id for d in layer.list_dead_letters(count=1000)]


@pytest.fixture
def mixed(ft_config: FTConfig, redis_client: redis.Redis) -> tuple[FTLayer, dict[str, str]]:
    """Two dead letters from 2 h ago (KeyError, FailRecord) and two fresh ones (KeyError, ValueError)."""
    _dead_letters(ft_config, ["in parse\nKeyError: 'user'", "FailRecord: empty"], age_s=2 * HOUR_S)
    layer = _dead_letters(ft_config, ["in parse\nkeyerror: 'id'", "ValueError: bad"])
    by_reason = {d.reason.splitlines()[-1]: d.entry_id for d in layer.list_dead_letters(count=10)}
    assert len(by_reason) == 4
    return layer, by_reason


Mixed = tuple[FTLayer, dict[str, str]]


def test_list_filters_by_reason_and_age(capsys: Any, ft_config: FTConfig, mixed: Mixed) -> None:
    _, ids = mixed

    def listed(*flt: str) -> set[str]:
        code, out, _ = _dlq(capsys, ft_config, "list", "-o", "json", *flt)
        assert code == 0
        return {e["entry_id"] for e in json.loads(out)["dead_letters"]}

    assert listed() == set(ids.values())
    assert listed("--reason", "KEYERROR") == {ids["KeyError: 'user'"], ids["keyerror: 'id'"]}  # case-insensitive
    assert listed("--older-than", "1h") == {ids["KeyError: 'user'"], ids["FailRecord: empty"]}
    assert listed("--newer-than", "30m") == {ids["keyerror: 'id'"], ids["ValueError: bad"]}
    assert listed("--reason", "keyerror", "--older-than", "90m") == {ids["KeyError: 'user'"]}
    assert listed("--reason", "nothing like it") == set()
    code, out, _ = _dlq(capsys, ft_config, "list", "-o", "json", "--reason", "error", "--limit", "1")
    doc = json.loads(out)
    assert len(doc["dead_letters"]) == 1 and doc["filters"]["reason"] == "error"
    assert doc["truncated"] == ["topo/src: showing 1 of 3 matching (raise --limit)"]
    code, out, _ = _dlq(capsys, ft_config, "list", "--reason", "nothing like it")
    assert code == 0 and "no dead letters matching (reason contains 'nothing like it')" in out
    code, _, err = _dlq(capsys, ft_config, "list", "--older-than", "soon")
    assert code == 2 and "invalid duration 'soon'" in err and err.startswith("usage: ftlayer dlq list")


def test_requeue_dry_run_changes_nothing(capsys: Any, ft_config: FTConfig, mixed: Mixed) -> None:
    layer, ids = mixed
    before = _ids(layer)
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all", "--reason", "keyerror", "--dry-run")
    assert code == 0 and "would requeue 2 dead letter(s) of topo/src (matching: reason contains 'keyerror')" in out
    assert ids["KeyError: 'user'"] in out and ids["ValueError: bad"] not in out and "dry run: nothing requeued" in out
    code, out, _ = _dlq(capsys, ft_config, "requeue", ids["ValueError: bad"], "1-1", "--dry-run")
    assert code == 1 and "not in the dlq of topo/src: 1-1" in out and "would requeue 1" in out
    assert _ids(layer) == before and layer.pending_count() == 0


def test_requeue_all_with_a_filter_takes_only_what_it_matches(
    capsys: Any, ft_config: FTConfig, mixed: tuple[FTLayer, dict[str, str]]
) -> None:
    layer, ids = mixed
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all", "--older-than", "1h")
    assert code == 1 and "nothing requeued: pass --yes" in out and layer.pending_count() == 0
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all", "--older-than", "1h", "--yes")
    assert code == 0 and "requeued 2 of 2" in out
    assert sorted(_ids(layer)) == sorted([ids["keyerror: 'id'"], ids["ValueError: bad"]])
    assert layer.pending_count() == 2


def test_requeue_all_asks_at_a_terminal(
    capsys: Any, ft_config: FTConfig, mixed: tuple[FTLayer, dict[str, str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    layer, _ = mixed
    monkeypatch.setattr(runtime.cli.confirm, "interactive", lambda: True)
    monkeypatch.setattr("builtins.input", lambda _prompt: "no")
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all")
    assert code == 1 and "nothing requeued" in out and len(_ids(layer)) == 4
    monkeypatch.setattr("builtins.input", lambda _prompt: "yes")
    code, out, _ = _dlq(capsys, ft_config, "requeue", "--all")
    assert code == 0 and "requeued 4 of 4" in out and _ids(layer) == []


def test_purge_dry_run_and_purge_by_filter(
    capsys: Any, ft_config: FTConfig, mixed: tuple[FTLayer, dict[str, str]]
) -> None:
    layer, ids = mixed
    code, out, _ = _dlq(capsys, ft_config, "purge", "--all", "--newer-than", "10m", "--dry-run")
    assert code == 0 and "would delete 2 dead letter(s)" in out and "dry run: nothing deleted" in out
    assert len(_ids(layer)) == 4
    code, out, _ = _dlq(capsys, ft_config, "purge", "--all", "--reason", "failrecord", "--yes")
    assert code == 0 and "deleted 1 dead letter(s)" in out
    assert ids["FailRecord: empty"] not in _ids(layer) and len(_ids(layer)) == 3


def test_filters_need_all(capsys: Any, ft_config: FTConfig, mixed: tuple[FTLayer, dict[str, str]]) -> None:
    _, ids = mixed
    code, _, err = _dlq(capsys, ft_config, "purge", ids["ValueError: bad"], "--reason", "x", "--yes")
    assert code == 2 and "use them with --all" in err
