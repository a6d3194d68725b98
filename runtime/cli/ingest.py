"""``ftlayer ingest``: persist records into a source from a process of its own, beside any query.

::

    ftlayer ingest clicks events events.jsonl --key user          # files (or - for stdin), then exit
    ftlayer ingest clicks events --webhook 8080 --key user        # HTTP until SIGINT / SIGTERM
                                                                  # (runtime.cli.ingest_webhook)
    ftlayer ingest clicks events --mqtt mqtt://broker:1883 --topic 'sensors/#' --key user   # MQTT, until a signal
    ftlayer ingest clicks events big.jsonl --worker 0/2 &         # two processes share one file
    ftlayer ingest clicks events big.jsonl --worker 1/2 &

Records are persisted before any query can see them (the ingest contract of
:mod:`runtime.driver.ingest`); the query that reads them (``ftlayer.read_stream`` or a
Topology with the same topology and source names, namespace and ``num_channels``) may run
before, during or after. Any number of ingest processes may write one source at once: every
record gets its own random RecordId and every persist is one atomic script, so processes never
collide; ``--worker I/N`` splits the lines of shared files so that none is taken twice.

Files resume: the byte offset past the last persisted line of each file is saved after each
batch (:mod:`runtime.driver.file_source`), so a killed or stopped process started again with
the same arguments reads on from there: nothing is lost, and at most one batch is persisted
twice. Standard input and the webhook do not resume: their loss window is the ingest
contract's (the webhook's client retries anything not answered 200). MQTT resumes on the
broker's side: the session of ``--client-id`` keeps what was never acknowledged
(:mod:`runtime.cli.ingest_mqtt`, :mod:`runtime.driver.mqtt`).

It needs a Redis that the query's driver and executors also reach (``--redis-url``): an
embedded server would live and die with this process.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ftlayer.config import FTConfig, mask_url
from ftlayer.errors import ConfigError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.keyspace.keys import check_name
from ftlayer.servers.state_dir import state_root
from runtime.cli.common import CLIError, connection_options, embedded_url_hint, load_config
from runtime.cli.env import add_env_options, ingest_option
from runtime.cli.ingest_mqtt import check_no_mqtt_options, mqtt_source, run_mqtt, topic_key
from runtime.cli.ingest_webhook import check_no_webhook_options, check_webhook_options, run_webhook
from runtime.driver.file_source import STDIN, LinesSource
from runtime.driver.ingest import Ingestor, PayloadCheck

PROGRESS_EVERY_S = 5.0


def add_parser(sub: Any) -> None:
    """Add ``ftlayer ingest`` to the CLI's subparsers."""
    p = sub.add_parser(
        "ingest", parents=[connection_options()],
        help="persist records (JSON lines, text lines, a webhook or MQTT) into a source, beside any query",
        description="Persist records into source SOURCE of topology TOPOLOGY, from files (- for stdin), "
                    "an HTTP webhook or an MQTT subscription, in a process of its own. A query reading the "
                    "source may run before, during or after. Files resume from their saved offsets when "
                    "started again; MQTT from the broker's session of --client-id. Exit status 0 once every "
                    "record read was persisted (or dead-lettered, if it could not be), 1 if records read "
                    "were not persisted (stopped while Redis was unreachable), 2 on an error (a bad option, "
                    "an unreachable or refusing broker, ingest stopped by an error).",
    )
    p.add_argument("topology", help="topology name (the first name given to ftlayer.read_stream / Topology)")
    p.add_argument("source", help="source name")
    p.add_argument("files", nargs="*", metavar="FILE", help="files to read, one record per line; - is stdin")
    add_env_options(p, "ingest")
    p.set_defaults(func=_cmd_ingest, trailing_positionals="files")


# the options that only mean something with FILE arguments, and the value each has when not given
FILE_ONLY: dict[str, Any] = {"worker": "0/1", "offsets_dir": None, "from_start": False}


def check_no_file_options(args: argparse.Namespace) -> None:
    """Refuse a FILE-only option (given, or set by its variable) with --webhook or --mqtt, where it would
    be ignored; and ``--format`` with --webhook (whose bodies are JSON or NDJSON by their Content-Type)."""
    def refuse(dest: str, why: str) -> None:
        opt = ingest_option(dest)
        msg = f"{opt.flag} {why} (unset {opt.env} if it comes from there)"
        raise CLIError(msg)

    for dest, unset in FILE_ONLY.items():
        if getattr(args, dest) != unset:
            refuse(dest, "is for FILE arguments: it does nothing with --webhook or --mqtt")
    if args.webhook and args.format != "json":
        refuse("format", "is for FILE arguments and --mqtt: a webhook body is JSON or NDJSON by its Content-Type")


