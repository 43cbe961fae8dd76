"""Issue 12 end to end on one known demo run (the demo's own session through Envoy, the
processor and two simulated workers per model): the timeline export, what-if replay, online
trace replay, the metrics, and the web view in a real headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from extproc.cli import main
from extproc.dev import demo
from extproc.dev.clustersim.trace import read_trace
from extproc.dev.harness import Stack, run_stack
from extproc.dev.trace_replay import HITS, QUERIES, Settings, replay
from extproc.observability.replay import read_records
from tests.conftest import ROOT, session_config_data

pytestmark = pytest.mark.e2e
ARTEFACTS = ROOT / "build" / "artefacts"
DOCS = ROOT / "docs"


class Run:
    def __init__(self, stack: Stack, workdir: Path, config: dict[str, Any]) -> None:
        self.stack = stack
        self.workdir = workdir
        self.config = config
        self.token = Path(config["admin"]["token_file"]).read_text().strip()
        self.rows = demo.session(stack)

    def get(self, path: str) -> Any:
        return demo.admin_get(self.stack, path, self.token)

    @property
    def replay_file(self) -> Path:
        return Path(self.config["replay"]["jsonl_path"])

    def records(self) -> list[dict[str, Any]]:
        """The JSONL sink's records once every outcome has landed in it."""
        expected = {r["replay"] for r in self.rows}
        for _ in range(200):
            found = {r["replay_id"]: r for r in read_records(self.replay_file)}
            if expected <= found.keys() and all(
                "latency_ms" in (found[i].get("outcome") or {}) for i in expected
            ):
                return list(found.values())
            _pause()
        raise AssertionError("the replay sink never got every outcome")


def _pause() -> None:
    import time

    time.sleep(0.05)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Iterator[Run]:
    workdir = tmp_path_factory.mktemp("demo")
    config = demo.demo_config(session_config_data(), workdir)
    with run_stack(config, workdir=workdir, workers_per_model=2) as stack:
        yield Run(stack, workdir, config)


def test_the_demo_run_is_the_known_one(run):
    assert [(r["model"], r["action"]) for r in run.rows] == [
        ("qwen3-32b", "new"), ("qwen3-32b", "locked_keep"), ("qwen3-8b", "new"),
        ("qwen3-8b", "switch"), ("qwen3-8b", "locked_keep"), ("qwen3-8b", "keep"),
        ("qwen3-32b", "switch"), ("qwen3-32b", "locked_keep"),
    ]


