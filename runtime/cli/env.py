"""The one table of the CLI's own ``FTLAYER_*`` environment variables, and what is built from it.

Every command-line option with an environment default is a row of :data:`ENV_OPTIONS`; the
config options' variables (``FTLAYER_<OPTION>``) come from :class:`ftlayer.config.FTConfig`.
From these two tables come: each option's help text (``[env NAME]`` and the default), the
environment section of ``ftlayer --help`` (the config options' variables only: a command's own
variables are in that command's help), and the list of known names that
:func:`unknown_env_warnings` checks the environment against.

Contract of the lazy defaults: an option added with :func:`add_env_option` has a placeholder
default, so building the parser and ``--help`` never read or convert a variable. After parsing,
:func:`resolve_env_defaults` converts the variables of the options that were not given on the
command line, and raises :class:`~runtime.cli.common.CLIError` naming the variable, its value,
what is expected and the option it sets. A variable of another command is never read.
"""

from __future__ import annotations

import argparse
import difflib
import os
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ftlayer.config import CONFIG_FILE_ENV, ENV_PREFIX, FTConfig
from runtime.cli.common import CLIError


@dataclass(frozen=True)
class EnvOption:
    """One option whose default comes from an environment variable.

    ``kind`` is ``int``, ``float``, ``str``, ``flag`` (on when the variable is ``1``, ``true``, ``yes``
    or ``on``; a value that is none of these nor ``0``/``false``/``no``/``off`` is refused) or ``list``
    (the option may be repeated; the variable holds the values comma-separated);
    ``default`` is the default as text (None: no value); ``lo`` is the smallest allowed number.
    """

    command: str
    flag: str
    env: str
    kind: str
    default: str | None
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()
    lo: float | None = None

    @property
    def dest(self) -> str:
        return self.flag.lstrip("-").replace("-", "_")


def _bench(flag: str, env: str, kind: str, default: str | None, text: str, *, lo: float | None = 1) -> EnvOption:
    return EnvOption("bench", flag, "FTLAYER_BENCH_" + env, kind, default, text,
                     lo=lo if kind in ("int", "float") else None)


