"""Operator chains as a stage runs them (no Spark)."""

from __future__ import annotations

from typing import Any

from runtime.graph import Op
from runtime.spark.stages import make_chain


def test_chains_of_every_shape() -> None:
    double = Op("map", lambda v: v * 2, 1)
    even = Op("filter", lambda v: v % 2 == 0, 2)
    twice = Op("flat_map", lambda v: [v, v + 1], 3)
    cases: list[tuple[list[Op], int, list[Any]]] = [
        ([double], 3, [6]),  # the one-map fast path
        ([even], 3, []),
        ([even], 4, [4]),
        ([twice], 3, [3, 4]),
        ([double, twice, even], 3, [6]),
        ([twice, double], 1, [2, 4]),
        ([], 5, [5]),
    ]
    for ops, value, expected in cases:
        assert make_chain(ops)(value) == expected, (ops, value)


def test_a_raising_map_raises_through_the_chain() -> None:
    def boom(v: Any) -> Any:
        raise ValueError(v)

    for ops in ([Op("map", boom, 1)], [Op("map", boom, 1), Op("filter", bool, 2)]):
        try:
            make_chain(ops)(7)
        except ValueError as exc:
            assert exc.args == (7,)
        else:
            raise AssertionError("the chain swallowed the error")
