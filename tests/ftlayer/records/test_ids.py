from __future__ import annotations

import os
import random
import struct

from hypothesis import given
from hypothesis import strategies as st

from ftlayer.records import ids
from ftlayer.records.ids import IdGenerator, child_id, new_id_array, new_ids, new_record_id, to_signed64, to_unsigned64

I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)


def test_ids_are_nonzero_signed_64_bit_and_distinct() -> None:
    drawn = new_ids(50_000) + [new_ids(1)[0] for _ in range(1000)]
    assert all(v != 0 and -(2**63) <= v < 2**63 for v in drawn)
    assert len(set(drawn)) == len(drawn)
    rid = new_record_id()
    assert rid.source_record_id != rid.current_record_id


def test_id_arrays_are_nonzero_signed_64_bit_and_distinct() -> None:
    import numpy as np

    drawn = new_id_array(50_000)
    assert drawn.dtype == np.int64 and drawn.shape == (50_000,)
    values = drawn.tolist() + new_ids(1000)
    assert all(v != 0 for v in values)
    assert len(set(values)) == len(values)
    assert new_id_array(0).tolist() == []


def test_an_id_array_is_the_same_draw_as_a_list() -> None:
    """Two generators in the same state give the same ids either way."""
    a, b = IdGenerator(), IdGenerator()
    a._rng.seed(11)
    b._rng.seed(11)
    assert a.next_id_array(500).tolist() == b.next_ids(500)


class _ZeroOnce(random.Random):
    """A seeded generator whose first 256-bit draw holds the words 5, 0, -1, 7 (little-endian): a
    zero id, which a real draw gives with probability 2**-64."""

    first = True

    def getrandbits(self, k: int) -> int:
        if self.first and k == 256:
            self.first = False
            words = [5, 0, to_unsigned64(-1), 7]
            return sum(w << (64 * i) for i, w in enumerate(words))
        return super().getrandbits(k)


def test_a_zero_in_an_id_array_is_drawn_again() -> None:
    gen = IdGenerator()
    gen._rng = _ZeroOnce(5)
    got = gen.next_id_array(4).tolist()
    assert got[0] == 5 and got[2] == -1 and got[3] == 7
    assert got[1] != 0


@given(I64, I64)
def test_signed_xor_is_closed_and_matches_unsigned(a: int, b: int) -> None:
    assert -(2**63) <= a ^ b < 2**63
    assert to_unsigned64(a ^ b) == to_unsigned64(a) ^ to_unsigned64(b)
    assert to_signed64(to_unsigned64(a)) == a


def _draw_in_child(n: int) -> list[int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: draw ids after the fork and send them back
        os.close(read)
        os.write(write, struct.pack(f">{n}q", *new_ids(n)))
        os._exit(0)
    os.close(write)
    data = b""
    while chunk := os.read(read, 65536):
        data += chunk
    os.close(read)
    os.waitpid(pid, 0)
    return list(struct.unpack(f">{n}q", data))


def test_forked_workers_draw_different_ids() -> None:
    # Draw in the parent first so the generator state exists before the fork,
    # as in PySpark's daemon, which forks workers from an initialised process.
    new_ids(10)
    first, second = _draw_in_child(100), _draw_in_child(100)
    parent = new_ids(100)
    assert not set(first) & set(second)
    assert not set(first) & set(parent)


def test_fork_safety_does_not_rely_on_the_fork_hook_alone() -> None:
    gen = ids.IdGenerator()
    gen.next_id()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.write(write, struct.pack(">q", gen.next_id()))  # no after_fork hook for this instance
        os._exit(0)
    os.close(write)
    child_value = struct.unpack(">q", os.read(read, 8))[0]
    os.waitpid(pid, 0)
    assert child_value != gen.next_id()


@given(I64, st.integers(0, 1000), st.integers(0, 2**32 - 1))
def test_child_ids_are_deterministic_and_nonzero(parent: int, op: int, idx: int) -> None:
    assert child_id(parent, op, idx) == child_id(parent, op, idx) != 0


def test_child_ids_differ_by_operator_and_index() -> None:
    (parent,) = new_ids(1)
    values = {child_id(parent, op, i) for op in range(20) for i in range(50)}
    assert len(values) == 1000
