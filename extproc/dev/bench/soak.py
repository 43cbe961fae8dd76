"""``saar bench soak``: a stack under steady agent traffic for minutes, watched for growth.

The stack (``run_stack``: Envoy, the processor, two simulated workers per model answering at
once) is first loaded closed-loop at rising concurrency for a few seconds a step: the best
req/s is the **ceiling**. Then many distinct sessions — agent loops over the three APIs, a tool
call and its result, Responses chained with ``previous_response_id``, a third of Chat turns
streamed, each session new, from 20 tenants — are sent open-loop at ``--rate`` (default half
the ceiling) for ``--minutes``. Every window the soak samples the processor's RSS (``/proc``),
its tables (``saar_table_entries``), its asyncio tasks (``saar_asyncio_tasks``), the number of
series ``/metrics`` exports, its full garbage collections (``saar_gc_seconds``: they stop the
event loop), the interpreter's allocated blocks (``saar_python_heap_blocks``: RSS growing while
they stay flat is native memory), and the client's req/s, p50 and p99, then prints a row.

The router's caps are lowered (``CAPS``) so a run of ten minutes reaches them; the verdicts
say whether RSS stays flat once they are reached, whether any table or the series count keeps
growing in the second half, whether tasks leak, and whether p99 stays within twice its median.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import statistics
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import yaml

from .. import EXAMPLE_CONFIG
from ..harness import Stack, run_stack
from .load import _percentile
from .wire import Http

CAPS = {"memory": {"max_sessions": 4000, "max_owned_ids": 12000},
        "replay": {"capacity": 3000}}
"""Lower than the defaults, so a ten-minute soak fills them (the defaults take hours)."""
CAPPED = {"sessions": ("memory", "max_sessions"), "owners": ("memory", "max_owned_ids"),
          "replay_records": ("replay", "capacity"), "replay_index": ("replay", "capacity"),
          "prompt_memos": ("memory", "max_sessions"),
          "session_figures": ("memory", "max_sessions")}
FILLING = ("prefix_index_blocks",)
"""Tables bounded by what the workers report (the prefix index: their KV's size), not by the
config: full once a window shows the same count as the one before."""
TAIL_S = 360.0
TAIL_RSS_MIB = 2.0
"""Issue 15's line: RSS within 2 MiB over a run's last six minutes, the caps reached before."""
TENANTS = 20
LOOPS = 48
TIMEOUT = 30.0
HARD = "Please refactor the storage layer and debug the failing test."
CHAT_TOOL = {"type": "function", "function": {"name": "run_tests", "description": "Run tests",
                                              "parameters": {"type": "object",
                                                             "properties": {}}}}
RESPONSES_TOOL = {"type": "function", "name": "run_tests", "description": "Run tests",
                  "parameters": {"type": "object", "properties": {}}}
MESSAGES_TOOL = {"name": "run_tests", "description": "Run tests",
                 "input_schema": {"type": "object", "properties": {}}}


@dataclass(frozen=True)
class Settings:
    minutes: float = 10.0
    rate: float | None = None
    """Requests per second; None: half the measured ceiling."""
    window_s: float = 30.0
    ceiling_step_s: float = 4.0
    ceiling_steps: tuple[int, ...] = (4, 16, 48)


# -- agent sessions ------------------------------------------------------------------------


@dataclass
class Record:
    latencies: list[tuple[float, float]] = field(default_factory=list)
    """(finished at, seconds) of every answered request."""
    errors: list[tuple[float, int]] = field(default_factory=list)


class Pacer:
    """Open loop: hands out send times ``1/rate`` apart; a loop that falls behind sends at
    once (closed loop then, at the stack's pace)."""

    def __init__(self, rate: float | None) -> None:
        self.interval = 0.0 if not rate else 1.0 / rate
        self._next = time.perf_counter()

    async def wait(self) -> None:
        if not self.interval:
            return
        now = time.perf_counter()
        slot = max(self._next, now - 1.0)  # never a burst of more than a second's backlog
        self._next = slot + self.interval
        if slot > now:
            await asyncio.sleep(slot - now)


async def _send(http: Http, pacer: Pacer, record: Record, path: str, doc: dict[str, Any],
                headers: dict[str, str]) -> Any:
    await pacer.wait()
    started = time.perf_counter()
    try:
        async with asyncio.timeout(TIMEOUT):
            status, body = await http.post(path, orjson.dumps(doc), headers)
    except (OSError, asyncio.IncompleteReadError, TimeoutError):
        record.errors.append((time.perf_counter(), 0))
        return None
    done = time.perf_counter()
    if status != 200:
        record.errors.append((done, status))
        return None
    record.latencies.append((done, done - started))
    if doc.get("stream"):
        return _sse_tool_calls(body)
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        record.errors.append((done, -1))
        return None


def _sse_tool_calls(body: bytes) -> dict[str, Any]:
    """A streamed chat answer as the non-streamed shape this client reads (tool call ids)."""
    calls = []
    for line in body.split(b"\n"):
        if line.startswith(b"data: {"):
            with contextlib.suppress(orjson.JSONDecodeError):
                for choice in orjson.loads(line[6:]).get("choices", ()):
                    for call in (choice.get("delta") or {}).get("tool_calls") or ():
                        if call.get("id"):
                            calls.append({"id": call["id"], "type": "function",
                                          "function": {"name": "run_tests", "arguments": "{}"}})
    return {"choices": [{"message": {"role": "assistant", "content": None,
                                     "tool_calls": calls}}]}


async def chat_session(http: Http, pacer: Pacer, record: Record, headers: dict[str, str],
                       stream: bool) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": HARD}]
    for _ in range(2):
        doc: dict[str, Any] = {"model": "auto", "messages": messages, "tools": [CHAT_TOOL]}
        if stream:
            doc.update(stream=True, stream_options={"include_usage": True})
        answer = await _send(http, pacer, record, "/v1/chat/completions", doc, headers)
        if answer is None:
            return
        message = answer["choices"][0]["message"]
        calls = message.get("tool_calls") or []
        if not calls:
            return
        messages = [*messages, {"role": "assistant", "content": None, "tool_calls": calls},
                    *({"role": "tool", "tool_call_id": c["id"], "content": "3 passed"}
                      for c in calls)]


async def responses_session(http: Http, pacer: Pacer, record: Record,
                            headers: dict[str, str]) -> None:
    items: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": HARD}]
    previous = None
    for _ in range(3):
        doc: dict[str, Any] = {"model": "auto", "input": items, "tools": [RESPONSES_TOOL]}
        if previous:
            doc["previous_response_id"] = previous
        answer = await _send(http, pacer, record, "/v1/responses", doc, headers)
        if answer is None:
            return
        previous = answer["id"]
        calls = [i["call_id"] for i in answer.get("output", ()) if i.get("type") ==
                 "function_call"]
        items = ([{"type": "function_call_output", "call_id": c, "output": "3 passed"}
                  for c in calls] or [{"type": "message", "role": "user", "content": "go on"}])


async def messages_session(http: Http, pacer: Pacer, record: Record,
                           headers: dict[str, str]) -> None:
    messages: list[dict[str, Any]] = [{"role": "user", "content": HARD}]
    for _ in range(2):
        doc = {"model": "auto", "max_tokens": 64, "messages": messages, "tools": [MESSAGES_TOOL]}
        answer = await _send(http, pacer, record, "/v1/messages", doc, headers)
        if answer is None:
            return
        blocks = answer.get("content", [])
        calls = [b["id"] for b in blocks if b.get("type") == "tool_use"]
        if not calls:
            return
        messages = [*messages, {"role": "assistant", "content": blocks},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": c, "content": "3 passed"}
                        for c in calls]}]


