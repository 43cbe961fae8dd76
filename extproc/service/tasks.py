"""The service's background work, each loop a named task that is kept and stopped on shutdown:
scraping workers' ``/metrics`` when the pacer says they are due (then dispatching flow
control's queues), ticking session-aware admission, reloading the workers file,
(precise prefix mode) subscribing to the workers' KV events and a shared pool's, and delivering
KV hints to the workers. All I/O is async; the core objects they feed stay synchronous."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp

from ..adapter.waker import Waker
from ..config import Config
from ..observability.metrics import Metrics
from ..scheduling.kv_events import PreciseKVIndex
from ..scheduling.kv_hints import HINTS_PATH, KvHint, by_worker, encode_hints
from ..scheduling.pacing import Pace, ScrapePacer
from ..scheduling.placement import Pools
from ..scheduling.prefix_index import ApproximatePrefixIndex
from ..types import Clock
from .kv_subscriber import KVEventListener, KVEventSubscriber, SharedPoolSubscriber, ZmqFeed
from .pages import PageError, PageReader

log = logging.getLogger(__name__)

WATCH_SECONDS = 1.0
FLOW_TICK_SECONDS = 0.05
"""With flow control on, its queues are dispatched at least this often while requests are
queued or in flight (a finished request frees room before any scrape shows it)."""
SHARED_POOL = "shared-pool"
"""The shared pool's feed among the subscribers (keyed by worker address otherwise)."""
LISTENER = "listener"
"""The feed of the engines that connect to the router's own endpoint."""


