"""``ftlayer ingest --webhook`` with its issue-28 options: the real CLI in a child process, real HTTP, real Redis."""

from __future__ import annotations

import os
import re
import signal
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.cli.main import main
from runtime.driver.webhook_body import SIGNATURE_HEADER, sign
from tests.runtime.mqtt_support import CHANNELS, IngestProcess, persisted_ids, self_signed
from tests.runtime.webhook_support import Answer, Http, ndjson
from tests.waiting import wait_until


def _url(proc: IngestProcess) -> str:
    proc.wait_for("listening on")
    line = next(line for line in proc.lines if "listening on" in line)
    return line.split(" listening on ")[1].split(" ")[0]


def _layer(redis_url: str, namespace: str) -> FTLayer:
    return FTLayer(FTConfig(redis_url=redis_url, namespace=namespace), "clicks", "events", num_channels=CHANNELS)


@pytest.mark.slow
def test_token_from_the_environment_hmac_from_the_command_line(redis_server_url: str, namespace: str) -> None:
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", "--webhook-hmac-secret", "k3y",
                         redis_url=redis_server_url, namespace=namespace,
                         env={"FTLAYER_INGEST_WEBHOOK_TOKEN": "t0ken"})
    try:
        url = _url(proc)
        assert "Bearer token required" in proc.output and "HMAC signature required" in proc.output
        http = Http(url)
        body = ndjson([{"i": i} for i in range(7)]).encode()
        signed = {"Content-Type": "application/x-ndjson", SIGNATURE_HEADER: sign(b"k3y", body)}
        refused = http.call("POST", "batch", body, signed)  # no token
        taken = http.call("POST", "batch", body, {**signed, "Authorization": "Bearer t0ken"})
        ready = http.call("GET", "/readyz")
        http.close()
        assert (refused.status, taken.status, taken.doc) == (401, 200, {"accepted": 7})
        assert (ready.status, ready.doc) == (200, {"ready": True})  # Redis answered the PING
        assert sorted(persisted_ids(_layer(redis_server_url, namespace))) == list(range(7))
    finally:
        rc, out = proc.stop()
    assert rc == 0, out
    assert re.search(r"confirmed 7 records; requests answered 200: 1, 401: 1", out), out
    assert "t0ken" not in out and "k3y" not in out


@pytest.mark.slow
def test_tls_options(redis_server_url: str, namespace: str, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", "--webhook-tls-cert", str(cert),
                         redis_url=redis_server_url, namespace=namespace,
                         env={"FTLAYER_INGEST_WEBHOOK_TLS_KEY": str(key)})
    try:
        url = _url(proc)
        assert url.startswith("https://")
        http = Http(url, context=ssl.create_default_context(cafile=str(cert)))
        answers = [http.post("batch", [{"i": i} for i in range(k, k + 5)]).status for k in (0, 5)]
        http.close()
        assert answers == [200, 200]
    finally:
        rc, out = proc.stop()
    assert rc == 0, out


def _post_in_thread(url: str, value: Any) -> tuple[threading.Thread, list[Answer]]:
    answers: list[Answer] = []

    def post() -> None:
        http = Http(url, timeout_s=60)
        answers.append(http.post("batch", value))
        http.close()

    thread = threading.Thread(target=post, daemon=True)
    thread.start()
    return thread, answers


def _hold_in_backpressure(proc: IngestProcess) -> tuple[threading.Thread, list[Answer]]:
    """With FTLAYER_MAX_PENDING=3 and no query: 5 records persisted, then a request of 2 taken that ingest
    holds while it waits for room; the thread posting it, and where its answer goes."""
    url = _url(proc)
    http = Http(url)
    assert http.post("batch", [{"i": i} for i in range(5)]).status == 200  # now 5 pending >= 3
    held, answers = _post_in_thread(url, [{"i": 5}, {"i": 6}])  # taken, then ingest waits for room
    wait_until(lambda: "backpressure" in str(http.call("GET", "/readyz").doc), 30, "ingest to wait for room")
    http.close()
    return held, answers


@pytest.mark.slow
def test_sigterm_while_ingest_waits_for_room_persists_what_it_holds_and_exits_0(
        redis_server_url: str, namespace: str) -> None:
    """docs/operations.md: SIGTERM "stops taking requests, persists what was taken, and exits 0", also
    while ingest waits for room (max_pending records pending: no query reads the source)."""
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", redis_url=redis_server_url,
                         namespace=namespace, env={"FTLAYER_MAX_PENDING": "3"})
    try:
        held, answers = _hold_in_backpressure(proc)
        started = time.monotonic()
        rc, out = proc.stop(timeout_s=30)
        took = time.monotonic() - started
    finally:
        proc.stop()
    assert rc == 0 and took < 15, (rc, took, out)
    held.join(10)
    assert [(a.status, a.doc) for a in answers] == [(200, {"accepted": 2})]
    assert sorted(persisted_ids(_layer(redis_server_url, namespace))) == list(range(7))


