"""scripts/chaos-matrix reads each run's report: verdict, lost and duplicates."""

from __future__ import annotations

from runtime.chaos.matrix import LOCK_TAKEN, Cell, lock_taken, parse_report

REPORT = """chaos scenario kill-driver: OK
  records in         2000 produced by the source, 2000 persisted by ingest
  delivered          2000 distinct ids in 2003 lines
  duplicates         3 ids (3 extra copies); 0 lineage ids written twice, 3 ids re-sent by the source
  lost               0
"""


def test_a_report_gives_its_verdict_lost_and_duplicates() -> None:
    assert parse_report(REPORT) == (True, 0, 3)
    two = REPORT + REPORT.replace(": OK", ": FAILED").replace("lost               0", "lost               7 [1, 2]")
    assert parse_report(two) == (False, 7, 3)  # --durability all: the worst of its reports
    assert parse_report("Traceback ...") == (False, None, None)


def test_an_effectively_once_sink_passes_only_with_no_duplicates() -> None:
    assert Cell("lines", "topology", "delayed-acks", True, 0, 3, 1.0).passed
    assert not Cell("postgres", "topology", "delayed-acks", True, 0, 3, 1.0).passed
    assert Cell("postgres", "topology", "delayed-acks", True, 0, 0, 1.0).passed
    assert not Cell("delta", "dataframe", "kill-driver", True, None, 0, 1.0).passed


def test_a_run_under_the_lock_is_timed_from_when_it_got_it() -> None:
    assert lock_taken(f"{LOCK_TAKEN} 1700000123.250000000\n" + REPORT, 1.0) == 1700000123.25
    assert lock_taken(REPORT, 7.0) == 7.0
