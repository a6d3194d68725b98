"""What a running topology starts for operators: the metrics exporter and the progress listener.

::

    observers = TopologyObservers.start(spark, layers, config, query_name="ftlayer-clicks")
    ...
    observers.stop()

``start`` attaches an :class:`~runtime.driver.listener.FTProgressListener` limited to
``query_name`` (attach it before the query starts, so the first batch is
logged too) and starts a :class:`~runtime.driver.metrics.MetricsExporter`, which does
nothing unless ``config.metrics_port`` is set. If the exporter cannot start
(its port is taken), the listener is detached again and the
:class:`~runtime.driver.metrics.MetricsError` propagates. ``stop`` undoes both and is
idempotent.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ftlayer.config import FTConfig
from ftlayer.facade.ft_layer import FTLayer

if TYPE_CHECKING:  # runtime.driver.listener imports pyspark; this module stays importable without it
    from runtime.driver.listener import FTProgressListener
    from runtime.driver.metrics import MetricsExporter


class TopologyObservers:
    """The listener and metrics exporter of one topology's query."""

    def __init__(self, spark: Any, listener: FTProgressListener | None, exporter: MetricsExporter) -> None:
        self.spark = spark
        self.listener = listener
        self.exporter = exporter

    @classmethod
    def start(
        cls,
        spark: Any,
        layers: Sequence[FTLayer],
        config: FTConfig,
        *,
        query_name: str | None,
        listen: bool = True,
    ) -> TopologyObservers:
        """Attach the progress listener (unless ``listen`` is False) and start the metrics exporter."""
        from runtime.driver.listener import attach, detach

        listener = attach(spark, layers, query_name=query_name) if listen else None
        try:
            from runtime.driver.metrics import MetricsExporter  # driver-side: executors need no prometheus_client

            exporter = MetricsExporter(layers, config).start()
        except BaseException:
            if listener is not None:
                detach(spark, listener)
            raise
        return cls(spark, listener, exporter)

    @property
    def metrics_url(self) -> str | None:
        """Where the metrics are served, or None when metrics are off."""
        return self.exporter.url

    def stop(self) -> None:
        """Stop the exporter and detach the listener. Idempotent."""
        self.exporter.stop()
        listener, self.listener = self.listener, None
        if listener is not None:
            from runtime.driver.listener import detach

            listener.close()
            detach(self.spark, listener)