def parse_worker(text: str) -> tuple[int, int]:
    """``I/N`` as ``(I, N)`` with ``0 <= I < N``; CLIError otherwise."""
    i, sep, n = text.partition("/")
    try:
        worker = (int(i), int(n))
    except ValueError:
        worker = (-1, 0)
    if not sep or worker[1] < 1 or not 0 <= worker[0] < worker[1]:
        msg = f"--worker (or FTLAYER_INGEST_WORKER) {text!r}: expected I/N with 0 <= I < N, e.g. 0/2"
        raise CLIError(msg)
    return worker


def check_files(files: list[str]) -> None:
    """:class:`CLIError` for a FILE that cannot be read, before Redis is touched: a bad argument is one
    error line, not an ingest thread's traceback and an ``ERROR`` left in ``ftlayer status``."""
    for path in files:
        if path == STDIN:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            msg = f"cannot read {path}: {exc.strerror or exc}"
            raise CLIError(msg) from None


def _key_selector(field: str | None) -> Any:
    if field is None:
        return None

    def key(value: Any) -> Any:
        return value[field]  # a missing field or a non-object record is rejected into the dead letters

    return key


def _offsets_dir(args: argparse.Namespace, config: FTConfig) -> Path | None:
    if args.offsets_dir:
        return Path(args.offsets_dir)
    if config.state_temporary:
        return None
    root: Path = state_root(config, args.topology)
    return root / "ingest" / str(args.source)


def _cmd_ingest(args: argparse.Namespace) -> int:
    config = load_config(args)
    if not config.redis_url:
        msg = ("ftlayer ingest needs the Redis that the query also uses: pass --redis-url or set "
               "FTLAYER_REDIS_URL (start one with `ftlayer redis --data-dir DIR` if you have none)"
               + embedded_url_hint(config))
        raise CLIError(msg)
    check_name("topology", args.topology)
    check_name("source", args.source)
    if sum(map(bool, (args.files, args.webhook, args.mqtt))) != 1:
        msg = "give FILE arguments (- for stdin), --webhook [HOST:]PORT or --mqtt URL: exactly one of them"
        raise CLIError(msg)
    # the MQTT options are checked before Redis is touched: a bad URL is a bad option
    mqtt = mqtt_source(args, config) if args.mqtt else None
    if mqtt is None:
        check_no_mqtt_options(args)
    if not args.webhook:
        check_no_webhook_options(args)
    # likewise the webhook's address and TLS files
    webhook = check_webhook_options(args) if args.webhook else None
    if not args.files:
        check_no_file_options(args)
    worker = parse_worker(args.worker)
    check_files(args.files)
    if args.files and args.key and args.format == "text":
        msg = (f"--key {args.key} names a field of a JSON record, but --format text makes each line a string "
               "(every record would be dead-lettered): drop --key, or read the lines as JSON")
        raise CLIError(msg)
    # text lines (files, MQTT payloads) are strings, unless the topic makes each record a dict
    as_text = args.format == "text" and not (args.mqtt and (args.topic_field or args.key_topic))
    check = _schema_check(args.schema, as_text, keep_columns=not args.no_columns)
    channels = args.num_channels or config.num_channels
    layer = FTLayer(config, args.topology, args.source, num_channels=channels).open()
    shards = layer.write_shards(*worker) if worker[1] > 1 else list(range(layer.num_shards))
    key = _key_selector(args.key)
    if args.webhook:
        return run_webhook(args, layer, key, run=_run, checked=webhook, check=check)
    if mqtt is not None:
        return run_mqtt(mqtt, layer, key if not args.key_topic else topic_key(mqtt), run=_run, check=check)
    offsets = _offsets_dir(args, config)
    if offsets is not None and args.from_start:
        for path in args.files:  # forget this worker's saved offsets of these files
            from runtime.driver.file_source import offset_file

            offset_file(offsets, path, worker).unlink(missing_ok=True)
    source = LinesSource(args.files, fmt=args.format, worker=worker, offsets_dir=offsets)
    print(f"ftlayer ingest: {args.topology}/{args.source} on {mask_url(config.redis_url)} namespace "
          f"{config.namespace!r}, {channels} channels, worker {worker[0]}/{worker[1]}"
          + (f", shards {shards}" if layer.num_shards > 1 else ""), flush=True)
    ingestor = Ingestor(layer, source, key=key, check=check)
    return _run(ingestor, source_label="files", resumed=source.skipped_offsets)


