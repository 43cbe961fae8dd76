"""The rounds, the report and ``saar bench peers``'s entry point.

Each round, every router takes its turn (the order rotated by one each round) in front of the
same pool: the pool is made fresh, the router started, its overhead cells measured (the tiny
request at concurrency 1 beside the same request sent straight to a worker, then concurrency
16 with its processes' CPU), then each workload is sent, the pool made fresh before each, the
workers' prefix-cache counters read before and after; then the router is stopped. Each round
draws its own sessions (the seed and the round), so a router's memory of an earlier round
never meets the same prompts again.

``--json``: the last line is ``{"runs": [{"workload", "backend", "routers": {NAME: figures |
{"missing": REASON}}, "details": {NAME: {...}}}]}`` (``stats.FIGURES`` are the figures); on a
backend where saar's precise index is judged (real vLLM) each run adds ``"precise_index":
{"requests": n, "within_one_block": k}`` (``precise``). A backend that cannot start makes every
router ``{"missing": REASON}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...clustersim.trace import TraceRow, read_trace
from . import precise
from .backends import BACKENDS, Backend, Pool
from .client import Target, added_latency, closed_loop, run_workload
from .install import PeerMissing
from .procstat import cpu_seconds, rss_mib
from .routers import Router, Running, standard
from .settings import BACKENDS as KNOWN
from .settings import WORKLOADS, Settings
from .stats import FIGURES, Measure, Overhead, PreciseCount, details, figures
from .workloads import Shape, TraceShape, Workload, build


@dataclass
class Results:
    backend: str
    routers: tuple[str, ...]
    workloads: tuple[str, ...]
    measures: dict[tuple[str, str], list[Measure]] = field(default_factory=dict)
    missing: dict[str, str] = field(default_factory=dict)
    precise: bool = False
    """saar's precise index is judged on this backend (``precise_index`` in each run)."""

    def add(self, workload: str, router: str, measure: Measure) -> None:
        self.measures.setdefault((workload, router), []).append(measure)


