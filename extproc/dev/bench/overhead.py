"""``saar bench overhead``: Envoy alone, Envoy + a pass-through Python processor, and Envoy + saar,
side by side in one run, so the added latency is measured against a baseline taken minutes apart
on the same machine rather than against numbers from elsewhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from .. import EXAMPLE_CONFIG
from ..harness import Service, Stack, StoreCluster, run_stack
from .bodies import DEFAULT_BODIES, STREAMED, body
from .load import Load, LoadResult, pick_client, run_load
from .passthrough import command
from .upstream import STREAM_HEADER, canned_upstream
from .variants import STORES, VARIANTS, pointed_at, transform

PHYSICAL_MODEL = "qwen3-8b"
HEADERS = {"content-type": "application/json", "x-session-id": "bench-session"}


@dataclass(frozen=True)
class Bar:
    """One of issue 15's lines: ``variant`` against ``floor`` in the same run, for each of
    ``bodies`` — its p50 at concurrency 1 at most ``p50_ms`` above the floor's, and its req/s
    at higher concurrency at least ``rps_share`` of the floor's."""

    variant: str
    floor: str
    p50_ms: float
    rps_share: float
    bodies: tuple[str, ...] = ("2kb", "64kb")


BARS = (Bar("saar", "passthrough", 0.5, 0.70), Bar("saar-redis", "saar", 0.3, 0.85))


@dataclass(frozen=True)
class Settings:
    variants: Sequence[str] = VARIANTS
    bodies: Sequence[str] = DEFAULT_BODIES
    concurrencies: Sequence[int] = (1, 16)
    warmup_s: float = 1.0
    duration_s: float = 4.0
    rounds: int = 1
    """Every variant's cells measured this many times, the variants taking turns (all their
    stacks up at once): a neighbour's burst lands on one round of every variant rather than on
    all of one variant's cells."""
    client: str = "auto"
    # "canned" by default: sim-server --time-scale 0 caps Envoy alone near 1,100 req/s (2 KB) and
    # 60 req/s (64 KB, it tokenizes the prompt) on 2 cores, so it would measure itself.
    upstream: str = "canned"


@dataclass(frozen=True)
class Cell:
    variant: str
    body: str
    concurrency: int
    result: LoadResult
    cpu_ms: dict[str, float]
    """CPU milliseconds (user + system, every thread) per request, by part of the stack
    (``processor``, ``store``, ``envoy``): what each costs the machine, a figure this noisy
    machine's neighbours move far less than req/s."""
    round: int = 0

    @property
    def key(self) -> tuple[str, str, int]:
        return self.variant, self.body, self.concurrency

    def as_json(self) -> dict[str, Any]:
        r = self.result
        return {
            "variant": self.variant, "body": self.body, "concurrency": self.concurrency,
            "round": self.round,
            "p50_ms": round(r.p50_ms, 3), "p99_ms": round(r.p99_ms, 3), "rps": round(r.rps, 1),
            "requests": r.requests, "non_200": r.non_200,
            "cpu_ms": {part: round(ms, 3) for part, ms in self.cpu_ms.items()},
        }


@dataclass(frozen=True)
class Report:
    client: str
    upstream: str
    cells: list[Cell]

    def as_json(self) -> dict[str, Any]:
        return {"client": self.client, "upstream": self.upstream,
                "results": [c.as_json() for c in self.cells]}

    def baseline(self, cell: Cell) -> Cell | None:
        return self.find("envoy", cell.body, cell.concurrency, cell.round)

    def find(self, variant: str, body: str, concurrency: int, round_: int) -> Cell | None:
        return next((c for c in self.cells if c.key == (variant, body, concurrency)
                     and c.round == round_), None)


@contextlib.contextmanager
def _upstream(kind: str, workdir: Path) -> Iterator[str | None]:
    if kind == "sim":
        yield None
        return
    with canned_upstream(workdir) as address:
        yield address


def run_overhead(config: dict[str, Any], settings: Settings) -> Report:
    """Start every variant's stack, then load each with every (body, concurrency), the
    variants taking turns for ``settings.rounds`` rounds."""
    transforms = {variant: transform(variant) for variant in settings.variants}
    client = pick_client(settings.client)
    cells = []
    with tempfile.TemporaryDirectory(prefix="saar-bench-") as tmp, \
            _upstream(settings.upstream, Path(tmp)) as upstream, contextlib.ExitStack() as up:
        stacks = {variant: up.enter_context(run_stack(
            config,
            sim_args=["--time-scale", "0"],
            processor=command(variant),
            workdir=Path(tmp) / variant,
            envoy_transform=pointed_at(upstream, transforms[variant]),
            store=STORES.get(variant),
        )) for variant in settings.variants}
        for round_ in range(settings.rounds):
            for variant, stack in stacks.items():
                model = "auto" if variant.startswith("saar") else PHYSICAL_MODEL
                for name in settings.bodies:
                    for concurrency in settings.concurrencies:
                        headers = {**HEADERS, **({STREAM_HEADER: "1"} if name in STREAMED
                                                 else {})}
                        load = Load(f"{stack.url}/v1/chat/completions", body(name, model),
                                    headers, concurrency, 0.0, settings.duration_s)
                        if settings.warmup_s > 0:
                            run_load(replace(load, duration_s=settings.warmup_s), client)
                        before = cpu_seconds(stack)
                        result = run_load(load, client)
                        after = cpu_seconds(stack)
                        cpu = {part: 1000 * (after[part] - before[part]) / max(1, result.requests)
                               for part in after}
                        cells.append(Cell(variant, name, concurrency, result, cpu, round_))
    return Report(client, settings.upstream, cells)


