"""SIGHUP: the config file read again; what of it can change while the service runs is applied at
once, the rest is named and waits for a restart.

Applied without a restart:

* ``routing.decisions`` (rules, candidates, SAAR's knobs) and ``models.NAME.pricing`` /
  ``quality``: a new SAAR engine, over the same model health and sessions;
* ``models.NAME.endpoints`` / ``workers``: the pools (workers that stay keep their signals and
  in-flight counts; those that leave lose their prefix index);
* ``scheduling.scorers.NAME`` of the scorers built at start (0 turns one off), and
  ``scheduling.overlap_weight``;
* ``logging.level`` and ``logging.format`` (unless ``--log-level`` / ``-v`` set the level).

Anything else that differs (ports, TLS, the store, a model added or removed, a scorer not
built at start...) needs a restart: the running value stays, the key is logged as a warning
and ``saar_config_restart_pending{key}`` is 1 until the file and the process agree again. A
file that does not load (a duplicate key, a bad value) changes nothing: its error is logged
with its ``file:line``, and ``saar_config_reloads_total{outcome="rejected"}`` counts it.
The workers file and the TLS certificates are read again when they change, SIGHUP or not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Collection
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge

from ..config import Config, ConfigError, parse_config
from ..core.saar import SaarEngine
from ..observability import logs
from .roles import pool_config

if TYPE_CHECKING:
    from .app import RunningService

log = logging.getLogger(__name__)

Key = tuple[str | int, ...]
MODEL_KEYS = ("pricing", "quality", "endpoints", "workers")
"""What of a model (one already running) a reload changes."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one reload did: the keys applied, those that need a restart (dotted), or the
    error that kept the running config whole."""

    applied: tuple[str, ...] = ()
    restart: tuple[str, ...] = ()
    error: str | None = None

    @property
    def name(self) -> str:
        """``rejected``, ``partial`` (something needs a restart), ``applied`` or
        ``unchanged``: the metric's label."""
        if self.error is not None:
            return "rejected"
        if self.restart:
            return "partial"
        return "applied" if self.applied else "unchanged"


def changes(old: Any, new: Any, key: Key = ()) -> list[Key]:
    """Where two plain documents (dicts, lists, scalars) differ: a key on one side only, or
    lists of different lengths, is one change."""
    if isinstance(old, dict) and isinstance(new, dict):
        found: list[Key] = []
        for name in dict.fromkeys([*old, *new]):
            if name in old and name in new:
                found += changes(old[name], new[name], (*key, name))
            else:
                found.append((*key, name))
        return found
    if isinstance(old, list | tuple) and isinstance(new, list | tuple) and len(old) == len(new):
        return [k for i, (a, b) in enumerate(zip(old, new, strict=True))
                for k in changes(a, b, (*key, i))]
    return [] if old == new else [key]


def dotted(key: Key) -> str:
    out = ""
    for part in key:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def reloadable(key: Key, scorers: Collection[str]) -> bool:
    """Whether the change at ``key`` applies without a restart (``scorers``: those built at
    start)."""
    if key[:1] == ("logging",) or key[:2] == ("routing", "decisions"):
        return True
    if key[:1] == ("models",) and len(key) >= 3:  # deeper than a model: it runs on both sides
        return key[2] in MODEL_KEYS
    if key[:2] == ("scheduling", "scorers") and len(key) == 3:
        return key[2] in scorers
    return key == ("scheduling", "overlap_weight")


