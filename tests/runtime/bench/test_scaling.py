"""The scaling benchmark's measurement code on a real server, and its PNG plots.

No timing is asserted: the tests check counts, structure, plausible memory per
record, that the benchmark leaves no key behind, and that the plots are PNGs.
"""

from __future__ import annotations

import builtins
import io
import math
import struct
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from ftlayer.errors import ConfigError, FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from runtime.bench import scaling as bs
from runtime.bench.plot import MEMORY_PNG, THROUGHPUT_PNG, PlotDependencyError, plot_scaling

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SIZES = [200, 2000]


def _keys_under(url: str, prefix: str) -> list[bytes]:
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match=f"{prefix}*", count=1000))
    finally:
        client.close()


@pytest.fixture(scope="module")
def scaling_run(redis_server_url: str) -> dict[str, Any]:
    """One small run shared by the tests below, with its namespace prefix and progress output.

    ``pending_seen`` records, for each drain call, how many records were pending just
    before it and the keys under the prefix at that moment: proof that the figures
    were taken on a populated namespace that the cleanup then removed.
    """
    prefix = "tscale" + uuid.uuid4().hex[:8]
    seen: list[tuple[int, int]] = []
    real_ack = FTLayer.ack

    def watching_ack(self: FTLayer, current_ids: Any, *, token: str | None = None) -> Any:
        seen.append((self.pending_count(), len(_keys_under(redis_server_url, prefix))))
        return real_ack(self, current_ids, token=token)

    out = io.StringIO()
    mp = pytest.MonkeyPatch()
    mp.setattr(FTLayer, "ack", watching_ack)
    try:
        result = bs.bench_scaling(redis_server_url, SIZES, payload_bytes=32, sample=100, progress=out,
                                  namespace_prefix=prefix)
    finally:
        mp.undo()
    return {"result": result, "prefix": prefix, "progress": out.getvalue(), "seen": seen}


def test_structure_and_counts(scaling_run: dict[str, Any]) -> None:
    result = scaling_run["result"]
    assert result["sizes"] == SIZES
    assert result["payload_bytes"] == 32
    assert result["num_channels"] == 2
    assert isinstance(result["method"], str) and "MEMORY USAGE" in result["method"]
    assert [p["pending"] for p in result["points"]] == SIZES
    for point in result["points"]:
        n = point["pending"]
        assert point["acker_sample"] == min(100, n)
        for field in ("persist_per_s", "acker_updates_per_s", "drain_per_s"):
            assert math.isfinite(point[field]) and point[field] > 0, field
        # the rates are the counts over the timed seconds
        assert point["persist_per_s"] == pytest.approx(n / point["persist_s"])
        assert point["drain_per_s"] == pytest.approx(n / point["drain_s"])
        assert point["acker_updates_per_s"] == pytest.approx(2 * point["acker_sample"] / point["acker_s"])


def test_memory_per_record_is_plausible(scaling_run: dict[str, Any]) -> None:
    result = scaling_run["result"]
    payload = result["payload_bytes"]
    for point in result["points"]:
        n = point["pending"]
        # frame (payload + header) and ack value are stored per record: more than the payload,
        # and far below 2000 B unless the measurement counts something it should not
        assert payload < point["bytes_per_pending_record"] < 2000
        assert point["bytes_per_record_beyond_payload"] == pytest.approx(point["bytes_per_pending_record"] - payload)
        assert point["key_bytes"] == pytest.approx(point["bytes_per_pending_record"] * n)
        assert point["used_memory_per_record"] == pytest.approx(point["used_memory_bytes"] / n)
    big = result["points"][-1]
    # at 2000 records INFO used_memory growth is dominated by the records themselves
    assert payload < big["used_memory_per_record"] < 2000
    assert big["used_memory_bytes"] > 2000 * payload


def test_drain_starts_at_n_pending_and_namespaces_are_cleaned_up(
    scaling_run: dict[str, Any], redis_server_url: str
) -> None:
    seen = scaling_run["seen"]
    # one drain call per size here (sizes <= flush_batch_size), each at exactly N pending
    assert [pending for pending, _ in seen] == SIZES
    assert all(keys > 0 for _, keys in seen)  # the keys existed while measuring...
    assert _keys_under(redis_server_url, scaling_run["prefix"]) == []  # ...and are gone now


def test_progress_is_reported(scaling_run: dict[str, Any]) -> None:
    text = scaling_run["progress"]
    assert "[scaling]" in text
    assert "N=2,000: persist" in text and "drain" in text


def test_bad_arguments_are_refused(redis_server_url: str) -> None:
    with pytest.raises(ConfigError):
        bs.bench_scaling(redis_server_url, [], progress=False)
    with pytest.raises(ConfigError):
        bs.bench_scaling(redis_server_url, [0], progress=False)
    with pytest.raises(ConfigError):
        bs.bench_scaling(redis_server_url, [10], sample=0, progress=False)


def test_lost_records_are_reported_and_cleaned_up(redis_server_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """If the acker does not complete what it should, the bench fails and still deletes its keys."""
    prefix = "tscale" + uuid.uuid4().hex[:8]
    real_ack = FTLayer.ack

    def dropping_ack(self: Any, current_ids: Any, *, token: str | None = None) -> Any:
        # drop one record of each drain chunk: it stays pending
        return real_ack(self, dict(list(current_ids.items())[1:]), token=token)

    monkeypatch.setattr(FTLayer, "ack", dropping_ack)
    with pytest.raises(bs.ScalingBenchError, match="drain completed 49 of 50"):
        bs.bench_scaling(redis_server_url, [50], sample=10, progress=False, namespace_prefix=prefix)
    assert _keys_under(redis_server_url, prefix) == []


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, path
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_scaling_writes_two_pngs(scaling_run: dict[str, Any], tmp_path: Path) -> None:
    outdir = tmp_path / "plots"
    paths = plot_scaling(scaling_run["result"], outdir)
    assert [p.name for p in paths] == [THROUGHPUT_PNG, MEMORY_PNG]
    for path in paths:
        assert path.parent == outdir
        assert path.stat().st_size > 1000
        width, height = _png_size(path)
        assert width > 100 and height > 100


def test_plot_scaling_refuses_an_empty_result(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        plot_scaling({"points": []}, tmp_path)


def test_plot_scaling_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                         scaling_run: dict[str, Any]) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(PlotDependencyError, match="pip install matplotlib") as info:
        plot_scaling(scaling_run["result"], tmp_path)
    assert isinstance(info.value, FTLayerError)
    assert not list(tmp_path.iterdir())
