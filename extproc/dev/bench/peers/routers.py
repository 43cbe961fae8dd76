"""The routers compared, each started in front of a pool and stopped after its turn.

- ``saar``: Envoy + ``saar serve``, the pool's workers as the endpoints of one model behind the
  logical model ``auto`` (what clients ask for), every other setting its default but what the
  pool says of its engines (``Pool.saar_model``, ``Pool.saar_config``: over real vLLM, its KV
  events, the model's tokenizer and window, the precise index); where the precise index is
  judged (``Pool.precise_block_size``) its replay records go to a JSONL file;
- ``vllm-router:POLICY`` (vllm-router 0.1.17: ``cache_aware``, ``consistent_hash`` — it hashes
  ``x-session-id`` — and ``round_robin``) and ``sglang-router:cache_aware`` (sglang-router
  0.3.2), each from PyPI in its own environment (``install``), with their default settings
  but their per-request log lines off (``RUST_LOG=warn``; Envoy runs at ``warn`` too).

A router's CPU and RSS are its own processes' (saar: the processor and Envoy).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml

from ....adapter.bootstrap import EnvoyPorts, bootstrap
from ....config import parse_config
from ...harness import Service, envoy_binary, free_port, wait_http
from ..overhead import UNTHROTTLED
from .backends import Pool
from .install import PeerMissing, ensure
from .procstat import with_descendants
from .settings import ROUTERS


@dataclass(frozen=True)
class Running:
    """A started router: where clients send, the ``model`` they ask for, and its processes."""

    url: str
    model: str
    pids: Callable[[], list[int]]
    fresh_connections: bool = False
    replay_jsonl: Path | None = None
    """saar's replay records, where the bench asked for them (the precise index's
    predictions)."""


class Router(Protocol):
    @property
    def name(self) -> str:
        """The name the report gives it."""
        ...

    def prepare(self) -> None:
        """Make it runnable (install it); raise ``PeerMissing`` saying why it cannot be."""
        ...

    def start(self, pool: Pool, workdir: Path) -> contextlib.AbstractContextManager[Running]:
        ...


def _pids(*services: Service) -> Callable[[], list[int]]:
    def read() -> list[int]:
        return with_descendants(s.proc.pid for s in services if s.proc is not None)
    return read


LOGICAL_MODEL = "auto"


def saar_config(pool: Pool) -> dict[str, Any]:
    """One model, the pool's workers its endpoints (or the pool's ``workers`` entries), behind
    ``auto``; the pool's own keys; defaults elsewhere."""
    model: dict[str, Any] = {
        "cluster": "pool",
        "endpoints": [url.removeprefix("http://") for url in pool.workers],
    }
    model.update(pool.saar_model)
    if "workers" in pool.saar_model:
        model.pop("endpoints")
    return {
        "models": {pool.model: model},
        "routing": {"logical_models": [LOGICAL_MODEL],
                    "decisions": [{"name": "default", "modelRefs": [{"model": pool.model}]}]},
        "limits": dict(UNTHROTTLED),
        **pool.saar_config,
    }


@dataclass(frozen=True)
class SaarRouter:
    name: str = "saar"
    overrides: dict[str, Any] = field(default_factory=dict)
    """Merged into the config (top-level keys replaced): a variant of saar."""

    def prepare(self) -> None:
        envoy_binary()

    @contextlib.contextmanager
    def start(self, pool: Pool, workdir: Path) -> Iterator[Running]:
        workdir.mkdir(parents=True, exist_ok=True)
        grpc_port, http_port, listen, admin = free_port(), free_port(), free_port(), free_port()
        config = {**saar_config(pool), **self.overrides}
        config["server"] = {"host": "127.0.0.1", "grpc_port": grpc_port, "http_port": http_port}
        replay = workdir / "replay.jsonl" if pool.precise_block_size else None
        if replay is not None:
            replay.unlink(missing_ok=True)
            config["replay"] = {**config.get("replay", {}), "jsonl_path": str(replay)}
        path = workdir / "saar.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        envoy_yaml = workdir / "envoy.yaml"
        envoy_yaml.write_text(yaml.safe_dump(
            bootstrap(parse_config(config), EnvoyPorts(listen=listen, admin=admin,
                                                       processor_port=grpc_port)),
            sort_keys=False))
        processor = Service("processor", [
            sys.executable, "-m", "extproc", "serve", "--config", str(path),
            "--grpc-port", str(grpc_port), "--http-port", str(http_port)],
            workdir, functools.partial(wait_http, f"http://127.0.0.1:{http_port}/healthz"))
        envoy = Service("envoy", [envoy_binary(), "-c", str(envoy_yaml), "--log-level", "warn",
                                  "--concurrency", "1", "--use-dynamic-base-id"],
                        workdir, functools.partial(wait_http, f"http://127.0.0.1:{admin}/ready"))
        try:
            processor.start()
            envoy.start()
            yield Running(f"http://127.0.0.1:{listen}", LOGICAL_MODEL, _pids(processor, envoy),
                          replay_jsonl=replay)
        finally:
            envoy.close()
            processor.close()


@dataclass(frozen=True)
class Peer:
    """A peer's PyPI distribution and how it is launched."""

    dist: str
    version: str
    command: tuple[str, ...]
    """The program in its environment's ``bin`` and the words before the flags."""
    log_level: str


VLLM_ROUTER = Peer("vllm-router", "0.1.17", ("vllm-router",), "warning")
SGLANG_ROUTER = Peer("sglang-router", "0.3.2", ("sglang-router", "launch"), "warn")


@dataclass
class PeerRouter:
    name: str
    peer: Peer
    policy: str
    home: Path | None = None
    """Where the peers' environments live (default: ``install.peers_home()``)."""
    _env: Path | None = None

    def prepare(self) -> None:
        if self._env is None:
            self._env = ensure(self.peer.dist, self.peer.version, home=self.home)

    def argv(self, pool: Pool, port: int, metrics_port: int) -> list[str]:
        if self._env is None:
            raise PeerMissing(f"{self.name} was not prepared")
        program, *words = self.peer.command
        # env execs the router (the same pid); RUST_LOG: its own --log-level leaves the
        # per-request lines of some modules on.
        return ["env", "RUST_LOG=warn", str(self._env / "bin" / program), *words,
                "--host", "127.0.0.1",
                "--port", str(port), "--worker-urls", *pool.workers, "--policy", self.policy,
                "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
                "--log-level", self.peer.log_level]

    @contextlib.contextmanager
    def start(self, pool: Pool, workdir: Path) -> Iterator[Running]:
        workdir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        service = Service(self.name.replace(":", "-"), self.argv(pool, port, free_port()),
                          workdir, functools.partial(wait_http, f"{url}/health", timeout=60.0))
        try:
            service.start()
            yield Running(url, pool.model, _pids(service))
        finally:
            service.close()


def standard(name: str, home: Path | None = None) -> Router:
    """The router called ``name`` (one of ``ROUTERS``)."""
    if name == "saar":
        return SaarRouter()
    peer_name, _, policy = name.partition(":")
    peers = {"vllm-router": VLLM_ROUTER, "sglang-router": SGLANG_ROUTER}
    if peer_name not in peers or not policy:
        raise ValueError(f"unknown router {name!r}; known: {', '.join(ROUTERS)}")
    return PeerRouter(name, peers[peer_name], policy, home)