def shapes(settings: Settings, trace_words_per_block: int = 16) -> tuple[Shape, TraceShape]:
    return (Shape(sessions=settings.sessions, turns=settings.turns),
            TraceShape(sessions=settings.sessions, turns=max(2, settings.turns // 2),
                       block_size=trace_words_per_block))


def workloads_for(settings: Settings, round_: int, pool: Pool,
                  trace_rows: Sequence[TraceRow] | None) -> dict[str, Workload]:
    shape, trace = shapes(settings, pool.trace_words_per_block)
    return {name: build(name, shape=shape, trace=trace, seed=f"{settings.seed}r{round_}",
                        kv_tokens=pool.kv_tokens, oversubscription=settings.oversubscription,
                        trace_rows=trace_rows)
            for name in settings.workloads}


def rotated(items: Sequence[Router], by: int) -> list[Router]:
    if not items:
        return []
    by %= len(items)
    return [*items[by:], *items[:by]]


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def measure_overhead(running: Running, pool: Pool, settings: Settings) -> Overhead:
    target = Target(running.url, running.model, running.fresh_connections)
    alone = pool.direct_target()
    direct = Target(alone.url, pool.model, alone.fresh_connections, alone.headers)
    added_ms, failed = asyncio.run(added_latency(target, direct, settings.c1_pairs))
    pids = running.pids()
    before = cpu_seconds(pids)
    ok, errors, elapsed = asyncio.run(closed_loop(target, settings.concurrency,
                                                  settings.c16_seconds))
    used = cpu_seconds(pids) - before
    return Overhead(added_p50_ms_c1=added_ms,
                    rps_c16=ok / elapsed if elapsed > 0 else 0.0,
                    cpu_ms_per_req_c16=1000 * used / max(1, ok + errors),
                    requests_c16=ok + errors, errors=failed + errors)


def measure_workload(workload: Workload, running: Running, pool: Pool,
                     round_: int) -> Measure:
    pool.reset()
    before = pool.counters()
    tally, wall = asyncio.run(run_workload(
        workload, Target(running.url, running.model, running.fresh_connections)))
    after = pool.counters()
    measure = Measure(round_, wall_s=wall, output_tokens=tally.output_tokens,
                      requests=tally.requests, errors=dict(tally.errors),
                      ttfts_s=tally.ttfts_s, rss_mib=rss_mib(running.pids()))
    for url, (hits, queries) in after.items():
        old_hits, old_queries = before.get(url, (0.0, 0.0))
        measure.hit_tokens += hits - old_hits
        measure.query_tokens += queries - old_queries
    if running.replay_jsonl is not None and pool.precise_block_size:
        records = precise.records_for(running.replay_jsonl,
                                      (seen.replay_id for seen in tally.observed))
        measure.precise = precise.count(tally.observed, records, pool.precise_block_size)
    return measure


def run(settings: Settings, backend: Backend, routers: Sequence[Router], workdir: Path,
        trace_rows: Sequence[TraceRow] | None = None) -> Results:
    results = Results(backend.name, tuple(r.name for r in routers), settings.workloads)
    live = []
    for router in routers:
        try:
            router.prepare()
        except (PeerMissing, RuntimeError) as exc:
            results.missing[router.name] = str(exc)
            _log(f"{router.name}: missing ({exc})")
        else:
            live.append(router)
    failures: dict[str, str] = {}
    with contextlib.ExitStack() as stack:
        try:
            pool = stack.enter_context(backend.pool(workdir / "pool"))
        except RuntimeError as exc:  # not installed, or it did not start
            _log(f"backend {backend.name}: {exc}")
            for router in live:
                results.missing[router.name] = f"backend {backend.name} did not start: {exc}"
            return results
        results.precise = pool.precise_block_size is not None
        for round_ in range(settings.rounds):
            workloads = workloads_for(settings, round_, pool, trace_rows)
            for router in rotated(live, round_):
                home = workdir / f"round{round_}-{router.name.replace(':', '-')}"
                try:
                    pool.reset()
                    with router.start(pool, home) as running:
                        overhead = measure_overhead(running, pool, settings)
                        for name, workload in workloads.items():
                            measure = measure_workload(workload, running, pool, round_)
                            measure.overhead = overhead
                            results.add(name, router.name, measure)
                            _log(_progress(round_, router.name, name, workload, measure))
                except RuntimeError as exc:  # it (or the pool) did not start, or died
                    failures[router.name] = f"failed in round {round_ + 1}: {exc}"
                    _log(f"{router.name}: {failures[router.name]} (logs: {home})")
    for name, reason in failures.items():
        if not any(router == name for _, router in results.measures):
            results.missing[name] = reason
    return results


def _progress(round_: int, router: str, name: str, workload: Workload, m: Measure) -> str:
    hit = f"{m.hit_tokens / m.query_tokens:.1%}" if m.query_tokens else "-"
    errors = ", ".join(f"{n} {kind}" for kind, n in m.errors.items()) or "no errors"
    index = (f", precise index {m.precise.within_one_block}/{m.precise.requests} within a block"
             if m.precise is not None else "")
    return (f"round {round_ + 1} {router} {name}: {m.requests} requests "
            f"({len(workload.sessions)} sessions), {errors}, hit {hit}, {m.wall_s:.1f} s{index}")


def report(results: Results) -> dict[str, Any]:
    runs = []
    for workload in results.workloads:
        entries: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        for router in results.routers:
            measures = results.measures.get((workload, router))
            if router in results.missing or not measures:
                entries[router] = {"missing": results.missing.get(router, "not measured")}
                continue
            entries[router] = figures(measures)
            extra[router] = details(measures)
        run_: dict[str, Any] = {"workload": workload, "backend": results.backend,
                                "routers": entries, "details": extra}
        if results.precise:
            counts = [m.precise for m in results.measures.get((workload, "saar"), ())
                      if m.precise is not None]
            run_["precise_index"] = sum(counts, PreciseCount()).figure()
        runs.append(run_)
    return {"runs": runs}


def _cell(value: Any, scale: float = 1.0, digits: int = 1, suffix: str = "") -> str:
    return "-" if value is None else f"{value * scale:,.{digits}f}{suffix}"


def table(doc: Mapping[str, Any]) -> str:
    head = ("router", "hit", "ttft p50", "p90", "p99", "tok/s", "+p50 c1", "req/s c16",
            "cpu/req c16", "rss MiB", "requests", "errors")
    lines = ["ttft in ms; +p50 c1 = added over a worker alone, ms; cpu/req = the router's "
             "processes' CPU ms per request at c=16; rss = their peak"]
    for run_ in doc["runs"]:
        rows: list[tuple[str, ...]] = [head]
        for name, entry in run_["routers"].items():
            if "missing" in entry:
                rows.append((name, f"missing: {entry['missing']}"))
                continue
            more = run_["details"].get(name, {})
            rows.append((
                name, _cell(entry["prefix_hit"], 100, 1, "%"),
                _cell(entry["ttft_p50_s"], 1000, 0), _cell(entry["ttft_p90_s"], 1000, 0),
                _cell(entry["ttft_p99_s"], 1000, 0), _cell(entry["throughput_tok_s"], 1, 0),
                _cell(entry["added_p50_ms_c1"], 1, 2), _cell(more.get("rps_c16"), 1, 0),
                _cell(entry["cpu_ms_per_req_c16"], 1, 2), _cell(entry["rss_mib"], 1, 0),
                str(more.get("requests", "")), str(more.get("errors", ""))))
        widths = [max(len(r[i]) for r in rows if len(r) > i and len(r) == len(head))
                  for i in range(len(head))]
        lines += ["", f"{run_['workload']} ({run_['backend']})"]
        for row in rows:
            if len(row) != len(head):
                lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
            else:
                lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                                       for i, (v, w) in enumerate(zip(row, widths, strict=True))))
        index = run_.get("precise_index")
        if index is not None:
            n, k = index["requests"], index["within_one_block"]
            share = f" ({k / n:.1%})" if n else ""
            lines.append(f"saar's precise index: {k} of {n} requests within one block of the "
                         f"engine's cached tokens{share}")
    return "\n".join(lines)