def _export(run: Run, *source: str) -> dict[str, Any]:
    out = run.workdir / f"trace-{len(source)}-{source[0].strip('-')}.json"
    assert main(["trace", "export", *source, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_trace_export_has_the_sessions_turns_and_marks_of_the_demo(run, tmp_path):
    run.records()
    token = tmp_path / "token"
    token.write_text(run.token)
    from_file = _export(run, "--replay", str(run.replay_file))
    from_url = _export(run, "--url", run.stack.processor_http, "--token-file", str(token))
    for document in (from_file, from_url):
        events = document["traceEvents"]
        threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
                   if e["ph"] == "M" and e["name"] == "thread_name"}
        processes = {e["pid"]: e["args"]["name"] for e in events
                     if e["ph"] == "M" and e["name"] == "process_name"}
        assert sorted(threads.values()) == [
            "agent demo-session-1", "sub-agent demo-session-1-explorer (of demo-session-1)"]
        assert len(processes) == 1, "the sub-agent's track sits under its parent's process"
        assert next(iter(processes.values())).startswith("session demo-session-1 [k-")
        turns = sorted((e for e in events if e.get("cat") == "turn"), key=lambda e: e["ts"])
        assert [t["args"]["replay_id"] for t in turns] == [r["replay"] for r in run.rows]
        assert [t["args"]["model"] for t in turns] == [r["model"] for r in run.rows]
        assert all(t["dur"] > 0 and t["args"]["status"] == 200 for t in turns)
        marks = Counter(e["name"] for e in events if e["ph"] == "i")
        assert marks == {"lock: tool_loop": 2, "lock: provider_state": 1,
                         "reset: drift": 2, "switch qwen3-32b → qwen3-8b": 1,
                         "switch qwen3-8b → qwen3-32b": 1}
        switch = next(e for e in events if e["ph"] == "i" and e["name"].startswith("switch"))
        assert switch["args"] == {"replay_id": run.rows[3]["replay"], "reason": "drift_reset"}
        gaps = Counter(e["cat"] for e in events if e.get("cat") in ("tool", "idle"))
        assert gaps["tool"] == 2, "after each answer that called the test tool"
        streamed = [e for e in events if e.get("cat") in ("ttft", "decode")]
        assert {e["args"]["replay_id"] for e in streamed} == {run.rows[5]["replay"]}
        routes = [e for e in events if e.get("cat") == "route"]
        assert len(routes) == len(turns) and all(r["args"]["parse"] > 0 for r in routes)
    ARTEFACTS.mkdir(parents=True, exist_ok=True)
    (ARTEFACTS / "demo-timeline.json").write_text(json.dumps(from_file))


def _config_file(run: Run, name: str, **knobs: Any) -> Path:
    config = session_config_data()
    for decision in config["routing"]["decisions"]:
        decision.setdefault("algorithm", {}).setdefault("session_aware", {}).update(knobs)
    path = run.workdir / name
    path.write_text(yaml.safe_dump(config))
    return path


def _what_if(run: Run, config: Path, capsys) -> dict[str, Any]:
    assert main(["replay", "what-if", "--replay", str(run.replay_file), "--config",
                 str(config), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_what_if_without_the_tool_lock_reports_the_unsafe_switch_it_prevented(run, capsys):
    run.records()
    same = _what_if(run, _config_file(run, "same.yaml"), capsys)["total"]
    assert same["changed_turns"] == 0, "the same config decides every recorded turn the same"
    assert same["recorded"] == same["what_if"]
    assert same["recorded"]["unsafe"] == 0 and same["recorded"]["locked"] == 3
    summary = _what_if(run, _config_file(run, "no-lock.yaml", tool_loop_hard_lock=False), capsys)
    session = next(s for s in summary["sessions"] if s["session"] == "demo-session-1")
    assert session["recorded"]["unsafe"] == 0
    assert session["what_if"]["unsafe"] == 1, "turn 2's tool results leave for the cheap tier"
    assert session["recorded"]["locked"] == 3 and session["what_if"]["locked"] == 1
    assert session["changed_turns"] == 1
    assert summary["total"]["what_if"]["unsafe"] == 1
    assert main(["replay", "what-if", "--replay", str(run.replay_file), "--config",
                 str(run.workdir / "no-lock.yaml")]) == 0
    table = capsys.readouterr().out
    assert "unsafe (rec → what-if)" in table and "0 → 1" in table


def _sim_counters(run: Run) -> dict[str, tuple[float, float]]:
    from prometheus_client.parser import text_string_to_metric_families

    out = {}
    for urls in run.stack.sims.values():
        for url in urls:
            with urllib.request.urlopen(f"{url}/metrics", timeout=5) as response:
                families = text_string_to_metric_families(response.read().decode())
                totals = {f.name: sum(s.value for s in f.samples if s.name.endswith("_total"))
                          for f in families if f.name in (HITS, QUERIES)}
            out[f"{url}/metrics"] = (totals[HITS], totals[QUERIES])
    return out


def _small_trace(path: Path) -> Path:
    """Three sessions of three calls sharing a system prefix (ids 0-3), each growing its own."""
    rows = []
    for session in range(3):
        own = [100 + 10 * session + i for i in range(4)]
        for turn in range(3):
            ids = [0, 1, 2, 3, *own[: 2 + turn]]
            rows.append({"timestamp": 1000 * session + 10 * turn, "input_length": 16 * len(ids),
                         "output_length": 8, "hash_ids": ids, "session_id": f"s{session}",
                         **({"delay": 20} if turn else {})})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("which", ["small", "written by the processor"])
def test_online_trace_replay_reports_the_workers_own_hit_rates(run, tmp_path, which):
    import asyncio

    if which == "small":
        trace = _small_trace(tmp_path / "small.jsonl")
    else:
        run.records()
        trace = Path(run.config["replay"]["mooncake_trace_path"])
    rows = read_trace(trace)
    urls = tuple(_sim_counters(run))
    before = _sim_counters(run)
    report = asyncio.run(replay(rows, Settings(run.stack.url, speed=50.0, model="auto",
                                               worker_metrics=urls)))
    after = _sim_counters(run)
    assert report["requests"] == report["ok"] == len(rows)
    assert report["ttft_ms"]["p50"] is not None and report["output_tokens_per_s"] > 0
    for url in urls:
        hits = after[url][0] - before[url][0]
        queries = after[url][1] - before[url][1]
        worker = report["workers"][url]
        assert (worker["prefix_hit_tokens"], worker["prefix_query_tokens"]) == (hits, queries)
        assert worker["prefix_hit_rate"] == (round(hits / queries, 4) if queries else None)
    total_hits = sum(w["prefix_hit_tokens"] for w in report["workers"].values())
    assert total_hits > 0, "the sessions' later calls find their earlier prefix cached"


def _metric(text: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name)


def test_metrics_of_the_run(run):
    run.records()
    with urllib.request.urlopen(f"{run.stack.processor_http}/metrics", timeout=5) as response:
        text = response.read().decode()
    assert _metric(text, "saar_router_overhead_seconds_count") >= len(run.rows)
    assert 'saar_scheduling_plugin_seconds_bucket{le="+Inf",plugin="prefix"}' in text
    assert _metric(text, "saar_session_tool_seconds_count") >= 2
    # The sub-agent said it was done (x-dynamo-session-final): its figures are in.
    assert _metric(text, "saar_session_turns_count") >= 1
    assert _metric(text, "saar_session_turns_sum") >= 1


def _chromium(user_data: Path) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run",
                 "--disable-dev-shm-usage", "--window-size=1600,1000",
                 "--force-device-scale-factor=1", f"--user-data-dir={user_data}"):
        options.add_argument(flag)
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(service=service, options=options)


def test_web_view_in_headless_chromium(run, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    run.records()
    driver = _chromium(tmp_path / "chromium-profile")
    wait = WebDriverWait(driver, 30)
    try:
        driver.get(f"{run.stack.processor_http}/ui")
        driver.find_element(By.ID, "token").send_keys(run.token)
        driver.find_element(By.ID, "sign-in").click()
        row = wait.until(lambda d: d.find_element(
            By.CSS_SELECTOR, "#sessions tr[data-session='demo-session-1']"))
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        assert cells[1:5] == ["qwen3-32b", "7", "2", "3"], cells
        assert cells[5].startswith("$")
        row.click()
        slices = wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "rect.slice") or None)
        assert sorted(s.get_attribute("data-replay") for s in slices) == \
            sorted(r["replay"] for r in run.rows)
        lanes = [t.text for t in driver.find_elements(By.CSS_SELECTOR, "#timeline-svg text.lane")]
        assert "agent demo-session-1" in lanes
        assert any(t.startswith("sub-agent demo-session-1") for t in lanes)
        marks = Counter(m.get_attribute("data-mark").split(":")[0].split(" ")[0]
                        for m in driver.find_elements(By.CSS_SELECTOR, "path.mark"))
        assert marks == {"lock": 3, "reset": 2, "switch": 2}
        widths = [float(s.get_attribute("width")) for s in slices]
        assert all(w >= 2 for w in widths)

        def explain(turn: int) -> str:
            driver.find_element(
                By.CSS_SELECTOR, f"rect.slice[data-replay='{run.rows[turn]['replay']}']").click()
            return str(wait.until(lambda d: (
                d.find_element(By.ID, "decision-title").text.endswith(run.rows[turn]["replay"])
                and d.find_element(By.ID, "decision-body").text) or None))

        locked = explain(1)
        assert "locked_keep" in locked and "tool_loop" in locked
        assert "A hard lock decided" in locked
        priced = explain(5)  # the streamed summary: kept on qwen3-8b by its price terms
        assert "stay_priced" in priced and "Candidates" in priced
        for header in ("base", "stay", "handoff", "history", "cache", "USD", "score"):
            assert header in priced
        assert "prefix blocks" in priced, "the workers' scores: two workers per model"
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(ARTEFACTS / "web-view.png"))
        driver.find_element(By.ID, "timeline").screenshot(str(ARTEFACTS / "timeline.png"))
    finally:
        driver.quit()
    for name in ("web-view.png", "timeline.png"):
        data = (ARTEFACTS / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000
        if os.environ.get("SAAR_UPDATE_DOCS"):
            DOCS.mkdir(exist_ok=True)
            shutil.copy(ARTEFACTS / name, DOCS / name)


def test_make_demo_says_where_to_look(tmp_path):
    """The demo itself, as ``make demo`` runs it (not waiting: stdin is no terminal)."""
    out = subprocess.run(
        [sys.executable, "-m", "extproc", "demo"], cwd=ROOT, text=True,
        capture_output=True, timeout=300, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    lines = out.stdout.splitlines()
    view = next(line for line in lines if line.startswith("web view:"))
    assert "/ui" in view and "admin-token" in view
    timeline = next(line for line in lines if line.startswith("timeline:"))
    path = Path(timeline.split()[1])
    assert path.exists() and json.loads(path.read_text())["otherData"]["sessions"] == 2
