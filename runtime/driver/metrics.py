"""Prometheus metrics of the FT layer, served over HTTP by the driver (opt-in).

Metrics are off unless ``metrics_port`` is set (1-65535; ``FTLAYER_METRICS_PORT``,
``spark.ftlayer.metrics_port``). Then :class:`MetricsExporter` serves
``http://<metrics_host>:<metrics_port>/metrics`` from a daemon thread::

    exporter = MetricsExporter(query.layers, config).start()   # no-op when metrics_port == 0
    ...
    exporter.stop()

Contract:

- The figures are read from Redis **at scrape time** by a custom collector
  (:class:`FTCollector`), with the same read-only pipeline as ``ftlayer
  status`` (:func:`runtime.cli.status.sample`): nothing is counted in the driver,
  so the numbers are those of every process that works on the sources, and
  they survive a driver restart. A scrape costs one Redis round trip per
  namespace.
- Every series has the labels ``namespace``, ``topology`` and ``source``.
  Counters (``*_total``): ``ftlayer_records_persisted_total``,
  ``ftlayer_records_acked_total``, ``ftlayer_records_failed_total`` (extra
  label ``kind`` = ``explicit`` | ``timeout``), ``ftlayer_records_replayed_total``,
  ``ftlayer_records_dead_lettered_total``, ``ftlayer_records_requeued_total``,
  ``ftlayer_late_deltas_total``, ``ftlayer_duplicate_flushes_total``,
  ``ftlayer_records_refiled_unread_total``, ``ftlayer_records_refiled_held_total``,
  ``ftlayer_records_late_completions_total``. They come
  from the source's ``stats`` hash and restart from 0 only if its keys are
  deleted. Gauges: ``ftlayer_pending_records``,
  ``ftlayer_failed_waiting_records``, ``ftlayer_dead_letters``,
  ``ftlayer_bucket_generation``, ``ftlayer_oldest_pending_age_seconds``
  (0 when nothing is pending, NaN when pending records' bucket start is
  unknown; an upper bound accurate to one rotation interval),
  ``ftlayer_service_alive`` (1 while an FT service holds the rotator lease),
  ``ftlayer_sink_breaker_open`` (1 while an acking point retries a failed write and the
  source's replays are paused), ``ftlayer_running_batches`` (micro-batches holding the
  source's records now)
  and ``ftlayer_redis_up`` (0 when the source could not be read at this
  scrape; its other series are then absent). Histogram:
  ``ftlayer_complete_latency_seconds`` (see :class:`CompleteLatencyTracker`).
- Several exporters of one process on the same host and port share one HTTP
  server (two topologies in one driver); the server stops with the last.
  A port that cannot be bound raises :class:`MetricsError`.
- The endpoint has no authentication: the default host 127.0.0.1 keeps it
  local. No URL or password is ever part of a metric.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from types import TracebackType

import redis
from prometheus_client import CollectorRegistry, Histogram, generate_latest, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from ftlayer.config import FTConfig
from ftlayer.errors import FTLayerError
from ftlayer.facade.ft_layer import FTLayer
from ftlayer.logs import logger_for
from ftlayer.status.read_model import SourceStatus, sample
from ftlayer.store.source_store import SourceStore

log = logger_for(__name__)

LABELS = ("namespace", "topology", "source")
# (metric name without _total, stats counter, help)
COUNTERS: tuple[tuple[str, str, str], ...] = (
    ("ftlayer_records_persisted", "persisted",
     "Source records persisted by ingest (replays and requeues count separately)."),
    ("ftlayer_records_acked", "acked", "Source records whose whole tree was acked (complete)."),
    ("ftlayer_records_replayed", "replayed", "Failed records replayed under a new source record id."),
    ("ftlayer_records_dead_lettered", "dead_lettered", "Records moved to the dead-letter stream after max_replays."),
    ("ftlayer_records_requeued", "requeued", "Dead letters put back into their channel (ftlayer dlq requeue)."),
    ("ftlayer_late_deltas", "late_deltas", "XOR deltas ignored because their record had completed or failed."),
    ("ftlayer_duplicate_flushes", "duplicate_flushes", "Flushes skipped because their token was already applied."),
    ("ftlayer_records_refiled_unread", "refiled_unread",
     "Timeouts of records no task had read yet (a stall): re-filed, not failed, no replay spent."),
    ("ftlayer_records_refiled_held", "refiled_held",
     "Timeouts of records a running micro-batch had read (its hold): postponed, not failed."),
    ("ftlayer_records_late_completions", "late_completions",
     "Timed-out records whose DataFrame batch committed after all: their replay was cancelled."),
)
FAILED_COUNTER = "ftlayer_records_failed"
LATENCY_METRIC = "ftlayer_complete_latency_seconds"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, math.inf)

SourceLike = FTLayer | SourceStore


class MetricsError(FTLayerError):
    """The metrics endpoint cannot be served (for example, its port is taken)."""


def _store(source: SourceLike) -> SourceStore:
    return source.store if isinstance(source, FTLayer) else source


def _labels(store: SourceStore) -> tuple[str, str, str]:
    k = store.keys
    return (k.namespace, k.topology, k.source)


class CompleteLatencyTracker:
    """Histogram ``ftlayer_complete_latency_seconds``: persist to complete (tree acked), per source.

    The acker does not know when a completed record was persisted, so the
    runtime measures the latency where it knows both ends and calls
    :meth:`observe`. Observations count in the process that makes them and
    only the driver serves them: observe in the driver (for example in the
    driver-side ``foreachBatch`` sink), not in Spark's Python workers, whose
    observations would stay in the worker process. Negative values (clock
    skew) count as 0; NaN is ignored.
    """

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self.histogram = Histogram(
            LATENCY_METRIC, "Seconds from persist to complete (whole tree acked) of source records.",
            LABELS, buckets=buckets, registry=None,
        )

    def observe(self, seconds: float, of: SourceLike | None = None) -> None:
        """Count one record that completed ``seconds`` after it was persisted; ``of`` gives the labels."""
        if math.isnan(seconds):
            return
        labels = _labels(_store(of)) if of is not None else ("", "", "")
        self.histogram.labels(*labels).observe(max(0.0, seconds))


COMPLETE_LATENCY = CompleteLatencyTracker()


def observe_complete_latency(seconds: float, of: SourceLike | None = None) -> None:
    """Count a completed record in the process-wide :data:`COMPLETE_LATENCY` histogram (served by exporters)."""
    COMPLETE_LATENCY.observe(seconds, of)


class FTCollector:
    """A prometheus_client collector that reads the sources' figures from Redis at each scrape."""

    def __init__(self, sources: Iterable[SourceLike] = ()) -> None:
        self._lock = threading.Lock()
        self._stores: dict[tuple[str, str, str], tuple[SourceStore, int]] = {}
        self.add(sources)

    def add(self, sources: Iterable[SourceLike]) -> None:
        """Serve these sources too (a source added twice is served once, until removed twice)."""
        with self._lock:
            for src in sources:
                store = _store(src)
                old = self._stores.get(_labels(store))
                self._stores[_labels(store)] = (old[0] if old else store, (old[1] if old else 0) + 1)

    def remove(self, sources: Iterable[SourceLike]) -> None:
        """Undo one :meth:`add` of these sources."""
        with self._lock:
            for src in sources:
                key = _labels(_store(src))
                if key in self._stores:
                    store, refs = self._stores[key]
                    if refs > 1:
                        self._stores[key] = (store, refs - 1)
                    else:
                        del self._stores[key]

    @property
    def stores(self) -> list[SourceStore]:
        """The sources served, sorted by namespace, topology and source."""
        with self._lock:
            return [self._stores[k][0] for k in sorted(self._stores)]

    def _samples(self) -> Iterator[tuple[SourceStore, SourceStatus | None]]:
        """Each source with its figures, or None if Redis could not be read (one pipeline per group)."""
        groups: dict[tuple[int, str], tuple[redis.Redis | None, list[SourceStore]]] = {}
        for store in self.stores:
            try:
                client: redis.Redis | None = store.client
            except FTLayerError as exc:
                log.warning("ftlayer metrics: cannot connect for %s: %s", store.keys.prefix, exc)
                client = None
            groups.setdefault((id(client), store.keys.namespace), (client, []))[1].append(store)
        for (_, namespace), (client, stores) in groups.items():
            figures: list[SourceStatus | None] = [None] * len(stores)
            if client is not None:
                try:
                    snap = sample(client, namespace, [(s.keys.topology, s.keys.source) for s in stores])
                    figures = list(snap.sources)
                except (redis.RedisError, FTLayerError) as exc:
                    log.warning("ftlayer metrics: cannot read namespace %r: %s", namespace, exc)
            yield from zip(stores, figures, strict=True)

    def collect(self) -> Iterator[Metric]:
        """The metric families of the module contract, read now."""
        counters = {name: CounterMetricFamily(name, doc, labels=LABELS) for name, _, doc in COUNTERS}
        failed = CounterMetricFamily(
            FAILED_COUNTER, "Source records failed, explicitly (FailRecord, a failed task) or by timeout.",
            labels=(*LABELS, "kind"),
        )

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=LABELS)

        pending = gauge("ftlayer_pending_records", "Source records persisted and not yet complete or failed.")
        waiting = gauge("ftlayer_failed_waiting_records", "Failed records waiting for their replay (backoff).")
        dead = gauge("ftlayer_dead_letters", "Entries in the dead-letter stream now (kept until requeued or purged).")
        gen = gauge("ftlayer_bucket_generation", "Current generation of the rotating timeout buckets (rotations).")
        age = gauge(
            "ftlayer_oldest_pending_age_seconds",
            "Age of the oldest pending record: upper bound, accurate to one rotation interval; "
            "0 when nothing is pending, NaN when unknown.",
        )
        alive = gauge("ftlayer_service_alive", "1 while an FT service holds the source's rotator lease, else 0.")
        breaker = gauge("ftlayer_sink_breaker_open",
                        "1 while the source's sink breaker is open (a write is failing; replays paused), else 0.")
        running = gauge("ftlayer_running_batches", "Micro-batches running now that read the source (live holds).")
        up = gauge("ftlayer_redis_up", "1 if the source's figures were read from Redis at this scrape, else 0.")
        for store, s in self._samples():
            labels = list(_labels(store))
            up.add_metric(labels, 0.0 if s is None else 1.0)
            if s is None:
                continue
            for name, counter, _ in COUNTERS:
                counters[name].add_metric(labels, float(s.counters[counter]))
            failed.add_metric([*labels, "explicit"], float(s.counters["failed_explicit"]))
            failed.add_metric([*labels, "timeout"], float(s.counters["failed_timeout"]))
            pending.add_metric(labels, float(s.pending))
            waiting.add_metric(labels, float(s.failed_waiting))
            dead.add_metric(labels, float(s.dead_letters))
            gen.add_metric(labels, float(s.bucket_gen))
            oldest = s.oldest_pending_age_s
            age.add_metric(labels, oldest if oldest is not None else (0.0 if s.pending == 0 else math.nan))
            alive.add_metric(labels, 1.0 if s.service_alive else 0.0)
            now_ms = int(time.time() * 1000)
            breaker.add_metric(labels, 1.0 if s.breaker_open(now_ms) else 0.0)
            running.add_metric(labels, float(len(s.running_batches(now_ms))))
        yield from counters.values()
        yield from (failed, pending, waiting, dead, gen, age, alive, breaker, running, up)


