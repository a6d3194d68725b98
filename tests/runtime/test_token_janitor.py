"""The token janitor deletes the tokens of committed batches only (real server, no Spark session)."""

from __future__ import annotations

from pathlib import Path

from ftlayer.acker.flush_tokens import FlushToken, batch_key
from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.driver.token_janitor import TokenJanitor, last_committed_batch
from serialization.serializers import make_record


def _batches_with_tokens(layer: FTLayer, query: str) -> list[int]:
    prefix = layer.store.keys.token(batch_key(query, ""))
    return sorted(int(k.decode()[len(prefix):]) for k in layer.store.client.scan_iter(match=prefix + "*"))


def test_janitor_deletes_committed_batches_once_and_keeps_the_running_one(
    ft_config: FTConfig, redis_client: object, tmp_path: Path
) -> None:
    layer = FTLayer(ft_config, "topo", "src").open()
    rec = make_record(layer, "x")
    layer.persist([rec])
    sid = rec.record_id.source_record_id
    for batch in range(6):  # batches 0..4 of a driver that died, and the running batch 5
        layer.xor({sid: 1 << batch}, token=FlushToken(batch_key("q", batch), "st1/p0/s0"))
    janitor = TokenJanitor([layer], query_name="ftlayer-topo", checkpoint=str(tmp_path / "ckpt"))
    assert janitor.committed("q", 3) == 4  # first clean-up of this run finds 0..3 by SCAN
    assert _batches_with_tokens(layer, "q") == [4, 5]
    assert janitor.committed("q", 3) == 0
    assert janitor.committed("q", 4) == 1
    assert _batches_with_tokens(layer, "q") == [5]
    # at close, the checkpoint's commit log says batch 5 committed too
    (tmp_path / "ckpt" / "commits").mkdir(parents=True)
    for b in range(6):
        (tmp_path / "ckpt" / "commits" / str(b)).write_text("v1\n")
    (tmp_path / "ckpt" / "commits" / ".5.crc").write_text("")
    assert last_committed_batch(str(tmp_path / "ckpt")) == 5
    assert last_committed_batch("s3a://bucket/ckpt") is None
    janitor.query_id = "q"
    janitor.close()
    assert _batches_with_tokens(layer, "q") == []
