"""The event loop: sessions arrive, the policy routes each turn, workers step, admission ticks.

Virtual time, one heap of events. A turn is ready when the session's tools finish; with
admission, a turn of a paused session waits in the held queue until a tick resumes it or its
hold runs out (``admission.hold_timeout_seconds``: then it goes ahead, as the exchange lets a
held request go; with ``on_paused: reject`` it is refused at once), and a turn already sent is
never pre-empted. Routing sees each worker's live load, as a 50 ms scrape would.
A policy with a hint emitter has its KV hints delivered to the workers as they are made: a
tick's before the turns it resumes are sent, so a prefetch is under way when they arrive.

With prefill workers (``ClusterSpec.prefill_workers``) a pick that names one is played as the
decode worker's sidecar plays it: the prompt goes to the prefill worker first (a prefill-only
request), then to the decode worker, which pulls the KV it lacks and decodes; the turn's TTFT
runs from its arrival to the decode worker's first token.

With flow control (``Policy.flow``, the server's ``FlowController``) a ready turn enters the
pool's queue first: it is placed at once, queued (a ticket, woken by ``dispatch`` after an
engine step frees room, or shed when its wait passes the class's TTL) or shed. A shed turn
ends its session (the client gave up; a sub-agent's parent carries on without it). Every turn
is counted against its tenant and class (TTFT, its target, sheds, tokens); a policy's
``predictor`` learns each turn's TTFT from its worker's features at the pick.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from ...config import Admission as AdmissionConfig
from ...config import FlowControl
from ...scheduling.admission import AdmissionTick
from ...scheduling.flow import Arrival, FlowController
from ...scheduling.kv_events import KVEvent
from ...scheduling.kv_hints import KvHint, KvHintEmitter
from ...scheduling.latency import Features, LatencyPredictor
from ...scheduling.types import SchedulingRequest, Worker
from .blocks import chain_ids
from .engine import CostModel, EngineWorker, SimRequest, WorkerSpec
from .metrics import RunMetrics, percentile
from .policies import Pick
from .workload import AgenticWorkload, Script

_ARRIVE, _STEP, _TICK, _WARM, _EXPIRE, _UNHOLD = 0, 1, 2, 3, 4, 5


class Admission(Protocol):
    """What the loop needs of ``extproc.scheduling.admission.Admission``."""

    config: AdmissionConfig

    def turn_started(self, session_key: str, worker: str, prompt_tokens: int) -> None: ...
    def turn_finished(self, session_key: str, worker: str, prompt_tokens: int,
                      completion_tokens: int) -> None: ...
    def release(self, session_key: str) -> None: ...
    def tick(self, workers: Sequence[Worker]) -> AdmissionTick: ...
    def is_paused(self, session_key: str) -> bool: ...
    def priority(self, session_key: str) -> float: ...
    def paused_count(self) -> int: ...


class Policy(Protocol):
    name: str
    tick_s: float

    @property
    def admission(self) -> Admission | None: ...

    @property
    def hints(self) -> KvHintEmitter | None: ...

    @property
    def flow(self) -> FlowController | None: ...

    @property
    def predictor(self) -> LatencyPredictor | None: ...

    def route(self, request: SchedulingRequest, workers: Sequence[Worker]) -> Pick: ...
    def first_token(self, request_id: str) -> None: ...
    def finished(self, request_id: str, prompt_tokens: int, cached_tokens: int,
                 completion_tokens: int) -> None: ...


@dataclass(frozen=True)
class ClusterSpec:
    workers: int = 4
    worker: WorkerSpec = field(default_factory=WorkerSpec)
    cost: CostModel = field(default_factory=CostModel)
    block_size: int = 64
    model: str = "agent-model"
    prefill_workers: int = 0
    """Workers of role ``prefill`` beside the ``workers`` (then of role ``decode``)."""
    pin_tool_loops: bool = False
    """A turn carrying tool results is pinned to the worker that issued the calls, as the live
    router's hard lock pins it (off: only the session-affinity scorer keeps it there)."""


