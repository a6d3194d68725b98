"""The webhook receiver's HTTP front in a process of its own (runtime.driver.webhook_link), for real:
a real front process, real HTTP connections, ingest into a real Redis, and real signals.

What is checked: the HTTP side is another process and every decision about records stays in this
one (health, readiness and the counters are this process's); a value msgpack cannot carry reaches
ingest unchanged; a killed front is started again on its port (its records not yet polled taken
back), and one that keeps dying stops ingest with the reason; a killed ingest process takes its
front (and the port) with it; SIGTERM and SIGINT leave the front to its ingest process; the
``front`` option and TLS contexts.
"""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.driver import webhook
from runtime.driver.webhook import WebhookSource, tls_context
from runtime.driver.webhook_body import WebhookError
from tests.runtime.mqtt_support import persisted_ids, self_signed
from tests.runtime.webhook_support import Answer, Http, receiving
from tests.waiting import wait_until


def _layer(config: FTConfig, source: str) -> FTLayer:
    return FTLayer(config, "front", source, num_channels=2).open()


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


def _gone(pid: int) -> bool:
    """The process ended (reaped, or a zombie nobody reaped yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_the_http_side_is_its_own_process_and_this_one_decides(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "own")
    with receiving(layer) as (hooks, _ing):
        pid = hooks.front_pid
        assert pid is not None and pid != os.getpid()
        assert "runtime.driver.webhook_front" in _cmdline(pid)
        http = Http(hooks.url)
        answers = [http.post("batch", [{"i": i} for i in range(10)]), http.post("", {"i": 10}),
                   http.post("batch", {"i": 11})]  # not an array: 400 from the front
        health = http.call("GET", "/healthz")
        http.close()
        assert [a.status for a in answers] == [200, 200, 400]
        assert answers[2].error.startswith("a batch body must be a JSON array")
        # counted here, before the front wrote the 200s; the front's own 400 comes over the link
        assert hooks.confirmed == 11
        wait_until(lambda: hooks.answers == {200: 2, 400: 1}, 10, "the front's count of its 400")
        assert health.status == 200 and health.doc["confirmed"] == 11  # this process's counters
    assert sorted(persisted_ids(layer)) == list(range(11))


def test_a_value_msgpack_cannot_carry_reaches_ingest_unchanged() -> None:
    values: list[Any] = [{"big": 2**70, "i": 0}, {"s": "\ud800", "i": 1}, {"deep": 1, "i": 2}]
    hooks = WebhookSource()
    try:
        out: list[Answer] = []

        def post() -> None:
            http = Http(hooks.url, timeout_s=30)
            out.append(http.post("batch", values))
            http.close()

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        wait_until(lambda: hooks.health()["queued"] == 3, 10, "the request to be queued")
        polled = hooks.poll()
        assert polled == values  # the integer beyond 64 bits and the lone surrogate survived the link
        assert polled is not None
        hooks.ack(list(polled))
        poster.join(10)
        assert [(a.status, a.doc) for a in out] == [(200, {"accepted": 3})]
    finally:
        hooks.close()


def _five_then_kill_the_front(hooks: WebhookSource) -> None:
    """Records 0-4 confirmed; the front SIGKILLed; a new one started (another pid)."""
    http = Http(hooks.url)
    assert http.post("batch", [{"i": i} for i in range(5)]).status == 200
    http.close()
    first = hooks.front_pid
    assert first is not None
    os.kill(first, signal.SIGKILL)
    wait_until(lambda: hooks.front_pid not in (None, first), 30, "a new front process")


def test_a_killed_front_is_started_again_on_the_same_port(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "restarted")
    with receiving(layer) as (hooks, ing):
        _five_then_kill_the_front(hooks)
        http = Http(hooks.url)  # the same URL: the same port
        assert http.post("batch", [{"i": i} for i in range(5, 8)]).status == 200
        http.close()
        assert ing.error is None and not ing.done
    assert sorted(persisted_ids(layer)) == list(range(8))


def test_a_front_that_keeps_dying_stops_ingest_with_the_reason(ft_config: FTConfig,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "FRONT_RESTARTS", 1)
    layer = _layer(ft_config, "dying")
    with receiving(layer) as (hooks, ing):
        _five_then_kill_the_front(hooks)
        second = hooks.front_pid
        assert second is not None
        os.kill(second, signal.SIGKILL)  # the second end within the minute: not started again
        wait_until(lambda: ing.done, 30, "ingest to stop")
        assert isinstance(ing.error, WebhookError)
        assert f"(pid {second}) exited with code -9; it ended 2 times within 60 s" in str(ing.error)
        assert _gone(second) and hooks.front_pid in (None, second)  # not replaced
    assert sorted(persisted_ids(layer)) == list(range(5))


def _fronts() -> set[int]:
    """The webhook front processes this process started (from any of its threads)."""
    out: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            children = (task / "children").read_text().split()
        except OSError:  # the thread ended meanwhile
            continue
        out.update(int(c) for c in children if "runtime.driver.webhook_front" in _cmdline(int(c)))
    return out


def test_a_front_killed_while_it_starts_is_one_more_end_and_started_again() -> None:
    """A new front that dies before it serves (its link reset with the config unread) was the end of the
    restarts ("starting a new one failed: ConnectionResetError") after 2 ends, not 4."""
    hooks = WebhookSource()
    try:
        first = hooks.front_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        starting: list[int] = []
        wait_until(lambda: starting.extend(_fronts() - {first}) or starting, 10, "a new front process", 0.002)
        os.kill(starting[0], signal.SIGKILL)  # within its start (an interpreter and aiohttp's import)
        wait_until(lambda: hooks.front_pid not in (None, first, starting[0]), 30, "a third front process")
        assert hooks.front_failure is None
        http = Http(hooks.url, timeout_s=30)
        answers: list[Answer] = []
        poster = threading.Thread(target=lambda: answers.append(http.post("batch", [{"i": 1}])), daemon=True)
        poster.start()
        wait_until(lambda: hooks.health()["queued"] == 1, 10, "the request to be queued")
        polled = hooks.poll()
        assert polled == [{"i": 1}]
        hooks.ack(list(polled))
        poster.join(10)
        http.close()
        assert [(a.status, a.doc) for a in answers] == [(200, {"accepted": 1})]
    finally:
        hooks.close()


def test_a_front_that_cannot_load_the_certificate_names_it_without_a_traceback(
        tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The front loads the TLS files again at each start: a certificate replaced by a bad one (a rotation
    gone wrong) is named in the reason ingest stops with, and the front prints no traceback."""
    monkeypatch.setattr(webhook, "FRONT_RESTARTS", 1)
    cert, key = self_signed(tmp_path)
    hooks = WebhookSource(tls=tls_context(str(cert), str(key)))
    try:
        first = hooks.front_pid
        assert first is not None
        cert.write_text("not a certificate\n")
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: hooks.front_failure is not None, 60, "the front to be given up")
        why = str(hooks.front_failure)
        assert f"cannot load the TLS certificate {cert} and key {key}" in why, why
        assert "exited with code 2 before serving: cannot load" in why, why
        assert why.endswith("it ended 2 times within 60 s, so it is not started again"), why
    finally:
        hooks.close()
    assert "Traceback" not in capfd.readouterr().err


