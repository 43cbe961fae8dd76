"""``saar simulate``: every policy at every concurrency (or over a trace), a table and JSON.

Each run is independent and seeded: the same sessions in the same order for every policy, on
the same engine (device pool, host-memory tier, offload on eviction unless ``--no-offload``), so
differences come from routing, admission and KV hints alone.

``--scenario`` picks the comparison: ``agents`` (the default: the policies above on one model),
``pd`` (a disaggregated pool: prefill workers beside the decode workers, agent sessions with
long first prefills; never, always or session-aware splitting) or ``lora`` (a fleet of LoRA
adapters on one base model; KV-aware with and without LoRA affinity). A scenario's JSON gives
each policy's figures at its headline (most oversubscribed) load, and every load under
``loads``.

``fairness`` plays two tenants at once: ``quiet``, interactive agent sessions with the class's
TTFT target, and ``noisy``, whose every session bursts 16-32 sub-agents (batch, a quarter of
them sheddable), under ``fcfs``, ``kv_aware_admission`` and ``flow_control``; and the quiet
tenant alone. Its load is stated as oversubscription: the tokens per second the same tenants
complete on a pool four times as large (offered: it never saturates) over those the pool
completes under ``fcfs`` (its capacity).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field, replace

from ...config import PriorityClass, Scheduling, load_config
from ...scheduling.latency import LatencyPredictor
from .engine import CostModel, WorkerSpec
from .metrics import RunMetrics, Share, percentile
from .policies import FAIRNESS_POLICIES, LORA_POLICIES, PD_POLICIES, POLICIES, build_policy
from .simulation import ClusterSpec, Simulation, VirtualClock
from .tiers import CPU, DISK, GPU
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

    headline_concurrency: int | None = None
    """The load a scenario's JSON reports at its top level (default, or when ``--concurrency``
    leaves it out: the largest)."""

    @property
    def headline(self) -> str:
        if self.headline_concurrency in self.concurrencies:
            return str(self.headline_concurrency)
        return str(max(self.concurrencies))

    tenants: tuple[tuple[AgenticWorkload, int], ...] = ()
    """The fairness scenario's tenants: each one's workload and its concurrent sessions."""

    def simulation(self, policy: str, cluster: ClusterSpec | None = None) -> Simulation:
        """A run of ``policy`` (on ``cluster``, default the experiment's); with tenants, its
        policy fits a latency predictor."""
        clock = VirtualClock()
        cluster = cluster or self.cluster
        built = build_policy(policy, scheduling=self.scheduling, block_size=cluster.block_size,
                             seed=self.seed, clock=clock,
                             predictor=LatencyPredictor() if self.tenants else None)
        return Simulation(cluster, built, clock, self.scheduling.flow_control)


@dataclass(frozen=True)
class Scenario:
    """A comparison's deployment, traffic and policies (the CLI's flags still apply)."""

    experiment: Experiment
    describe: str


SCENARIOS: dict[str, Scenario] = {
    "agents": Scenario(Experiment(), "agent sessions on one model"),
    "pd": Scenario(
        Experiment(
            cluster=ClusterSpec(workers=4, prefill_workers=2, pin_tool_loops=True,
                                worker=WorkerSpec(capacity_tokens=1_024_000)),
            workload=AgenticWorkload(context_tokens=(32000, 96000), turns=(4, 16)),
            concurrencies=(32, 48, 64, 96, 128),
            headline_concurrency=96,
            policies=PD_POLICIES,
        ),
        "prefill/decode: 2 prefill + 4 decode workers (1M device KV tokens each); agent "
        "sessions of 4-16 turns whose first prefill is 38-102k tokens"),
    "lora": Scenario(
        Experiment(
            cluster=ClusterSpec(worker=WorkerSpec(max_lora=4), pin_tool_loops=True),
            workload=AgenticWorkload(adapters=16),
            concurrencies=(32, 64, 96),
            policies=LORA_POLICIES,
        ),
        "LoRA: 16 adapters (Zipf popularity) of one base model, 4 GPU slots per worker"),
    "fairness": Scenario(
        Experiment(
            tenants=((AgenticWorkload(tenant="quiet", klass="interactive"), 8),
                     (AgenticWorkload(tenant="noisy", klass="batch", subagent_probability=1.0,
                                      subagents=(16, 32), turns=(3, 6), subagent_turns=(3, 8),
                                      sheddable_fraction=0.25), 18)),
            policies=FAIRNESS_POLICIES,
        ),
        "fairness: 8 quiet interactive agent sessions beside 18 noisy ones that each burst "
        "16-32 sub-agents (batch, a quarter sheddable)"),
}
ALONE = ("fcfs", "flow_control")
"""The policies the quiet tenant is also run under by itself."""
OFFERED_SCALE = 4
"""The offered load is measured on a pool this many times as large."""


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


def scenario_json(name: str, experiment: Experiment, results: Results) -> dict[str, object]:
    """``policies.<name>``: the figures at the headline load, and ``loads.<concurrency>``."""
    headline = experiment.headline
    return {"scenario": name, "headline_concurrency": int(headline), "policies": {
        policy: {**runs[headline].summary(),
                 "loads": {key: m.summary() for key, m in runs.items()}}
        for policy, runs in results.items()}}


def run_fairness(experiment: Experiment) -> dict[str, object]:
    """Every policy with all tenants, the first tenant alone, and the offered load."""
    def play(policy: str, tenants: tuple[tuple[AgenticWorkload, int], ...],
             cluster: ClusterSpec | None = None) -> RunMetrics:
        return experiment.simulation(policy, cluster).run_tenants(
            tenants, experiment.horizon_s, experiment.warmup_s)

    tenants = experiment.tenants
    runs = {policy: play(policy, tenants) for policy in experiment.policies}
    quiet = tenants[0][0].tenant
    alone = {policy: play(policy, tenants[:1]) for policy in ALONE}
    big = replace(experiment.cluster, workers=experiment.cluster.workers * OFFERED_SCALE)
    offered = play("fcfs", tenants, big).throughput
    capacity = (runs.get("fcfs") or play("fcfs", tenants)).throughput
    flow = experiment.scheduling.flow_control
    policies = {}
    for policy, m in runs.items():
        classes = {}
        for name, share in sorted(m.classes.items()):
            klass = flow.classes[name]
            classes[name] = {**share.summary(m.duration_s), "ttl_s": klass.ttl_seconds,
                             "longest_wait_s": round(share.longest_wait_s, 3),
                             "shed_by_reason": dict(sorted(share.shed.items()))}
        policies[policy] = {
            "throughput_tok_s": round(m.throughput, 1),
            "prefix_hit_rate": round(m.hit_rate, 4),
            "predictor_median_error": None if m.predictor_error is None
            else round(m.predictor_error, 4),
            "tenants": {t: share.summary(m.duration_s) for t, share in sorted(m.tenants.items())},
            "classes": classes,
            "sheddable_shed_first": _shed_first(m.classes, flow.classes),
        }
    found: dict[str, object] = {
        "scenario": "fairness",
        "load": {"workers": experiment.cluster.workers,
                 "tenants": {w.tenant: {"sessions": n, "class": w.klass,
                                        "subagent_class": w.subagent_class or w.klass,
                                        "sheddable_fraction": w.sheddable_fraction}
                             for w, n in tenants},
                 "offered_tok_s": round(offered, 1), "capacity_tok_s": round(capacity, 1),
                 "oversubscription": round(offered / max(capacity, 1e-9), 2)},
        "policies": policies,
        "alone": {quiet: {**alone["fcfs"].tenants[quiet].summary(alone["fcfs"].duration_s),
                          "policy": "fcfs",
                          "by_policy": {p: m.tenants[quiet].summary(m.duration_s)
                                        for p, m in alone.items()}}},
    }
    found["targets"] = _targets(found, quiet)
    return found


def _shed_first(classes: dict[str, Share], config: dict[str, PriorityClass]) -> bool:
    """No class that is not sheddable lost a turn before the sheddable ones lost theirs."""
    first = [s.first_shed_s for n, s in classes.items()
             if config[n].sheddable and s.first_shed_s is not None]
    others = [s.first_shed_s for n, s in classes.items()
              if not config[n].sheddable and s.first_shed_s is not None]
    return not others or (bool(first) and min(first) <= min(others))


def _targets(found: dict[str, object], quiet: str) -> dict[str, object]:
    """Issue 20's figures, each beside its bar (missing policies: None)."""
    policies: dict[str, dict[str, object]] = found["policies"]  # type: ignore[assignment]
    alone: dict[str, dict[str, float]] = found["alone"]  # type: ignore[assignment]
    base = alone[quiet]["ttft_p99_s"]

    def tenant(policy: str, field_: str) -> float | None:
        row = policies.get(policy)
        return None if row is None else row["tenants"][quiet][field_]  # type: ignore[index]

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    flow, fcfs = policies.get("flow_control"), policies.get("fcfs")
    interactive = {p: row["classes"].get("interactive", {}).get("slo_attainment")  # type: ignore[attr-defined]
                   for p, row in policies.items()}
    gain = (None if interactive.get("flow_control") is None
            or interactive.get("kv_aware_admission") is None
            else round(100 * (interactive["flow_control"] - interactive["kv_aware_admission"]), 1))
    throughput = ratio(flow and flow["throughput_tok_s"], fcfs and fcfs["throughput_tok_s"])  # type: ignore[arg-type]
    waits = None if flow is None else all(
        c["longest_wait_s"] <= c["ttl_s"] for c in flow["classes"].values())  # type: ignore[attr-defined]
    return {
        "quiet_p99_vs_alone": {"flow_control": ratio(tenant("flow_control", "ttft_p99_s"), base),
                               "fcfs": ratio(tenant("fcfs", "ttft_p99_s"), base), "bar": 1.5},
        "throughput_vs_fcfs": {"flow_control": throughput, "bar": 0.95},
        "interactive_slo_points_over_admission": {"flow_control": gain, "bar": 20},
        "predictor_median_error": {"flow_control": flow and flow["predictor_median_error"],
                                   "bar": 0.25},
        "waits_within_ttl": waits,
        "sheddable_shed_first": None if flow is None else flow["sheddable_shed_first"],
    }


