"""Drives the live ``Router`` through the matrix: one policy x workload x seed per fresh router.

Each turn goes through the same three calls the gRPC adapter makes (``route``, then
``response_started`` and ``response_finished`` with the observed ``ResponseSummary``) while a
virtual clock advances by the session's think time, tool time and model latency. The oracle and
the backend, not the router, say what each turn cost and broke.
"""

from __future__ import annotations

import random
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context

from ...config import Config
from ...core.router import LocalDriver
from .backend import Answer, Backend
from .client import AgentSession, Request
from .oracle import Oracle, Unsafe, Verdict
from .policies import POLICIES, build, matrix_config
from .workloads import WORKLOAD_NAMES, workload

FIRST_TOKEN_SECONDS = 0.4
DECODE_TOKENS_PER_SECOND = 60.0


@dataclass(frozen=True, slots=True)
class MatrixSpec:
    seeds: int = 5
    sessions: int = 40
    turns: int = 18
    workloads: tuple[str, ...] = WORKLOAD_NAMES
    policies: tuple[str, ...] = POLICIES

    @property
    def total_turns(self) -> int:
        return self.seeds * self.sessions * self.turns * len(self.workloads)


@dataclass(slots=True)
class Tally:
    """One policy's raw counts; everything relative to the baseline is derived in ``report``."""

    turns: int = 0
    switches: int = 0
    unsafe: dict[str, int] = field(default_factory=lambda: {u.value: 0 for u in Unsafe})
    cost_usd: float = 0.0
    shortfall: float = 0.0
    """Sum over turns of min(0, served model quality - difficulty the task needs)."""

    def add(self, other: Tally) -> None:
        self.turns += other.turns
        self.switches += other.switches
        for kind, count in other.unsafe.items():
            self.unsafe[kind] += count
        self.cost_usd += other.cost_usd
        self.shortfall += other.shortfall


class VirtualClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass(frozen=True, slots=True)
class Step:
    model: str
    verdict: Verdict
    answer: Answer


class Cell:
    """One fresh live router with its oracle, backend and clock: a workload x seed of a policy."""

    def __init__(self, config: Config, policy: str) -> None:
        self.config = config
        self.clock = VirtualClock()
        self.parts = build(config, policy, self.clock)
        self.router = self.parts.router
        self.driver = LocalDriver(self.router)
        self.oracle = Oracle()
        self.backend = Backend(config.models, self.oracle)
        self._needs = {d.name: d.difficulty for d in config.routing.decisions}

    def step(self, session_id: str, request: Request) -> Step:
        """One turn, through the calls the gRPC adapter makes."""
        self.clock.advance(request.gap)
        routed = self.driver.route(request.api, request.headers, request.raw)
        verdict = self.oracle.judge(session_id, routed.model, request.carried)
        answer = self.backend.serve(routed.model, request.reply, self.clock())
        self.clock.advance(FIRST_TOKEN_SECONDS)
        self.clock.advance(request.reply.completion_tokens / DECODE_TOKENS_PER_SECOND)
        self.driver.respond(routed, answer.summary)
        return Step(routed.model, verdict, answer)

    def play(self, session: AgentSession, turns: int, tally: Tally) -> None:
        for _ in range(turns):
            request = session.next_request()
            step = self.step(session.session_id, request)
            session.observe(step.answer, request.reply)
            tally.turns += 1
            tally.switches += step.verdict.switched
            if step.verdict.unsafe is not None:
                tally.unsafe[step.verdict.unsafe.value] += 1
            tally.cost_usd += step.answer.cost_usd
            quality = self.config.models[step.model].quality
            tally.shortfall += min(0.0, quality - self._needs[request.task])


def run_cell(
    config: Config, policy: str, workload_name: str, seed: int, spec: MatrixSpec, tally: Tally
) -> None:
    """Every session of one workload and seed, in sequence, on one fresh router."""
    mix = workload(workload_name)
    cell = Cell(config, policy)
    for index in range(spec.sessions):
        session_id = f"{workload_name}-{seed}-{index}"
        rng = random.Random(f"{workload_name}/{seed}/{index}")
        session = AgentSession(mix, rng, session_id, tenant=f"{workload_name}-{seed}")
        cell.play(session, spec.turns, tally)


def run_workload(policy: str, workload_name: str, spec: MatrixSpec) -> Tally:
    config = matrix_config()
    tally = Tally()
    for seed in range(spec.seeds):
        run_cell(config, policy, workload_name, seed, spec, tally)
    return tally


def run_matrix(spec: MatrixSpec, jobs: int = 1) -> dict[str, Tally]:
    """Policy x workload pieces are independent, so ``jobs`` > 1 spreads them over processes."""
    pieces = [(p, w) for p in spec.policies for w in spec.workloads]
    policies, workloads = zip(*pieces, strict=True)
    if jobs <= 1:
        tallies = list(map(run_workload, policies, workloads, [spec] * len(pieces)))
    else:
        with ProcessPoolExecutor(jobs, mp_context=get_context("spawn")) as pool:
            tallies = list(pool.map(run_workload, policies, workloads, [spec] * len(pieces)))
    totals = {p: Tally() for p in spec.policies}
    for policy, tally in zip(policies, tallies, strict=True):
        totals[policy].add(tally)
    return totals