def test_open_after_close_gives_a_front_given_up_its_restarts_anew(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(webhook, "FRONT_RESTARTS", 1)
    hooks = WebhookSource()
    try:
        first = hooks.front_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: hooks.front_pid not in (None, first), 30, "a second front process")
        second = hooks.front_pid
        assert second is not None
        os.kill(second, signal.SIGKILL)  # the second end within the minute: given up
        wait_until(lambda: hooks.front_failure is not None, 30, "the front to be given up")
        hooks.close()
        hooks.open()  # a restarted topology
        assert hooks.front_failure is None
        pid = hooks.front_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)  # its first end: started again, not given up
        wait_until(lambda: hooks.front_pid not in (None, pid), 30, "a new front process")
        assert hooks.front_failure is None
    finally:
        hooks.close()


def test_a_front_that_cannot_start_and_has_nobody_to_tell_exits_2_quietly(tmp_path: Path) -> None:
    """Its ingest process gone (the link closed) while it fails to load the TLS files: no traceback."""
    import msgpack

    bad = tmp_path / "cert.pem"
    bad.write_text("not a certificate\n")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    config = {"path": "/", "max_body_bytes": 1000, "token": None, "hmac_secret": None, "reply_timeout_s": 1.0,
              "retry_after_s": 1, "tls": [str(bad), None]}
    ours.sendall(msgpack.packb(("config", config)))
    ours.close()  # gone before the front could say why
    front = subprocess.run([sys.executable, "-m", "runtime.driver.webhook_front", str(theirs.fileno()),
                            str(listener.fileno())], check=False, pass_fds=(theirs.fileno(), listener.fileno()),
                           capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[3])
    theirs.close()
    listener.close()
    assert (front.returncode, front.stderr) == (2, "")


