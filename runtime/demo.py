"""The demo job (pre-Spark stage): click events through the FT layer, with real faults.

Until the Spark runtime lands (issue 5), this runs the same record life on
plain Python processes: a non-replayable generator of click events is
persisted batch by batch (routed by user to one of two channels), two worker
processes read their channel, parse, filter, keep a per-user count (keyed
state, which is why routing matters), write to a JSON-lines sink and ack. It
injects FailRecord on a fraction of records, one poison record, and one worker
killed with ``os._exit`` between its sink write and its ack. The driver runs
the FT service (rotation and replay) and restarts the dead worker.

It ends with the report: records in, delivered, duplicates, replays, dead
letters, lost (must be 0) and acker entries left (must be 0); exit status 1
if either is not 0.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig
from ftlayer.connection import resolved
from ftlayer.layer import FTLayer
from ftlayer.service import FTService
from serialization.payload import unpack_payload

TOPOLOGY, SOURCE = "clicks", "events"


def click_events(n: int) -> Any:
    """A generator source: it cannot rewind, so only the FT layer can replay its records."""
    for i in range(n):
        yield {
            "i": i,
            "user": f"user-{i % 97}",
            "page": f"/p/{i % 13}",
            "bot": i % 50 == 7,
            "poison": i == n // 2 + 1,  # one record that always fails
            "ts": datetime(2026, 11, 21, tzinfo=timezone.utc),
        }


def worker(cfg: FTConfig, channel: int, out_dir: str, fail_rate: float, die_after: int) -> None:
    """Process one channel until told to stop; ``die_after`` > 0 kills it once mid-batch."""
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=cfg.num_channels)
    per_user: Counter[str] = Counter()
    sink = Path(out_dir, f"sink-{channel}.jsonl").open("a")  # noqa: SIM115 - open for the worker's life
    after, batches, seen = "-", 0, 0
    stop_key = layer.store.keys.key("demo-stop")
    while not layer.store.client.exists(stop_key):
        batch = layer.persistence.read_channel(channel, after, max_entries=4)
        if not batch.frames:
            time.sleep(0.05)
            continue
        acks: dict[int, int] = {}
        fails: dict[int, str] = {}
        for rec in batch.records():
            sid, cur = rec.record_id
            event = unpack_payload(rec.payload)  # parse
            seen += 1
            if event["poison"] or (hash((rec.origin_id, rec.replay_count)) % 10_000) < fail_rate * 10_000:
                fails[sid] = "FailRecord: injected" if not event["poison"] else "ValueError: poison record"
                continue
            if not event["bot"]:  # filter; a filtered record is simply acked
                per_user[event["user"]] += 1  # per-user aggregate: state lives in this channel
                sink.write(json.dumps({"origin": rec.origin_id, "user": event["user"],
                                       "count": per_user[event["user"]], "channel": channel}) + "\n")
            acks[sid] = cur
        sink.flush()
        if die_after and seen >= die_after:
            os._exit(17)  # killed between the sink write and the ack: those records must be replayed
        layer.xor(acks, fails=fails, token=f"demo/{channel}/{batch.last_id}")
        layer.persistence.trim(channel, batch.last_id)  # "commit" the range
        after = batch.last_id
        batches += 1
    sink.close()


def run(records: int, fail_rate: float, timeout_s: float) -> int:
    cfg = resolved(FTConfig.load(env=os.environ).replace(timeout_s=timeout_s, max_replays=3,
                                                         replay_backoff_initial_s=0.0))
    out_dir = tempfile.mkdtemp(prefix="ftlayer-demo-")
    layer = FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=cfg.num_channels).open()
    service = FTService([layer]).start()
    ctx = mp.get_context("fork")
    die_after = max(1, records // (4 * cfg.num_channels))  # channel 0's worker dies a quarter in
    procs = {ch: ctx.Process(target=worker, args=(cfg, ch, out_dir, fail_rate, die_after if ch == 0 else 0))
             for ch in range(cfg.num_channels)}
    for p in procs.values():
        p.start()
    started = time.monotonic()
    persisted = 0
    batch: list[Any] = []
    for event in click_events(records):
        rec = layer.make_record(event, key=event["user"])
        batch.append(rec)
        if len(batch) == 500:
            persisted += layer.persist(batch)
            batch = []
            while layer.pending_count() > cfg.max_pending:  # backpressure
                time.sleep(0.05)
    persisted += layer.persist(batch)
    restarted = False
    deadline = time.monotonic() + 60 + 20 * timeout_s
    while True:
        for ch, p in list(procs.items()):
            if not p.is_alive() and p.exitcode == 17 and not restarted:
                print(f"[demo] worker of channel {ch} was killed (exit 17); restarting it", flush=True)
                procs[ch] = ctx.Process(target=worker, args=(cfg, ch, out_dir, fail_rate, 0))
                procs[ch].start()
                restarted = True
        st = layer.stats()
        print(f"[demo] {time.monotonic() - started:5.1f}s persisted={st['persisted']} acked={st['acked']} "
              f"pending={st['pending']} failed={st['failed_explicit'] + st['failed_timeout']} "
              f"replayed={st['replayed']} dead={st['dead_lettered']}", flush=True)
        if st["pending"] == 0 and st["failed_waiting"] == 0 and restarted:
            break
        if time.monotonic() > deadline:
            print("[demo] did not drain in time; reporting what is there", flush=True)
            break
        time.sleep(1.0)
    layer.store.client.set(layer.store.keys.key("demo-stop"), 1)
    for p in procs.values():
        p.join(10)
    service.stop()
    layer.store.client.delete(layer.store.keys.key("demo-stop"))
    return report(layer, out_dir, persisted)


def report(layer: FTLayer, out_dir: str, records_in: int) -> int:
    delivered: Counter[int] = Counter()
    for path in Path(out_dir).glob("sink-*.jsonl"):
        for line in path.read_text().splitlines():
            delivered[json.loads(line)["origin"]] += 1
    dead = {d.origin_id for d in layer.dead_letters.list(10_000)}
    origins = {rec_origin for rec_origin in delivered} | dead
    st = layer.stats()
    # bots are filtered (acked without output); they count as processed, not lost
    bots = sum(1 for e in click_events(records_in) if e["bot"] and not e["poison"])
    lost = records_in - bots - len(origins)
    left = st["pending"] + st["failed_waiting"]
    for ch in range(layer.num_channels):
        layer.persistence.trim(ch, layer.persistence.channel_tail(ch))
    leftovers = layer.leftovers()
    print("\n== ftlayer demo report ==")
    print(f"records in           {records_in}")
    print(f"records delivered    {len(delivered)} (unique origins; {bots} bot events filtered)")
    print(f"duplicates           {sum(delivered.values()) - len(delivered)}")
    print(f"replays              {st['replayed']}")
    print(f"dead letters         {len(dead)}")
    print(f"lost                 {lost}   (must be 0)")
    print(f"acker entries left   {left}   (must be 0)")
    print(f"leftover keys        {leftovers or 'none'}")
    print(f"sink files           {out_dir}")
    return 0 if lost == 0 and left == 0 and not leftovers else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ftlayer demo", description="Run the demo pipeline with faults.")
    parser.add_argument("--records", type=int, default=20_000, help="click events to generate")
    parser.add_argument("--fail-rate", type=float, default=0.02, help="fraction of records that raise FailRecord")
    parser.add_argument("--timeout-s", type=float, default=3.0, help="FT timeout for the demo [env FTLAYER_TIMEOUT_S]")
    args = parser.parse_args(argv)
    return run(args.records, args.fail_rate, args.timeout_s)


if __name__ == "__main__":
    sys.exit(main())
