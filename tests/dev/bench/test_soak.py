"""``saar bench soak``: the tool itself, for seconds (the figures come from a run of minutes),
and its verdicts on made-up windows."""

from __future__ import annotations

import json

import pytest

from extproc.cli import main
from extproc.dev.bench.soak import Window, verdicts

CAPS = {"sessions": 100, "replay_records": 50}


def window(t: float, rss: float, sessions: int, other: int, tasks: int = 10,
           series: int = 300, p99: float = 20.0, blocks: float = 200_000) -> Window:
    tables = {"sessions": sessions, "replay_records": min(50, sessions), "other": other}
    return Window(t, 100.0, 5.0, p99, 0, {"rss_mib": rss, "tasks": tasks, "series": series,
                                          "tables": tables, "py_blocks": blocks})


def test_a_steady_run_passes_every_verdict():
    windows = [window(10 * i, 100 + min(i, 3) * 5, min(100, 40 * i), 500) for i in range(1, 9)]
    v = verdicts(windows, CAPS)
    assert v["caps_reached_at_s"] == 30
    assert v["rss_flat"] and v["tables_bounded"] and v["series_bounded"]
    assert v["no_task_leak"] and v["p99_stable"]


def test_growth_is_called_out():
    windows = [window(10 * i, 100 + 20 * i, min(100, 40 * i), 500 * i, tasks=10 * i,
                      series=300 + 50 * i, p99=20 * (1 + (i == 7) * 5)) for i in range(1, 9)]
    v = verdicts(windows, CAPS)
    assert not v["rss_flat"]
    assert v["growing_tables"] == ["other"]
    assert not v["series_bounded"] and not v["no_task_leak"] and not v["p99_stable"]


def test_the_caps_are_reached_when_the_prefix_index_stops_filling():
    windows = [window(10 * i, 100 + min(i, 5) * 5, min(100, 40 * i), 500) for i in range(1, 9)]
    for i, w in enumerate(windows):  # the workers' KV bounds it: full at the fifth window
        w.state["tables"]["prefix_index_blocks"] = min(4096, 1000 * (i + 1))
    v = verdicts(windows, CAPS)
    assert v["caps_reached_at_s"] == 60, "the first window showing the index's count again"
    assert v["rss_flat"] and v["tables_bounded"]


@pytest.mark.parametrize(("last", "met"), [(104.0, True), (104.1, False)])
def test_the_last_six_minutes_hold_rss_within_two_mib_once_the_caps_are_reached(last, met):
    # Windows of 60 s over 12 minutes; the caps are reached at 120 s.
    rss = [90.0, 100.0, 101.0, 101.5, 101.8, 102.0, 102.1, 102.5, 103.0, 103.2, 103.6, last]
    blocks = [100_000 + 40 * i for i in range(12)]  # Python's share: +40 blocks a minute
    windows = [window(60 * (i + 1), r, min(100, 50 * (i + 1)), 500, blocks=b)
               for i, (r, b) in enumerate(zip(rss, blocks, strict=True))]
    v = verdicts(windows, CAPS)
    assert v["caps_reached_at_s"] == 120
    # 360 s to 720 s: the sixth window to the twelfth
    assert v["rss_tail"] == {"seconds": 360, "mib": round(last - 102.0, 1), "py_blocks": 240}
    assert v["rss_tail_met"] is met
    assert v["rss_flat"]  # the looser check, growth after the caps within 8 MiB, passes both


def test_a_tail_that_begins_before_the_caps_are_reached_is_not_met():
    windows = [window(60 * (i + 1), 100.0, min(100, 10 * (i + 1)), 500) for i in range(12)]
    v = verdicts(windows, CAPS)
    assert v["caps_reached_at_s"] == 600 and v["rss_tail"]["mib"] == 0.0
    assert not v["rss_tail_met"]


@pytest.mark.e2e
def test_the_soak_runs_and_samples_every_window(capsys):
    assert main(["bench", "soak", "--minutes", "0.25", "--rate", "20", "--window", "5",
                 "--json"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["ceiling_rps"] is None and report["rate"] == 20
    assert len(report["windows"]) == 3
    for w in report["windows"]:
        assert w["rps"] > 0 and w["errors"] == 0
        assert w["rss_mib"] > 10 and w["tasks"] > 0 and w["series"] > 50
        assert w["py_blocks"] > 1e4
        assert {"sessions", "owners", "replay_records", "replay_index"} <= set(w["tables"])
    assert report["windows"][-1]["tables"]["sessions"] > 0
    assert set(report["verdicts"]) >= {"rss_flat", "tables_bounded", "series_bounded",
                                       "no_task_leak", "p99_stable"}
    assert any(line.startswith("p99: median") for line in out)
    assert any(line.startswith("Python's allocated blocks over") for line in out)
