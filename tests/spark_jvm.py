"""How the suite's JVMs start: the tests' Spark conf as driver options, and a class-data archive.

On a 2-core machine the suite waits for CPU, and a good part of it goes into starting JVMs: every
SparkSession, every driver app a chaos test starts and restarts, the demo, the Connect server. A
driver JVM loads some ten thousand classes from Spark's jars before its first job. A dynamic
class-data-sharing archive (JDK CDS, ``-XX:ArchiveClassesAtExit`` once, then
``-XX:SharedArchiveFile``) maps them parsed and verified instead: a session's start and two small
jobs cost about 9.5 CPU-s with it against 14.8 without (three runs each, 2026-11-26).

Two things follow from how the JVM checks an archive against its classpath, and they shape this
module:

- The archive must have been dumped with the same classpath (as a prefix) and the JVM refuses to
  dump one with a non-empty directory on it. Spark puts ``SPARK_CONF_DIR`` first on the driver's
  classpath, so the suite points ``SPARK_CONF_DIR`` at an **empty** directory and passes the conf of
  ``tests/spark-conf/spark-defaults.conf`` through ``SPARK_SUBMIT_OPTS`` instead: the driver options
  as the driver JVM's own flags, every other key as ``-Dspark.…`` (SparkConf reads ``spark.*``
  system properties). Every ``spark-submit`` reads ``SPARK_SUBMIT_OPTS``, PySpark's own launch
  included, so the in-process session, the driver apps and the Connect server all get it.
- The executor JVMs of a ``local-cluster`` master start with the same classpath, so they map it
  too (``spark.executor.defaultJavaOptions``).
- A JVM that cannot use the archive (another classpath, such as the shipped-environment test's
  own Spark; another JDK) runs without it; ``-Xlog:cds…=off`` keeps its warning out of the
  driver's stdout, which some tests read.

The archive lives in ``.cache/spark-cds/`` under the checkout, named by the PySpark version, the
``java`` on PATH and the driver options, so a change of any of them makes a new one.
``scripts/test`` builds it before the suite (``python -m tests.spark_jvm``, about 40 s once per
checkout); without it the suite runs as before, only slower. A ``SPARK_CONF_DIR`` set by the
caller wins: then none of this applies.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CONF_FILE = ROOT / "tests" / "spark-conf" / "spark-defaults.conf"
CACHE = ROOT / ".cache" / "spark-cds"
EMPTY_CONF_DIR = CACHE / "conf"
DRIVER_OPTIONS = "spark.driver.defaultJavaOptions"
EXECUTOR_OPTIONS = "spark.executor.defaultJavaOptions"
QUIET_CDS = "-Xlog:cds=off,cds+dynamic=off"


def read_conf(path: Path = CONF_FILE) -> dict[str, str]:
    """The ``key value`` lines of a spark-defaults.conf (comments and blank lines skipped)."""
    conf: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition(" ")
            conf[key] = value.strip()
    return conf


def archive_path(conf: dict[str, str]) -> Path:
    """Where the archive for this PySpark, this ``java`` and these driver options lives."""
    # The installed distribution's version, read from its metadata: importing pyspark here would
    # cost every test worker ~0.2 s, the fast tier's included, for one string.
    version = importlib.metadata.version("pyspark")
    java = shutil.which("java") or ""
    ident = "\n".join([version, os.path.realpath(java) if java else "", conf.get(DRIVER_OPTIONS, "")])
    return CACHE / f"spark-{version}-{hashlib.sha256(ident.encode()).hexdigest()[:12]}.jsa"


def submit_opts(conf: dict[str, str], archive: Path | None = None, *, dump: bool = False) -> str:
    """``SPARK_SUBMIT_OPTS`` carrying ``conf``: the driver options as flags, the rest as ``-D``.

    With ``archive``, the driver maps it, and so do the executor JVMs of ``local-cluster`` masters
    (their classpath starts as the driver's); with ``dump`` too, the driver writes it at exit
    instead (the executors are left out: each would write it).
    """
    parts = shlex.split(conf.get(DRIVER_OPTIONS, ""))
    conf = dict(conf)
    if archive is not None and dump:
        parts.append(f"-XX:ArchiveClassesAtExit={archive}")
    elif archive is not None:
        mapped = f"-XX:SharedArchiveFile={archive} {QUIET_CDS}"
        parts += shlex.split(mapped)
        conf[EXECUTOR_OPTIONS] = f"{conf.get(EXECUTOR_OPTIONS, '')} {mapped}".strip()
    parts += [f"-D{key}={value}" for key, value in conf.items() if key != DRIVER_OPTIONS]
    # Spark's launcher splits this string itself, honouring quotes (a value with spaces stays one).
    return " ".join(shlex.quote(p) for p in parts)


def configure(environ: dict[str, str] | os._Environ[str] = os.environ) -> None:
    """Point this process's future JVMs at the tests' conf (and the archive, when built).

    Does nothing when the caller set ``SPARK_CONF_DIR``: their conf wins, as before.
    """
    if "SPARK_CONF_DIR" in environ:
        return
    conf = read_conf()
    archive = archive_path(conf)
    EMPTY_CONF_DIR.mkdir(parents=True, exist_ok=True)
    environ["SPARK_CONF_DIR"] = str(EMPTY_CONF_DIR)
    environ["SPARK_SUBMIT_OPTS"] = submit_opts(conf, archive if archive.is_file() else None)


_DUMP_JOB = """
from pyspark import SparkContext
from pyspark.sql import SparkSession, functions as F
s = SparkSession.builder.master("local[2]").appName("cds-dump").config("spark.ui.enabled", "false") \\
    .config("spark.sql.shuffle.partitions", "2").getOrCreate()
df = s.range(2000).withColumn("k", F.col("id") % 7)
df.groupBy("k").count().collect()
df.mapInArrow(lambda it: (b for b in it), df.schema).count()
seen = []
q = (s.readStream.format("rate").option("rowsPerSecond", 50).load()
     .writeStream.foreachBatch(lambda b, i: seen.append(b.count())).trigger(processingTime="200 milliseconds")
     .option("checkpointLocation", {checkpoint!r}).start())
while len(seen) < 3:
    q.awaitTermination(0.2)
q.stop()
# The archive is written when the JVM exits, and PySpark does not wait for that: close the
# gateway's stdin (which ends the JVM) and wait for the process.
gateway = SparkContext._gateway
s.stop()
gateway.proc.stdin.close()
gateway.proc.wait()
"""


def build_archive() -> Path:
    """Dump the archive by running a small batch and streaming job; returns its path.

    Written under a temporary name and renamed, so a run that dies half-way leaves no archive a
    JVM would try to map. Idempotent: an archive already there is kept.
    """
    conf = read_conf()
    archive = archive_path(conf)
    if archive.is_file():
        return archive
    import tempfile

    EMPTY_CONF_DIR.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(f".{os.getpid()}.part")
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, SPARK_CONF_DIR=str(EMPTY_CONF_DIR), PYSPARK_PYTHON=sys.executable,
                   SPARK_SUBMIT_OPTS=submit_opts(conf, partial, dump=True))
        job = _DUMP_JOB.format(checkpoint=str(Path(tmp) / "ckpt"))
        done = subprocess.run([sys.executable, "-c", job], check=False, env=env, cwd=tmp,
                              capture_output=True, text=True)
    if done.returncode != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        msg = f"the class-data archive was not written (exit {done.returncode}): {done.stderr[-2000:]}"
        raise RuntimeError(msg)
    partial.rename(archive)
    return archive


if __name__ == "__main__":
    print(f"class-data archive for the suite's JVMs: {build_archive()}")