async def _loop(url: str, pacer: Pacer, record: Record, stop: float, ids: Any) -> None:
    http = Http(url)
    try:
        while time.perf_counter() < stop:
            n = next(ids)
            headers = {"authorization": f"Bearer soak-tenant-{n % TENANTS}",
                       "x-session-id": f"soak-{n}"}
            kind = n % 6
            if kind < 3:
                await chat_session(http, pacer, record, headers, stream=kind == 0)
            elif kind < 5:
                await responses_session(http, pacer, record, headers)
            else:
                await messages_session(http, pacer, record, headers)
    finally:
        http.close()


async def drive(url: str, seconds: float, rate: float | None, loops: int,
                ids: Any) -> Record:
    record = Record()
    pacer = Pacer(rate)
    stop = time.perf_counter() + seconds
    await asyncio.gather(*(_loop(url, pacer, record, stop, ids) for _ in range(loops)))
    return record


# -- what the processor shows --------------------------------------------------------------


def metrics_page(url: str) -> str:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
        return str(response.read().decode())


def _rss(stack: Stack) -> float:
    proc = stack.processors[0].service.proc
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024 / 2**20
    return math.nan


def sample(stack: Stack) -> dict[str, Any]:
    """RSS (MiB), tasks, series and the table sizes, now."""
    text = metrics_page(stack.processor_http)
    tables: dict[str, float] = {}
    tasks = gc_seconds = gc_count = blocks = math.nan
    series = 0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        name, _, value = line.rpartition(" ")
        if name.startswith("saar_table_entries{"):
            tables[name.split('"')[1]] = float(value)
        elif name == "saar_asyncio_tasks":
            tasks = float(value)
        elif name == "saar_python_heap_blocks":
            blocks = float(value)
        elif name == 'saar_gc_seconds_sum{generation="2"}':
            gc_seconds = float(value)
        elif name == 'saar_gc_seconds_count{generation="2"}':
            gc_count = float(value)
    return {"rss_mib": round(_rss(stack), 1), "tasks": tasks, "series": series,
            "tables": tables, "gc2": [gc_count, round(gc_seconds, 4)], "py_blocks": blocks}


