"""Partitioners: route records to channels live and on replay, and land them exactly in Spark.

- :mod:`partitioners.base`: the interfaces (:class:`Partitioner`,
  :class:`ReplayPartitioner`, :class:`RoutedRecord`).
- :mod:`partitioners.strategies`: fields, rebalance, shuffle, broadcast, global, forward.
- :mod:`partitioners.factory`: build one from a strategy name.
- :mod:`partitioners.plan`: one source with several successors; what is persisted.
- :mod:`partitioners.channels`: channel-count validation and the no-rescale policy.
- :mod:`partitioners.spark_exact`: make channel ``c`` be Spark partition ``c``.

``partitioners.spark_exact`` imports pyspark lazily, so this package works without it.
"""

from partitioners.base import Partitioner, PersistedRoute, ReplayPartitioner, RoutedRecord
from partitioners.channels import check_channel_count
from partitioners.factory import STRATEGIES, partitioner_for, replay_partitioner_for, source_strategy
from partitioners.plan import SourceRoutingPlan, SuccessorSpec
from partitioners.spark_exact import exact_repartition, landing_values
from partitioners.strategies import (
    BroadcastPartitioner,
    FieldsPartitioner,
    ForwardPartitioner,
    GlobalPartitioner,
    RebalancePartitioner,
    ShufflePartitioner,
)

__all__ = [
    "STRATEGIES",
    "BroadcastPartitioner",
    "FieldsPartitioner",
    "ForwardPartitioner",
    "GlobalPartitioner",
    "Partitioner",
    "PersistedRoute",
    "RebalancePartitioner",
    "ReplayPartitioner",
    "RoutedRecord",
    "ShufflePartitioner",
    "SourceRoutingPlan",
    "SuccessorSpec",
    "check_channel_count",
    "exact_repartition",
    "landing_values",
    "partitioner_for",
    "replay_partitioner_for",
    "source_strategy",
]
