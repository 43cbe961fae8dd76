"""The routing policies compared, built from the server's own scheduling objects.

``kv_aware`` is the ``Scheduler`` the server builds from the default ``scheduling`` config
(prefix, queue, KV-utilization and session-affinity scorers over an approximate prefix index
that learns only from its own picks); ``kv_aware_admission`` adds the server's
``AdmissionController``, wired into the Scheduler as ``Pools`` wires it;
``kv_aware_admission_hints`` adds a ``KvHintEmitter`` that turns admission's pauses, resumes and
session ends, and the prefixes routing finds shared, into KV hints for the engines (as ``Pools``
does for the live server).
``least_loaded`` is the same Scheduler with only the load scorers (queue and KV utilization:
the "load-only" baseline); ``round_robin`` is the one local picker.

``kv_aware`` leaves the ``lora_affinity`` scorer out (neutral without adapters);
``lora_affinity`` is ``kv_aware`` with it, at its default weight. ``pd_never``, ``pd_always`` and
``pd_session_aware`` are ``kv_aware`` (decode pick) with the server's ``Disaggregator`` in that
mode (prefill pick by its own scorers): never split, split every request, split by the uncached
tokens on the decode worker (``scheduling.disaggregation.threshold_tokens``).

The fairness comparison: ``fcfs`` is ``kv_aware`` (no admission, no queue: every turn straight
to the engines, first come first served in their queues); ``flow_control`` is ``kv_aware`` with
the server's ``FlowController`` (``scheduling.flow_control``, enabled) in front of the pick,
given the policy's ``LatencyPredictor``; ``kv_aware_admission`` is today's.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ...apis import CHARS_PER_TOKEN
from ...config import Scheduling
from ...scheduling.admission import AdmissionController
from ...scheduling.disaggregation import Disaggregator
from ...scheduling.flow import FlowController
from ...scheduling.kv_hints import KvHintEmitter
from ...scheduling.latency import LatencyPredictor
from ...scheduling.lora import LoraAffinityScorer
from ...scheduling.prefix_index import ApproximatePrefixIndex
from ...scheduling.scheduler import Scheduler, from_config
from ...scheduling.types import SchedulingRequest, Worker

POLICIES = ("round_robin", "least_loaded", "kv_aware", "kv_aware_admission",
            "kv_aware_admission_hints")
"""The default comparison (agent sessions, one model, no roles)."""
PD_POLICIES = ("pd_never", "pd_always", "pd_session_aware")
LORA_POLICIES = ("kv_aware", "lora_affinity")
FAIRNESS_POLICIES = ("fcfs", "kv_aware_admission", "flow_control")
KNOWN = (*POLICIES, "lora_affinity", *PD_POLICIES, "fcfs", "flow_control")


@dataclass(frozen=True, slots=True)
class Pick:
    address: str
    matched_tokens: int = 0
    """What the prefix index matched of the prompt on ``address`` before this request."""
    prefill: str | None = None
    """The prefill worker the decode worker's sidecar calls first (None: local prefill)."""


