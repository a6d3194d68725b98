"""The aiohttp webhook receiver (issue 28 item 3) on real HTTP connections into a real Redis.

Every test talks to the real receiver over http.client (HTTP/1.1, one connection reused: keep-alive)
with ingest running, and reads what was persisted back out of Redis. The contract under test:
a 200 only once every record of the request is persisted, 503 + Retry-After while ingest cannot
take records, clear 4xx for anything that must not be retried, /healthz and /readyz.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.servers.embedded import EmbeddedServer
from runtime.driver.webhook import WebhookSource, tls_context
from runtime.driver.webhook_body import SIGNATURE_HEADER, WebhookError, sign
from tests.runtime.mqtt_support import persisted_ids, self_signed
from tests.runtime.webhook_support import Http, ndjson, receiving
from tests.waiting import wait_until


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[EmbeddedServer]:
    """A server of this test's own, to freeze with SIGSTOP."""
    server = EmbeddedServer(data_dir=tmp_path / "redis", appendfsync="always").start()
    yield server
    server.stop()


def _layer(config: FTConfig, source: str) -> FTLayer:
    return FTLayer(config, "hooks", source, num_channels=2).open()


def _recs(start: int, n: int) -> list[dict[str, int]]:
    return [{"i": i} for i in range(start, start + n)]


def test_keep_alive_single_array_and_ndjson_bodies_on_one_connection(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "keepalive")
    with receiving(layer) as (hooks, _ing):
        http = Http(hooks.url)
        answers = [http.post("", {"i": 0})]
        answers.append(http.post("batch", _recs(1, 9)))  # a JSON array: 9 records
        answers.append(http.call("POST", "", ndjson(_recs(10, 10)), {"Content-Type": "application/x-ndjson"}))
        answers.append(http.call("POST", "batch", "\n" + ndjson(_recs(20, 5)) + "\n\n",
                                 {"Content-Type": "application/x-ndjson; charset=utf-8"}))
        answers.append(http.post("", [1, 2]))  # an array to the records route is one record
        http.close()
        assert [(a.status, a.doc) for a in answers] == [
            (200, {"accepted": 1}), (200, {"accepted": 9}), (200, {"accepted": 10}), (200, {"accepted": 5}),
            (200, {"accepted": 1})]
        assert len(http.sockets) == 1, "every request went out on the same connection (keep-alive)"
        assert all(a.headers.get("connection", "keep-alive").lower() != "close" for a in answers)
        assert sorted(persisted_ids_or_list(layer)) == list(range(25))
        assert hooks.confirmed == 26


def test_the_signature_is_githubs() -> None:
    """The example of GitHub's webhook docs ("Validating webhook deliveries"): same secret, same body, same value."""
    got = sign(b"It's a Secret to Everybody", b"Hello, World!")
    assert got == "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17"
    # the secret as the receiver is given it (hmac_secret="...", --webhook-hmac-secret): a str, its UTF-8 bytes
    assert sign("It's a Secret to Everybody", b"Hello, World!") == got


def persisted_ids_or_list(layer: FTLayer) -> list[int]:
    """Ids of the persisted objects with an "i" (the one array record has none)."""
    from tests.runtime.mqtt_support import persisted

    return [int(v["i"]) for v, _h in persisted(layer) if isinstance(v, dict)]


@pytest.mark.parametrize(("path", "body", "content_type", "status", "says"), [
    ("", "{not json", "application/json", 400, "the body is not JSON"),
    ("", "null", "application/json", 400, "null is not a record"),
    ("batch", '{"i": 1}', "application/json", 400, "must be a JSON array"),
    ("batch", '[{"i": 1}, null]', "application/json", 400, "element 1"),
    ("batch", '{"i": 1}\n{"i": 2\n{"i": 3}\n', "application/x-ndjson", 400, "line 2"),
    ("", '{"i": 1}\nnull\n', "application/x-ndjson", 400, "line 2: null is not a record"),
    ("", b'\xff\xfe', "application/json", 400, "not UTF-8 JSON"),
    ("", '{"i": 1}'.encode("utf-16"), "application/json", 400, "not UTF-8 JSON"),
    ("batch", '[{"i": 1}]'.encode("utf-32"), "application/json", 400, "not UTF-8 JSON"),
    ("", b'{"i": 1}\n\xff{"i": 2}\n', "application/x-ndjson", 400, "line 2 is not UTF-8 JSON"),
    ("", '{"i": 1}', "application/xml", 415, "application/xml"),
])
def test_bad_bodies_are_refused_with_a_clear_4xx_and_nothing_is_taken(
        ft_config: FTConfig, path: str, body: str | bytes, content_type: str, status: int, says: str) -> None:
    layer = _layer(ft_config, "bad")
    with receiving(layer) as (hooks, _ing):
        http = Http(hooks.url)
        bad = http.call("POST", path, body, {"Content-Type": content_type})
        after = http.post("batch", _recs(0, 3))  # the connection and the confirmations go on
        http.close()
    assert (bad.status, says in bad.error) == (status, True), bad
    assert bad.headers["content-type"].startswith("application/json")
    assert after.status == 200
    assert sorted(persisted_ids(layer)) == [0, 1, 2]


