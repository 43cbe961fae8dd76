"""``saar bench route``: the routing core alone (no Envoy, no gRPC), on an agent session whose
context grows turn by turn, beside the floor of parsing and re-serialising the same bodies.

Each size is a fresh session of ``TURNS`` turns whose body grows linearly to the size (a coding
agent resending its whole history plus one more tool call and result); the figure is the median
time of the last ``MEASURED`` turns through ``Router.read`` + ``Router.route`` with the facts
loaded from the in-process store, and each turn is answered (committed) before the next, as
live. The floor is ``orjson.loads`` + ``orjson.dumps`` of the same bodies, timed in the same
run: compare the ratio, not the milliseconds (this is a shared, noisy machine).
"""

from __future__ import annotations

import gc
import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import yaml

from ...assembly import assemble
from ...config import Config, parse_config
from ...core.router import LocalDriver
from ...types import Api, ResponseSummary
from .. import EXAMPLE_CONFIG

SIZES = {"2kb": 2 << 10, "64kb": 64 << 10, "256kb": 256 << 10, "1mb": 1 << 20, "4mb": 4 << 20}
TURNS = 24
MEASURED = 8
HEADERS = {"authorization": "Bearer bench", "x-session-id": "bench-route"}
_WORDS = ("the", "parser", "module", "reads", "tokens", "and", "builds", "a", "tree", "for",
          "each", "file", "in", "the", "repo")


def session_bodies(size: int) -> list[bytes]:
    """Chat bodies of one agent session: the last is about ``size`` bytes, each adds a tool call
    and its output (code-like text) to the one before (fewer turns for the smallest sizes)."""
    turns = min(TURNS, max(MEASURED, size // 2048))
    step = max(1, (size - 300 - 150 * turns) // turns)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent."},
        {"role": "user", "content": "Debug the failing parser tests, then refactor the module."},
    ]
    bodies = []
    for turn in range(turns):
        call = f"call_{turn:04d}"
        words = " ".join(_WORDS[(turn + i) % len(_WORDS)] for i in range(step // 5))
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": call, "type": "function",
                 "function": {"name": "read_file", "arguments": f'{{"path": "src/m{turn}.py"}}'}}]},
            {"role": "tool", "tool_call_id": call, "content": words[:step]},
        ]
        # In the order the openai SDK writes them: the messages, then the model.
        bodies.append(orjson.dumps({"messages": messages, "model": "auto", "max_tokens": 64}))
    return bodies


@dataclass(frozen=True)
class Row:
    size: str
    bytes: int
    one_worker_ms: float
    two_workers_ms: float
    floor_ms: float

    def as_json(self) -> dict[str, Any]:
        return {"size": self.size, "bytes": self.bytes, "one_worker_ms": self.one_worker_ms,
                "two_workers_ms": self.two_workers_ms, "floor_ms": self.floor_ms,
                "two_workers_over_floor": round(self.two_workers_ms / self.floor_ms, 2)}


def with_workers(config: Config, workers: int) -> Config:
    """Each model with ``workers`` workers (scored by the scheduler when more than one)."""
    models = {
        name: replace(model, endpoints=tuple(f"10.0.{i}.{w + 1}:8000" for w in range(workers)),
                      workers=())
        for i, (name, model) in enumerate(config.models.items())
    }
    return replace(config, models=models)


def route_ms(config: Config, bodies: Sequence[bytes]) -> float:
    """Median ms of read + route over the last ``MEASURED`` turns of one session."""
    driver = LocalDriver(assemble(config).router)
    router = driver.router
    times = []
    for raw in bodies:
        gc.disable()
        started = time.perf_counter()
        request = router.read(Api.CHAT, HEADERS, raw)
        routed = router.route(request, driver.store.load_now(request.query))
        times.append(time.perf_counter() - started)
        gc.enable()
        driver.respond(routed, ResponseSummary(status=200, model=routed.model,
                                               tool_call_ids=[f"next-{len(times)}"]))
    return statistics.median(times[-MEASURED:]) * 1000


def floor_ms(bodies: Sequence[bytes]) -> float:
    times = []
    for raw in bodies[-MEASURED:]:
        started = time.perf_counter()
        orjson.dumps(orjson.loads(raw))
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def run(config: Config, sizes: Sequence[str] = tuple(SIZES)) -> list[Row]:
    rows = []
    one, two = with_workers(config, 1), with_workers(config, 2)
    for name in sizes:
        bodies = session_bodies(SIZES[name])
        rows.append(Row(name, len(bodies[-1]), round(route_ms(one, bodies), 3),
                        round(route_ms(two, bodies), 3), round(floor_ms(bodies), 3)))
    return rows


def format_table(rows: Sequence[Row]) -> str:
    head = ("body", "bytes", "one worker ms", "two workers ms", "floor ms", "two / floor")
    lines = [head]
    for r in rows:
        lines.append((r.size, str(r.bytes), f"{r.one_worker_ms:.3f}", f"{r.two_workers_ms:.3f}",
                      f"{r.floor_ms:.3f}", f"{r.two_workers_ms / r.floor_ms:.2f}x"))
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    text = ["Router.read + Router.route, medians of a growing session's last "
            f"{MEASURED} of {TURNS} turns; floor = orjson loads + dumps of the same bodies"]
    text += ["  ".join(v.rjust(w) for v, w in zip(line, widths, strict=True)) for line in lines]
    return "\n".join(text)


def main(config_path: str | None, sizes: Sequence[str], *, as_json: bool) -> int:
    config = parse_config(yaml.safe_load(Path(config_path or EXAMPLE_CONFIG).read_text()))
    rows = run(config, sizes)
    print(format_table(rows), flush=True)
    if as_json:
        print(json.dumps([r.as_json() for r in rows]), flush=True)
    return 0
