"""What the MQTT tests share: reading back what was persisted, a self-signed certificate, and an
``ftlayer ingest --mqtt`` child process whose output is followed line by line (runtime.chaos.ingest_cli,
which the chaos scenarios use too)."""

from __future__ import annotations

import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedSerializer
from runtime.chaos.ingest_cli import CHANNELS, IngestProcess
from serialization.payload import unpack_payload

__all__ = ["CHANNELS", "IngestProcess", "loss_and_duplicates", "persisted", "persisted_ids", "self_signed"]


def persisted(layer: FTLayer) -> list[tuple[Any, int]]:
    """(value, key hash) of every record pending in ``layer`` (no query runs: every record persisted)."""
    serde = SemiDeserializedSerializer()
    out = []
    for _sid, frame in layer.iter_pending():
        rec = serde.decode(frame)
        out.append((unpack_payload(rec.payload), rec.key_hash))
    return out


def persisted_ids(layer: FTLayer) -> list[int]:
    return [int(v["i"]) for v, _h in persisted(layer)]


def loss_and_duplicates(confirmed: Iterable[int], ids: list[int]) -> tuple[list[int], int]:
    """(confirmed ids never persisted, records persisted more than once: their extra copies)."""
    seen = Counter(ids)
    return sorted(set(confirmed) - set(seen)), sum(n - 1 for n in seen.values())


def self_signed(tmp: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (PEM), made with openssl."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.fail("the 'openssl' command is needed to make a test certificate (apt-get install openssl)")
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "2", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=60,
    )
    return cert, key
