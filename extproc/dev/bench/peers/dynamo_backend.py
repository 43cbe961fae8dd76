"""The ``dynamo`` backend: NVIDIA Dynamo's mocker workers behind its frontend
(``engines.dynamo``), with the routers that can run there.

- ``dynamo:kv``: Dynamo's own KV router (the frontend started with ``--router-mode kv``);
  ``dynamo:kv_affinity`` the same with its session affinity on
  (``--router-session-affinity-ttl-secs``: a session stays on its first worker; it reads the
  ``x-session-id`` the workloads send).
- ``saar``: Envoy + ``saar serve`` choosing the worker, the same frontend started with
  ``--router-mode direct`` doing what saar says. A mocker has no HTTP address of its own and
  saar's pick is an address, so each mocker is given one: a small Envoy (the *worker slots*)
  listens on one loopback port per mocker and forwards to the frontend with
  ``x-dynamo-worker-instance-id: <that mocker's id>``; saar's config lists the slots as the
  model's endpoints, so its pick (``x-gateway-destination-endpoint``) is a slot and the slot
  names the worker to Dynamo. Nothing in saar changes. The mockers publish their KV events and
  load over Dynamo's own event plane, which saar does not read: saar runs in its approximate
  mode, learning the workers' prefixes from its own routing, and a slot's ``/metrics`` answers
  an empty page (no queue or KV signal; the frontend's own page is not the worker's).

What is counted as each router's processes: everything between the client and the mockers —
Dynamo's frontend for ``dynamo:*``; saar's processor and Envoy, the slots' Envoy and the
frontend for ``saar``. The "worker alone" of the added latency is the frontend with the first
worker named in the header. Prefix hits are the frontend's ``dynamo_frontend_cached_tokens`` over
``dynamo_frontend_input_sequence_tokens`` (the workers' reported cached tokens).

Freshness: a mocker's cache cannot be emptied and its instance id changes when it restarts, so
making the pool fresh restarts the mockers and the frontend (about 2–3 s), the frontend on the
same port; the slots keep listening (saar marks a worker it cannot read as down) and Envoy
reloads their routes, with the new ids, from a file it watches. Dynamo's frontend stalls on a
reused keep-alive connection (``../shared/REFERENCE.md`` §12), so the client and the slots open a
new connection per request to it.
"""

from __future__ import annotations

import contextlib
import functools
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ...engines import dynamo
from ...harness import Service, envoy_binary, free_port, free_ports, wait_http
from .backends import TINY_TRACE_WORDS_PER_BLOCK, Direct, Pool
from .procstat import with_descendants
from .routers import Router, Running, SaarRouter, standard
from .settings import DYNAMO_ROUTERS, ROUTERS

MODEL = "tiny"
AFFINITY_TTL_S = 300
KV_ROUTERS: dict[str, tuple[str, ...]] = {
    "dynamo:kv": (),
    "dynamo:kv_affinity": ("--router-session-affinity-ttl-secs", str(AFFINITY_TTL_S)),
}
"""Dynamo's own routers: name → the frontend's flags beside ``--router-mode kv``."""
EMPTY_METRICS = "# a Dynamo mocker publishes its load on Dynamo's event plane, not here\n"