def ok(doc: Mapping[str, Any]) -> bool:
    """saar measured on every workload, without a failed request."""
    for run_ in doc["runs"]:
        if "missing" in run_["routers"].get("saar", {}):
            return False
        saar = run_["details"].get("saar", {})
        if saar.get("errors") or saar.get("overhead_errors"):
            return False
    return True


@contextlib.contextmanager
def _workdir(path: str | None) -> Iterator[Path]:
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="saar-bench-peers-") as tmp:
        yield Path(tmp)


def make_backend(settings: Settings) -> Backend:
    if settings.backend not in BACKENDS:
        raise SystemExit(f"backend {settings.backend!r} is not wired in yet (known: "
                         f"{', '.join(KNOWN)}; available: {', '.join(BACKENDS)})")
    return BACKENDS[settings.backend](settings)


def main(settings: Settings, *, as_json: bool) -> int:
    unknown = [w for w in settings.workloads if w not in WORKLOADS]
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; known: {', '.join(WORKLOADS)}")
    backend = make_backend(settings)
    own = getattr(backend, "routers", None)  # a backend with routers of its own (Dynamo's)
    routers: list[Router] = (list(own(settings.routers)) if callable(own)
                             else [standard(name) for name in settings.routers])
    rows = read_trace(settings.trace) if settings.trace else None
    load = os.getloadavg()[0]
    with _workdir(settings.workdir) as workdir:
        doc = report(run(settings, backend, routers, workdir, rows))
    print(f"{os.cpu_count()} cores; load average {load:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end", flush=True)
    print(table(doc), flush=True)
    if as_json:
        print(json.dumps(doc), flush=True)
    return 0 if ok(doc) else 1


__all__ = ["FIGURES", "Settings", "main", "report", "run", "table"]