ENV_OPTIONS: tuple[EnvOption, ...] = (
    EnvOption("redis", "--data-dir", "FTLAYER_EMBEDDED_DATA_DIR", "str", None,
              "data directory (the AOF lives here; kept after the server stops); default a temporary "
              "directory, removed when the server stops", metavar="DIR"),
    EnvOption("ingest", "--key", "FTLAYER_INGEST_KEY", "str", None,
              "field of each JSON record that is its key (routing and replays by key, like key= in the "
              "API); default none: round-robin", metavar="FIELD"),
    EnvOption("ingest", "--schema", "FTLAYER_INGEST_SCHEMA", "str", None,
              "Spark DDL of the columns the query reads (\"i long, user string, ts timestamp\"): a record that "
              "does not fit is dead-lettered here at once with the reason naming its column, never persisted, "
              "and the others are kept as Arrow columns too, which a query reading with this schema takes "
              "without decoding (as ftlayer.ingest(..., schema=...)); default none: checked only when read",
              metavar="DDL"),
    EnvOption("ingest", "--no-columns", "FTLAYER_INGEST_NO_COLUMNS", "flag", None,
              "with --schema: check the records only, keep no Arrow columns of them (less Redis memory; a "
              "query then decodes each payload)"),
    EnvOption("ingest", "--format", "FTLAYER_INGEST_FORMAT", "str", "json",
              "json: each line (with --mqtt: each message's payload) is a JSON value; text: a string record",
              choices=("json", "text")),
    EnvOption("ingest", "--worker", "FTLAYER_INGEST_WORKER", "str", "0/1",
              "I/N: this process takes the lines whose number modulo N is I, so N processes share "
              "the files without overlap", metavar="I/N"),
    EnvOption("ingest", "--webhook", "FTLAYER_INGEST_WEBHOOK", "str", None,
              "[HOST:]PORT: receive records over HTTP/1.1 (POST / one JSON record, POST /batch a JSON array, "
              "either with Content-Type application/x-ndjson one record per line); answered 200 once persisted, "
              "503 + Retry-After while ingest waits; GET /healthz, /readyz; runs until SIGINT/SIGTERM",
              metavar="[HOST:]PORT"),
    EnvOption("ingest", "--webhook-token", "FTLAYER_INGEST_WEBHOOK_TOKEN", "str", None,
              "--webhook: every POST must carry Authorization: Bearer TOKEN (401 otherwise); best set in the "
              "variable, off the command line", metavar="TOKEN"),
    EnvOption("ingest", "--webhook-hmac-secret", "FTLAYER_INGEST_WEBHOOK_HMAC_SECRET", "str", None,
              "--webhook: every POST must carry X-Hub-Signature-256: sha256=<hex HMAC-SHA256 of the raw body "
              "keyed with SECRET> (GitHub's webhook signature; 401 otherwise); best set in the variable",
              metavar="SECRET"),
    EnvOption("ingest", "--webhook-tls-cert", "FTLAYER_INGEST_WEBHOOK_TLS_CERT", "str", None,
              "--webhook: serve HTTPS with this certificate (PEM, chain included); needs --webhook-tls-key "
              "unless the file holds the key too", metavar="FILE"),
    EnvOption("ingest", "--webhook-tls-key", "FTLAYER_INGEST_WEBHOOK_TLS_KEY", "str", None,
              "--webhook: the private key (PEM) of --webhook-tls-cert", metavar="FILE"),
    EnvOption("ingest", "--max-body-bytes", "FTLAYER_INGEST_MAX_BODY_BYTES", "int", "1048576",
              "--webhook: largest request body taken (413 beyond it)", metavar="N", lo=1),
    EnvOption("ingest", "--webhook-reply-timeout-s", "FTLAYER_INGEST_WEBHOOK_REPLY_TIMEOUT_S", "float", "30",
              "--webhook: a request whose records are not persisted within this long is answered 503 "
              "(the client retries)", metavar="S", lo=0.1),
    EnvOption("ingest", "--mqtt", "FTLAYER_INGEST_MQTT", "str", None,
              "mqtt://[USER[:PASSWORD]@]HOST[:PORT] (mqtts:// for TLS): subscribe to the --topic filters on this "
              "MQTT broker on a persistent session; a message is acknowledged only once persisted; runs until "
              "SIGINT/SIGTERM (the variable keeps a password off the command line)", metavar="URL"),
    EnvOption("ingest", "--topic", "FTLAYER_INGEST_TOPIC", "list", None,
              "--mqtt: a topic filter to subscribe to (+ and # wildcards); repeat for several", metavar="FILTER"),
    EnvOption("ingest", "--qos", "FTLAYER_INGEST_QOS", "str", "1",
              "--mqtt: subscription QoS; 2 holds the PUBREC until persisted, so both lose nothing and may "
              "duplicate", choices=("1", "2")),
    EnvOption("ingest", "--client-id", "FTLAYER_INGEST_CLIENT_ID", "str", None,
              "--mqtt: the client id, under which the broker keeps the session (subscription, unacknowledged "
              "messages) while this process is down: start it again with the same id; default "
              "ftlayer-<namespace>-<topology>-<source>", metavar="ID"),
    EnvOption("ingest", "--shared-group", "FTLAYER_INGEST_SHARED_GROUP", "str", None,
              "--mqtt: subscribe to $share/GROUP/<filter>, so the ingest processes of one group split the "
              "messages (each needs its own --client-id)", metavar="GROUP"),
    EnvOption("ingest", "--key-topic", "FTLAYER_INGEST_KEY_TOPIC", "flag", None,
              "--mqtt: the message's topic is the record's key (it is added to each record under "
              "--topic-field, default 'topic')"),
    EnvOption("ingest", "--topic-field", "FTLAYER_INGEST_TOPIC_FIELD", "str", None,
              "--mqtt: add the message's topic to each record under this field (a JSON object gets the field; "
              "any other payload becomes {FIELD: topic, \"payload\": value})", metavar="FIELD"),
    EnvOption("ingest", "--mqtt-protocol", "FTLAYER_INGEST_MQTT_PROTOCOL", "str", "5",
              "--mqtt: MQTT protocol version", choices=("5", "3.1.1")),
    EnvOption("ingest", "--max-inflight", "FTLAYER_INGEST_MAX_INFLIGHT", "int", "1000",
              "--mqtt: most messages the broker may send unacknowledged (MQTT 5 Receive Maximum); bounds what "
              "this process holds while ingest waits", metavar="N", lo=1),
    EnvOption("ingest", "--tls-ca", "FTLAYER_INGEST_TLS_CA", "str", None,
              "--mqtt: CA certificates (PEM) to verify the broker with; turns TLS on; default with mqtts:// the "
              "system's", metavar="FILE"),
    EnvOption("ingest", "--tls-cert", "FTLAYER_INGEST_TLS_CERT", "str", None,
              "--mqtt: client certificate (PEM) for brokers that require one; needs --tls-key", metavar="FILE"),
    EnvOption("ingest", "--tls-key", "FTLAYER_INGEST_TLS_KEY", "str", None,
              "--mqtt: the client certificate's private key (PEM)", metavar="FILE"),
    EnvOption("ingest", "--num-channels", "FTLAYER_INGEST_NUM_CHANNELS", "int", None,
              "channels of the source; must match the reader's; default num_channels of the config",
              metavar="N", lo=1),
    EnvOption("ingest", "--offsets-dir", "FTLAYER_INGEST_OFFSETS_DIR", "str", None,
              "where the byte offset of each file already persisted is kept, so a restarted ingest "
              "resumes; default <state_dir>/<topology>/ingest/<source>", metavar="DIR"),
    EnvOption("ingest", "--from-start", "FTLAYER_INGEST_FROM_START", "flag", None,
              "ignore saved offsets and read every file from its start"),
    EnvOption("chaos", "--records", "FTLAYER_CHAOS_RECORDS", "int", None,
              "records to emit; default the scenario's CI size (soak: 1000000)", metavar="N", lo=1),
    EnvOption("chaos", "--durability", "FTLAYER_CHAOS_DURABILITY", "str", None,
              "kill-redis and kill-primary: the durability mode to test, or 'all' for each in turn "
              "(default: all for kill-redis, replicated for kill-primary)",
              choices=("none", "everysec", "waitaof", "replicated", "replicated-aof", "all")),
    EnvOption("chaos", "--workdir", "FTLAYER_CHAOS_WORKDIR", "str", None,
              "directory for the sink output, fault marks and checkpoint; default a new temporary directory",
              metavar="DIR"),
    EnvOption("chaos", "--master", "FTLAYER_CHAOS_MASTER", "str", "local[2,4]",
              "the Spark master of the scenario's session; 'local-cluster[2,1,1024]' runs two executor "
              "JVMs (needed by kill-executor)", metavar="MASTER"),
    EnvOption("chaos", "--pipeline", "FTLAYER_CHAOS_PIPELINE", "str", "topology",
              "the pipeline under the faults: the Topology API, or a DataFrame pipeline (read_stream, "
              "ftlayer.udf, foreachBatch(acking)); dataframe runs fail-rate, kill-worker, kill-executor, poison, "
              "batch-fails, kill-driver, kill-redis, long-outage, delayed-acks, mixed, webhook-driver-kill, "
              "webhook-driver-front-kill, mqtt-driver-kill, slow-sink, sink-outage and aggregate",
              choices=("topology", "dataframe")),
    EnvOption("chaos", "--sink", "FTLAYER_CHAOS_SINK", "str", "lines",
              "where the pipeline writes: JSON lines (at-least-once: a replay shows as a duplicate), or an "
              "effectively-once sink keyed by lineage id (postgres, delta, redis); the report then counts what "
              "the target holds and expects no record twice", choices=("lines", "postgres", "delta", "redis")),
    EnvOption("chaos", "--sink-url", "FTLAYER_CHAOS_SINK_URL", "str", None,
              "the --sink's server: a postgresql:// conninfo (default: an embedded PostgreSQL started in the "
              "work directory), a Delta table path (default <workdir>/delta) or a redis:// URL (default the "
              "FT server)", metavar="URL"),
    EnvOption("chaos", "--strict", "FTLAYER_CHAOS_STRICT", "flag", None,
              "also fail on replays no injected fault explains"),
    EnvOption("chaos", "--keep", "FTLAYER_CHAOS_KEEP", "flag", None,
              "keep the temporary work directory and the generated namespace's Redis keys (default: remove "
              "them; a --namespace you name is never deleted)"),
    _bench("--out", "OUT", "str", "./ftlayer-bench",
           "directory of results.json and the PNG plots, created if missing; a relative path is taken from the "
           "current directory (scripts/bench passes the checkout's docs/bench)"),
    _bench("--no-write", "NO_WRITE", "flag", None, "print only; leave results.json and the plots alone"),
    _bench("--records", "RECORDS", "int", "100000",
           "acker: records per round and pending records of the memory figure; redis-cpu and ingest-cpu: half "
           "their records"),
    _bench("--repeats", "REPEATS", "int", "5",
           "acker: alternating rounds per variant; redis-cpu and ingest-cpu: rounds"),
    _bench("--payload-bytes", "PAYLOAD_BYTES", "int", "32",
           "acker and scaling: payload size of the memory figures", lo=0),
    _bench("--scaling-sizes", "SCALING_SIZES", "str", "10000,100000,1000000",
           "scaling: pending-record levels, comma-separated"),
    _bench("--replay-records", "REPLAY_RECORDS", "int", "20000", "replay and retry: records in the failed batch"),
    _bench("--replay-repeats", "REPLAY_REPEATS", "int", "3", "replay and retry: rounds"),
    _bench("--latency-rate", "LATENCY_RATE", "float", "2000", "latency: offered records per second"),
    _bench("--latency-duration-s", "LATENCY_DURATION_S", "float", "30", "latency: measured seconds after the warm-up"),
    _bench("--trigger-interval-s", "TRIGGER_INTERVAL_S", "float", "0.5", "latency: the trigger interval",
           lo=0.05),
    _bench("--e2e-records", "E2E_RECORDS", "int", "1000000", "e2e: small records per run"),
    _bench("--e2e-kib-records", "E2E_KIB_RECORDS", "int", "200000", "e2e: 1 KiB records per run"),
    _bench("--e2e-dataframe-records", "E2E_DATAFRAME_RECORDS", "int", "300000",
           "e2e: small records per run of the DataFrame pipeline", lo=1),
    _bench("--e2e-repeats", "E2E_REPEATS", "int", "3", "e2e: alternating rounds per variant"),
    _bench("--once-records", "ONCE_RECORDS", "int", "100000",
           "effectively-once: records per run of the DataFrame pipeline into Postgres and into Delta", lo=1),
    _bench("--once-repeats", "ONCE_REPEATS", "int", "3",
           "effectively-once: alternating rounds of the at-least-once and the effectively-once writer", lo=1),
    _bench("--postgres-url", "POSTGRES_URL", "str", None,
           "effectively-once: the PostgreSQL to write to; default an embedded server from the machine's "
           "initdb/postgres"),
    _bench("--cluster-records", "CLUSTER_RECORDS", "int", "200000",
           "cluster: records each of the 2 client processes persists and acks per round", lo=1),
    _bench("--cluster-repeats", "CLUSTER_REPEATS", "int", "3", "cluster: alternating rounds per cluster size", lo=1),
    _bench("--masters-records", "MASTERS_RECORDS", "int", "200000",
           "masters: records of each measured FT-on run on local[2] and on local-cluster[2,1,1024]", lo=1),
    _bench("--masters-repeats", "MASTERS_REPEATS", "int", "2", "masters: alternating rounds per master", lo=1),
    _bench("--webhook-records", "WEBHOOK_RECORDS", "int", "200000", "webhook: records per round", lo=1),
    _bench("--webhook-batch", "WEBHOOK_BATCH", "int", "100", "webhook: records per request (a JSON array)", lo=1),
    _bench("--webhook-connections", "WEBHOOK_CONNECTIONS", "int", "8",
           "webhook: keep-alive client connections posting at once", lo=1),
    _bench("--mqtt-records", "MQTT_RECORDS", "int", "50000",
           "mqtt: QoS 1 messages per round (from 2 publisher processes)", lo=2),
    _bench("--receiver-repeats", "RECEIVER_REPEATS", "int", "3",
           "webhook and mqtt: alternating rounds of the raw server or broker and ftlayer's receiver", lo=1),
)


