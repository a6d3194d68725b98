"""What the MQTT tests share: reading back what was persisted, a self-signed certificate, and an
``ftlayer ingest --mqtt`` child process whose output is followed line by line."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from ftlayer.frames import SemiDeserializedSerializer
from ftlayer.layer import FTLayer
from serialization.payload import unpack_payload
from tests.waiting import wait_until

CHANNELS = 2


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


class IngestProcess:
    """``python -m runtime.cli.main ingest TOPOLOGY SOURCE --mqtt ...`` with its output collected as it comes."""

    def __init__(self, *args: str, redis_url: str, namespace: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runtime.cli.main", "ingest", *args, "--redis-url", redis_url,
             "--namespace", namespace, "--num-channels", str(CHANNELS)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, text: str, timeout_s: float = 60.0) -> None:
        """Until a line contains ``text``; fails the test if the process ends first or on the timeout."""
        def seen() -> bool:
            if any(text in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                self._reader.join(5)
                if not any(text in line for line in self.lines):
                    pytest.fail(f"ingest exited {self.proc.returncode} before printing {text!r}:\n{self.output}")
            return False

        wait_until(seen, timeout_s, f"ingest to print {text!r}")

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(5)

    def stop(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """SIGTERM, then wait for the exit; (exit status, output)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self._reader.join(5)
        return self.proc.returncode, self.output

    def run(self, timeout_s: float = 60.0) -> tuple[int, str]:
        """Wait for the process to end by itself; (exit status, output)."""
        self.proc.wait(timeout_s)
        self._reader.join(5)
        return self.proc.returncode, self.output