def render_fairness(found: dict[str, object]) -> str:
    """One row per (policy, tenant): TTFT, SLO attainment, sheds, throughput."""
    lines = [f"{'policy':<20} {'tenant':<8} {'ttft50':>7} {'ttft99':>7} {'slo':>6} "
             f"{'shed':>5} {'tok/s':>8}"]
    rows: list[tuple[str, str, dict[str, object]]] = []
    for policy, row in found["policies"].items():  # type: ignore[attr-defined]
        rows += [(policy, t, figures) for t, figures in row["tenants"].items()]
        rows.append((policy, "all", {"throughput_tok_s": row["throughput_tok_s"]}))
    for tenant, figures in found["alone"].items():  # type: ignore[attr-defined]
        for policy, own in figures["by_policy"].items():
            rows.append((f"alone ({policy})", tenant, own))
    for policy, tenant, f in rows:
        slo = f.get("slo_attainment")
        lines.append(f"{policy:<20} {tenant:<8} {f.get('ttft_p50_s', ''):>7} "
                     f"{f.get('ttft_p99_s', ''):>7} {'' if slo is None else f'{slo:.1%}':>6} "
                     f"{f.get('shed', ''):>5} {f['throughput_tok_s']:>8.0f}")
    load = found["load"]
    lines.append(f"offered {load['offered_tok_s']:.0f} tok/s on {OFFERED_SCALE}x the pool, "  # type: ignore[index]
                 f"capacity {load['capacity_tok_s']:.0f} tok/s: "  # type: ignore[index]
                 f"{load['oversubscription']}x oversubscribed")  # type: ignore[index]
    lines.append(f"targets {json.dumps(found['targets'])}")
    return "\n".join(lines)


