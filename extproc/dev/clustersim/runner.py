"""``saar simulate``: every policy at every concurrency (or over a trace), a table and JSON.

Each run is independent and seeded: the same sessions in the same order for every policy, so
differences come from routing and admission alone.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace

from ...config import Scheduling, load_config
from .engine import WorkerSpec
from .metrics import RunMetrics
from .policies import POLICIES, build_policy
from .simulation import ClusterSpec, Simulation, VirtualClock
from .trace import MOONCAKE_BLOCK_SIZE, read_trace, scripts_from_trace
from .workload import AgenticWorkload

Results = dict[str, dict[str, RunMetrics]]
"""policy → concurrency (or ``trace``) → what the run measured."""

BASELINE = "kv_aware"


@dataclass(frozen=True)
class Experiment:
    cluster: ClusterSpec = field(default_factory=ClusterSpec)
    workload: AgenticWorkload = field(default_factory=AgenticWorkload)
    concurrencies: tuple[int, ...] = (16, 32, 64, 96, 128, 192)
    horizon_s: float = 900.0
    warmup_s: float = 120.0
    policies: tuple[str, ...] = POLICIES
    scheduling: Scheduling = field(default_factory=Scheduling)
    seed: int = 0

    def simulation(self, policy: str) -> Simulation:
        clock = VirtualClock()
        built = build_policy(policy, scheduling=self.scheduling,
                             block_size=self.cluster.block_size, seed=self.seed, clock=clock)
        return Simulation(self.cluster, built, clock)


def run_matrix(experiment: Experiment) -> Results:
    """Closed loop: ``concurrency`` agent sessions live at all times, for the horizon."""
    return {
        policy: {
            str(c): experiment.simulation(policy).run_closed(
                experiment.workload, c, experiment.horizon_s, experiment.warmup_s)
            for c in experiment.concurrencies
        }
        for policy in experiment.policies
    }


def run_trace(experiment: Experiment, path: str) -> Results:
    """Replay a Mooncake trace under each policy until every request is done."""
    rows = read_trace(path)
    return {policy: {"trace": experiment.simulation(policy).run_scripts(scripts_from_trace(rows))}
            for policy in experiment.policies}


def to_json(results: Results) -> dict[str, object]:
    return {"policies": {policy: {key: m.summary() for key, m in runs.items()}
                         for policy, runs in results.items()}}


def render_table(results: Results) -> str:
    """One row per (concurrency, policy); throughput is prompt + output tokens of completed turns
    per second, with its change against ``kv_aware`` at the same concurrency."""
    header = (f"{'conc':>6} {'policy':<19} {'hit':>6} {'tok/s':>9} {'vs kv':>7} {'out/s':>7} "
              f"{'ttft50':>7} {'ttft99':>8} {'reprefill':>10} {'turns':>6} {'held':>5} "
              f"{'paused':>6}")
    lines = [header, "-" * len(header)]
    keys = list(next(iter(results.values())))
    for key in keys:
        base = results.get(BASELINE, {}).get(key)
        for policy, runs in results.items():
            s, e = runs[key].summary(), runs[key].extra()
            delta = ""
            if base is not None and policy != BASELINE:
                reference = base.summary()["throughput_tok_s"]
                delta = f"{100 * (s['throughput_tok_s'] / max(reference, 1e-9) - 1):+.1f}%"
            lines.append(
                f"{key:>6} {policy:<19} {s['prefix_hit_rate']:>6.1%} "
                f"{s['throughput_tok_s']:>9.0f} {delta:>7} {e['output_tok_s']:>7.0f} "
                f"{s['ttft_p50_s']:>7.2f} {s['ttft_p99_s']:>8.1f} {s['reprefill_tokens']:>10} "
                f"{e['turns']:>6} {e['held_turns']:>5} {e['max_paused']:>6}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="last stdout line is JSON")
    parser.add_argument("--trace", help="replay a Mooncake JSONL trace instead of the workload")
    parser.add_argument("--trace-block-size", type=int, default=MOONCAKE_BLOCK_SIZE,
                        help="tokens per hash id in --trace")
    parser.add_argument("--config", help="take the scheduling section from this config file")
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated concurrent sessions (default 16,32,64,96,128,192)")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--capacity-tokens", type=int, default=WorkerSpec().capacity_tokens,
                        help="KV pool of each worker in tokens")
    parser.add_argument("--horizon", type=float, default=900.0, help="simulated seconds")
    parser.add_argument("--warmup", type=float, default=120.0, help="simulated seconds left out")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    started = time.process_time()
    experiment = _experiment(args)
    results = run_trace(experiment, args.trace) if args.trace else run_matrix(experiment)
    cluster = experiment.cluster
    print(f"{cluster.workers} workers x {cluster.worker.capacity_tokens} KV tokens, "
          f"block {cluster.block_size}; "
          + (f"trace {args.trace}" if args.trace else
             f"horizon {experiment.horizon_s:.0f}s (first {experiment.warmup_s:.0f}s left out)"))
    print(render_table(results))
    print(f"cpu {time.process_time() - started:.1f}s")
    if args.json:
        print(json.dumps(to_json(results), separators=(",", ":")))
    return 0


def _experiment(args: argparse.Namespace) -> Experiment:
    experiment = Experiment(
        policies=tuple(p for p in args.policies.split(",") if p),
        horizon_s=args.horizon, warmup_s=args.warmup, seed=args.seed,
        workload=AgenticWorkload(seed=args.seed),
    )
    if args.concurrency:
        experiment = replace(experiment,
                             concurrencies=tuple(int(c) for c in args.concurrency.split(",")))
    if args.config:
        experiment = replace(experiment, scheduling=load_config(args.config).scheduling)
    worker = replace(experiment.cluster.worker, capacity_tokens=args.capacity_tokens)
    block = args.trace_block_size if args.trace else experiment.cluster.block_size
    cluster = replace(experiment.cluster, workers=args.workers, worker=worker, block_size=block)
    return replace(experiment, cluster=cluster)