def test_unknown_path_wrong_method_and_health(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "routes")
    with receiving(layer, path="/in") as (hooks, _ing):
        assert hooks.url.endswith("/in/")
        http = Http(hooks.url.removesuffix("/in/"))
        missing = http.post("/elsewhere", {"i": 1})
        wrong = http.call("GET", "/in/")
        health = http.call("GET", "/healthz")
        ready = http.call("GET", "/readyz")
        taken = http.post("/in/", {"i": 1})
        as_given = http.post("/in", {"i": 2})  # the path as given to path=, without the "/" the url adds
        batch = http.post("/in/batch", [{"i": 3}, {"i": 4}])
        http.close()
    assert (missing.status, "no route /elsewhere" in missing.error) == (404, True)
    assert (wrong.status, wrong.headers.get("allow")) == (405, "POST")
    assert "GET is not allowed" in wrong.error
    assert health.status == 200 and health.doc["ok"] is True
    assert (ready.status, ready.doc) == (200, {"ready": True})
    assert taken.status == 200
    assert (as_given.status, as_given.doc) == (200, {"accepted": 1})
    assert (batch.status, batch.doc) == (200, {"accepted": 2})


def test_readyz_before_ingest_polls_and_while_ending(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "ready")
    hooks = WebhookSource(reply_timeout_s=5.0)
    try:
        http = Http(hooks.url)
        before = http.call("GET", "/readyz")
        assert (before.status, before.doc["ready"]) == (503, False)
        assert "no ingest has polled" in before.doc["why"]
        assert http.call("GET", "/healthz").status == 200  # up, though not ready
        with receiving(layer) as (again, _ing):
            assert Http(again.url).call("GET", "/readyz").status == 200
        # no ingest runs this one, so it keeps serving while ending (ingest closes a source it drained)
        hooks.end()
        ending = http.call("GET", "/readyz")
        assert (ending.status, ending.doc["why"]) == (503, "the source is ending")
        http.close()
    finally:
        hooks.close()


@pytest.mark.slow  # 30 receivers started and stopped, each with its front process: 14-20 s
def test_a_client_connecting_as_the_receiver_stops_is_reset_never_left_waiting() -> None:
    """A connection accepted as the server stops: asyncio failed to make its transport once the
    server was closed and left the socket open unanswered, so its client waited for its own timeout
    (the readyz test above hung 60 s on a loaded machine). It must be refused or reset at once."""
    outcomes: dict[str, int] = {}
    for _ in range(30):
        hooks = WebhookSource()
        got: list[str] = []

        def ask(url: str = hooks.url, into: list[str] = got) -> None:
            try:
                into.append(str(Http(url, timeout_s=5.0).call("GET", "/healthz").status))
            except OSError as exc:  # refused, reset, closed: what a client retries at once
                into.append(type(exc).__name__)

        client = threading.Thread(target=ask)
        client.start()
        hooks.close()
        client.join()
        outcomes[got[0]] = outcomes.get(got[0], 0) + 1
    print("client outcomes:", outcomes)
    assert "TimeoutError" not in outcomes and sum(outcomes.values()) == 30


@pytest.mark.slow
def test_readyz_is_503_while_redis_is_frozen_and_200_again_after(own_redis: EmbeddedServer) -> None:
    cfg = FTConfig(redis_url=own_redis.url, namespace="ready")
    layer = _layer(cfg, "frozen")
    with receiving(layer, ready_check=layer.client.ping) as (hooks, _ing):
        http = Http(hooks.url)
        assert http.call("GET", "/readyz").status == 200
        os.kill(own_redis.pid or 0, signal.SIGSTOP)
        try:
            frozen = http.call("GET", "/readyz")
            again = http.call("GET", "/readyz")  # the first PING still hangs: answered at once
        finally:
            os.kill(own_redis.pid or 0, signal.SIGCONT)
        assert (frozen.status, "did not answer within 2 s" in frozen.doc["why"]) == (503, True), frozen
        assert (again.status, "has not answered" in again.doc["why"]) == (503, True), again
        wait_until(lambda: http.call("GET", "/readyz").status == 200, 30, "ready again after SIGCONT")
        http.close()