def render_table(results: Results) -> str:
    """One row per (concurrency, policy): the prefix hit rate and its device / host-memory (and
    disk) parts, throughput (prompt + output tokens of completed turns per second) with its
    change against ``kv_aware`` at the same concurrency, TTFT, admission's activity, the median
    inter-token latency, the share of turns split (of all, of tool-loop turns) and the LoRA
    adapter loads."""
    disk = any(m.lower_tokens[DISK] for runs in results.values() for m in runs.values())
    width = max(len(p) for p in results)
    header = (f"{'conc':>6} {'policy':<{width}} {'hit':>6} {'gpu':>6} {'cpu':>6}"
              + (f" {'disk':>6}" if disk else "")
              + f" {'tok/s':>8} {'vs kv':>7} {'out/s':>6} {'ttft50':>6} {'ttft99':>7}"
              f" {'reprefill':>10} {'turns':>5} {'held':>5} {'paused':>6}"
              f" {'itl50':>6} {'split':>6} {'tl-split':>8} {'loads':>6}")
    lines = [header, "-" * len(header)]
    for key in next(iter(results.values())):
        base = results.get(BASELINE, {}).get(key)
        for policy, runs in results.items():
            m = runs[key]
            tiers = m.hit_by_tier()
            delta = ""
            if base is not None and policy != BASELINE:
                delta = f"{100 * (m.throughput / max(base.throughput, 1e-9) - 1):+.1f}%"
            lines.append(
                f"{key:>6} {policy:<{width}} {m.hit_rate:>6.1%} {tiers[GPU]:>6.1%}"
                f" {tiers[CPU]:>6.1%}" + (f" {tiers[DISK]:>6.1%}" if disk else "")
                + f" {m.throughput:>8.0f} {delta:>7} {m.output_rate:>6.0f}"
                f" {m.ttft(0.5):>6.2f} {m.ttft(0.99):>7.1f} {m.reprefill_tokens:>10}"
                f" {m.turns:>5} {m.held_turns:>5} {m.max_paused:>6}"
                f" {percentile(m.itls, 0.5):>6.3f} {m.split / max(m.routed, 1):>6.1%}"
                f" {m.tool_loop_split / max(m.tool_loop_routed, 1):>8.1%}"
                f" {m.adapter_loads:>6}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="last stdout line is JSON")
    parser.add_argument("--scenario", choices=sorted(SCENARIOS), default="agents",
                        help="the comparison: agents (default), pd, lora or fairness")
    parser.add_argument("--trace", help="replay a Mooncake JSONL trace instead of the workload")
    parser.add_argument("--trace-block-size", type=int, default=MOONCAKE_BLOCK_SIZE,
                        help="tokens per hash id in --trace")
    parser.add_argument("--config", help="take the scheduling section from this config file")
    parser.add_argument("--concurrency", default=None,
                        help="comma-separated concurrent sessions (default 16,32,64,96,128,192)")
    parser.add_argument("--policies", default=None,
                        help=f"comma-separated (default: the scenario's; agents: "
                             f"{','.join(POLICIES)})")
    parser.add_argument("--workers", type=int, default=None,
                        help="decode workers (default: the scenario's, 4)")
    parser.add_argument("--prefill-workers", type=int, default=None,
                        help="prefill workers beside them (default: the scenario's)")
    parser.add_argument("--capacity-tokens", type=int, default=None,
                        help=f"device KV pool of each worker in tokens (default: the "
                             f"scenario's, {WorkerSpec().capacity_tokens})")
    parser.add_argument("--cpu-tokens", type=int, default=WorkerSpec().cpu_tokens,
                        help="host-memory KV tier of each worker in tokens (0: none)")
    parser.add_argument("--disk-tokens", type=int, default=WorkerSpec().disk_tokens,
                        help="disk KV tier of each worker in tokens (0: none)")
    parser.add_argument("--no-offload", action="store_true",
                        help="device evictions vanish: only demote hints fill host memory")
    parser.add_argument("--cpu-tokens-per-s", type=float, default=CostModel().cpu_tokens_per_s,
                        help="host-to-device KV copy rate in tokens per second")
    parser.add_argument("--horizon", type=float, default=900.0, help="simulated seconds")
    parser.add_argument("--warmup", type=float, default=120.0, help="simulated seconds left out")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the workload")


def run(args: argparse.Namespace) -> int:
    started = time.process_time()
    experiment = _experiment(args)
    if experiment.tenants and not args.trace:
        found = run_fairness(experiment)
        print(_describe(experiment, None))
        print(render_fairness(found))
        print(f"cpu {time.process_time() - started:.1f}s")
        if args.json:
            print(json.dumps(found, separators=(",", ":")))
        return 0
    results = run_trace(experiment, args.trace) if args.trace else run_matrix(experiment)
    print(_describe(experiment, args.trace))
    print(render_table(results))
    print(f"cpu {time.process_time() - started:.1f}s")
    if args.json:
        found = (to_json(results) if args.scenario == "agents" or args.trace
                 else scenario_json(args.scenario, experiment, results))
        print(json.dumps(found, separators=(",", ":")))
    return 0


def _describe(experiment: Experiment, trace: str | None) -> str:
    cluster, worker = experiment.cluster, experiment.cluster.worker
    roles = f" + {cluster.prefill_workers} prefill" if cluster.prefill_workers else ""
    tiers = f"{worker.capacity_tokens} device + {worker.cpu_tokens} CPU"
    if worker.disk_tokens:
        tiers += f" + {worker.disk_tokens} disk"
    played = (f"trace {trace}" if trace else f"horizon {experiment.horizon_s:.0f}s"
              f" (first {experiment.warmup_s:.0f}s left out)")
    return (f"{cluster.workers}{roles} workers x {tiers} KV tokens (offload on eviction "
            f"{'on' if worker.offload else 'off'}, {cluster.cost.cpu_tokens_per_s:.0f} tok/s "
            f"to device), block {cluster.block_size}; {played}")


def _experiment(args: argparse.Namespace) -> Experiment:
    base = SCENARIOS[args.scenario].experiment
    experiment = replace(base, horizon_s=args.horizon, warmup_s=args.warmup, seed=args.seed,
                         workload=replace(base.workload, seed=args.seed),
                         tenants=tuple((replace(w, seed=args.seed + n), c)
                                       for n, (w, c) in enumerate(base.tenants)))
    if args.policies:
        experiment = replace(experiment, policies=tuple(p for p in args.policies.split(",") if p))
    if args.concurrency:
        experiment = replace(experiment,
                             concurrencies=tuple(int(c) for c in args.concurrency.split(",")))
    if args.config:
        experiment = replace(experiment, scheduling=load_config(args.config).scheduling)
    worker = replace(experiment.cluster.worker, cpu_tokens=args.cpu_tokens,
                     disk_tokens=args.disk_tokens, offload=not args.no_offload)
    if args.capacity_tokens is not None:
        worker = replace(worker, capacity_tokens=args.capacity_tokens)
    cost = replace(experiment.cluster.cost, cpu_tokens_per_s=args.cpu_tokens_per_s)
    block = args.trace_block_size if args.trace else experiment.cluster.block_size
    cluster = replace(experiment.cluster, worker=worker, cost=cost, block_size=block)
    if args.workers is not None:
        cluster = replace(cluster, workers=args.workers)
    if args.prefill_workers is not None:
        cluster = replace(cluster, prefill_workers=args.prefill_workers)
    return replace(experiment, cluster=cluster)