@pytest.mark.slow
def test_sigterm_to_the_whole_process_group_still_answers_what_was_taken(redis_server_url: str, namespace: str) -> None:
    """docs/operations.md: the HTTP front ignores the SIGTERM that systemd's default KillMode (or a
    terminal, or ``docker stop`` of a shell) sends every process of the group, so the request held when
    it comes still gets its 200 from the front once ingest persisted it."""
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", redis_url=redis_server_url,
                         namespace=namespace, env={"FTLAYER_MAX_PENDING": "3"}, new_session=True)
    try:
        held, answers = _hold_in_backpressure(proc)
        rc, out = proc.stop(timeout_s=30, group=True)
    finally:
        proc.stop()
    assert rc == 0, out
    held.join(10)
    assert [(a.status, a.doc) for a in answers] == [(200, {"accepted": 2})]
    assert sorted(persisted_ids(_layer(redis_server_url, namespace))) == list(range(7))


def _front_pid(proc: IngestProcess, other_than: int | None = None) -> int:
    """The pid of the ingest process's HTTP front (a new one, if ``other_than``), once it runs."""
    found: list[int] = []

    def front() -> bool:
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, IndexError, ValueError):  # ended meanwhile
                continue
            pid = int(stat.parent.name)
            if ppid == proc.proc.pid and b"runtime.driver.webhook_front" in cmdline and pid != other_than:
                found.append(pid)
                return True
        return False

    wait_until(front, 30, "a webhook front process")
    return found[0]


@pytest.mark.slow
def test_a_front_that_keeps_dying_while_ingest_waits_for_room_ends_in_one_error_line(
        redis_server_url: str, namespace: str) -> None:
    """docs/sources.md: a front that ends more than 3 times within 60 s is not started again and ingest
    stops with the reason: also while ingest waits for room (no query reads the source), when it does
    not poll the source (it waited for ever, serving no port); exit 2, no traceback."""
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", redis_url=redis_server_url,
                         namespace=namespace, env={"FTLAYER_MAX_PENDING": "3"})
    try:
        url = _url(proc)
        http = Http(url)
        assert http.post("batch", [{"i": i} for i in range(5)]).status == 200  # now 5 pending >= 3
        http.close()
        errors: list[BaseException] = []

        def post() -> None:
            held = Http(url, timeout_s=60)
            try:
                held.post("batch", [{"i": 5}, {"i": 6}])
            except OSError as exc:  # its front killed: the connection reset
                errors.append(exc)
            finally:
                held.close()

        poster = threading.Thread(target=post, daemon=True)
        poster.start()  # taken, then ingest waits for room
        wait_until(lambda: "backpressure" in proc.output, 30, "ingest to wait for room")
        def serves() -> bool:
            probe = Http(url, timeout_s=10)
            try:
                return probe.call("GET", "/healthz").status == 200
            except OSError:
                return False
            finally:
                probe.close()

        pid = _front_pid(proc)
        for _ in range(3):
            os.kill(pid, signal.SIGKILL)
            pid = _front_pid(proc, other_than=pid)
            wait_until(serves, 30, "the new front to serve")
        os.kill(pid, signal.SIGKILL)  # the 4th end within the minute: not started again
        rc, out = proc.run(timeout_s=20)
        poster.join(10)
    finally:
        proc.stop()
    assert rc == 2, out
    assert f"ftlayer: error: ingest stopped: WebhookError: the webhook's HTTP process (pid {pid}) exited with " \
           "code -9; it ended 4 times within 60 s, so it is not started again" in out, out
    assert "Traceback" not in out, out
    assert len(errors) == 1


@pytest.mark.slow
def test_sigterm_while_redis_is_down_ends_with_exit_1_and_a_503(namespace: str, tmp_path: Path) -> None:
    """docs/operations.md: exit status 1 "if records read were not persisted (stopped while Redis was
    unreachable)"; the request whose records were not persisted is answered 503 (the client retries)."""
    server = EmbeddedServer(data_dir=tmp_path / "redis").start()
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", redis_url=server.url, namespace=namespace)
    try:
        url = _url(proc)
        wait_until(lambda: Http(url).call("GET", "/readyz").status == 200, 30, "the receiver to be ready")
        server.stop()
        held, answers = _post_in_thread(url, [{"i": 1}])
        wait_until(lambda: Http(url).call("GET", "/healthz").doc["paused"], 30, "ingest to pause for the outage")
        started = time.monotonic()
        rc, out = proc.stop(timeout_s=40)
        took = time.monotonic() - started
    finally:
        proc.stop()
        server.stop()
    assert rc == 1 and took < 25, (rc, took, out)
    assert "were not persisted" in out, out
    held.join(10)
    assert [a.status for a in answers] == [503]


