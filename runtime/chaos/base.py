"""What every chaos scenario shares: its context, the chaos topology, the run loop that restarts a
dead query on its checkpoint, and the final check.

The chaos topology is ``source "events" (ScriptedSource, keyed by "user") -> map(ChaosMap)
[-> key_by(user) -> map] -> sink`` under the topology name ``chaos`` in the scenario's
namespace. The run loop (:func:`run_query`) starts it, waits until it drained (ingest ended,
nothing pending or waiting for replay), lets the last batch commit, and stops it. If the query
dies (a micro-batch failed for good), it is stopped and a new topology with the same name,
config, checkpoint and *the same source object* is started: the ScriptedSource continues
where it stopped, and records already persisted are read again from Redis, as a restarted
driver would. Each restart is noted in the report.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer
from runtime.chaos.errors import ChaosError
from runtime.checker import Report, check
from runtime.spark.scratch import scratch_env
from runtime.spark.xor_handler import DUPLICATE_FLUSH_PROPERTY
from runtime.testing import CollectingSink, FaultLog, ScriptedSource
from runtime.topology import FTQuery, Topology

if TYPE_CHECKING:
    from runtime.chaos.targets import Target

TOPOLOGY = "chaos"
SOURCE = "events"
TRIGGER_S = 0.2


def user_key(value: Any) -> Any:
    """The key of chaos records (routing and key_by)."""
    return value["user"]


def same(value: Any) -> Any:
    return value


@dataclass
class ScenarioContext:
    """Everything a scenario needs; ``say`` prints progress (a no-op in tests)."""

    name: str
    spark: Any
    config: FTConfig
    workdir: Path
    strict: bool = False
    say: Callable[[str], None] = lambda _msg: None
    target: Target | None = None  # where the pipeline writes (runtime.chaos.targets); None: lines in out_dir
    notes: list[str] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)

    @property
    def faults(self) -> FaultLog:
        return FaultLog(self.workdir / "faults")

    @property
    def out_dir(self) -> Path:
        return self.workdir / "out"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def spark_scratch(self) -> Path:
        """Spark's scratch files of the driver programs this scenario starts (see :func:`spawn_driver`)."""
        return self.workdir / SPARK_SCRATCH

    def sink(self) -> Any:
        """The Topology pipeline's sink: the target's (``--sink``), else lines in ``out_dir``."""
        return self.eo_sink() or CollectingSink(self.out_dir)

    def eo_sink(self) -> Any:
        """The effectively-once target's Topology sink (``--sink postgres|delta|redis``), else None."""
        if self.target is None or not self.target.effectively_once:
            return None
        return self.target.topology_sink()

    def layer(self, config: FTConfig | None = None) -> FTLayer:
        """A handle on the chaos source's FT state (for monitoring and the check)."""
        cfg = config or self.config
        return FTLayer(cfg, TOPOLOGY, SOURCE, num_channels=cfg.num_channels)


#: The file a scenario drops into the workdir to end a push source's driver program (webhook, MQTT:
#: ``runtime.chaos.driver_app.run_pipeline``).
END_FILE = "end"
#: The directory under a scenario's workdir that holds its driver programs' Spark scratch files.
SPARK_SCRATCH = "spark-scratch"


def spawn_driver(ctx: ScenarioContext, module: str, args: list[str], log_name: str) -> subprocess.Popen[str]:
    """``python -m module args`` as a driver program the scenario may SIGKILL: a session of its own
    (``os.killpg`` takes its Spark JVM and Python workers too), stdout piped, stderr into
    ``log_name`` under the workdir, and Spark's scratch files in :attr:`ScenarioContext.spark_scratch`,
    which :func:`remove_scratch` deletes once the scenario is over."""
    with (ctx.workdir / log_name).open("w") as log:  # the child holds its own copy of the descriptor
        return subprocess.Popen([sys.executable, "-m", module, *args], stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True, env=scratch_env(ctx.spark_scratch))


def remove_scratch(workdir: Path) -> None:
    """Delete the Spark scratch files the scenario's driver programs left (a killed one leaves its own)."""
    shutil.rmtree(workdir / SPARK_SCRATCH, ignore_errors=True)


def sink_args(ctx: ScenarioContext) -> list[str]:
    """The ``--sink-spec`` arguments that give a scenario's driver program its target."""
    return ["--sink-spec", ctx.target.spec()] if ctx.target is not None else []


def new_workdir(name: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"ftlayer-chaos-{name}-"))