PARTS = ("processor", "store", "envoy")


def cpu_seconds(stack: Stack) -> dict[str, float]:
    """CPU seconds each part of ``stack`` has used so far (its processes' user + system
    time, from ``/proc``); parts it does not run are left out."""
    store = stack.store
    pids = {"processor": [p.service.proc for p in stack.processors],
            "store": ([] if store is None else [node.proc for node in store.nodes]
                      if isinstance(store, StoreCluster) else [store.proc]),
            "envoy": [s.proc for s in stack.services
                      if isinstance(s, Service) and s.name == "envoy"]}
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for part, procs in pids.items():
        running = [proc.pid for proc in procs if proc is not None]
        if not running:
            continue
        total = 0.0
        for pid in running:
            fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        out[part] = total
    return out


def _added(value: float, base: float | None) -> str:
    return "" if base is None else f"{value - base:+.2f}"


def format_table(report: Report) -> str:
    head = ("round", "variant", "body", "conc", "p50 ms", "p99 ms", "req/s", "+p50", "+p99",
            "non-200", *(f"{part} cpu" for part in PARTS))
    rows = [head]
    for cell in report.cells:
        r, base = cell.result, report.baseline(cell)
        rows.append((
            str(cell.round + 1), cell.variant, cell.body, str(cell.concurrency),
            f"{r.p50_ms:.2f}", f"{r.p99_ms:.2f}",
            f"{r.rps:.0f}", _added(r.p50_ms, base.result.p50_ms if base else None),
            _added(r.p99_ms, base.result.p99_ms if base else None), str(r.non_200),
            *(f"{cell.cpu_ms[part]:.3f}" if part in cell.cpu_ms else "" for part in PARTS),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [f"client: {report.client}; upstream: {report.upstream}; "
             "req/s counts 200s; +p50/+p99 = added over Envoy alone (same body, concurrency); "
             "cpu = CPU ms per request of each part"]
    lines += ["  ".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join([*lines, *verdicts(report)])


def verdicts(report: Report) -> list[str]:
    """Each of ``BARS`` whose two variants were run, cell by cell: measured against the floor
    of the same round, the median over the rounds, the line, and whether it is met (never
    with failed requests)."""
    keys = list(dict.fromkeys(c.key for c in report.cells))
    out = []
    for bar in BARS:
        for variant, name, concurrency in keys:
            if variant != bar.variant or name not in bar.bodies:
                continue
            pairs = [(c, f) for c in report.cells if c.key == (variant, name, concurrency)
                     and (f := report.find(bar.floor, name, concurrency, c.round)) is not None]
            if not pairs:
                continue
            failed = sum(c.result.non_200 for c, _ in pairs)
            errors = f" with {failed} non-200" if failed else ""
            label = f"{variant} {name} c={concurrency}"
            if concurrency == 1:
                added = [c.result.p50_ms - f.result.p50_ms for c, f in pairs]
                figure = statistics.median(added)
                met = figure <= bar.p50_ms
                line = (f"{label}: p50 {figure:+.2f} ms over {bar.floor}{errors}"
                        f"{_rounds(f'{a:+.2f}' for a in added)} (line: <= {bar.p50_ms} ms)")
            else:
                shares = [c.result.rps / f.result.rps if f.result.rps else 0.0 for c, f in pairs]
                figure = statistics.median(shares)
                met = figure >= bar.rps_share
                rps = statistics.median(c.result.rps for c, _ in pairs)
                floor = statistics.median(f.result.rps for _, f in pairs)
                line = (f"{label}: {rps:.0f} req/s, {figure:.0%} of {bar.floor}'s {floor:.0f}"
                        f"{errors}{_rounds(f'{x:.0%}' for x in shares)} "
                        f"(line: >= {bar.rps_share:.0%})")
            out.append(f"{line}: {'met' if met and not failed else 'MISSED'}")
    return out


def _rounds(figures: Iterable[str]) -> str:
    """Each round's figure, when there was more than one (the verdict is on their median)."""
    shown = list(figures)
    return f", median of {' / '.join(shown)}" if len(shown) > 1 else ""


def ok(report: Report) -> bool:
    return all(c.result.requests > 0 and c.result.non_200 == 0 for c in report.cells)


UNTHROTTLED = {"large_body_bytes_per_second": 1 << 40, "large_body_bytes_per_second_total": 1 << 40,
               "large_bodies_per_tenant": 64}
"""The bench is one tenant sending large bodies back to back: the guards against heavy bodies
(``limits.large_*``, the tenant's and the process's) would measure themselves, so they are
lifted here."""


def main(config_path: str | None, settings: Settings, *, as_json: bool) -> int:
    config = yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text())
    config.setdefault("limits", {}).update(UNTHROTTLED)
    report = run_overhead(config, settings)
    print(format_table(report), flush=True)
    if as_json:
        print(json.dumps(report.as_json()), flush=True)
    return 0 if ok(report) else 1
