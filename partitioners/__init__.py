"""Partitioners: route records to channels live and on replay, and land them exactly in Spark.

- :mod:`partitioners.base`: the interfaces (:class:`Partitioner`,
  :class:`ReplayPartitioner`, :class:`RoutedRecord`).
- :mod:`partitioners.strategies`: fields, rebalance, shuffle, global (a source's ``partitioning=``).
- :mod:`partitioners.factory`: build one from a strategy name.
- :mod:`ftlayer.acker.channels`: channel-count validation and the no-rescale policy.
- :mod:`partitioners.spark_exact`: make channel ``c`` be Spark partition ``c``.

``partitioners.spark_exact`` imports pyspark lazily, so this package works without it.
"""

from ftlayer.acker.channels import check_channel_count
from partitioners.base import Partitioner, PersistedRoute, ReplayPartitioner, RoutedRecord
from partitioners.factory import STRATEGIES, partitioner_for, replay_partitioner_for, source_strategy
from partitioners.spark_exact import exact_repartition, landing_values
from partitioners.strategies import (
    FieldsPartitioner,
    GlobalPartitioner,
    RebalancePartitioner,
    ShufflePartitioner,
)

__all__ = [
    "STRATEGIES",
    "FieldsPartitioner",
    "GlobalPartitioner",
    "Partitioner",
    "PersistedRoute",
    "RebalancePartitioner",
    "ReplayPartitioner",
    "RoutedRecord",
    "ShufflePartitioner",
    "check_channel_count",
    "exact_repartition",
    "landing_values",
    "partitioner_for",
    "replay_partitioner_for",
    "source_strategy",
]