def ingest_option(dest: str) -> EnvOption:
    """The ``ftlayer ingest`` option (flag and variable) behind ``args.<dest>``."""
    return next(o for o in ENV_OPTIONS if o.command == "ingest" and o.dest == dest)

# Variables read elsewhere than an option default: (name, what reads it).
OTHER_ENV_VARS: tuple[tuple[str, str], ...] = (
    (CONFIG_FILE_ENV, "the ftlayer TOML config file (default ./ftlayer.toml if it exists)"),
    ("FTLAYER_BENCH", "ftlayer bench: the benchmarks to run when none is named, comma-separated"),
    ("FTLAYER_CHAOS_DUPLICATE_FLUSH", "ftlayer chaos: =1 in the process that flushes sends every flush twice "
                                      "(the duplicate-flushes scenario sets the Spark local property "
                                      "ftlayer.chaos.duplicateFlush instead, for its own queries)"),
    ("FTLAYER_TEST_REDIS_URL", "tests: use this server instead of an embedded one"),
    ("FTLAYER_TEST_WORKERS", "scripts/test: pytest-xdist workers (default 4; 0 runs the tests in one process)"),
    ("FTLAYER_VENV", "scripts/*: the virtualenv to create or reuse"),
    ("FTLAYER_KEEP_PYSPARK_ZIP", "Spark's Python processes: =1 keeps pyspark.zip first on their path even "
                                 "when it is the installed pyspark's (runtime/spark/installed_pyspark.py)"),
)