@pytest.mark.slow
def test_no_2xx_before_persist_on_a_keep_alive_connection(own_redis: EmbeddedServer) -> None:
    """Redis frozen (SIGSTOP) with a batch and an NDJSON body in flight on one keep-alive connection:
    no answer may come until Redis resumes, then 200 with every record persisted."""
    cfg = FTConfig(redis_url=own_redis.url, namespace="frozen", durability="waitaof")
    layer = _layer(cfg, "persist")
    with receiving(layer, reply_timeout_s=60.0) as (hooks, _ing):
        http = Http(hooks.url)
        assert http.post("batch", _recs(0, 10)).status == 200
        answers: list[int] = []

        def send() -> None:
            answers.append(http.post("batch", _recs(10, 50)).status)
            lines = ndjson(_recs(60, 20))
            answers.append(http.call("POST", "", lines, {"Content-Type": "application/x-ndjson"}).status)

        os.kill(own_redis.pid or 0, signal.SIGSTOP)
        sender = threading.Thread(target=send)
        try:
            sender.start()
            time.sleep(2.0)
            assert answers == [], "a 2xx before the records were persisted"
        finally:
            os.kill(own_redis.pid or 0, signal.SIGCONT)
        sender.join(60)
        http.close()
        assert answers == [200, 200]
        assert sorted(persisted_ids(layer)) == list(range(80))
        assert len(http.sockets) == 1


@pytest.mark.slow
def test_503_with_retry_after_under_backpressure_for_batches(ft_config: FTConfig) -> None:
    layer = _layer(ft_config.replace(max_pending=20), "bp")
    with receiving(layer, retry_after_s=3, reply_timeout_s=2.0) as (hooks, ing):
        http = Http(hooks.url)
        first = http.post("batch", _recs(0, 20))
        assert first.status == 200
        # the next batch is polled, then ingest finds 20 pending and waits: not confirmed in time;
        # the ones after it find ingest paused and are refused at once
        answers = [http.post("batch", _recs(20 + 10 * k, 10)) for k in range(4)]
        ready = http.call("GET", "/readyz")
        http.close()
        print("answers at max_pending:", [(a.status, a.error) for a in answers])
        assert [a.status for a in answers] == [503] * 4
        assert all(a.headers["retry-after"] == "3" for a in answers)
        assert answers[0].error == "not confirmed in time"
        assert all(a.error.startswith("ingest paused: backpressure") for a in answers[1:])
        assert ing.paused is not None and ing.paused.startswith("backpressure")
        assert (ready.status, ready.doc["why"].startswith("ingest paused: backpressure")) == (503, True)
        assert sorted(persisted_ids(layer)) == list(range(20))  # none of the 503 answers was persisted


def test_size_limit_by_content_length_and_by_chunked_body(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "size")
    with receiving(layer, max_body_bytes=1000) as (hooks, _ing):
        big = json.dumps(_recs(0, 200))
        assert len(big) > 1000
        http = Http(hooks.url)
        by_length = http.call("POST", "batch", big, {"Content-Type": "application/json"})
        http.close()
        http = Http(hooks.url)
        http.conn.putrequest("POST", "/batch")
        http.conn.putheader("Content-Type", "application/json")
        http.conn.putheader("Transfer-Encoding", "chunked")
        http.conn.endheaders()
        for k in range(0, len(big), 300):
            part = big[k:k + 300].encode()
            http.conn.send(f"{len(part):x}\r\n".encode() + part + b"\r\n")
        http.conn.send(b"0\r\n\r\n")
        chunked = http.conn.getresponse()
        chunked_doc = json.loads(chunked.read())
        http.close()
        small = Http(hooks.url)
        fits = small.post("batch", _recs(0, 3))
        small.close()
    assert (by_length.status, "at most 1000" in by_length.error) == (413, True), by_length
    assert (chunked.status, "more than 1000 bytes" in chunked_doc["error"]) == (413, True), chunked_doc
    assert fits.status == 200
    assert sorted(persisted_ids(layer)) == [0, 1, 2]


