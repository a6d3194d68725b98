"""TaskProgress: plain rate-limited lines off a terminal, a rich bar on one."""

from __future__ import annotations

import io

from runtime.driver.progress import TaskProgress


def test_plain_lines_are_rate_limited_and_the_final_state_is_printed_once() -> None:
    out = io.StringIO()
    bar = TaskProgress("demo", total=3000, stream=out, plain_interval_s=3600)
    assert not bar.interactive  # a StringIO is not a terminal
    bar.log("started")
    bar.update(10, info="acked 10")  # the first update prints at once
    bar.update(20, info="acked 20")  # rate-limited
    bar.update(advance=5, info="acked 25")
    bar.close()
    bar.close()
    bar.update(99, info="after close")  # ignored
    lines = out.getvalue().splitlines()
    assert lines[0] == "[demo] started"
    assert lines[1].startswith("[demo] ") and lines[1].endswith("  10/3000  acked 10")
    assert lines[2].endswith("  25/3000  acked 25") and len(lines) == 3


def test_close_prints_nothing_new_when_the_last_line_was_current() -> None:
    out = io.StringIO()
    with TaskProgress("bench", stream=out, plain_interval_s=0) as bar:
        bar.update(advance=1, info="round 1")
        bar.update(advance=1, info="round 2", force=True)
    lines = out.getvalue().splitlines()
    assert [line.split("s  ", 1)[1] for line in lines] == ["round 1", "round 2"]  # no total: no count


def test_count_is_capped_at_the_total() -> None:
    out = io.StringIO()
    with TaskProgress("x", total=10, stream=out, plain_interval_s=0) as bar:
        bar.update(12.0, info="over")
    assert out.getvalue().splitlines()[-1].endswith("10/10  over")


def test_interactive_mode_draws_a_rich_bar() -> None:
    out = io.StringIO()
    with TaskProgress("demo", total=100, stream=out, interactive=True) as bar:
        bar.log("a message above the bar")
        bar.update(40, info="persisted 50  acked 40")
    text = out.getvalue()
    assert "a message above the bar" in text
    assert "40/100" in text and "persisted 50  acked 40" in text and "━" in text


def test_figures_are_aligned_in_plain_lines_and_compact_under_the_bar() -> None:
    plain = io.StringIO()
    with TaskProgress("demo", total=3000, stream=plain, plain_interval_s=0) as bar:
        bar.update(5, figures={"acked": 5, "pending": 2995})
        bar.update(1500, figures={"acked": 1500, "pending": 1500})
    first, second = plain.getvalue().splitlines()
    assert first.endswith("5/3000  acked      5  pending   2995")
    assert second.index("pending") - second.index("acked") == first.index("pending") - first.index("acked")
    tty = io.StringIO()
    with TaskProgress("demo", total=3000, stream=tty, interactive=True) as bar:
        bar.update(1500, figures={"acked": 1500, "pending": 1500}, info="round 2")
    assert "  acked 1500  pending 1500  round 2" in tty.getvalue()