class EnvDefault:
    """Placeholder default of an :class:`EnvOption`; replaced by :func:`resolve_env_defaults`."""

    def __init__(self, option: EnvOption) -> None:
        self.option = option

    def __repr__(self) -> str:  # what argparse would show; help text never shows it
        return f"${self.option.env}"


class _AppendAfterEnvDefault(argparse.Action):
    """``action="append"`` whose first use replaces the lazy :class:`EnvDefault` (not appended to)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        items = getattr(namespace, self.dest, None)
        items = [] if items is None or isinstance(items, EnvDefault) else list(items)
        items.append(values)
        setattr(namespace, self.dest, items)


def option_help(opt: EnvOption) -> str:
    """The help text of ``opt``: its text, its default when it has one, and its variable."""
    if opt.kind == "flag":
        return f"{opt.help} [env {opt.env}=1]"
    if opt.kind == "list":
        return f"{opt.help} [env {opt.env}, comma-separated]"
    default = f"; default {opt.default}" if opt.default is not None else ""
    return f"{opt.help}{default} [env {opt.env}]"


def add_env_option(parser: argparse.ArgumentParser, opt: EnvOption) -> None:
    """Add ``opt`` to ``parser`` with a lazy environment default."""
    kw: dict[str, Any] = {"dest": opt.dest, "default": EnvDefault(opt), "help": option_help(opt)}
    if opt.kind == "flag":
        parser.add_argument(opt.flag, action="store_true", **kw)
        return
    if opt.kind == "list":
        kw["action"] = _AppendAfterEnvDefault
    else:
        kw["type"] = _converter(opt)
    if opt.choices:
        kw["choices"] = opt.choices
    if opt.metavar:
        kw["metavar"] = opt.metavar
    parser.add_argument(opt.flag, **kw)


def add_env_options(parser: argparse.ArgumentParser, command: str) -> None:
    """Add every row of the table that belongs to ``command``."""
    for opt in ENV_OPTIONS:
        if opt.command == command:
            add_env_option(parser, opt)


def _expected(opt: EnvOption) -> str:
    what = {"int": "an integer", "float": "a number", "str": "a value", "list": "comma-separated values"}[opt.kind]
    if opt.lo is not None:
        what += f" >= {opt.lo:g}"
    if opt.choices:
        what = "one of " + ", ".join(opt.choices)
    return what


def _convert(opt: EnvOption, raw: str) -> Any:
    """``raw`` as the option's type; ValueError if it is not one."""
    text = raw.strip()
    if opt.kind == "int":
        value: Any = int(text.replace("_", ""))
    elif opt.kind == "float":
        value = float(text)
    elif opt.kind == "list":
        value = [part.strip() for part in raw.split(",") if part.strip()]
        if not value:
            raise ValueError(raw)
        return value
    else:
        value = raw
    if opt.lo is not None and not value >= opt.lo:
        raise ValueError(raw)
    if opt.choices and value not in opt.choices:
        raise ValueError(raw)
    return value


