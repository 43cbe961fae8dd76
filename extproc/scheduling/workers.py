"""Each model's pool of workers, from the configuration and from a workers file that can change
without a restart, with the load signals their scrapes report and the router's in-flight counts.

The registry does no I/O beyond reading the workers file when asked: the server scrapes each
``metrics_url`` and hands the page to ``apply_scrape``. A worker that has not been scraped within
``staleness_seconds`` keeps its last values but is marked ``stale``, so scorers lean on the
router's own in-flight count instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from ..config import ROLES, ConfigError, Model, WorkerSpec
from ..types import Clock
from .signals import parse_metrics
from .types import Worker

log = logging.getLogger(__name__)

_SPEC_KEYS = frozenset({"address", "metrics_url", "kv_events", "role"})


class WorkerRegistry:
    def __init__(
        self, models: Mapping[str, Model], *, clock: Clock, staleness_seconds: float = 2.0
    ) -> None:
        self._clock = clock
        self._staleness = staleness_seconds
        self._configured = {name: _specs(model) for name, model in models.items()
                            if model.base is None}
        self._bases = {name: model.base for name, model in models.items() if model.base}
        """Adapter → its base model: an adapter's pool is its base's workers."""
        self._pools: dict[str, dict[str, Worker]] = {}
        self._sources: dict[str, Mapping[str, tuple[WorkerSpec, ...]]] = {}
        """Workers from elsewhere than the config: the workers file, Kubernetes discovery."""
        self._listeners: list[Callable[[], None]] = []
        self._rebuild()

    def pool(self, model: str) -> list[Worker]:
        """The workers of ``model`` with their ``stale`` flag brought up to date."""
        now = self._clock()
        workers = list(self._pools.get(self._bases.get(model, model), {}).values())
        for worker in workers:
            worker.stale = worker.scraped_at is None or now - worker.scraped_at > self._staleness
        return workers

    def is_adapter(self, model: str) -> bool:
        """``model`` is a LoRA adapter served by its base model's workers."""
        return model in self._bases

    def apply_scrape(self, address: str, text: str, now: float) -> bool:
        """Record the signals of ``address``'s metrics page; a malformed page is logged and
        ignored (the worker goes stale), never raised."""
        try:
            signals = parse_metrics(text)
        except ValueError as exc:
            log.warning("unreadable metrics from %s: %s", address, exc)
            return False
        for worker in self._workers(address):
            if signals.running is not None:
                worker.running = signals.running
            if signals.waiting is not None:
                worker.waiting = signals.waiting
            if signals.kv_usage is not None:
                worker.kv_usage = signals.kv_usage
            if signals.block_size is not None:
                worker.block_size = signals.block_size
            if signals.num_blocks is not None:
                worker.num_blocks = signals.num_blocks
            if signals.cpu_blocks is not None:
                worker.cpu_blocks = signals.cpu_blocks
            if signals.adapters_running is not None:
                worker.adapters_running = signals.adapters_running
            if signals.adapters_waiting is not None:
                worker.adapters_waiting = signals.adapters_waiting
            if signals.max_lora is not None:
                worker.max_lora = signals.max_lora
            if signals.engine is not None:
                worker.engine = signals.engine
            worker.scraped_at = now
            worker.since_scrape = 0
        return True

    def on_started(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` (on the caller's thread) each time the router starts a request on
        a worker: the scrape loop, asleep while every worker is idle, wakes to read it."""
        self._listeners.append(listener)

    def started(self, address: str) -> None:
        for worker in self._workers(address):
            worker.in_flight += 1
            worker.since_scrape += 1
            worker.routed += 1
        for listener in self._listeners:
            listener()

    def finished(self, address: str) -> None:
        for worker in self._workers(address):
            worker.routed += 1
            if worker.in_flight:
                worker.in_flight -= 1
                worker.since_scrape -= 1

    def set_healthy(self, address: str, healthy: bool) -> None:
        for worker in self._workers(address):
            worker.healthy = healthy

    def reload_file(self, path: str | Path) -> tuple[str, ...]:
        """Replace the file's workers with what ``path`` now says; workers that stay keep their
        signals and in-flight counts. Returns the addresses that left every pool (so their prefix
        index can be dropped). A bad file raises ``ConfigError`` and changes nothing."""
        return self.set_source("file", load_workers_file(path, known=self._configured.keys()))

    def set_configured(self, models: Mapping[str, Model]) -> tuple[str, ...]:
        """Replace the workers the config names (``endpoints``, ``workers``) of the models
        already known (a new config's, on SIGHUP; a model added or removed needs a restart);
        workers that stay keep their signals and in-flight counts. Returns the addresses that
        left every pool."""
        before = {w.address for w in self._all()}
        for name in self._configured:
            if name in models:
                self._configured[name] = _specs(models[name])
        self._rebuild()
        return tuple(sorted(before - {w.address for w in self._all()}))

    def set_source(self, name: str, specs: Mapping[str, tuple[WorkerSpec, ...]]) -> tuple[str, ...]:
        """Replace the workers source ``name`` brings (``{model: specs}``, models unknown to
        the config ignored); workers that stay keep their signals and in-flight counts.
        Returns the addresses that left every pool."""
        before = {w.address for w in self._all()}
        self._sources[name] = specs
        self._rebuild()
        return tuple(sorted(before - {w.address for w in self._all()}))

    def _rebuild(self) -> None:
        pools: dict[str, dict[str, Worker]] = {}
        for model, configured in self._configured.items():
            pool = pools[model] = {}
            extra = [spec for source in self._sources.values() for spec in source.get(model, ())]
            for spec in (*configured, *extra):
                if spec.address in pool:
                    continue
                worker = self._pools.get(model, {}).get(spec.address) or Worker(spec.address, model)
                worker.metrics_url = spec.metrics_url or f"http://{spec.address}/metrics"
                worker.kv_events = spec.kv_events
                worker.role = spec.role
                pool[spec.address] = worker
        self._pools = pools

    def _all(self) -> Iterable[Worker]:
        return (w for pool in self._pools.values() for w in pool.values())

    def _workers(self, address: str) -> list[Worker]:
        return [pool[address] for pool in self._pools.values() if address in pool]


def load_workers_file(
    path: str | Path, *, known: Iterable[str]
) -> dict[str, tuple[WorkerSpec, ...]]:
    """Parse ``{model: [host:port | {address, metrics_url, kv_events, role}]}``; every model
    must be one of ``known`` (a base model: adapters have no workers of their own)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: cannot read YAML: {exc}") from None
    data = {} if data is None else data
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of model to workers")
    known = set(known)
    specs: dict[str, tuple[WorkerSpec, ...]] = {}
    for model, entries in data.items():
        if model not in known:
            raise ConfigError(f"{path}: {model}: unknown model")
        if not isinstance(entries, list):
            raise ConfigError(f"{path}: {model}: expected a list of workers")
        specs[model] = tuple(_spec(e, f"{path}: {model}[{i}]") for i, e in enumerate(entries))
    return specs


def _spec(entry: Any, where: str) -> WorkerSpec:
    if isinstance(entry, str) and entry:
        return WorkerSpec(address=entry)
    if isinstance(entry, dict) and isinstance(entry.get("address"), str):
        unknown = set(entry) - _SPEC_KEYS
        if unknown:
            raise ConfigError(f"{where}: unknown keys {sorted(unknown)}")
        if entry.get("role", "both") not in ROLES:
            raise ConfigError(f"{where}: role: one of {', '.join(ROLES)}, got {entry['role']!r}")
        if not all(v is None or isinstance(v, str) for v in entry.values()):
            raise ConfigError(f"{where}: values must be strings")
        return WorkerSpec(**entry)
    raise ConfigError(f"{where}: expected host:port or a mapping with an address")


def _specs(model: Model) -> tuple[WorkerSpec, ...]:
    return (*(WorkerSpec(address=a) for a in model.endpoints), *model.workers)