class Background:
    def __init__(self, config: Config, pools: Pools, metrics: Metrics, waker: Waker,
                 clock: Clock) -> None:
        """``waker`` wakes the requests held for sessions admission resumes."""
        self._config = config
        self._pools = pools
        self._metrics = metrics
        self._waker = waker
        self._clock = clock
        self._tasks: list[asyncio.Task[None]] = []
        self._subscribers: dict[str, ZmqFeed] = {}
        self._session: aiohttp.ClientSession | None = None
        """For the KV hints (``_deliver_hints``)."""
        self._pages = PageReader(timeout=max(0.5, config.scheduling.staleness_seconds))
        """For the workers' ``/metrics`` pages."""
        self._mtime: float | None = None
        self._hints = metrics.kv_hints
        self._hints_dropped = 0
        scheduling = config.scheduling
        self._pacer = ScrapePacer(Pace.of(scheduling.scrape_interval_seconds,
                                          scheduling.scrape_idle_interval_seconds,
                                          scheduling.staleness_seconds), clock=clock)

    def start(self) -> None:
        scheduling = self._config.scheduling
        if not scheduling.enabled:
            return
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=max(0.5, scheduling.staleness_seconds))
        )
        routed = asyncio.Event()
        self._pools.registry.on_started(routed.set)
        self._tasks.append(asyncio.create_task(self._paced_scrapes(routed),
                                               name="scrape-workers"))
        if scheduling.admission.enabled:
            self._spawn("admission-tick", self._tick, scheduling.admission.tick_seconds)
        if scheduling.workers_file:
            self._spawn("watch-workers-file", self._watch, WATCH_SECONDS)
        if scheduling.hints.enabled:
            self._spawn("kv-hints", self._deliver_hints, scheduling.hints.flush_seconds)
        self._subscribe()
        index, listen = self._pools.index, scheduling.prefix.kv_events_listen
        if isinstance(index, PreciseKVIndex) and listen:
            listener = KVEventListener(index, listen, self._pools.all_workers)
            self._subscribers[LISTENER] = listener
            listener.start()
        pool, shared = self._pools.shared_pool, scheduling.prefix.shared_pool
        if pool is not None and shared.endpoint:
            feed = SharedPoolSubscriber(pool, shared.endpoint, shared.topic)
            self._subscribers[SHARED_POOL] = feed
            feed.start()

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for subscriber in self._subscribers.values():
            await subscriber.stop()
        if self._session is not None:
            await self._session.close()
            await self._pages.close()

    def _spawn(self, name: str, step: Callable[[], Awaitable[None]], every: float) -> None:
        async def loop() -> None:
            while True:
                try:
                    await step()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("background task %s failed; retrying", name)
                await asyncio.sleep(every)

        self._tasks.append(asyncio.create_task(loop(), name=name))

    async def _paced_scrapes(self, routed: asyncio.Event) -> None:
        """Read the workers the pacer says are due, then sleep until the next is. Every wake
        of the processor's event loop costs CPU (about 0.25 ms), so an idle pool is not
        polled: while no worker is due before the idle pace, the loop sleeps until ``routed``
        says the router started a request, or the idle pace ends (a worker that joined the
        pool is read then)."""
        pace = self._pacer.pace
        while True:
            delay = pace.busy_seconds
            try:
                await self._scrape()
                delay = self._next_scrape()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("background task scrape-workers failed; retrying")
            if delay <= pace.busy_seconds:
                await asyncio.sleep(delay)
                continue
            routed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(routed.wait(), delay)

    def _next_scrape(self) -> float:
        """Seconds until the next worker is due, at most the idle pace; with flow control on,
        at most ``FLOW_TICK_SECONDS`` while requests are queued or in flight."""
        workers, flow = self._pools.scrape_workers(), self._pools.flow
        delay = min(self._pacer.wait(workers), self._pacer.pace.idle_seconds)
        if flow.enabled and (flow.queued() or any(w.in_flight for w in workers)):
            delay = min(delay, FLOW_TICK_SECONDS)
        return delay

    async def _scrape(self) -> None:
        due = self._pacer.due(self._pools.scrape_workers())
        if due:
            await asyncio.gather(*(self._scrape_one(w.address, w.metrics_url)
                                   for w in due if w.metrics_url))
        if self._pools.flow.enabled:
            self._dispatch()

    def _dispatch(self) -> None:
        """Fresh load signals may show room: wake what flow control dispatches; export the
        queues' depth by pool and class (every pair, so an emptied queue reads 0)."""
        pools, flow = self._pools, self._pools.flow
        for model in self._config.models:
            for ticket in pools.dispatch(model):
                self._waker.wake("queue", ticket)
        depth = flow.queued()
        gauge = self._metrics.flow_queued
        for model in self._config.models:
            for klass in flow.config.classes:
                gauge.labels(model, klass).set(depth.get((model, klass), 0))

    def release_queues(self) -> None:
        """The process drains: every request flow control holds goes now (``release``)."""
        pools = self._pools
        if not pools.flow.enabled:
            return
        for model in self._config.models:
            for ticket in pools.flow.release(model):
                self._waker.wake("queue", ticket)

    async def _scrape_one(self, address: str, url: str) -> None:
        pools, metrics = self._pools, self._metrics
        try:
            text = await self._pages.get(url)
        except (TimeoutError, OSError, PageError):
            # An unreachable server is left out of the pick (Envoy's fallback still covers it).
            metrics.scrape_failures.labels(address).inc()
            pools.registry.set_healthy(address, False)
            return
        pools.registry.set_healthy(address, True)
        if pools.registry.apply_scrape(address, text, self._clock()):
            index = pools.index
            if isinstance(index, ApproximatePrefixIndex):
                for worker in pools.all_workers():
                    if worker.address == address:
                        index.resize(worker)

    async def _tick(self) -> None:
        pools, metrics = self._pools, self._metrics
        workers = pools.all_workers()
        tick = pools.tick(workers)
        for key in tick.resumed:
            self._waker.wake("paused", key)
        metrics.paused_sessions.set(pools.admission.paused_count())
        for worker in workers:
            metrics.worker_utilization.labels(worker.address).set(
                pools.admission.utilization(worker.address)
            )

    async def _deliver_hints(self) -> None:
        """Everything queued, one batch per worker, all at once: best effort, a worker that
        fails or is slower than ``hints.timeout_seconds`` loses its batch (hints are advice;
        retrying a stale demote or prefetch would do more harm than losing it)."""
        pools = self._pools
        dropped = pools.hints_dropped - self._hints_dropped
        self._hints_dropped = pools.hints_dropped
        if dropped:
            self._hints.labels("any", "dropped").inc(dropped)
        hints = list(pools.hints_out)
        pools.hints_out.clear()
        await asyncio.gather(*(self._post_hints(w, batch) for w, batch in by_worker(hints).items()))

    async def _post_hints(self, worker: str, hints: list[KvHint]) -> None:
        assert self._session is not None
        timeout = aiohttp.ClientTimeout(total=self._config.scheduling.hints.timeout_seconds)
        try:
            async with self._session.post(
                f"http://{worker}{HINTS_PATH}", data=encode_hints(hints), timeout=timeout,
                headers={"content-type": "application/json"},
            ) as response:
                outcome = "delivered" if response.status < 300 else "failed"
        except (TimeoutError, aiohttp.ClientError):
            outcome = "failed"
        for hint in hints:
            self._hints.labels(hint.kind, outcome).inc()

    async def _watch(self) -> None:
        path = Path(self._config.scheduling.workers_file or "")
        try:
            mtime = path.stat().st_mtime
        except OSError:
            return
        if mtime == self._mtime:
            return
        self._mtime = mtime
        removed = self._pools.registry.reload_file(path)
        await self.workers_changed(removed)
        log.info("workers file %s reloaded; %d workers left the pools", path, len(removed))

    async def workers_changed(self, removed: tuple[str, ...]) -> None:
        """The pools changed (the workers file, a config reloaded): forget what the workers
        that left had, follow the KV events of those that came."""
        for address in removed:
            self._pools.index.forget(address)
            subscriber = self._subscribers.pop(address, None)
            if subscriber is not None:
                await subscriber.stop()
        self._subscribe()

    def _subscribe(self) -> None:
        """Precise prefix mode: follow the KV events of every worker that publishes them."""
        index = self._pools.index
        if not isinstance(index, PreciseKVIndex):
            return
        for worker in self._pools.all_workers():
            if worker.kv_events and worker.address not in self._subscribers:
                subscriber = KVEventSubscriber(index, worker.address, worker.kv_events)
                subscriber.start()
                self._subscribers[worker.address] = subscriber