def _expecting(port: int, headers: dict[str, str], body: bytes | None) -> tuple[bytes, bytes]:
    """An ``Expect: 100-continue`` request on a raw socket: the server's first answer, read before the body
    went out (``body`` None: the body is never sent), then the answer that came after the body."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": "127.0.0.1", "Expect": "100-continue", **headers}.items())
    sock.sendall(f"POST /batch HTTP/1.1\r\n{head}\r\n".encode())

    def answer() -> bytes:  # one answer: its head, and its JSON body if it has one (a 100 has none)
        got = b""
        while b"\r\n\r\n" not in got or (not got.startswith(b"HTTP/1.1 100") and not got.endswith(b"}")):
            data = sock.recv(65536)
            if not data:
                break
            got += data
        return got

    try:
        first = answer()
        if body is None:
            return first, b""
        sock.sendall(body)
        return first, answer()
    finally:
        sock.close()


@pytest.mark.parametrize("front", ["process", "thread"])
def test_expect_100_continue_is_refused_before_the_upload(ft_config: FTConfig, front: str,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    """A request over the size limit, or without its token, with ``Expect: 100-continue`` gets its 413 or 401
    instead of the ``100 Continue`` (aiohttp's own handler says Continue to anything, so the client uploaded
    the whole body to be told it is too large); an acceptable one gets its Continue and its 200."""
    layer = _layer(ft_config, "expect")
    with receiving(layer, max_body_bytes=1000, token="s3cret", front=front) as (hooks, _ing):
        auth = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
        too_big, _ = _expecting(hooks.port, {**auth, "Content-Length": "100000000"}, None)
        no_token, _ = _expecting(hooks.port, {"Content-Type": "application/json", "Content-Length": "20"}, None)
        body = json.dumps(_recs(0, 3)).encode()
        cont, taken = _expecting(hooks.port, {**auth, "Content-Length": str(len(body))}, body)
        wait_until(lambda: hooks.answers == {413: 1, 401: 1, 200: 1}, 10, "the three answers to be counted")
    assert too_big.startswith(b"HTTP/1.1 413 ") and b"at most 1000 are taken" in too_big, too_big
    assert b"Connection: close" in too_big  # the body the client held back is never read
    assert no_token.startswith(b"HTTP/1.1 401 "), no_token
    assert cont.startswith(b"HTTP/1.1 100 Continue"), cont
    assert taken.startswith(b"HTTP/1.1 200 ") and taken.endswith(b'{"accepted": 3}'), taken
    assert sorted(persisted_ids(layer)) == [0, 1, 2]
    # a refused connection's handler, still lingering over the body never sent, is cleaned up at stop
    assert "Task was destroyed but it is pending" not in capfd.readouterr().err


HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"


@pytest.mark.parametrize("front", ["process", "thread"])
def test_a_request_that_is_not_http_1_is_a_400_and_one_log_line(front: str, capfd: pytest.CaptureFixture[str],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """An HTTP/2 client with prior knowledge, or a header line that is not one: aiohttp's 400, and not an
    ERROR with a traceback on the receiver's stderr for each such request."""
    hooks = WebhookSource(front=front)
    try:
        for raw in (HTTP2_PREFACE, b"POST / HTTP/1.1\r\nHost: x\r\nno colon here\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", hooks.port), timeout=10) as sock:
                sock.sendall(raw)
                assert sock.recv(1 << 16).split(b" ")[1] == b"400", raw  # HTTP/1.0 or 1.1: aiohttp's own
    finally:
        hooks.close()
    assert "Traceback" not in capfd.readouterr().err  # the front process's stderr (it logs nowhere else)
    assert not [r for r in caplog.records if r.name == "aiohttp.server" and r.levelno >= logging.WARNING]


def test_bearer_token_refused_then_accepted(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "token")
    with receiving(layer, token="s3cret") as (hooks, _ing):
        http = Http(hooks.url)
        missing = http.post("", {"i": 0})
        wrong = http.post("", {"i": 1}, headers={"Authorization": "Bearer s3cre"})
        basic = http.post("", {"i": 2}, headers={"Authorization": "Basic s3cret"})
        right = http.post("batch", _recs(3, 2), headers={"Authorization": "Bearer s3cret"})
        probe = http.call("GET", "/healthz")  # health needs no credentials
        http.close()
    assert [a.status for a in (missing, wrong, basic, right, probe)] == [401, 401, 401, 200, 200]
    assert missing.headers["www-authenticate"].startswith("Bearer")
    assert "missing credentials" in missing.error and "does not match" in wrong.error
    assert "s3cret" not in json.dumps([missing.doc, wrong.doc, basic.doc])
    assert sorted(persisted_ids(layer)) == [3, 4]