def build(config: FTConfig, source: Any, mapper: Callable[[Any], Any], sink: Any, *, keyed: bool) -> Topology:
    """The chaos topology (see the module notes)."""
    topo = Topology(TOPOLOGY, config)
    stream = topo.source(SOURCE, source, key=user_key).map(mapper)
    if keyed:
        stream = stream.key_by(user_key).map(same)
    stream.sink(sink)
    return topo


@contextlib.contextmanager
def duplicate_flushes(spark: Any, on: bool) -> Iterator[None]:
    """Switch the duplicated-flush fault on for queries started inside (Spark local property)."""
    if not on:
        yield
        return
    sc = spark.sparkContext
    sc.setLocalProperty(DUPLICATE_FLUSH_PROPERTY, "1")
    try:
        yield
    finally:
        sc.setLocalProperty(DUPLICATE_FLUSH_PROPERTY, None)


def _first_line(exc: BaseException) -> str:
    """The most telling line of an error: the last ``Name: message`` line of a Python traceback
    inside a Spark error, else the first line."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    named = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*: ", line) and not line.startswith("File ")]
    return (named[-1] if named else lines[0])[:200]


def count_restart(ctx: ScenarioContext, died: BaseException, restarts: int, max_restarts: int) -> int:
    """The scenario's query died after ``restarts`` restarts: note it and return the new count, or
    raise ChaosError (naming the last failure) once ``max_restarts`` are used up."""
    if restarts >= max_restarts:
        msg = f"chaos {ctx.name}: the query died {restarts + 1} times; last: {_first_line(died)}"
        raise ChaosError(msg) from died
    restarts += 1
    ctx.notes.append(f"query died ({_first_line(died)}); restarted on its checkpoint (#{restarts})")
    ctx.say(f"query died; restarting on its checkpoint (#{restarts})")
    return restarts


def run_query(
    ctx: ScenarioContext,
    make: Callable[[], Topology],
    *,
    timeout_s: float = 300.0,
    max_records_per_batch: int | None = 500,
    max_restarts: int = 3,
    on_tick: Callable[[FTQuery], None] | None = None,
    dup_flushes: bool = False,
) -> int:
    """Start the topology ``make()`` builds, wait until drained, stop it; restart it on its
    checkpoint when the query dies (at most ``max_restarts`` times). Returns the restarts.
    A run that does not drain in ``timeout_s`` is stopped and noted (the check then shows
    what is still pending)."""
    deadline = time.monotonic() + timeout_s
    restarts = 0
    while True:
        with duplicate_flushes(ctx.spark, dup_flushes):
            query = make().start(ctx.spark, checkpoint_location=str(ctx.checkpoint),
                                 trigger_interval_s=TRIGGER_S, max_records_per_batch=max_records_per_batch)
        died: BaseException | None = None
        drained = False
        try:
            while time.monotonic() < deadline:
                died = query.query.exception()
                if died is not None:
                    break
                if query.drained():
                    drained = True
                    break
                if on_tick is not None:
                    on_tick(query)
                time.sleep(0.25)
            if drained:
                query.query.processAllAvailable()  # the last commit trims the channel streams
        except Exception as exc:  # the query died while finishing
            died = exc
        finally:
            query.stop()
        if died is not None:
            restarts = count_restart(ctx, died, restarts, max_restarts)
            continue
        if not drained:
            ctx.notes.append(f"not drained within {timeout_s:.0f} s")
        return restarts


def finish(ctx: ScenarioContext, layers: list[FTLayer], sink: Any, source: ScriptedSource | Iterable[int]) -> Report:
    """Run the checker and attach the scenario's notes and elapsed time. ``source``: what the source
    produced (a ScriptedSource's emitted ids, or the ids themselves)."""
    emitted = source.emitted_ids if isinstance(source, ScriptedSource) else source
    eo = ctx.target is not None and ctx.target.effectively_once
    if eo:
        assert ctx.target is not None
        sink = ctx.target.lines()  # what the target holds, read back
    report = check(layers, sink, emitted, ctx.faults, strict=ctx.strict, scenario=ctx.name)
    if eo:
        assert ctx.target is not None
        report.notes.append(f"sink: {ctx.target.kind} (effectively once, keyed by lineage id)")
        report.expect(f"the {ctx.target.kind} sink holds no record twice, but what the source itself sent again "
                      f"({report.duplicates} ids twice, {report.resent} re-sent by the source)",
                      report.lineage_duplicates == 0 and report.duplicates == report.resent)
    report.notes.extend(ctx.notes)
    report.elapsed_s = time.monotonic() - ctx.started
    return report