def slot_routes(index: int, instance: int) -> dict[str, Any]:
    """Slot ``index``'s route configuration (a file Envoy watches): everything forwarded to the
    frontend naming worker ``instance``, ``/metrics`` answered with an empty page."""
    return {"resources": [{
        "@type": "type.googleapis.com/envoy.config.route.v3.RouteConfiguration",
        "name": f"worker_{index}",
        "virtual_hosts": [{"name": f"worker_{index}", "domains": ["*"], "routes": [
            {"match": {"path": "/metrics"},
             "direct_response": {"status": 200, "body": {"inline_string": EMPTY_METRICS}}},
            {"match": {"prefix": "/"},
             "route": {"cluster": "frontend", "timeout": "0s"},
             "request_headers_to_add": [{
                 "header": {"key": dynamo.WORKER_HEADER, "value": str(instance)},
                 "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]},
        ]}],
    }]}


def slots_bootstrap(ports: Sequence[int], frontend_port: int, admin_port: int,
                    routes: Sequence[Path]) -> dict[str, Any]:
    """Envoy's config for the worker slots: a listener per port whose routes come from its
    file in ``routes`` (``slot_routes``; replaced when the workers restart with new ids, while
    the slots keep listening), and the frontend as their one upstream, one request per
    connection."""
    listeners = []
    for index, (port, path) in enumerate(zip(ports, routes, strict=True)):
        manager = {
            "@type": "type.googleapis.com/envoy.extensions.filters.network."
                     "http_connection_manager.v3.HttpConnectionManager",
            "stat_prefix": f"worker_{index}",
            "rds": {"route_config_name": f"worker_{index}", "config_source": {
                "path_config_source": {"path": str(path)},
                "resource_api_version": "V3"}},
            "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}],
        }
        listeners.append({
            "name": f"worker-{index}",
            "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
            "filter_chains": [{"filters": [{
                "name": "envoy.filters.network.http_connection_manager",
                "typed_config": manager}]}],
        })
    frontend = {"socket_address": {"address": "127.0.0.1", "port_value": frontend_port}}
    return {
        "node": {"id": "worker-slots", "cluster": "worker-slots"},  # what file RDS requires
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {
            "listeners": listeners,
            "clusters": [{
                "name": "frontend", "type": "STATIC", "connect_timeout": "2s",
                "load_assignment": {"cluster_name": "frontend", "endpoints": [
                    {"lb_endpoints": [{"endpoint": {"address": frontend}}]}]},
                "typed_extension_protocol_options": {
                    "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3."
                                 "HttpProtocolOptions",
                        "common_http_protocol_options": {"max_requests_per_connection": 1},
                        "explicit_http_config": {"http_protocol_options": {}}}},
            }],
        },
    }


ROUTES_TIMEOUT_S = 15.0


class WorkerSlots:
    """One loopback address per Dynamo worker (an Envoy, ``slots_bootstrap``): each forwards
    to the frontend naming its worker. ``point(ids)`` names the workers (starting the Envoy
    the first time, else rewriting the route files and waiting until Envoy has loaded them);
    the slots keep listening in between."""

    def __init__(self, workdir: Path, count: int, frontend_port: int) -> None:
        self.workdir = workdir
        self.ports = free_ports(count)
        self.frontend_port = frontend_port
        self.admin_port = free_port()
        self._envoy: Service | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        return tuple(f"http://127.0.0.1:{port}" for port in self.ports)

    @property
    def route_files(self) -> list[Path]:
        return [self.workdir / f"slot-{index}-routes.yaml" for index in range(len(self.ports))]

    def point(self, ids: Sequence[int]) -> None:
        before = self._route_updates()
        for index, (instance, path) in enumerate(zip(ids, self.route_files, strict=True)):
            staged = path.with_suffix(".tmp")
            staged.write_text(yaml.safe_dump(slot_routes(index, instance), sort_keys=False))
            staged.replace(path)  # Envoy watches for a file moved into place
        if self._envoy is None:
            self.workdir.mkdir(parents=True, exist_ok=True)
            config = self.workdir / "slots.yaml"
            config.write_text(yaml.safe_dump(slots_bootstrap(
                self.ports, self.frontend_port, self.admin_port, self.route_files),
                sort_keys=False))
            self._envoy = Service("slots", [
                envoy_binary(), "-c", str(config), "--log-level", "warn", "--concurrency", "1",
                "--use-dynamic-base-id"], self.workdir,
                functools.partial(wait_http, f"http://127.0.0.1:{self.admin_port}/ready"))
            self._envoy.start()
            return
        deadline = time.monotonic() + ROUTES_TIMEOUT_S
        while not all(after > before.get(name, 0)
                      for name, after in self._route_updates().items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker slots did not load their new routes in "
                                   f"{ROUTES_TIMEOUT_S:.0f} s (logs: {self.workdir})")
            time.sleep(0.05)

    def _route_updates(self) -> dict[str, int]:
        """Each slot's count of route updates Envoy applied (``rds.*.update_success``)."""
        if self._envoy is None:
            return {}
        url = f"http://127.0.0.1:{self.admin_port}/stats?filter=update_success"
        with urllib.request.urlopen(url, timeout=5) as response:
            text = response.read().decode()
        out = {}
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if ".rds." in name and value.strip().isdigit():
                out[name.strip()] = int(value)
        return out

    def pids(self) -> list[int]:
        envoy = self._envoy
        return with_descendants([envoy.proc.pid]) if envoy and envoy.proc else []

    def close(self) -> None:
        if self._envoy is not None:
            self._envoy.close()
            self._envoy = None


@dataclass
class DynamoStack:
    """The mockers and the frontend (in one routing mode at a time), started and restarted
    together, the frontend on a stable port; and the worker slots, listening throughout (so
    that saar's reads of the slots never fail while the workers restart), pointed at the new
    ids at each start."""

    python: Path
    model_dir: Path
    workdir: Path
    workers: int = 2
    kv_blocks: int = 1024
    block_size: int = 16
    mode: str = "direct"
    frontend_args: tuple[str, ...] = ()
    frontend_port: int = field(default_factory=free_port)
    restarts: int = 0
    slots: WorkerSlots = field(init=False)
    _pool: dynamo.DynamoPool | None = None
    _stack: contextlib.ExitStack | None = None

    def __post_init__(self) -> None:
        self.slots = WorkerSlots(self.workdir, self.workers, self.frontend_port)

    @property
    def frontend_url(self) -> str:
        return f"http://127.0.0.1:{self.frontend_port}"

    @property
    def pool(self) -> dynamo.DynamoPool:
        if self._pool is None:
            raise RuntimeError("the Dynamo pool is not running")
        return self._pool

    def start(self) -> None:
        """Start the workers and the frontend, then point the slots at the workers."""
        home = self.workdir / f"start-{self.restarts}"
        self.restarts += 1
        stack = contextlib.ExitStack()
        try:
            self._pool = stack.enter_context(dynamo.dynamo_pool(
                self.model_dir, workers=self.workers, router_mode=self.mode,
                model_name=MODEL, workdir=home, block_size=self.block_size,
                port=self.frontend_port, python=self.python,
                mocker_args=("--num-gpu-blocks-override", str(self.kv_blocks)),
                frontend_args=self.frontend_args))
            self.slots.point(self._pool.worker_ids)
        except BaseException:
            stack.close()
            self._pool = None
            raise
        self._stack = stack

    def stop(self) -> None:
        """Stop the workers and the frontend (the slots keep listening)."""
        if self._stack is not None:
            self._stack.close()
        self._stack = self._pool = None

    def close(self) -> None:
        self.stop()
        self.slots.close()

    def restart(self) -> None:
        self.stop()
        self.start()

    def use(self, mode: str, frontend_args: Sequence[str] = ()) -> None:
        """The frontend in ``mode`` with ``frontend_args`` (restarted if it is not)."""
        if (mode, tuple(frontend_args)) != (self.mode, self.frontend_args) or self._pool is None:
            self.mode, self.frontend_args = mode, tuple(frontend_args)
            self.restart()

    def counters(self) -> dict[str, tuple[float, float]]:
        hits = self.pool.prefix_hits()
        return {self.frontend_url: (hits.cached_tokens, hits.prompt_tokens)}

    def frontend_pids(self) -> list[int]:
        return with_descendants([self.pool.frontend_pid])

    def direct(self) -> Direct:
        """The first worker through the frontend, named in the header."""
        return Direct(self.frontend_url,
                      tuple(self.pool.headers_for(self.pool.worker_ids[0]).items()),
                      fresh_connections=True)


@dataclass
class DynamoBackend:
    """Two mockers of the tiny model's tokenizer (16k tokens of KV each, 16-token blocks, as
    the vLLM backend's 16k), behind Dynamo's frontend."""

    workers: int = 2
    kv_tokens: int = 16384
    block_size: int = 16
    name: str = "dynamo"
    stack: DynamoStack | None = None

    @contextlib.contextmanager
    def pool(self, workdir: Path) -> Iterator[Pool]:
        python = dynamo.ensure_dynamo()
        model_dir = dynamo.mocker_model_dir(workdir / "model", python)
        stack = DynamoStack(python, model_dir, workdir, workers=self.workers,
                            kv_blocks=self.kv_tokens // self.block_size,
                            block_size=self.block_size)
        try:
            stack.start()
            self.stack = stack
            yield Pool(stack.slots.urls, MODEL, self.kv_tokens, stack.counters, stack.restart,
                       direct=stack.direct, trace_words_per_block=TINY_TRACE_WORDS_PER_BLOCK)
        finally:
            stack.close()
            self.stack = None

    def running(self) -> DynamoStack:
        if self.stack is None:
            raise RuntimeError("the Dynamo pool is not running")
        return self.stack

    def routers(self, names: Sequence[str]) -> list[Router]:
        """The routers run here: by default (the standard names) saar and Dynamo's own
        (``DYNAMO_ROUTERS``); a peer named explicitly runs over the worker slots."""
        chosen = DYNAMO_ROUTERS if tuple(names) == ROUTERS else tuple(names)
        out: list[Router] = []
        for name in chosen:
            if name == "saar":
                out.append(SaarOverDynamo(self))
            elif name in KV_ROUTERS:
                out.append(DynamoKvRouter(name, self, KV_ROUTERS[name]))
            elif name.startswith("dynamo:"):
                raise ValueError(f"unknown router {name!r}; Dynamo's: {', '.join(KV_ROUTERS)}")
            else:
                out.append(standard(name))
        return out


@dataclass
class DynamoKvRouter:
    """Dynamo's own router: the frontend in ``kv`` mode."""

    name: str
    backend: DynamoBackend
    frontend_args: tuple[str, ...] = ()

    def prepare(self) -> None:
        dynamo.ensure_dynamo()

    @contextlib.contextmanager
    def start(self, pool: Pool, workdir: Path) -> Iterator[Running]:
        stack = self.backend.running()
        stack.use("kv", self.frontend_args)
        yield Running(stack.frontend_url, pool.model, stack.frontend_pids,
                      fresh_connections=True)


@dataclass
class SaarOverDynamo:
    """saar choosing the worker, the frontend in ``direct`` mode, through the worker slots."""

    backend: DynamoBackend
    name: str = "saar"

    def prepare(self) -> None:
        envoy_binary()

    @contextlib.contextmanager
    def start(self, pool: Pool, workdir: Path) -> Iterator[Running]:
        stack = self.backend.running()
        stack.use("direct")
        with SaarRouter().start(pool, workdir) as running:
            def pids() -> list[int]:
                return [*running.pids(), *stack.slots.pids(), *stack.frontend_pids()]

            yield Running(running.url, running.model, pids)