def _converter(opt: EnvOption) -> Any:
    def convert(raw: str) -> Any:
        try:
            return _convert(opt, raw)
        except ValueError:
            msg = f"invalid value {raw!r}: expected {_expected(opt)}"
            raise argparse.ArgumentTypeError(msg) from None

    convert.__name__ = opt.kind  # argparse names the type in some messages
    return convert


def _flag(opt: EnvOption, raw: str | None) -> bool:
    """A flag's variable: 1/true/yes/on (any case) sets it; unset, empty or 0/false/no/off leave it off.

    Anything else is refused (:class:`CLIError` naming the variable): ``=maybe`` silently meaning off
    would run, say, a chaos scenario without the check its user asked for.
    """
    text = "" if raw is None else raw.strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("", "0", "false", "no", "off"):
        return False
    msg = (f"environment variable {opt.env}={raw!r} is invalid: expected 1 (or true, yes, on) to set it, "
           f"0 (or false, no, off, empty) to leave it off (it sets ftlayer {opt.command} {opt.flag}; "
           "unset it or fix it)")
    raise CLIError(msg)


def resolve_env_defaults(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> argparse.Namespace:
    """Replace every :class:`EnvDefault` left in ``args`` by its variable's value or the default."""
    env = os.environ if env is None else env
    for dest, value in vars(args).items():
        if not isinstance(value, EnvDefault):
            continue
        opt = value.option
        raw = env.get(opt.env)
        if opt.kind == "flag":
            setattr(args, dest, _flag(opt, raw))
            continue
        if raw is None or (raw == "" and opt.kind != "str"):
            setattr(args, dest, None if opt.default is None else _convert(opt, opt.default))
            continue
        try:
            setattr(args, dest, _convert(opt, raw))
        except ValueError:
            msg = (f"environment variable {opt.env}={raw!r} is invalid: expected {_expected(opt)} "
                   f"(it sets ftlayer {opt.command} {opt.flag}; unset it or fix it)")
            raise CLIError(msg) from None
    return args


def config_env_vars() -> list[tuple[str, str]]:
    """(variable, meaning) of every config option, from FTConfig."""
    return [(env, doc) for _, env, _, doc in FTConfig().describe()]


def known_env_vars() -> set[str]:
    """Every ``FTLAYER_*`` name that something in ftlayer reads."""
    return {e for e, _ in config_env_vars()} | {o.env for o in ENV_OPTIONS} | {n for n, _ in OTHER_ENV_VARS}


def unknown_env_warnings(env: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``FTLAYER_*`` variable that nothing reads, with the closest known name."""
    env = os.environ if env is None else env
    known = known_env_vars()
    out: list[str] = []
    for name in sorted(n for n in env if n.startswith(ENV_PREFIX) and n not in known):
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else " (ftlayer --help and each command's --help name them)"
        out.append(f"unknown environment variable {name} is ignored{hint}")
    return out


def env_help_epilog() -> str:
    """The environment section of ``ftlayer --help``: the config options' variables only.

    The commands' own variables (bench, chaos, ingest: most of :data:`ENV_OPTIONS`) are listed
    by each command's ``--help``, next to the option each one sets; the top-level help only says so.
    """
    names = ", ".join(name for name, _ in config_env_vars())
    return "\n".join([
        "environment variables: every config option has one (precedence: defaults < ftlayer.toml <",
        "env < spark.ftlayer.* conf < command line; 'ftlayer config' shows the effective values and",
        "where each came from, docs/configuration.md what each means):",
        textwrap.fill(names, width=96, initial_indent="  ", subsequent_indent="  "),
        "Each command's --help names the variable behind each of its options that has one",
        "(FTLAYER_BENCH_*, FTLAYER_CHAOS_*, FTLAYER_INGEST_*, ...; --redis-url, --namespace, --config).",
        "Exit status: 0 done, 1 not (entirely) done, 2 error.",
    ])


def command_env_epilog(command: str) -> str:
    """The variables of :data:`OTHER_ENV_VARS` that ``command`` reads besides its options' (help epilog)."""
    rows = [(name, text.split(": ", 1)[1]) for name, text in OTHER_ENV_VARS if text.startswith(f"ftlayer {command}:")]
    return ("Also read from the environment: " + "; ".join(f"{name}: {text}" for name, text in rows)) if rows else ""