OWNER = textwrap.dedent("""
    import sys, time
    from runtime.driver.webhook import WebhookSource
    hooks = WebhookSource()
    print(hooks.port, hooks.front_pid, flush=True)
    time.sleep(600)
""")


def test_a_killed_ingest_process_takes_its_front_and_port_with_it() -> None:
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    try:
        assert owner.stdout is not None
        port, pid = map(int, owner.stdout.readline().split())
        with socket.create_connection(("127.0.0.1", port), timeout=10):
            pass  # served
        owner.kill()
        owner.wait(10)
        wait_until(lambda: _gone(pid), 10, "the front process to end with its ingest process")

        def refused() -> bool:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
            except ConnectionRefusedError:
                return True
            return False

        wait_until(refused, 10, "the port to close")
    finally:
        owner.kill()
        owner.wait(10)


def test_healthz_is_503_while_the_ingest_process_does_not_answer() -> None:
    """A stopped (or wedged) ingest process: the front still serves, but a liveness probe must not see
    the receiver alive."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER], stdout=subprocess.PIPE, text=True,
                             cwd=Path(__file__).resolve().parents[3])
    try:
        assert owner.stdout is not None
        port, _pid = map(int, owner.stdout.readline().split())
        http = Http(f"http://127.0.0.1:{port}/", timeout_s=30)
        assert http.call("GET", "/healthz").status == 200
        owner.send_signal(signal.SIGSTOP)
        try:
            health = http.call("GET", "/healthz")
        finally:
            owner.send_signal(signal.SIGCONT)
        assert (health.status, health.doc) == (503, {"ok": False, "why": "the ingest process did not answer "
                                                                         "within 3 s"})
        assert http.call("GET", "/healthz").status == 200  # it answers again
        http.close()
    finally:
        owner.kill()
        owner.wait(10)


def test_sigterm_and_sigint_leave_the_front_to_its_ingest_process(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "signals")
    with receiving(layer) as (hooks, _ing):
        pid = hooks.front_pid
        assert pid is not None
        os.kill(pid, signal.SIGTERM)  # what systemd or a terminal sends the whole process group
        os.kill(pid, signal.SIGINT)
        http = Http(hooks.url)
        assert http.post("batch", [{"i": 0}, {"i": 1}]).status == 200
        http.close()
        assert not _gone(pid)
    assert sorted(persisted_ids(layer)) == [0, 1]


def test_readyz_runs_the_ready_check_in_the_ingest_process(ft_config: FTConfig) -> None:
    ran_in: list[int] = []

    def check() -> None:
        ran_in.append(os.getpid())
        msg = "redis is gone"
        raise RuntimeError(msg)

    layer = _layer(ft_config, "ready")
    with receiving(layer, ready_check=check) as (hooks, _ing):
        http = Http(hooks.url)
        ready = http.call("GET", "/readyz")
        http.close()
        assert (ready.status, ready.doc) == (503, {"ready": False, "why": "the ready check failed: RuntimeError: "
                                                                          "redis is gone"})
        assert hooks.front_pid is not None and ran_in and set(ran_in) == {os.getpid()}


def test_the_front_option(tmp_path: Path) -> None:
    with pytest.raises(WebhookError, match="front must be one of auto, process, thread"):
        WebhookSource(front="fork")
    cert, key = self_signed(tmp_path)
    own = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)  # a context tls_context() did not build
    own.load_cert_chain(str(cert), str(key))
    with pytest.raises(WebhookError, match=r"build it with tls_context\(cert, key\) and change nothing, or use "
                                           r"front='thread'"):
        WebhookSource(tls=own, front="process")
    for tls, in_process in ((own, False), (tls_context(str(cert), str(key)), True)):
        hooks = WebhookSource(tls=tls)  # auto: a front process unless the context cannot be passed on
        try:
            assert (hooks.front_pid is not None) == in_process
            assert hooks.front_process == in_process
            with socket.create_connection(("127.0.0.1", hooks.port), timeout=10) as raw:
                client = ssl.create_default_context(cafile=str(cert))
                with client.wrap_socket(raw, server_hostname="127.0.0.1") as tls_sock:
                    assert tls_sock.version() is not None  # the TLS handshake went through
        finally:
            hooks.close()
    hooks = WebhookSource(front="thread")
    try:
        assert hooks.front_pid is None
    finally:
        hooks.close()


def test_a_tls_context_changed_after_tls_context_keeps_its_settings(tmp_path: Path) -> None:
    """Client certificates required on a context tls_context() built: the front process could only load its
    files, so the settings are kept by serving it from this process ("auto"), or refused ("process"); a
    client without a certificate is never let in."""
    cert, key = self_signed(tmp_path)
    mutual = tls_context(str(cert), str(key))
    mutual.verify_mode = ssl.CERT_REQUIRED
    mutual.load_verify_locations(str(cert))  # the client's certificate: the same self-signed one
    with pytest.raises(WebhookError, match="it was changed after tls_context"):
        WebhookSource(tls=mutual, front="process")
    hooks = WebhookSource(tls=mutual)
    try:
        assert hooks.front_pid is None and not hooks.front_process
        for with_cert in (False, True):
            client = ssl.create_default_context(cafile=str(cert))
            client.maximum_version = ssl.TLSVersion.TLSv1_2  # the refusal comes in the handshake itself
            if with_cert:
                client.load_cert_chain(str(cert), str(key))
            http = Http(hooks.url, timeout_s=10, context=client)
            try:
                if with_cert:
                    assert http.call("GET", "/healthz").status == 200
                else:
                    with pytest.raises((ssl.SSLError, ConnectionError)):
                        http.call("GET", "/healthz")
            finally:
                http.close()
    finally:
        hooks.close()


def test_the_records_of_a_dead_front_not_yet_polled_are_taken_back() -> None:
    """Their clients saw the connection reset and send them again: persisting them too would be a duplicate."""
    hooks = WebhookSource()
    try:
        out: list[BaseException | Answer] = []

        def post() -> None:
            http = Http(hooks.url, timeout_s=30)
            try:
                out.append(http.post("batch", [{"i": 1}, {"i": 2}]))
            except OSError as exc:  # the reset
                out.append(exc)
            finally:
                http.close()

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        wait_until(lambda: hooks.health()["queued"] == 2, 10, "the request to be queued")
        first = hooks.front_pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        poster.join(10)
        assert len(out) == 1 and isinstance(out[0], OSError)  # no answer: the client retries
        wait_until(lambda: hooks.front_pid not in (None, first), 30, "a new front process")
        assert hooks.health()["queued"] == 0 and hooks.poll() == []
    finally:
        hooks.close()