@dataclass
class Window:
    end_s: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    state: dict[str, Any]

    def as_json(self) -> dict[str, Any]:
        return {"end_s": round(self.end_s, 1), "rps": round(self.rps, 1),
                "p50_ms": round(self.p50_ms, 2), "p99_ms": round(self.p99_ms, 2),
                "errors": self.errors, **self.state}


def _window(record: Record, start: float, end: float, began: float,
            state: dict[str, Any]) -> Window:
    done = [s for t, s in record.latencies if start <= t < end]
    errors = sum(1 for t, _ in record.errors if start <= t < end)
    seconds = max(end - start, 1e-9)
    return Window(end - began, len(done) / seconds, _percentile(done, 50) * 1e3,
                  _percentile(done, 99) * 1e3, errors, state)


# -- verdicts ------------------------------------------------------------------------------


def verdicts(windows: Sequence[Window], caps: dict[str, int]) -> dict[str, Any]:
    """Whether RSS is flat once the caps are reached, no table or the series grows in the
    second half, no task leaks, p99 stays within twice its median."""
    out: dict[str, Any] = {}
    half = windows[len(windows) // 2:]
    first = windows[:len(windows) // 2] or windows[:1]
    capped = next((i for i, w in enumerate(windows)
                   if all(w.state["tables"].get(t, 0) >= 0.98 * cap
                          for t, cap in caps.items() if t in ("sessions", "replay_records"))
                   and all(i and w.state["tables"].get(t) == windows[i - 1].state["tables"].get(t)
                           for t in FILLING)),
                  None)
    out["caps_reached_at_s"] = None if capped is None else round(windows[capped].end_s, 1)
    after = windows[capped:] if capped is not None else half
    rss = [w.state["rss_mib"] for w in after]
    growth = rss[-1] - rss[0] if len(rss) > 1 else 0.0
    out["rss_after_caps_mib"] = [round(min(rss), 1), round(max(rss), 1)]
    out["rss_flat"] = capped is not None and growth <= max(8.0, 0.05 * rss[0])
    start = windows[-1].end_s - TAIL_S
    base = max((w for w in windows if w.end_s <= start), key=lambda w: w.end_s,
               default=windows[0])
    out["rss_tail"] = {"seconds": round(windows[-1].end_s - base.end_s, 1),
                       "mib": round(windows[-1].state["rss_mib"] - base.state["rss_mib"], 1),
                       # Python's own share of it: blocks it allocated more (or fewer)
                       "py_blocks": windows[-1].state.get("py_blocks", math.nan)
                       - base.state.get("py_blocks", math.nan)}
    out["rss_tail_met"] = (capped is not None and windows[capped].end_s <= base.end_s
                           and out["rss_tail"]["mib"] <= TAIL_RSS_MIB)
    growing = []
    for table in windows[-1].state["tables"]:
        last = windows[-1].state["tables"][table]
        cap = caps.get(table)
        if cap is not None and last <= cap:
            continue
        peak = max(w.state["tables"].get(table, 0) for w in first)
        if last > peak * 1.05 + 64:
            growing.append(table)
    out["growing_tables"] = growing
    out["tables_bounded"] = not growing
    series_first = max(w.state["series"] for w in first)
    out["series"] = [windows[0].state["series"], windows[-1].state["series"]]
    out["series_bounded"] = windows[-1].state["series"] <= series_first * 1.02 + 16
    tasks_first = max(w.state["tasks"] for w in first)
    out["tasks"] = [min(w.state["tasks"] for w in windows),
                    max(w.state["tasks"] for w in windows)]
    out["no_task_leak"] = windows[-1].state["tasks"] <= tasks_first + 16
    p99 = [w.p99_ms for w in windows[1:] or windows if not math.isnan(w.p99_ms)]
    median = statistics.median(p99) if p99 else math.nan
    out["p99_median_ms"] = round(median, 2)
    out["p99_max_ms"] = round(max(p99), 2) if p99 else math.nan
    out["p99_stable"] = bool(p99) and max(p99) <= 2 * median
    return out


# -- the run -------------------------------------------------------------------------------


def soak_config(base: dict[str, Any]) -> dict[str, Any]:
    config = json.loads(json.dumps(base))
    for section, values in CAPS.items():
        config[section] = {**config.get(section, {}), **values}
    for decision in config["routing"]["decisions"]:
        aware = decision.setdefault("algorithm", {}).setdefault("session_aware", {})
        aware.setdefault("idle_timeout_seconds", 300)
    return config


def ceiling(stack: Stack, settings: Settings, ids: Any) -> tuple[float, list[list[float]]]:
    """Closed loop at each concurrency of ``ceiling_steps``: the best req/s."""
    steps = []
    for loops in settings.ceiling_steps:
        record = asyncio.run(drive(stack.url, settings.ceiling_step_s, None, loops, ids))
        steps.append([loops, round(len(record.latencies) / settings.ceiling_step_s, 1)])
    return max(rps for _, rps in steps), steps


def run(config: dict[str, Any], settings: Settings) -> dict[str, Any]:
    config = soak_config(config)
    caps = {t: int(config[s][k]) for t, (s, k) in CAPPED.items()}
    ids = itertools.count()
    with tempfile.TemporaryDirectory(prefix="saar-soak-") as tmp, \
            run_stack(config, workers_per_model=2, sim_args=["--time-scale", "0"],
                      workdir=Path(tmp)) as stack:
        measured: float | None = None
        steps: list[list[float]] = []
        if settings.rate is None:
            measured, steps = ceiling(stack, settings, ids)
        rate = settings.rate or max(1.0, (measured or 2.0) / 2)
        seconds = settings.minutes * 60
        count = max(1, round(seconds / settings.window_s))
        length = seconds / count
        windows: list[Window] = []

        async def soak() -> None:
            record = Record()
            pacer = Pacer(rate)
            began = time.perf_counter()
            stop = began + seconds
            loops = [asyncio.ensure_future(_loop(stack.url, pacer, record, stop, ids))
                     for _ in range(LOOPS)]
            for n in range(1, count + 1):
                end = began + n * length
                await asyncio.sleep(max(0.0, end - time.perf_counter()))
                state = await asyncio.to_thread(sample, stack)
                windows.append(_window(record, end - length, end, began, state))
            await asyncio.gather(*loops)

        asyncio.run(soak())
    return {"ceiling_rps": measured, "ceiling_steps": steps, "rate": round(rate, 1),
            "minutes": settings.minutes, "caps": caps,
            "windows": [w.as_json() for w in windows], "verdicts": verdicts(windows, caps)}


TABLE_COLUMNS = ("sessions", "owners", "replay_records", "replay_index", "admission_programs",
                 "prompt_memos", "prompt_memo_blocks", "prefix_index_blocks", "large_body_tenants")


def table(report: dict[str, Any]) -> str:
    head = ["t s", "req/s", "p50 ms", "p99 ms", "err", "RSS MiB", "py blocks", "tasks", "series",
            "gen2 GCs (ms)", *TABLE_COLUMNS]
    rows = [head]
    before = [0.0, 0.0]
    for w in report["windows"]:
        gc2 = w.get("gc2", [math.nan, math.nan])
        collections = f"{gc2[0] - before[0]:.0f} ({(gc2[1] - before[1]) * 1e3:.0f})"
        before = gc2
        rows.append([f"{w['end_s']:.0f}", f"{w['rps']:.0f}", f"{w['p50_ms']:.1f}",
                     f"{w['p99_ms']:.1f}", str(w["errors"]), f"{w['rss_mib']:.1f}",
                     f"{w.get('py_blocks', math.nan):.0f}", f"{w['tasks']:.0f}",
                     str(w["series"]), collections,
                     *(f"{w['tables'].get(t, math.nan):.0f}" for t in TABLE_COLUMNS)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    ceiling_line = ("ceiling: " + ", ".join(f"{c} loops {r:.0f} req/s"
                                            for c, r in report["ceiling_steps"])
                    if report["ceiling_steps"] else "ceiling: not measured (--rate given)")
    v = report["verdicts"]
    lines = [ceiling_line,
             f"soak: {report['rate']:.0f} req/s offered for {report['minutes']:g} min; caps "
             + ", ".join(f"{k} {c}" for k, c in report["caps"].items()),
             *("  ".join(cell.rjust(wd) for cell, wd in zip(r, widths, strict=True))
               for r in rows),
             f"caps reached at: {v['caps_reached_at_s']} s; RSS after: "
             f"{v['rss_after_caps_mib'][0]}-{v['rss_after_caps_mib'][1]} MiB: "
             + ("flat" if v["rss_flat"] else "NOT FLAT"),
             f"RSS over the last {v['rss_tail']['seconds']:g} s: {v['rss_tail']['mib']:+.1f} MiB "
             f"(issue 15: <= {TAIL_RSS_MIB:g} MiB over {TAIL_S:g} s, the caps reached before): "
             + ("met" if v["rss_tail_met"] else "MISSED"),
             f"Python's allocated blocks over the same {v['rss_tail']['seconds']:g} s: "
             f"{v['rss_tail']['py_blocks']:+.0f} (RSS growing while these stay flat is native)",
             "tables: " + ("bounded" if v["tables_bounded"]
                           else "GROWING " + ", ".join(v["growing_tables"])),
             f"metric series: {v['series'][0]} -> {v['series'][1]}: "
             + ("bounded" if v["series_bounded"] else "GROWING"),
             f"asyncio tasks: {v['tasks'][0]:.0f}-{v['tasks'][1]:.0f}: "
             + ("no leak" if v["no_task_leak"] else "LEAK"),
             f"p99: median {v['p99_median_ms']} ms, max {v['p99_max_ms']} ms: "
             + ("stable" if v["p99_stable"] else "UNSTABLE")]
    return "\n".join(lines)


def main(config_path: str | None, settings: Settings, *, as_json: bool) -> int:
    config = yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text())
    report = run(config, settings)
    print(table(report), flush=True)
    if as_json:
        print(json.dumps(report), flush=True)
    # The verdicts need a run that reaches the caps (minutes); the exit status says only
    # whether the stack served every window.
    return 0 if all(w["rps"] > 0 for w in report["windows"]) else 1