class _Run:
    """A live session: where it is in its script and what it has computed so far."""

    __slots__ = ("arrival", "computed", "index", "parent", "pending", "prompted", "ready_s",
                 "script", "slot", "spawned", "worker")

    def __init__(self, script: Script, computed: int = 0, parent: _Run | None = None,
                 slot: int | None = None) -> None:
        self.script = script
        self.index = 0
        self.computed = computed
        self.parent = parent
        self.slot = slot
        self.pending = 0
        self.spawned = -1
        self.ready_s = 0.0
        self.worker: str | None = None
        """Where its last turn went: the session record's binding the live router passes."""
        self.prompted = 0
        """Its previous turn's prompt tokens (what leads this one: ``reused``)."""
        self.arrival: Arrival | None = None
        """Its turn in flight as flow control let it in (None: flow control is off)."""


class VirtualClock:
    """Simulated seconds; handed to the policy's admission controller as its clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Simulation:
    def __init__(self, cluster: ClusterSpec, policy: Policy, clock: VirtualClock,
                 flow_control: FlowControl | None = None) -> None:
        """``flow_control``: the classes (and their TTFT targets) turns are counted against
        (the policy's controller, if it has one, reads its own copy)."""
        self.cluster = cluster
        self.policy = policy
        self.clock = clock
        self.classes = flow_control or FlowControl()
        self.metrics = RunMetrics()
        self.workers = [EngineWorker(f"10.0.0.{i + 1}:8000", cluster.worker, cluster.cost,
                                     cluster.block_size, self._kv_event)
                        for i in range(cluster.workers)]
        self.workers += [EngineWorker(f"10.0.1.{i + 1}:8000", cluster.worker, cluster.cost,
                                      cluster.block_size, self._kv_event)
                         for i in range(cluster.prefill_workers)]
        self._by_address = {w.address: w for w in self.workers}
        decode_role = "decode" if cluster.prefill_workers else "both"
        self._views = [Worker(address=w.address, model=cluster.model,
                              block_size=cluster.block_size, num_blocks=w.total_blocks,
                              cpu_blocks=cluster.worker.cpu_tokens // cluster.block_size or None,
                              role=decode_role if i < cluster.workers else "prefill",
                              max_lora=cluster.worker.max_lora or None)
                       for i, w in enumerate(self.workers)]
        self._handoffs: dict[SimRequest, SimRequest] = {}
        """A prefill worker's request → the decode request its sidecar sends next."""
        self._loads_before = 0
        """Adapter loads before the warmup's end (left out of the metrics)."""
        self._events: list[tuple[float, int, int, object]] = []
        self._seq = 0
        self._held: list[_Run] = []
        self._in_flight: dict[SimRequest, tuple[_Run, str]] = {}
        self._live = 0
        self._loads: list[AgenticWorkload] = []
        self._slot_load: list[int] = []
        """Closed loop: slot → the workload (tenant) whose sessions fill it."""
        self._next_session: list[int] = []
        self._queued: dict[str, tuple[_Run, Arrival, str]] = {}
        """Flow control's tickets → the turn waiting, its arrival, what its expiry is."""
        self._placed: dict[SimRequest, Features] = {}
        self._pending: dict[str, float] = {}
        """Worker → uncached tokens (the pick's estimate) of its turns with no first token."""
        """A turn's worker as the predictor saw it at the pick."""
        self._errors: list[float] = []
        self._warmup = 0.0

    @property
    def now(self) -> float:
        return self.clock.now

    def run_closed(self, workload: AgenticWorkload, concurrency: int, horizon_s: float,
                   warmup_s: float = 0.0, ramp_s: float = 60.0) -> RunMetrics:
        """``concurrency`` top-level sessions at all times: each one that ends is replaced.
        Turns ready before ``warmup_s`` (cold caches, the ramp) are left out of the metrics."""
        return self.run_tenants([(workload, concurrency)], horizon_s, warmup_s, ramp_s)

    def run_tenants(self, loads: Sequence[tuple[AgenticWorkload, int]], horizon_s: float,
                    warmup_s: float = 0.0, ramp_s: float = 60.0) -> RunMetrics:
        """``run_closed`` for several workloads (tenants) at once, each at its concurrency."""
        self._warmup = warmup_s
        for load, (workload, concurrency) in enumerate(loads):
            self._loads.append(workload)
            self._next_session.append(concurrency)
            for index in range(concurrency):
                self._slot_load.append(load)
                self._start(workload.session(index, index * ramp_s / concurrency),
                            slot=len(self._slot_load) - 1)
        return self._loop(horizon_s)

    def run_scripts(self, scripts: Iterable[Script], horizon_s: float | None = None) -> RunMetrics:
        """Play fixed scripts (a trace) until they are done or the horizon."""
        for script in scripts:
            self._start(script)
        return self._loop(horizon_s)

    def _loop(self, horizon_s: float | None) -> RunMetrics:
        if self.policy.admission is not None:
            self._push(self.policy.tick_s, _TICK, None)
        self._push(self._warmup, _WARM, None)
        end = float("inf") if horizon_s is None else horizon_s
        while self._events and self._events[0][0] <= end:
            self.clock.now, _, kind, obj = heapq.heappop(self._events)
            if kind == _ARRIVE:
                self._arrive(obj)  # type: ignore[arg-type]
            elif kind == _STEP:
                self._on_step(obj)  # type: ignore[arg-type]
            elif kind == _WARM:
                self._loads_before = sum(w.adapter_loads for w in self.workers)
            elif kind == _EXPIRE:
                self._expire(obj)  # type: ignore[arg-type]
            elif kind == _UNHOLD:
                self._unhold(obj)  # type: ignore[arg-type]
            elif self._events or self._live:
                self._tick()
        if horizon_s is not None:
            self.clock.now = horizon_s
        self.metrics.duration_s = self.now - self._warmup
        self.metrics.adapter_loads = (sum(w.adapter_loads for w in self.workers)
                                      - self._loads_before)
        self._censor()
        if self._errors:
            self.metrics.predictor_error = percentile(self._errors, 0.5)
        return self.metrics

    def _push(self, at: float, kind: int, obj: object) -> None:
        self._seq += 1
        heapq.heappush(self._events, (at, self._seq, kind, obj))

    def _start(self, script: Script, *, computed: int = 0, parent: _Run | None = None,
               slot: int | None = None) -> None:
        self._live += 1
        run = _Run(script, computed, parent, slot)
        first = script.steps[0]
        self._push(max(max(self.now, script.start_s) + first.delay_s, first.not_before_s),
                   _ARRIVE, run)

    def _arrive(self, run: _Run) -> None:
        run.ready_s = self.now
        admission = self.policy.admission
        if admission is not None and admission.is_paused(run.script.key):
            if admission.config.on_paused == "reject":
                self._shed(run, "paused")
                return
            self.metrics.held_turns += self.now >= self._warmup
            self._held.append(run)
            self._push(self.now + admission.config.hold_timeout_seconds, _UNHOLD, run)
        elif self.policy.flow is not None:
            self._enter(run, self.policy.flow)
        else:
            self._dispatch(run)

    # -- flow control ------------------------------------------------------------------------

    def _klass(self, run: _Run) -> str:
        klass = run.script.klass
        return klass if klass in self.classes.classes else self.classes.default_class

    def _target(self, run: _Run) -> float | None:
        found = run.script.ttft_s
        return found if found is not None else self.classes.classes[self._klass(run)].ttft_seconds

    def _enter(self, run: _Run, flow: FlowController) -> None:
        script = run.script
        home = run.worker
        if home is None and run.parent is not None:
            home = run.parent.worker  # a sub-agent's first turn: where its parent's context is
        arrival = Arrival(self.cluster.model, script.tenant, script.parent or script.key,
                          self._klass(run), "continuation" if run.index else "first",
                          script.steps[run.index].prompt_tokens, ttft=self._target(run),
                          session=script.key, home=home,
                          pinned=self.cluster.pin_tool_loops and run.worker is not None)
        entered = flow.enter(arrival, self._refresh_views())
        for ticket in entered.evicted:
            evicted, _, _ = self._queued.pop(ticket)
            self._shed(evicted, flow.claim(ticket, late=False))
        if entered.shed is not None:
            self._shed(run, entered.shed)
        elif entered.ticket is None:
            self._dispatch(run, arrival)
        else:
            self._queued[entered.ticket] = (run, arrival, entered.expiry)
            self._push(self.now + entered.timeout, _EXPIRE, entered.ticket)
        self._wake(flow, entered.woken)

    def _wake(self, flow: FlowController, tickets: Sequence[str]) -> None:
        for ticket in tickets:
            run, arrival, _ = self._queued.pop(ticket)
            verdict = flow.claim(ticket, late=False)
            if verdict == "go":
                self._dispatch(run, arrival, dispatched=True)
            else:
                self._shed(run, verdict)

    def _expire(self, ticket: str) -> None:
        """A queued turn's wait ran out (its ticket is gone if it was woken in time)."""
        found = self._queued.pop(ticket, None)
        if found is None or self.policy.flow is None:
            return
        run, arrival, expiry = found
        verdict = self.policy.flow.claim(ticket, late=True)
        if verdict == "go":
            self._dispatch(run, arrival, dispatched=True)
        else:
            self._shed(run, expiry if verdict == "expired" else verdict)

    def _shed(self, run: _Run, reason: str) -> None:
        """Refused: the client gives up on the session (a sub-agent's parent goes on)."""
        if run.ready_s >= self._warmup:
            target = self._target(run)
            for share in self.metrics.shares(run.script.tenant, self._klass(run)):
                share.refused(reason, target, self.now)
        self._session_done(run)

    # -- placing a turn ----------------------------------------------------------------------

    def _dispatch(self, run: _Run, arrival: Arrival | None = None,
                  dispatched: bool = False) -> None:
        """Route ``run``'s turn and send it (``arrival``: it passed flow control, woken from
        its queue if ``dispatched``)."""
        step = run.script.steps[run.index]
        size = self.cluster.block_size
        if step.hash_ids is not None:
            blocks = chain_ids(step.hash_ids)[: step.prompt_tokens // size]
            done: Sequence[int] = blocks
        else:
            assert run.script.stream is not None
            done = run.script.stream.hashes(step.prompt_tokens + step.output_tokens)
            blocks = done[: step.prompt_tokens // size]
        key, adapter = run.script.key, run.script.adapter
        views = self._refresh_views()
        flow = self.policy.flow if arrival is not None else None
        subset, ttft = None, None
        if flow is not None and arrival is not None:
            arrival = replace(arrival, waited=self.now - run.ready_s)
            ttft = arrival.ttft
            subset = flow.placeable(
                arrival, views, run.worker if self.cluster.pin_tool_loops else None)
        request = SchedulingRequest(adapter or self.cluster.model, key, tuple(blocks),
                                    step.prompt_tokens, subset=subset, bound_worker=run.worker,
                                    ttft=ttft,
                                    pinned=run.worker if self.cluster.pin_tool_loops else None,
                                    reused=min(run.prompted // size, len(blocks)),
                                    parent_session=run.script.parent, adapter=adapter,
                                    request_id=_turn_key(run))
        run.prompted = step.prompt_tokens
        pick = self.policy.route(request, views)
        address = run.worker = pick.address
        uncached = max(0, step.prompt_tokens - pick.matched_tokens)
        run.arrival = arrival
        if run.ready_s >= self._warmup:
            for share in self.metrics.shares(run.script.tenant, self._klass(run)):
                share.longest_wait_s = max(share.longest_wait_s, self.now - run.ready_s)
        admission = self.policy.admission
        priority = 0.0
        if admission is not None:
            priority = admission.priority(key)
            admission.turn_started(key, address, step.prompt_tokens)
        sim_request = SimRequest(key, step.prompt_tokens, step.output_tokens, blocks, done,
                                 run.ready_s, priority, adapter, remote=pick.prefill is not None)
        self._in_flight[sim_request] = (run, address)
        if flow is not None and arrival is not None:
            flow.started(arrival, address, uncached, dispatched, request=_turn_key(run))
        if self.policy.predictor is not None:
            view = next(v for v in views if v.address == address)
            self._placed[sim_request] = Features.of(view, uncached,
                                                    self._pending.get(address, 0.0))
            self._pending[address] = self._pending.get(address, 0.0) + uncached
        sim_request.placed_s = self.now
        if self.now >= self._warmup:
            self.metrics.dispatched(tool_loop=run.index > 0, split=pick.prefill is not None)
        if pick.prefill is not None:
            prefill = SimRequest(key, step.prompt_tokens, 1, blocks, blocks, run.ready_s,
                                 priority, adapter, prefill_only=True)
            self._handoffs[prefill] = sim_request
            self._submit(self._by_address[pick.prefill], prefill)
        else:
            self._submit(self._by_address[address], sim_request)
        if self.policy.hints is not None:
            self._deliver(self.policy.hints.routed(
                key, address, matched_tokens=pick.matched_tokens,
                prompt_tokens=step.prompt_tokens, parent=run.script.parent))

    def _submit(self, worker: EngineWorker, request: SimRequest) -> None:
        worker.submit(request, self.now)
        if not worker.busy:
            self._start_step(worker)

    def _deliver(self, hints: Sequence[KvHint]) -> None:
        counting = self.now >= self._warmup
        for hint in hints:
            taken = self._by_address[hint.worker].hint(hint, self.now)
            if counting:
                self.metrics.hint(hint.kind, taken)

    def _kv_event(self, event: KVEvent) -> None:
        if self.now >= self._warmup:
            self.metrics.kv_event(event)

    def _refresh_views(self) -> list[Worker]:
        for view, worker in zip(self._views, self.workers, strict=True):
            view.running = len(worker.running)
            view.waiting = worker.waiting
            view.in_flight = view.running + view.waiting
            view.kv_usage = worker.kv_usage
            view.adapters_running, view.adapters_waiting = worker.adapter_names()
            view.scraped_at = self.now
        return self._views

    def _start_step(self, worker: EngineWorker) -> None:
        duration = worker.start_step(self.now)
        if duration is not None:
            self._push(self.now + duration, _STEP, worker)

    def _on_step(self, worker: EngineWorker) -> None:
        first, done = worker.finish_step(self.now)
        for request in first:
            if request.prefill_only:
                continue
            turn = _turn_key(self._in_flight[request][0])
            if self.policy.flow is not None:
                self.policy.flow.first_token(turn)
            self.policy.first_token(turn)
            self._learn(request)
            if request.ready_s >= self._warmup:
                self._first_token(self._in_flight[request][0], request.ready_s)
        for request in done:
            if request.prefill_only:  # the sidecar's second call: to the decode worker
                decode = self._handoffs.pop(request)
                self._submit(self._by_address[self._in_flight[decode][1]], decode)
            else:
                self._turn_done(request)
        self._start_step(worker)
        flow = self.policy.flow
        if flow is not None and self._queued:
            self._wake(flow, flow.dispatch(self.cluster.model, self._refresh_views()))

    def _first_token(self, run: _Run, ready_s: float) -> None:
        ttft = self.now - ready_s
        self.metrics.ttfts.append(ttft)
        target = self._target(run)
        for share in self.metrics.shares(run.script.tenant, self._klass(run)):
            share.first_token(ttft, target)

    def _learn(self, request: SimRequest) -> None:
        """The predictor learns the TTFT from the pick (the engine's part of it)."""
        features = self._placed.pop(request, None)
        if features is None or self.policy.predictor is None:
            return
        address = self._in_flight[request][1]
        self._pending[address] -= features.uncached_tokens
        error = self.policy.predictor.observed_ttft(self.cluster.model, features,
                                                    self.now - request.placed_s)
        if error is not None and request.ready_s >= self._warmup:
            self._errors.append(error)

    def _turn_done(self, request: SimRequest) -> None:
        run, address = self._in_flight.pop(request)
        prompt, output = request.prompt_tokens, request.output_tokens
        if self.now >= self._warmup:
            reprefill = max(0, min(prompt, run.computed) - request.cached_tokens)
            self.metrics.turn_done(prompt, request.cached_tokens, request.lower_tokens, output,
                                   reprefill)
            for share in self.metrics.shares(run.script.tenant, self._klass(run)):
                share.tokens += prompt + output
            if request.first_token_s is not None and output > 1:
                self.metrics.itls.append((self.now - request.first_token_s) / (output - 1))
        run.computed = prompt + output
        self.policy.finished(_turn_key(run), prompt, request.cached_tokens, output)
        if self.policy.flow is not None and run.arrival is not None:
            self.policy.flow.finished(run.arrival, address, prompt, output,
                                      request=_turn_key(run))
        admission, hints, key = self.policy.admission, self.policy.hints, run.script.key
        if admission is not None:
            admission.turn_finished(key, address, prompt, output)
            if hints is not None:
                self._deliver(hints.turn_finished(key, paused=admission.is_paused(key)))
        run.index += 1
        self._advance(run)

    def _advance(self, run: _Run) -> None:
        steps = run.script.steps
        if run.index >= len(steps):
            self._session_done(run)
            return
        step = steps[run.index]
        if step.children and run.spawned < run.index:
            run.spawned = run.index
            inherited = run.computed // self.cluster.block_size * self.cluster.block_size
            run.pending = len(step.children)
            for child in step.children:
                self._start(child, computed=inherited, parent=run)
            return
        self._push(max(self.now + step.delay_s, step.not_before_s), _ARRIVE, run)

    def _session_done(self, run: _Run) -> None:
        self._live -= 1
        if self.policy.admission is not None:
            self.policy.admission.release(run.script.key)
        if self.policy.hints is not None:
            self._deliver(self.policy.hints.ended(run.script.key))
        if run.parent is not None:
            run.parent.pending -= 1
            if run.parent.pending == 0:
                self._advance(run.parent)
        elif run.slot is not None:
            load = self._slot_load[run.slot]
            self._next_session[load] += 1
            self._start(self._loads[load].session(self._next_session[load] - 1, self.now),
                        slot=run.slot)

    def _tick(self) -> None:
        admission = self.policy.admission
        assert admission is not None
        tick = admission.tick(self._refresh_views())
        if self.policy.hints is not None:
            self._deliver(self.policy.hints.ticked(tick))
        self.metrics.max_paused = max(self.metrics.max_paused, admission.paused_count())
        held, self._held = self._held, []
        for run in held:
            if admission.is_paused(run.script.key):
                self._held.append(run)
            else:
                self._dispatch(run)
        self._push(self.now + self.policy.tick_s, _TICK, None)

    def _unhold(self, run: _Run) -> None:
        """A held turn's hold ran out: it goes ahead paused (gone already if a tick resumed
        it; a run held again later is a later turn, with its own hold)."""
        admission = self.policy.admission
        assert admission is not None
        if (any(held is run for held in self._held)
                and run.ready_s + admission.config.hold_timeout_seconds <= self.now):
            self._held = [held for held in self._held if held is not run]
            self._dispatch(run)

    def _censor(self) -> None:
        """Turns still waiting for a first token at the end count with their wait so far."""
        waiting = [(run, run.ready_s) for run in self._held]
        waiting += [(run, run.ready_s) for run, _, _ in self._queued.values()]
        waiting += [(run, r.ready_s) for r, (run, _) in self._in_flight.items()
                    if r.first_token_s is None]
        self.metrics.censored = len(waiting)
        for run, ready in waiting:
            self._first_token(run, ready)


def _turn_key(run: _Run) -> str:
    """Names a session's turn in flight to flow control (its prefill, its end)."""
    return f"{run.script.key}#{run.index}"