@pytest.mark.parametrize(("args", "env", "says"), [
    (["f.jsonl", "--webhook-token", "x"], {}, "--webhook-token is a webhook option: it needs --webhook"),
    (["f.jsonl"], {"FTLAYER_INGEST_WEBHOOK_HMAC_SECRET": "x"}, "or unset FTLAYER_INGEST_WEBHOOK_HMAC_SECRET"),
    (["f.jsonl", "--max-body-bytes", "10"], {}, "--max-body-bytes is a webhook option"),
    (["--webhook", "0", "--webhook-tls-key", "k.pem"], {}, "--webhook-tls-key needs --webhook-tls-cert"),
    (["--webhook", "0", "--webhook-tls-cert", "/nonexistent.pem"], {}, "cannot load the TLS certificate"),
    (["--webhook", "0", "--max-body-bytes", "0"], {}, "invalid value '0'"),
])
def test_bad_webhook_options_end_in_one_error_line(
        args: list[str], env: dict[str, str], says: str, redis_server_url: str, namespace: str,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    try:
        rc = main(["ingest", "clicks", "events", *args, "--redis-url", redis_server_url, "--namespace", namespace])
    except SystemExit as exc:  # argparse's usage error
        rc = int(exc.code or 0)
    out = capsys.readouterr()
    assert rc == 2, out
    assert says in out.err and out.err.count("error:") == 1, out.err


@pytest.mark.parametrize(("args", "env", "says"), [
    ([], {"FTLAYER_INGEST_WEBHOOK_TOKEN": ""}, "--webhook-token is empty: give the credential, or unset "
                                               "FTLAYER_INGEST_WEBHOOK_TOKEN for none"),
    (["--webhook-hmac-secret", ""], {}, "--webhook-hmac-secret is empty: give the credential, or unset "
                                        "FTLAYER_INGEST_WEBHOOK_HMAC_SECRET for none"),
])
def test_an_empty_credential_is_refused_not_read_as_none(
        args: list[str], env: dict[str, str], says: str, redis_server_url: str, namespace: str) -> None:
    """An empty variable (a secret never filled in) must not start a receiver that takes every request:
    one error line, exit 2 (in a child process: a receiver that starts would run until its timeout)."""
    proc = IngestProcess("clicks", "events", "--webhook", "127.0.0.1:0", *args, redis_url=redis_server_url,
                         namespace=namespace, env=env)
    try:
        rc, out = proc.run(30)
    finally:
        proc.stop()
    assert rc == 2 and out.strip().splitlines() == [f"ftlayer: error: {says}"], out


@pytest.mark.parametrize(("args", "says"), [
    (["--webhook", "abc"], "--webhook 'abc': expected [HOST:]PORT"),
    (["--webhook", "0", "--webhook-tls-key", "k.pem"], "--webhook-tls-key needs --webhook-tls-cert"),
    (["--webhook", "0", "--webhook-tls-cert", "/nonexistent.pem"], "cannot load the TLS certificate"),
])
def test_bad_webhook_options_are_refused_before_redis_is_touched(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    """runtime/cli/ingest_webhook.py: options are checked before Redis is touched; with no Redis listening
    the error is the option's, not the unreachable server's."""
    rc = main(["ingest", "clicks", "events", *args, "--redis-url", "redis://127.0.0.1:1/0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert says in err and err.count("error:") == 1 and "Redis" not in err, err


@pytest.mark.parametrize(("args", "says"), [
    (["--webhook", "0", "--worker", "1/2"], "--worker is for FILE arguments"),
    (["--webhook", "0", "--from-start"], "--from-start is for FILE arguments"),
    (["--webhook", "0", "--offsets-dir", "/tmp/x"], "--offsets-dir is for FILE arguments"),
    (["--webhook", "0", "--format", "text"], "--format is for FILE arguments and --mqtt"),
    (["--mqtt", "mqtt://127.0.0.1:1", "--topic", "a", "--worker", "0/2"], "--worker is for FILE arguments"),
])
def test_file_options_with_a_receiver_are_refused_not_ignored(
        args: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["ingest", "clicks", "events", *args, "--redis-url", "redis://127.0.0.1:1/0"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert says in err and err.count("error:") == 1 and "Redis" not in err, err


def test_help_names_every_webhook_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["ingest", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, env in [("--webhook-token", "FTLAYER_INGEST_WEBHOOK_TOKEN"),
                      ("--webhook-hmac-secret", "FTLAYER_INGEST_WEBHOOK_HMAC_SECRET"),
                      ("--webhook-tls-cert", "FTLAYER_INGEST_WEBHOOK_TLS_CERT"),
                      ("--webhook-tls-key", "FTLAYER_INGEST_WEBHOOK_TLS_KEY"),
                      ("--max-body-bytes", "FTLAYER_INGEST_MAX_BODY_BYTES"),
                      ("--webhook-reply-timeout-s", "FTLAYER_INGEST_WEBHOOK_REPLY_TIMEOUT_S")]:
        assert flag in text and f"[env {env}]" in text