def plan(running: Config, new: Config, scorers: Collection[str]) -> tuple[Config, Outcome]:
    """The config to run (``running`` with what ``new`` changes that can be applied) and what
    is applied and what waits for a restart. Raises ``ConfigError`` when the mix is not a
    valid config (a decision naming a model added to the file)."""
    applied: list[str] = []
    restart: list[str] = []
    for key in changes(asdict(running), asdict(new)):
        (applied if reloadable(key, scorers) else restart).append(dotted(key))
    if not applied:
        return running, Outcome((), tuple(restart))
    models = {name: replace(model, **{k: getattr(new.models[name], k) for k in MODEL_KEYS})
              if name in new.models else model for name, model in running.models.items()}
    weights = {**{k: v for k, v in running.scheduling.scorers.items() if k not in scorers},
               **{k: v for k, v in new.scheduling.scorers.items() if k in scorers}}
    mixed = replace(
        running, models=models, logging=new.logging,
        routing=replace(running.routing, decisions=new.routing.decisions),
        scheduling=replace(running.scheduling, scorers=weights,
                           overlap_weight=new.scheduling.overlap_weight))
    if restart:  # what the file's other keys were checked against is not what runs
        mixed = parse_config(asdict(mixed), source="the running config with its changes")
    return mixed, Outcome(tuple(applied), tuple(restart))


class Reloader:
    """Reads the config again when asked (``request``: the SIGHUP handler) and applies it to
    ``service``; one reload at a time, a request during one runs once it is done."""

    def __init__(self, service: RunningService, load: Callable[[], Config]) -> None:
        """``load`` reads the file as the service was started from it (the flags' ports, pool
        and log level on top)."""
        self._service = service
        self._load = load
        self._task: asyncio.Task[None] | None = None
        self._again = False
        registry = service.parts.metrics.registry
        self._reloads = Counter("saar_config_reloads", "Config reloads (SIGHUP), by outcome: "
                                "applied, partial (some keys need a restart), unchanged, "
                                "rejected (the file does not load; nothing changed)",
                                ["outcome"], registry=registry)
        self._pending = Gauge("saar_config_restart_pending", "1 for each key whose value in "
                              "the config file differs from the running one and needs a "
                              "restart to apply", ["key"], registry=registry)
        self._registry = registry

    def request(self) -> None:
        """Reload soon (on this loop); a reload running now is followed by another."""
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="config-reload")

    async def _run(self) -> None:
        while True:
            self._again = False
            await self.reload()
            if not self._again:
                return

    async def reload(self) -> Outcome:
        try:
            outcome = await self._reload()
        except ConfigError as exc:
            outcome = Outcome(error=str(exc))
            log.error("config not reloaded, the running one stays: %s", exc)
        except Exception as exc:  # never take the service down over a reload
            outcome = Outcome(error=f"{type(exc).__name__}: {exc}")
            log.exception("config not reloaded, the running one stays")
        self._reloads.labels(outcome.name).inc()
        return outcome

    async def _reload(self) -> Outcome:
        service = self._service
        parts = service.parts
        running = parts.config
        new = self._load()
        if running.scheduling.pool_name is not None:  # as ``app.start`` narrowed it
            new = pool_config(new, running.scheduling.pool_name, source="scheduling.pool_name")
        scheduler = parts.pools.scheduler
        config, outcome = plan(running, new, scheduler.weights())
        if outcome.applied:
            router = parts.router
            router.engine = SaarEngine(config, router.health, clock=router.clock)
            router.config = parts.config = config
            removed = parts.pools.registry.set_configured(config.models)
            await service.background.workers_changed(removed)
            scheduler.reweigh(config.scheduling.scorers, config.scheduling.overlap_weight)
            if config.logging != running.logging:
                logs.configure(config.logging.level, config.logging.format)
        self._pending.clear()
        for key in outcome.restart:
            self._pending.labels(key).set(1)
        if outcome.restart:
            log.warning("config reloaded: applied %s; needs a restart (the running values "
                        "stay): %s", ", ".join(outcome.applied) or "nothing",
                        ", ".join(outcome.restart))
        else:
            log.info("config reloaded: %s", ", ".join(outcome.applied) or "no change")
        return outcome

    async def stop(self) -> None:
        """Cancel a reload under way; take the metrics out of the registry."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for metric in (self._reloads, self._pending):
            self._registry.unregister(metric)
