"""The webhook-driver-kill chaos scenario: a driver fed by HTTP is SIGKILLed under load and restarted
(and webhook-driver-front-kill: only its webhook's HTTP front process is SIGKILLed; the driver lives on).

The driver program (``python -m runtime.chaos.webhook``; ``--pipeline dataframe``: the chaos
DataFrame pipeline, fed by ``ftlayer.ingest``) runs the chaos topology with a
:class:`~runtime.driver.webhook.WebhookSource` on a fixed port, until the harness creates
``<workdir>/end``; then it ends the source, drains, and exits 0 (1 if it did not drain).

The harness starts it, and a :class:`~runtime.chaos.webhook_client.RetryingClient` posts the records
from several threads, retrying every non-2xx answer and every connection error. Once a third
of the records are confirmed (and some are acked, some pending), the driver and its Spark JVM
are SIGKILLed: requests in flight fail, records ingest had taken and not persisted are never
confirmed. A second driver with the same topology, namespace, checkpoint and port starts; the
client keeps retrying until every record is confirmed (it holds at two thirds of the records
until the kill point, so a slow first batch cannot let it finish first). After the kill the client
is no longer paced and the second driver's map no longer sleeps per record: both are there to
have requests in flight and records pending at the kill, not to slow the second driver's run.
The checker's produced ids are the client's confirmed ids: every one must reach the sink
(records the dead driver had persisted are read again by the new driver's query, or replayed
after their timeout; the ids pending at the kill are recorded as the fault's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence

from ftlayer.servers.ports import free_port
from runtime.chaos.base import END_FILE, ScenarioContext, finish, sink_args, spawn_driver
from runtime.chaos.errors import ChaosError
from runtime.chaos.front import front_pid
from runtime.chaos.webhook_client import RetryingClient
from runtime.checker import Report
from runtime.testing import CollectingSink, default_value


def _driver(ctx: ScenarioContext, port: int, log_name: str, pipeline: str, *extra: str) -> subprocess.Popen[str]:
    cfg = ctx.config
    return spawn_driver(ctx, "runtime.chaos.webhook",
                        ["--redis-url", cfg.redis_url, "--namespace", cfg.namespace, "--workdir", str(ctx.workdir),
                         "--port", str(port), "--pipeline", pipeline, *sink_args(ctx), *extra], log_name)


def webhook_driver_kill(ctx: ScenarioContext, records: int, threads: int = 6, pace_s: float = 0.03, *,
                        kill_timeout_s: float = 240.0, pipeline: str = "topology") -> Report:
    """SIGKILL a webhook-fed driver under load, restart it on the same port; 0 confirmed records lost."""
    from runtime.chaos.procs import pending_ids

    port = free_port()
    layer = ctx.layer()
    client = RetryingClient(f"http://127.0.0.1:{port}/", [default_value(i) for i in range(records)],
                            threads=threads, pace_s=pace_s, hold_at=2 * records // 3)
    first = _driver(ctx, port, "driver1.log", pipeline)
    ctx.say(f"phase 1 driver started, webhook on port {port}")
    client.start()
    try:
        deadline = time.monotonic() + kill_timeout_s
        while time.monotonic() < deadline:
            st = layer.stats()
            if len(client.confirmed) >= records // 3 and st["acked"] > 0 and st["pending"] > 0:
                # The client holds at two thirds so a slow first batch cannot let it finish before
                # the kill; let it go and kill once more requests are under way.
                before = len(client.confirmed)
                client.release()
                settle = time.monotonic() + 5.0
                while len(client.confirmed) < before + threads and time.monotonic() < settle:
                    time.sleep(0.01)
                break
            if first.poll() is not None:
                msg = f"chaos webhook-driver-kill: phase 1 ended (exit {first.returncode}) before it could be killed"
                raise ChaosError(msg)
            time.sleep(0.05)
        else:
            msg = f"chaos webhook-driver-kill: phase 1 never reached the kill point: {layer.stats()}"
            raise ChaosError(msg)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)  # the driver and its Spark JVM, mid-request
        first.wait(30)
    confirmed_at_kill = len(client.confirmed)
    at_kill = layer.stats()
    ctx.faults.record("webhook-driver-kill", pending_ids(layer))
    ctx.notes.append(f"driver killed with {confirmed_at_kill} records confirmed, {at_kill['pending']} pending, "
                     f"{at_kill['acked']} acked")
    ctx.say(f"driver killed ({confirmed_at_kill} confirmed, {at_kill['pending']} pending); starting phase 2")
    # the paced client and the slow map only served the kill (requests in flight while records are
    # pending); the new driver maps at full speed and the client posts as fast as it confirms
    client.pace_s = 0.0
    second = _driver(ctx, port, "driver2.log", pipeline, "--sleep-ms", "0")
    try:
        all_confirmed = client.join(600)
    finally:
        client.stop()
        (ctx.workdir / END_FILE).touch()
    out, _ = second.communicate(timeout=600)
    ctx.say(f"phase 2 driver exited {second.returncode}")
    ctx.notes.append(f"client: answers {dict(sorted(client.answers.items(), key=str))}, retries {client.retries}")
    ctx.notes.append(f"restarted driver: exit {second.returncode}: {out.strip().splitlines()[-1:] or ''}")
    report = finish(ctx, [layer], CollectingSink(ctx.out_dir), sorted(client.confirmed))
    report.expect(f"killed under load ({confirmed_at_kill}/{records} confirmed, {at_kill['pending']} pending)",
                  confirmed_at_kill < records and at_kill["pending"] > 0)
    report.expect(f"the client retried refused or failed requests ({client.retries})", client.retries > 0)
    report.expect(f"every record was confirmed in the end ({len(set(client.confirmed))}/{records})",
                  all_confirmed and set(client.confirmed) == set(range(records)))
    report.expect("the restarted driver drained and exited 0", second.returncode == 0)
    return report


def webhook_front_kill_in_driver(ctx: ScenarioContext, records: int, threads: int = 6, pace_s: float = 0.03, *,
                                 kill_timeout_s: float = 240.0, pipeline: str = "topology") -> Report:
    """SIGKILL the HTTP front process of a webhook-fed driver under load; the driver starts a new one on
    the same port and drains; 0 confirmed records lost."""
    port = free_port()
    layer = ctx.layer()
    # the client holds at two thirds until the kill: on a loaded machine the pipeline's first ack can
    # come after a free-running client has had every record confirmed, and a front killed then has
    # nothing left to serve (ci75: killed with 1500 of 1500 confirmed, no new front seen)
    client = RetryingClient(f"http://127.0.0.1:{port}/", [default_value(i) for i in range(records)],
                            threads=threads, pace_s=pace_s, hold_at=2 * records // 3)
    driver = _driver(ctx, port, "driver.log", pipeline)
    ctx.say(f"driver started, webhook on port {port}")
    client.start()
    try:
        deadline = time.monotonic() + kill_timeout_s
        while not (len(client.confirmed) >= records // 3 and layer.stats()["acked"] > 0):
            if driver.poll() is not None or time.monotonic() > deadline:
                msg = f"chaos webhook-driver-front-kill: no kill point (driver exit {driver.poll()}, {layer.stats()})"
                raise ChaosError(msg)
            time.sleep(0.05)
        old = front_pid(driver.pid)
        if old is None:
            msg = "chaos webhook-driver-front-kill: the driver's webhook has no front process"
            raise ChaosError(msg)
        confirmed_at_kill = len(client.confirmed)
        os.kill(old, signal.SIGKILL)
        ctx.notes.append(f"the driver's HTTP front (pid {old}) killed with {confirmed_at_kill} of {records} confirmed")
        ctx.say(f"front {old} killed ({confirmed_at_kill} confirmed); the driver goes on")
        client.pace_s = 0.0
        client.release()  # the last third can only be confirmed by a new front
        all_confirmed = client.join(600)
        new = front_pid(driver.pid)
    finally:
        client.stop()
        (ctx.workdir / END_FILE).touch()
    out, _ = driver.communicate(timeout=600)
    ctx.notes.append(f"client: answers {dict(sorted(client.answers.items(), key=str))}, retries {client.retries}")
    ctx.notes.append(f"driver: exit {driver.returncode}: {out.strip().splitlines()[-1:] or ''}")
    report = finish(ctx, [layer], CollectingSink(ctx.out_dir), sorted(client.confirmed))
    report.expect(f"killed under load ({confirmed_at_kill}/{records} confirmed)", confirmed_at_kill < records)
    report.expect(f"the driver started a new front (pid {old} -> {new})", new not in (None, old))
    report.expect(f"the client retried refused or failed requests ({client.retries})", client.retries > 0)
    report.expect(f"every record was confirmed in the end ({len(set(client.confirmed))}/{records})",
                  all_confirmed and set(client.confirmed) == set(range(records)))
    report.expect("the driver drained and exited 0", driver.returncode == 0)
    return report


def main(argv: Sequence[str] | None = None) -> int:
    """The driver program: run until ``<workdir>/end`` exists, then end the source and drain."""
    from runtime.chaos.driver_app import driver_options, run_pipeline, warm_python_workers
    from runtime.driver.webhook import WebhookSource
    from runtime.spark.session import local_session

    p = driver_options("python -m runtime.chaos.webhook")
    p.add_argument("--port", type=int, required=True)
    args = p.parse_args(argv)
    spark = local_session("ftlayer-chaos-webhook")
    warm_python_workers(spark)
    hooks = WebhookSource(port=args.port, reply_timeout_s=30.0)
    return run_pipeline(spark, hooks, args, push=hooks)


if __name__ == "__main__":
    sys.exit(main())
