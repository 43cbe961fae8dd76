"""``saar bench soak``: the tool itself, for seconds (the figures come from a run of minutes),
and its verdicts on made-up windows."""

from __future__ import annotations

import json

import pytest

from extproc.cli import main
from extproc.dev.bench.soak import Window, verdicts

CAPS = {"sessions": 100, "replay_records": 50}


def window(t: float, rss: float, sessions: int, other: int, tasks: int = 10,
           series: int = 300, p99: float = 20.0) -> Window:
    tables = {"sessions": sessions, "replay_records": min(50, sessions), "other": other}
    return Window(t, 100.0, 5.0, p99, 0, {"rss_mib": rss, "tasks": tasks, "series": series,
                                          "tables": tables})


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
        assert {"sessions", "owners", "replay_records", "replay_index"} <= set(w["tables"])
    assert report["windows"][-1]["tables"]["sessions"] > 0
    assert set(report["verdicts"]) >= {"rss_flat", "tables_bounded", "series_bounded",
                                       "no_task_leak", "p99_stable"}
    assert any(line.startswith("p99: median") for line in out)
