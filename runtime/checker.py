"""The checker that runs after a fault-injection scenario: was anything lost, leaked, or replayed unexplained?

``check(query_or_layers, sink, emitted_ids, injected)`` returns a :class:`Report`:

- **lost**: emitted ids that were neither delivered (a sink line whose value has
  that ``"i"``) nor dead-lettered with a non-empty reason (a dead letter's payload
  is unpacked and its ``"i"`` read). The no-loss promise is ``lost == []``.
  ``emitted_ids`` are what the *source produced* (a ScriptedSource's
  ``emitted_ids``, a webhook client's confirmed ids), not what ingest persisted:
  a record ingest took and never persisted is lost. **never_persisted** counts
  them (produced records minus the sources' ``persisted`` counter).
- **leaked**: per source, every key :meth:`~ftlayer.facade.ft_layer.FTLayer.leftovers`
  reports, and nonzero ``pending`` or ``failed_waiting``. The no-leak promise is
  ``leaked == []``. Run the checker after the query was stopped (``FTQuery.stop``
  trims finished channel entries).
- **duplicates**: ids delivered more than once, split by cause: **lineage_duplicates**
  counts lineage ids (a line's ``"lineage"``) written more than once, the repeats an
  effectively-once sink drops (``runtime.idempotent``); **resent** counts ids delivered under
  more than one origin id, records the source itself sent again (a webhook client that never
  got its answer), which no sink can tell from new ones. **replays**: lines with
  ``"replay": true`` and the sources' ``replayed`` counter.
- **explained or not**: each fault injector records the ids it touched in a
  :class:`~runtime.testing.FaultLog`; a replayed (or dead-lettered) id that no
  fault touched is listed as unexplained. Unexplained replays make ``ok`` False
  only with ``strict=True`` (a record that waits longer than ``timeout_s`` is
  replayed by design, so loaded machines produce a few).
- **phantoms**: delivered ids that were never emitted (a harness bug or a
  corrupted payload); like unexplained replays they fail only a strict check.

``Report.ok`` is ``lost == [] and leaked == []`` (plus the strict conditions, and the
expectations a chaos scenario adds with :meth:`Report.expect`; a plain ``check`` adds
none). ``Report.lost_in_window`` holds losses a durability mode allows (set only by the
kill-redis scenario for ``everysec``/``none``); they do not count against ``ok``.
``Report.summary()`` is the printable form.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ftlayer.facade.ft_layer import FTLayer
from runtime.testing import FaultLog
from serialization.payload import unpack_payload

__all__ = ["Report", "check", "dead_letters_of", "default_id"]

IdOf = Callable[[Any], int]


def default_id(value: Any) -> int:
    """The record id of a delivered or dead-lettered value: its ``"i"``."""
    return int(value["i"])


@dataclass
class Report:
    """What a scenario did and whether the promises held (see the module notes)."""

    scenario: str
    records_in: int
    delivered: int  # distinct emitted ids that reached the sink
    lines: int  # sink lines in total (copies included)
    duplicates: int  # ids delivered more than once
    extra_copies: int  # lines beyond the first per id
    lineage_duplicates: int  # lineage ids written more than once (an effectively-once sink drops them)
    resent: int  # ids delivered under more than one origin id (sent again by the source)
    replay_lines: int  # lines with "replay": true
    replayed_ids: list[int]
    expected_replays: list[int]  # replayed ids some fault touched
    unexplained_replays: list[int]
    dead_letters: list[tuple[int | None, str]]  # (id or None if undecodable, reason)
    unexplained_dead_letters: list[int]
    lost: list[int]
    never_persisted: int  # produced records the sources' persisted counter does not account for
    leaked: list[str]
    phantoms: list[int]
    faults: dict[str, int]  # fault -> ids it touched
    stats: dict[str, int]  # counters summed over the sources
    strict: bool = False
    notes: list[str] = field(default_factory=list)  # scenario findings (restarts, windows, ...)
    elapsed_s: float = 0.0
    # set by scenarios, empty for a plain check():
    expectations: list[tuple[str, bool]] = field(default_factory=list)  # (what, held)
    lost_in_window: list[int] = field(default_factory=list)  # loss the durability mode allows

    @property
    def ok(self) -> bool:
        """No loss and no leak, and every scenario expectation held; with ``strict``, also no
        unexplained replay, dead letter or phantom. (A plain :func:`check` sets no expectations.)"""
        base = not self.lost and not self.leaked and all(held for _, held in self.expectations)
        if not self.strict:
            return base
        return base and not self.unexplained_replays and not self.unexplained_dead_letters and not self.phantoms

    def expect(self, what: str, held: bool) -> None:
        """Add a scenario expectation (it counts in :attr:`ok`)."""
        self.expectations.append((what, bool(held)))

    def summary(self) -> str:
        """A printable multi-line summary."""
        s = self.stats
        verdict = "OK" if self.ok else "FAILED"
        lines = [
            f"chaos scenario {self.scenario}: {verdict}" + (" (strict)" if self.strict else ""),
            f"  records in         {self.records_in} produced by the source, "
            f"{self.records_in - self.never_persisted} persisted by ingest",
            f"  delivered          {self.delivered} distinct ids in {self.lines} lines",
            f"  duplicates         {self.duplicates} ids ({self.extra_copies} extra copies); "
            f"{self.lineage_duplicates} lineage ids written twice, {self.resent} ids re-sent by the source",
            f"  replays            {self.replay_lines} lines, {len(self.replayed_ids)} ids "
            f"(counter replayed={s.get('replayed', 0)}); expected {len(self.expected_replays)}, "
            f"unexplained {len(self.unexplained_replays)}{_sample(self.unexplained_replays)}",
            f"  dead letters       {len(self.dead_letters)}{self._dead_sample()}"
            + (f"; unexplained {self.unexplained_dead_letters[:10]}" if self.unexplained_dead_letters else ""),
            f"  lost               {len(self.lost)}{_sample(self.lost)}"
            + (f" (+{len(self.lost_in_window)} in the durability window)" if self.lost_in_window else ""),
            f"  leaked             {self.leaked or 'nothing'}",
        ]
        if self.phantoms:
            lines.append(f"  phantoms           {len(self.phantoms)}{_sample(self.phantoms)}")
        if self.faults:
            lines.append("  faults             " + ", ".join(f"{k}: {v} ids" for k, v in sorted(self.faults.items())))
        keys = ("persisted", "acked", "failed_explicit", "failed_timeout", "replayed", "dead_lettered",
                "late_deltas", "duplicate_flushes")
        lines.append("  counters           " + " ".join(f"{k}={s.get(k, 0)}" for k in keys))
        if self.elapsed_s:
            rate = self.records_in / self.elapsed_s if self.elapsed_s > 0 else 0.0
            lines.append(f"  elapsed            {self.elapsed_s:.1f} s ({rate:.0f} records/s)")
        lines.extend(f"  expect: [{'ok' if held else 'FAILED'}] {what}" for what, held in self.expectations)
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _dead_sample(self) -> str:
        if not self.dead_letters:
            return ""
        i, reason = self.dead_letters[0]
        first = reason.strip().splitlines()[-1] if reason.strip() else "(no reason)"
        return f" (e.g. id {i}: {first[:80]})"


def _sample(ids: Sequence[int]) -> str:
    if not ids:
        return ""
    head = ", ".join(str(i) for i in ids[:10])
    return f" [{head}{', ...' if len(ids) > 10 else ''}]"


def _layers_of(query_or_layers: Any) -> list[FTLayer]:
    layers = getattr(query_or_layers, "layers", query_or_layers)
    if isinstance(layers, FTLayer):
        return [layers]
    return list(layers)


def _lines_of(sink: Any) -> Iterable[dict[str, Any]]:
    if hasattr(sink, "iter_lines"):
        return sink.iter_lines()  # type: ignore[no-any-return]
    if hasattr(sink, "read_all"):
        return sink.read_all()  # type: ignore[no-any-return]
    return sink  # type: ignore[no-any-return]


def _affected(injected: FaultLog | Mapping[str, Iterable[int]] | None) -> dict[str, set[int]]:
    if injected is None:
        return {}
    if isinstance(injected, FaultLog):
        return injected.affected()
    return {k: set(v) for k, v in injected.items()}


def dead_letters_of(layer: FTLayer, id_of: IdOf = default_id, page: int = 1000) -> list[tuple[int | None, str]]:
    """(record id or None if undecodable, reason) of every dead letter of one source."""
    out: list[tuple[int | None, str]] = []
    after = "-"
    while True:
        batch = layer.list_dead_letters(count=page, after=after)
        for dl in batch:
            rid: int | None = None
            if dl.record is not None:
                try:
                    rid = id_of(unpack_payload(dl.record.payload))
                except Exception:  # a payload the id function cannot read
                    rid = None
            out.append((rid, dl.reason))
        if len(batch) < page:
            return out
        after = batch[-1].entry_id


def check(
    query_or_layers: Any,
    sink: Any,
    emitted_ids: Iterable[int],
    injected: FaultLog | Mapping[str, Iterable[int]] | None = None,
    *,
    strict: bool = False,
    scenario: str = "custom",
    id_of: IdOf = default_id,
) -> Report:
    """Check a finished scenario (see the module notes for every figure).

    ``query_or_layers``: an :class:`~runtime.topology.FTQuery` (its ``layers``), one
    FTLayer or a list of them. ``sink``: a :class:`~runtime.testing.CollectingSink`,
    a JsonLinesSink with meta, or the lines themselves. ``emitted_ids``: every id the
    sources emitted (``ScriptedSource.emitted_ids``). ``injected``: the scenario's
    :class:`~runtime.testing.FaultLog` or a mapping fault -> ids it touched.
    """
    layers = _layers_of(query_or_layers)
    counts: Counter[int] = Counter()
    lineages: Counter[str] = Counter()
    origins: dict[int, set[Any]] = {}
    replayed: set[int] = set()
    lines = replay_lines = 0
    for line in _lines_of(sink):
        rid = id_of(line["value"])
        counts[rid] += 1
        lines += 1
        if line.get("lineage"):
            lineages[line["lineage"]] += 1
        origins.setdefault(rid, set()).add(line.get("origin"))
        if line.get("replay"):
            replay_lines += 1
            replayed.add(rid)
    dead: list[tuple[int | None, str]] = []
    stats: Counter[str] = Counter()
    leaked: list[str] = []
    for layer in layers:
        name = layer.keys.source
        dead += dead_letters_of(layer, id_of)
        st = layer.stats()
        stats.update({k: v for k, v in st.items() if k != "gen"})
        leaked += [f"{name}:{k}" for k in layer.leftovers()]
        leaked += [f"{name}:{k}={st[k]}" for k in ("pending", "failed_waiting") if st[k]]
    emitted = set(emitted_ids)
    dead_ok = {i for i, reason in dead if i is not None and reason.strip()}
    affected = _affected(injected)
    touched = set().union(*affected.values()) if affected else set()
    replayed_ids = sorted(replayed)
    return Report(
        scenario=scenario,
        records_in=len(emitted),
        delivered=len(emitted & counts.keys()),
        lines=lines,
        duplicates=sum(1 for c in counts.values() if c > 1),
        extra_copies=sum(c - 1 for c in counts.values() if c > 1),
        lineage_duplicates=sum(1 for c in lineages.values() if c > 1),
        resent=sum(1 for o in origins.values() if len(o) > 1),
        replay_lines=replay_lines,
        replayed_ids=replayed_ids,
        expected_replays=[i for i in replayed_ids if i in touched],
        unexplained_replays=[i for i in replayed_ids if i not in touched],
        dead_letters=dead,
        unexplained_dead_letters=sorted(i for i, _ in dead if i is not None and i not in touched),
        lost=sorted(emitted - counts.keys() - dead_ok),
        never_persisted=max(0, len(emitted) - stats["persisted"]),
        leaked=leaked,
        phantoms=sorted(counts.keys() - emitted),
        faults={k: len(v) for k, v in affected.items()},
        stats=dict(stats),
        strict=strict,
    )