class _Endpoint:
    """One HTTP server of this process, shared by the exporters of one host and port."""

    def __init__(self, host: str, port: int) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = FTCollector()
        self.registry.register(self.collector)
        self.registry.register(COMPLETE_LATENCY.histogram)
        try:
            self.server, self.thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            msg = f"cannot serve ftlayer metrics on {host}:{port} (metrics_host/metrics_port): {exc}"
            raise MetricsError(msg) from exc
        self.refs = 0

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5.0)


_endpoints: dict[tuple[str, int], _Endpoint] = {}
_endpoints_lock = threading.Lock()


class MetricsExporter:
    """Serves the FT metrics of ``sources`` on ``config.metrics_host:metrics_port`` (off when the port is 0)."""

    def __init__(self, sources: Sequence[SourceLike], config: FTConfig | None = None) -> None:
        if not sources and config is None:
            msg = "MetricsExporter needs a config when it is given no sources"
            raise MetricsError(msg)
        self.sources = [_store(s) for s in sources]
        self.config = config if config is not None else self.sources[0].config
        self._endpoint: _Endpoint | None = None

    @property
    def enabled(self) -> bool:
        """True when the config asks for metrics (metrics_port > 0)."""
        return self.config.metrics_on

    @property
    def running(self) -> bool:
        return self._endpoint is not None

    @property
    def url(self) -> str | None:
        """``http://host:port/metrics`` while serving, else None."""
        if self._endpoint is None:
            return None
        return f"http://{self.config.metrics_host}:{self.config.metrics_port}/metrics"

    def start(self) -> MetricsExporter:
        """Serve the sources (sharing a running server of the same host and port). No-op when off; idempotent."""
        if self._endpoint is not None or not self.enabled:
            return self
        key = (self.config.metrics_host, self.config.metrics_port)
        with _endpoints_lock:
            endpoint = _endpoints.get(key)
            if endpoint is None:
                endpoint = _Endpoint(*key)
                _endpoints[key] = endpoint
            endpoint.refs += 1
            endpoint.collector.add(self.sources)
            self._endpoint = endpoint
        log.info("ftlayer metrics served at %s", self.url)
        return self

    def stop(self) -> None:
        """Stop serving the sources; the server stops with its last exporter. Idempotent."""
        endpoint, self._endpoint = self._endpoint, None
        if endpoint is None:
            return
        with _endpoints_lock:
            endpoint.collector.remove(self.sources)
            endpoint.refs -= 1
            if endpoint.refs > 0:
                return
            _endpoints.pop((self.config.metrics_host, self.config.metrics_port), None)
        endpoint.close()

    def render(self) -> str:
        """The exposition text of these sources now, without HTTP (for tests, push gateways, debugging)."""
        registry = CollectorRegistry(auto_describe=False)
        registry.register(FTCollector(self.sources))
        registry.register(COMPLETE_LATENCY.histogram)
        return generate_latest(registry).decode()

    def __enter__(self) -> MetricsExporter:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def metric_names() -> list[str]:
    """Every metric family name the exporter serves (as in the exposition, counters with ``_total``)."""
    names = [f"{n}_total" for n, _, _ in COUNTERS] + [f"{FAILED_COUNTER}_total"]
    names += [
        "ftlayer_pending_records", "ftlayer_failed_waiting_records", "ftlayer_dead_letters",
        "ftlayer_bucket_generation", "ftlayer_oldest_pending_age_seconds", "ftlayer_service_alive",
        "ftlayer_sink_breaker_open", "ftlayer_running_batches", "ftlayer_redis_up", LATENCY_METRIC,
    ]
    return names
