"""`ftlayer status` shows what each source's ingest thread is doing, errors first of all."""

from __future__ import annotations

import json
from typing import Any

import redis

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.cli.main import main
from runtime.driver.ingest import Ingestor
from runtime.testing import Abort, Emit, ScriptedSource


def _status(capsys: Any, cfg: FTConfig, *extra: str) -> str:
    code = main(["status", "--redis-url", cfg.redis_url, "--namespace", cfg.namespace, "--interval", "0", *extra])
    out, _ = capsys.readouterr()
    assert code == 0
    return out


def test_status_reports_an_ingest_that_stopped_on_an_error(
    ft_config: FTConfig, redis_client: redis.Redis, capsys: Any
) -> None:
    broken = FTLayer(ft_config, "topo", "broken", num_channels=2).open()
    ended = FTLayer(ft_config, "topo", "fine", num_channels=2).open()
    Ingestor(broken, ScriptedSource([Emit(10), Abort(OSError("socket closed")), Emit(5)])).run()
    Ingestor(ended, range(7)).run()
    doc = json.loads(_status(capsys, ft_config, "--json"))
    by_name = {s["source"]: s for s in doc["sources"]}
    assert by_name["broken"]["ingest"]["state"] == "error"
    assert "OSError: socket closed" in by_name["broken"]["ingest"]["detail"]
    assert by_name["fine"]["ingest"]["state"] == "ended" and by_name["fine"]["ingest"]["detail"] == ""
    human = _status(capsys, ft_config)
    print(human)
    assert "ERROR: OSError: socket closed" in human
    assert "ended" in human