def test_hmac_signature_over_the_raw_body_refused_then_accepted(ft_config: FTConfig) -> None:
    layer = _layer(ft_config, "hmac")
    secret = b"k3y"
    with receiving(layer, hmac_secret=secret.decode(), token="t") as (hooks, _ing):
        http = Http(hooks.url)
        bearer = {"Authorization": "Bearer t"}
        body = json.dumps(_recs(0, 3)).encode()
        other = json.dumps(_recs(10, 3)).encode()
        answers = {
            "unsigned": http.call("POST", "batch", body, bearer),
            "signed other body": http.call("POST", "batch", body, {**bearer, SIGNATURE_HEADER: sign(secret, other)}),
            "wrong secret": http.call("POST", "batch", body, {**bearer, SIGNATURE_HEADER: sign(b"nope", body)}),
            "no prefix": http.call("POST", "batch", body, {**bearer, SIGNATURE_HEADER: sign(secret, body)[7:]}),
            "signed, no token": http.call("POST", "batch", body, {SIGNATURE_HEADER: sign(secret, body)}),
            "signed": http.call("POST", "batch", body, {**bearer, SIGNATURE_HEADER: sign(secret, body)}),
            "signed, upper hex": http.call("POST", "batch", other,
                                           {**bearer, SIGNATURE_HEADER: "sha256=" + sign(secret, other)[7:].upper()}),
        }
        http.close()
    assert {k: a.status for k, a in answers.items()} == {
        "unsigned": 401, "signed other body": 401, "wrong secret": 401, "no prefix": 401, "signed, no token": 401,
        "signed": 200, "signed, upper hex": 200}
    assert "does not match the body" in answers["signed other body"].error
    assert sorted(persisted_ids(layer)) == [0, 1, 2, 10, 11, 12]


def test_a_github_delivery_posts_here_as_it_is_in_either_content_type(ft_config: FTConfig) -> None:
    """docs/sources.md: "a GitHub webhook posts here as it is (its event is one record)": GitHub sends the
    event as a JSON body (content type application/json) or, its default, as a form field
    ``payload=<url-encoded JSON>`` (application/x-www-form-urlencoded); either signed over the raw body."""
    from urllib.parse import urlencode

    layer = _layer(ft_config, "github")
    secret = "It's a Secret to Everybody"
    events = [{"i": 1, "action": "opened", "text": "a & b = c?"}, {"i": 2, "action": "closed"}]
    bodies = [(json.dumps(events[0]).encode(), "application/json"),
              (urlencode({"payload": json.dumps(events[1])}).encode(), "application/x-www-form-urlencoded")]
    with receiving(layer, hmac_secret=secret) as (hooks, _ing):
        http = Http(hooks.url)
        answers = [http.call("POST", "", body, {"Content-Type": kind, "X-GitHub-Event": "issues",
                                                 SIGNATURE_HEADER: sign(secret, body)}) for body, kind in bodies]
        http.close()
    assert [(a.status, a.doc) for a in answers] == [(200, {"accepted": 1}), (200, {"accepted": 1})]
    from tests.runtime.mqtt_support import persisted

    assert sorted((v for v, _h in persisted(layer)), key=lambda v: v["i"]) == events


@pytest.mark.slow
def test_tls(ft_config: FTConfig, tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    layer = _layer(ft_config, "tls")
    with receiving(layer, tls=tls_context(str(cert), str(key))) as (hooks, _ing):
        assert hooks.url.startswith("https://127.0.0.1:")
        http = Http(hooks.url, context=ssl.create_default_context(cafile=str(cert)))
        answers = [http.post("batch", _recs(0, 5)), http.post("", {"i": 5})]
        assert isinstance(http.conn.sock, ssl.SSLSocket)
        http.close()
        plain = Http(hooks.url.replace("https://", "http://"))
        with pytest.raises((ConnectionError, OSError)):  # plain HTTP to the TLS port gets no HTTP answer
            plain.post("", {"i": 99})
        plain.close()
        untrusted = Http(hooks.url, context=ssl.create_default_context())  # not our CA: refused by the client
        with pytest.raises(ssl.SSLCertVerificationError):
            untrusted.post("", {"i": 98})
        untrusted.close()
    assert [a.status for a in answers] == [200, 200]
    assert len(http.sockets) == 1
    assert sorted(persisted_ids(layer)) == list(range(6))
    with pytest.raises(WebhookError, match="cannot load the TLS certificate"):
        tls_context(str(tmp_path / "missing.pem"))
