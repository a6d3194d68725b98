"""``ftlayer ingest``: files, stdin, the webhook, workers sharing a file, kill -9 and resume (issues 16, 18).

Every run is the real CLI in a subprocess against the session's Redis server; the checks read
the persisted records back out of Redis (every channel, every frame decoded) and count them
against the lines the test wrote: what the source produced, not what ingest says it handed over.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.records.frames import SemiDeserializedSerializer
from runtime.driver.file_source import LinesSource, offset_file
from serialization.payload import pack_payload, unpack_payload

CHANNELS = 4


def _cli(*args: str, url: str, ns: str, env: dict[str, str] | None = None,
         **kw: Any) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "runtime.cli.main", "ingest", *args, "--redis-url", url, "--namespace", ns,
         "--num-channels", str(CHANNELS)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})}, **kw,
    )


def _run(*args: str, url: str, ns: str, **kw: Any) -> tuple[int, str]:
    proc = _cli(*args, url=url, ns=ns, **kw)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out + err


def _layer(url: str, ns: str) -> FTLayer:
    return FTLayer(FTConfig(redis_url=url, namespace=ns), "clicks", "events", num_channels=CHANNELS)


def _persisted_values(layer: FTLayer) -> list[Any]:
    serde = SemiDeserializedSerializer()
    values = []
    for ch in range(CHANNELS):
        for batch in layer.persistence.iter_channel(ch):
            values += [unpack_payload(serde.decode(f).payload) for f in batch.frames]
    return values


def _write(path: Path, start: int, stop: int) -> None:
    with path.open("a") as fh:
        for i in range(start, stop):
            fh.write(json.dumps({"i": i, "user": f"u{i % 7}"}) + "\n")


def test_file_ingest_persists_every_line_and_dead_letters_the_bad_ones(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f = tmp_path / "events.jsonl"
    _write(f, 0, 500)
    with f.open("a") as fh:
        fh.write("{not json\n\n")  # one bad line, one empty line (skipped)
        fh.write(json.dumps({"i": 500}) + "\n")  # no "user": its key selector fails
    rc, out = _run("clicks", "events", str(f), "--key", "user", "--offsets-dir", str(tmp_path / "off"),
                   url=redis_server_url, ns=namespace)
    assert rc == 0, out
    assert "persisted 500, dead-lettered 2" in out
    layer = _layer(redis_server_url, namespace)
    values = _persisted_values(layer)
    assert sorted(v["i"] for v in values) == list(range(500))
    reasons = sorted(d.reason for d in layer.list_dead_letters())
    assert len(reasons) == 2
    assert "KeyError" in reasons[0] or "KeyError" in reasons[1]
    # the reason says what is wrong with the line, and where (not that a stand-in value cannot be packed)
    assert any(r.startswith(f"ingest: not valid JSON: {f}:501: Expecting property name") for r in reasons), reasons


def test_a_schema_dead_letters_each_line_that_does_not_fit_at_ingest(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    """``FTLAYER_INGEST_SCHEMA`` (``--schema``): a line whose value does not fit is dead-lettered with the
    reason naming its column, never persisted; the others are, as without it."""
    f = tmp_path / "events.jsonl"
    _write(f, 0, 300)
    with f.open("a") as fh:
        fh.write(json.dumps({"i": "three hundred", "user": "u1"}) + "\n")  # a string in the bigint column
        fh.write(json.dumps({"user": "u2"}) + "\n")  # no i: null in a NOT NULL column
        fh.write(json.dumps({"i": 302, "user": "u3", "ts": "2026-11-27T18:00:00"}) + "\n")  # fits
    rc, out = _run("clicks", "events", str(f), "--key", "user", "--offsets-dir", str(tmp_path / "off"),
                   url=redis_server_url, ns=namespace,
                   env={"FTLAYER_INGEST_SCHEMA": "i bigint not null, user string, ts timestamp"})
    assert rc == 0, out
    assert "persisted 301, dead-lettered 2" in out, out
    layer = _layer(redis_server_url, namespace)
    assert sorted(v["i"] for v in _persisted_values(layer)) == [*range(300), 302]
    reasons = sorted(d.reason for d in layer.list_dead_letters())
    assert reasons[0].startswith("ingest: does not fit the schema: column 'i' (bigint): "), reasons
    assert reasons[1] == "ingest: does not fit the schema: column 'i' is not nullable and the value is missing"
    # the records that fit are kept as Arrow columns as well, for a query that reads with this schema
    assert all(p.columns is not None for p in _pages(layer))


def _pages(layer: Any) -> list[Any]:
    pages = [layer.read_channel(c).spans() for c in range(layer.num_channels)]
    return [p for p in pages if len(p.sids)]


def test_no_columns_checks_the_schema_and_keeps_no_columns(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f = tmp_path / "events.jsonl"
    _write(f, 0, 50)
    rc, out = _run("clicks", "events", str(f), "--schema", "i bigint, user string", "--no-columns",
                   url=redis_server_url, ns=namespace)
    assert rc == 0, out
    assert "persisted 50, dead-lettered 0" in out, out
    pages = _pages(_layer(redis_server_url, namespace))
    assert pages and all(p.columns is None for p in pages)


def test_text_lines_fit_a_schema_of_one_string_column(redis_server_url: str, namespace: str) -> None:
    proc = _cli("clicks", "events", "-", "--format", "text", "--schema", "line string not null",
                url=redis_server_url, ns=namespace, stdin=subprocess.PIPE)
    out, err = proc.communicate("alpha\nbeta\n", timeout=120)
    assert proc.returncode == 0, out + err
    assert "persisted 2, dead-lettered 0" in out, out
    assert sorted(_persisted_values(_layer(redis_server_url, namespace))) == ["alpha", "beta"]


@pytest.mark.parametrize("ddl", ["line string", "line binary not null"])
def test_text_lines_are_a_schema_of_one_string_or_binary_column(ddl: str) -> None:
    from runtime.cli.ingest import _schema_check

    check = _schema_check(ddl, True)  # every line fits (a str converts to binary as its UTF-8 bytes)
    assert check is not None and check([pack_payload("a line"), pack_payload("é")]) == {}


@pytest.mark.parametrize(("args", "error"), [
    (["--schema", "i lng"], "ftlayer: error: --schema: cannot read the schema 'i lng' at position 2: unknown or "
                            "unsupported type 'lng'"),
    (["--schema", "i long, user string", "--format", "text"], "ftlayer: error: --schema struct<i:bigint,user:string>: "
                                                              "--format text makes each record a string"),
    (["--schema", "n long", "--format", "text"], "ftlayer: error: --schema struct<n:bigint>: --format text"),
    (["--schema", "d decimal(39)"], "ftlayer: error: --schema: cannot read the schema 'd decimal(39)' at position 2: "
                                    "decimal(39, 0): the precision must be 1 to 38"),
    (["--no-columns"], "ftlayer: error: --no-columns (or FTLAYER_INGEST_NO_COLUMNS) says what to keep of the "
                       "records --schema checks"),
    (["--schema", "a int, a string"], "ftlayer: error: --schema: the schema struct<a:int,a:string> names the "
                                      "column 'a' twice"),
])
def test_a_schema_that_cannot_be_used_is_one_error_line_and_nothing_is_registered(
        args: list[str], error: str, tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f = tmp_path / "events.jsonl"
    _write(f, 0, 10)
    rc, out = _run("clicks", "events", str(f), *args, url=redis_server_url, ns=namespace)
    assert rc == 2, out
    assert out.startswith(error) and len(out.strip().splitlines()) == 1, out
    assert _layer(redis_server_url, namespace).recorded_channels() is None


@pytest.mark.slow
def test_a_second_run_reads_on_from_the_saved_offset(tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f, off = tmp_path / "events.jsonl", tmp_path / "off"
    _write(f, 0, 300)
    assert _run("clicks", "events", str(f), "--offsets-dir", str(off), url=redis_server_url, ns=namespace)[0] == 0
    _write(f, 300, 450)  # the file grew
    rc, out = _run("clicks", "events", str(f), "--offsets-dir", str(off), url=redis_server_url, ns=namespace)
    assert rc == 0, out
    assert "persisted 150," in out and "resumed" in out
    values = _persisted_values(_layer(redis_server_url, namespace))
    assert sorted(v["i"] for v in values) == list(range(450))  # each line once
    rc, out = _run("clicks", "events", str(f), "--offsets-dir", str(off), "--from-start",
                   url=redis_server_url, ns=namespace)
    assert rc == 0 and "persisted 450," in out, out


def test_stdin_text_lines(redis_server_url: str, namespace: str) -> None:
    proc = _cli("clicks", "events", "-", "--format", "text", url=redis_server_url, ns=namespace, stdin=subprocess.PIPE)
    out, err = proc.communicate("alpha\nbeta\n\ngamma\n", timeout=120)
    assert proc.returncode == 0, out + err
    assert sorted(_persisted_values(_layer(redis_server_url, namespace))) == ["alpha", "beta", "gamma"]


@pytest.mark.slow
def test_two_workers_share_a_file_without_overlap_or_gap(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f = tmp_path / "big.jsonl"
    _write(f, 0, 20_000)
    procs = [_cli("clicks", "events", str(f), "--key", "user", "--worker", f"{w}/2",
                  "--offsets-dir", str(tmp_path / "off"), url=redis_server_url, ns=namespace) for w in (0, 1)]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    ids = [v["i"] for v in _persisted_values(_layer(redis_server_url, namespace))]
    assert len(ids) == 20_000 and sorted(ids) == list(range(20_000))


@pytest.mark.slow
def test_one_of_two_ingest_processes_killed_and_restarted_loses_nothing(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    f, off = tmp_path / "big.jsonl", tmp_path / "off"
    n = 60_000
    _write(f, 0, n)
    slow = {"FTLAYER_INGEST_BATCH_RECORDS": "200"}  # many small persists: the kill lands mid-file
    args = ("clicks", "events", str(f), "--key", "user", "--offsets-dir", str(off))
    layer = _layer(redis_server_url, namespace)
    victim = _cli(*args, "--worker", "1/2", url=redis_server_url, ns=namespace, env=slow)
    other = _cli(*args, "--worker", "0/2", url=redis_server_url, ns=namespace, env=slow)
    deadline = time.monotonic() + 120
    victim_offsets = offset_file(off, str(f), (1, 2))
    # both conditions: the other worker alone may persist n/6 before the victim saved an offset
    while (layer.stats()["persisted"] < n // 6 or not victim_offsets.exists()) and time.monotonic() < deadline:
        assert victim.poll() is None, "the victim ended before it could be killed"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait(30)
    persisted_at_kill = layer.stats()["persisted"]
    assert persisted_at_kill < n
    saved = int(victim_offsets.read_text())
    assert 0 < saved < f.stat().st_size  # the victim stopped mid-file
    again = _cli(*args, "--worker", "1/2", url=redis_server_url, ns=namespace, env=slow)
    for p in (other, again):
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, out + err
    ids = [v["i"] for v in _persisted_values(layer)]
    assert set(ids) == set(range(n)), f"lost {len(set(range(n)) - set(ids))}"
    dupes = [i for i, c in collections.Counter(ids).items() if c > 1]
    assert all(i % 2 == 1 for i in dupes)  # only the killed worker's lines, and at most one batch
    assert len(dupes) <= 200, len(dupes)


@pytest.mark.slow
def test_webhook_ingest_answers_after_persisting_and_ends_on_sigterm(redis_server_url: str, namespace: str) -> None:
    proc = _cli("clicks", "events", "--webhook", "127.0.0.1:0", "--key", "user", url=redis_server_url, ns=namespace)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        url = line.split(" listening on ")[1].split(" ")[0]
        body = json.dumps([{"i": i, "user": "u"} for i in range(50)]).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "batch", data=body, method="POST"), timeout=30) as r:
            assert r.status == 200
        assert _layer(redis_server_url, namespace).stats()["persisted"] == 50  # persisted before the 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err
    assert "persisted 50," in out


@pytest.mark.slow
def test_webhook_ingest_with_a_schema_confirms_a_misfit_once_it_is_dead_lettered(
        redis_server_url: str, namespace: str) -> None:
    """The webhook answers 200 for a batch with a record that does not fit ``--schema``: that record is
    dead-lettered (safe, with its reason) before the answer, the others persisted."""
    proc = _cli("clicks", "events", "--webhook", "127.0.0.1:0", "--schema", "i long, user string",
                url=redis_server_url, ns=namespace)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split(" listening on ")[1].split(" ")[0]
        records: list[Any] = [{"i": i, "user": "u"} for i in range(20)]
        records[7] = {"i": [7], "user": "u"}
        body = json.dumps(records).encode()
        with urllib.request.urlopen(urllib.request.Request(url + "batch", data=body, method="POST"), timeout=30) as r:
            assert r.status == 200
        layer = _layer(redis_server_url, namespace)
        assert layer.stats()["persisted"] == 19 and layer.stats()["dead_lettered"] == 1  # both before the 200
        assert layer.list_dead_letters()[0].reason.startswith("ingest: does not fit the schema: column 'i' (bigint)")
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err


@pytest.mark.parametrize("args", [["--worker", "2/2", "f"], ["--worker", "x", "f"], [], ["f", "--webhook", "1"],
                                  ["--webhook", "99999"]])
def test_bad_arguments_end_in_one_error_line(args: list[str], redis_server_url: str, namespace: str) -> None:
    rc, out = _run("clicks", "events", *args, url=redis_server_url, ns=namespace)
    assert rc == 2, out
    assert "Traceback" not in out and "ftlayer: error:" in out


def test_a_file_it_cannot_read_is_one_error_line_and_nothing_is_registered(
        tmp_path: Path, redis_server_url: str, namespace: str) -> None:
    good = tmp_path / "events.jsonl"
    _write(good, 0, 10)
    for bad, why in [(tmp_path / "missing.jsonl", "No such file or directory"), (tmp_path, "Is a directory")]:
        rc, out = _run("clicks", "events", str(good), str(bad), url=redis_server_url, ns=namespace)
        assert rc == 2, out
        assert out.strip() == f"ftlayer: error: cannot read {bad}: {why}", out  # one line, no traceback
    # refused before Redis was touched: no source registered, so no ingest ERROR left in ftlayer status
    assert FTLayer(FTConfig(redis_url=redis_server_url, namespace=namespace), "clicks", "events",
                   num_channels=CHANNELS).recorded_channels() is None


def test_key_with_text_lines_is_refused_before_anything_is_persisted(redis_server_url: str, namespace: str) -> None:
    proc = _cli("clicks", "events", "-", "--format", "text", "--key", "user", url=redis_server_url, ns=namespace,
                stdin=subprocess.PIPE)
    out, err = proc.communicate("alpha\nbeta\n", timeout=120)
    assert proc.returncode == 2, out + err
    assert out == "" and err.startswith("ftlayer: error: --key user names a field of a JSON record"), err
    assert len(err.strip().splitlines()) == 1
    layer = _layer(redis_server_url, namespace)
    assert layer.recorded_channels() is None  # nothing registered, nothing dead-lettered


def test_worker_split_is_stable_across_a_resume(tmp_path: Path) -> None:
    f = tmp_path / "x.txt"
    f.write_text("".join(f"{i}\n" for i in range(10)))
    first = LinesSource([str(f)], fmt="text", worker=(1, 3), offsets_dir=tmp_path, chunk=2)
    got = list(first.poll() or [])
    first.ack(got)  # lines 1 and 4 persisted; the offset is saved past line 4
    first.close()
    rest = LinesSource([str(f)], fmt="text", worker=(1, 3), offsets_dir=tmp_path, chunk=100)
    assert got + list(rest.poll() or []) == ["1", "4", "7"]


@pytest.mark.parametrize("text", ["3/2", "1", "a/b", "0/0", "-1/2"])
def test_a_bad_worker_split_names_the_option_and_its_variable(text: str) -> None:
    from runtime.cli.common import CLIError
    from runtime.cli.ingest import parse_worker

    with pytest.raises(CLIError, match=r"--worker \(or FTLAYER_INGEST_WORKER\) .*expected I/N"):
        parse_worker(text)
    assert parse_worker("1/2") == (1, 2)