def _schema_check(ddl: str | None, as_text: bool, *, keep_columns: bool = True) -> PayloadCheck | None:
    """``--schema``: the check of each record against it (:mod:`runtime.spark.schema_check`), or None; a
    schema that does not parse, or that no text line could fit, is a bad option (before Redis is touched),
    and so is ``--no-columns`` without it."""
    if not ddl:
        if not keep_columns:
            msg = ("--no-columns (or FTLAYER_INGEST_NO_COLUMNS) says what to keep of the records --schema checks: "
                   "give --schema too, or drop it (unset FTLAYER_INGEST_NO_COLUMNS if it comes from there)")
            raise CLIError(msg)
        return None
    from pyspark.sql.types import BinaryType, CharType, StringType, VarcharType

    from runtime.spark.ddl import parse_schema
    from runtime.spark.schema_check import SchemaCheck

    try:
        check = SchemaCheck(parse_schema(ddl), keep_columns=keep_columns)
    except ConfigError as exc:
        msg = f"--schema: {exc}"
        raise CLIError(msg) from exc
    fields = check.schema.fields
    text_types = (StringType, VarcharType, CharType, BinaryType)  # a str converts to binary as its UTF-8 bytes
    if as_text and (len(fields) != 1 or not isinstance(fields[0].dataType, text_types)):
        msg = (f"--schema {check.schema.simpleString()}: --format text makes each record a string, which fits "
               "only one string or binary column (every record would be dead-lettered): give one, or read the "
               "records as JSON")
        raise CLIError(msg)
    return check


def _run(ingestor: Ingestor, *, source_label: str, resumed: dict[str, int],
         ending: threading.Event | None = None, failed: Callable[[], BaseException | None] | None = None) -> int:
    """Run ``ingestor`` to its end with a progress line every few seconds; the exit status.

    ``ending`` (a push source: set by SIGINT/SIGTERM, which also ended the source): once it is set,
    ingest waiting (backpressure, or Redis unreachable) is told to stop, so the process ends instead
    of waiting for room or for Redis for ever: the batch in hand is persisted if Redis answers (past
    ``max_pending``), else abandoned after the stop grace (exit 1); what the source still queues is
    never confirmed upstream (a webhook client gets 503, the broker keeps an MQTT message).
    ``failed`` (a push source that can no longer take anything: a webhook whose HTTP process kept
    dying) is asked likewise: once it returns an error, ingest waiting is stopped the same way (a
    paused ingest does not poll, so the source's own error would wait for the pause to end), and
    the run ends with that error (exit 2), even if a signal stopped it first."""
    started = time.monotonic()
    ingestor.start()
    try:
        next_line = started + PROGRESS_EVERY_S
        while not ingestor.done:
            time.sleep(0.1)
            if ingestor.paused is not None and ((ending is not None and ending.is_set())
                                                or (failed is not None and failed() is not None)):
                ingestor.request_stop()  # idempotent
            if time.monotonic() >= next_line:
                next_line += PROGRESS_EVERY_S
                _progress(ingestor, started)
    except KeyboardInterrupt:  # files: stop reading; what was read is persisted and its offset saved
        print("ftlayer ingest: interrupted; persisting what was read", file=sys.stderr, flush=True)
        ingestor.stop(30.0)
    for path, skipped in resumed.items():
        print(f"  resumed {path} at byte {skipped}")
    _progress(ingestor, started, final=True)
    error = ingestor.error if ingestor.error is not None else (failed() if failed is not None else None)
    if error is not None:
        msg = f"ingest stopped: {type(error).__name__}: {error}"
        raise CLIError(msg)
    if ingestor.abandoned:
        print(f"ftlayer ingest: {ingestor.abandoned} records read from {source_label} were not persisted "
              "(stopped while Redis was unreachable)", file=sys.stderr)
        return 1
    return 0


def _progress(ingestor: Ingestor, started: float, *, final: bool = False) -> None:
    elapsed = max(time.monotonic() - started, 1e-9)
    state = "done" if final else (f"paused: {ingestor.paused}" if ingestor.paused else "running")
    print(f"ftlayer ingest: {state}: persisted {ingestor.ingested}, dead-lettered {ingestor.rejected} "
          f"in {elapsed:.1f} s ({ingestor.ingested / elapsed:,.0f} records/s)", flush=True)