class RoundRobin:
    name = "round_robin"
    admission: AdmissionController | None = None
    hints: KvHintEmitter | None = None
    flow: FlowController | None = None
    predictor: LatencyPredictor | None = None
    tick_s = 0.0

    def __init__(self) -> None:
        self._next = 0

    def route(self, request: SchedulingRequest, workers: Sequence[Worker]) -> Pick:
        self._next += 1
        return Pick(workers[(self._next - 1) % len(workers)].address)

    def first_token(self, request_id: str) -> None:
        """Its first token came (nothing to learn here)."""

    def finished(self, request_id: str, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> None:
        """Its answer ended (nothing to learn here)."""


class SchedulerPolicy:
    """Routes with a ``Scheduler``; the index is sized from the workers' reported KV as the
    server sizes it on each scrape. ``predictor`` learns each turn's TTFT (the loop feeds it);
    ``flow`` queues turns in front of the pick."""

    def __init__(self, name: str, scheduler: Scheduler, index: ApproximatePrefixIndex,
                 admission: AdmissionController | None = None, tick_s: float = 0.0,
                 hints: KvHintEmitter | None = None,
                 disaggregator: Disaggregator | None = None,
                 flow: FlowController | None = None,
                 predictor: LatencyPredictor | None = None) -> None:
        self.name = name
        self.flow = flow
        self.predictor = predictor
        self.scheduler = scheduler
        self.index = index
        self.admission = admission
        self.tick_s = tick_s
        self.hints = hints
        self.disaggregator = disaggregator

    def route(self, request: SchedulingRequest, workers: Sequence[Worker]) -> Pick:
        for worker in workers:
            self.index.resize(worker)
        result = self.scheduler.schedule(request, workers)
        if not result.ordered:
            raise RuntimeError(f"{self.name}: no worker picked")
        address = result.ordered[0]
        tokens = self.index.chars_per_block // CHARS_PER_TOKEN
        split = None
        if self.disaggregator is not None:
            split = self.disaggregator.decide(request, address, result.matched_blocks, workers)
        return Pick(address, int(result.matched_blocks.get(address, 0) * tokens),
                    None if split is None else split.prefill)

    def first_token(self, request_id: str) -> None:
        """The turn ``request_id`` got its first token (the predicted cost form's queue)."""
        predicted = self.scheduler.predicted
        if predicted is not None:
            predicted.first_token(request_id)

    def finished(self, request_id: str, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> None:
        """The turn ended: the predicted cost form learns its timings, as from an answer."""
        predicted = self.scheduler.predicted
        if predicted is not None:
            predicted.answered(request_id, prompt_tokens, cached_tokens, completion_tokens)
            predicted.finished(request_id)


def build_policy(name: str, *, scheduling: Scheduling, block_size: int, seed: int,
                 clock: Callable[[], float], predictor: LatencyPredictor | None = None
                 ) -> RoundRobin | SchedulerPolicy:
    """``name`` from ``KNOWN``; ``scheduling`` is the server's config section (its prefix
    blocks are set to the simulator's block of ``block_size`` tokens); ``predictor``, if
    given, is fitted on the run's TTFTs (and ``flow_control``'s controller reads it)."""
    if name == "round_robin":
        return RoundRobin()
    if name not in KNOWN:
        raise ValueError(f"unknown policy {name!r}; one of {', '.join(KNOWN)}")
    prefix = replace(scheduling.prefix, chars_per_block=block_size * CHARS_PER_TOKEN)
    scheduling = replace(scheduling, prefix=prefix)
    if name == "least_loaded":
        load = {k: w for k, w in scheduling.scorers.items() if k in ("queue", "kv_utilization")}
        scheduling = replace(scheduling, scorers=load or {"queue": 1.0})
    elif name != "lora_affinity":
        scorers = {k: w for k, w in scheduling.scorers.items() if k != LoraAffinityScorer.name}
        scheduling = replace(scheduling, scorers=scorers)
    index = ApproximatePrefixIndex.from_config(scheduling.prefix)
    rng = random.Random(seed)
    if name in PD_POLICIES:
        mode = name.removeprefix("pd_")
        scheduling = replace(scheduling, disaggregation=replace(
            scheduling.disaggregation, mode=mode))  # type: ignore[arg-type]
        scheduler = from_config(scheduling, index=index, rng=rng, clock=clock)
        disaggregator = Disaggregator.from_config(
            scheduling, index=index, rng=random.Random(seed + 1),
            tokens_per_block=block_size, clock=clock)
        return SchedulerPolicy(name, scheduler, index, disaggregator=disaggregator)
    if not name.startswith("kv_aware_admission"):
        flow = None
        scheduler = from_config(scheduling, index=index, rng=rng, clock=clock,
                                predictor=predictor if name == "flow_control" else None)
        if name == "flow_control":
            flow = FlowController(replace(scheduling.flow_control, enabled=True), clock=clock,
                                  predictor=predictor)
        return SchedulerPolicy(name, scheduler, index, flow=flow, predictor=predictor)
    admission = replace(scheduling.admission, enabled=True)
    controller = AdmissionController(admission, clock=clock)
    hints = KvHintEmitter(clock=clock) if name == "kv_aware_admission_hints" else None
    scheduler = from_config(scheduling, index=index, rng=rng, clock=clock,
                            prefer=controller.preferred_worker)
    return SchedulerPolicy(name, scheduler, index, controller, admission.tick_seconds, hints,
                           predictor=predictor)
