"""What a config needs from the machine, checked before the service starts: the files it names
can be read (or, for the replay sinks, written), its ports can be bound, and (``saar check``
only) the shared store answers. Each problem is one line that names the dotted key, so
``saar serve`` fails with that line instead of a traceback, and ``saar check`` lists them all.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable
from pathlib import Path

from ..config import Config, ConfigError
from ..state.cluster import connect
from .admin import load_token

Check = Callable[[Config], list[str]]


def file_problems(config: Config) -> list[str]:
    """Files the config reads at start that are missing or unreadable, and sinks it cannot
    create."""
    problems: list[str] = []
    secret = config.identity.tenant_secret_file
    if secret:
        problems += _readable("identity.tenant_secret_file", secret)
        if not problems and len(Path(secret).read_bytes().strip()) < 16:
            problems.append(f"identity.tenant_secret_file: {secret} holds fewer than 16 bytes")
    try:
        load_token(config.admin)
    except ConfigError as exc:
        problems.append(str(exc))
    tls = config.server.tls
    if tls.enabled and tls.cert_file and tls.key_file:
        for key, path, marker in (("cert_file", tls.cert_file, b"CERTIFICATE"),
                                  ("key_file", tls.key_file, b"PRIVATE KEY")):
            found = _readable(f"server.tls.{key}", path)
            if not found and marker not in Path(path).read_bytes():
                found = [f"server.tls.{key}: {path} is not a PEM {marker.decode().lower()}"]
            problems += found
    if tls.enabled and tls.client_ca_file:
        found = _readable("server.tls.client_ca_file", tls.client_ca_file)
        if not found and b"CERTIFICATE" not in Path(tls.client_ca_file).read_bytes():
            found = [f"server.tls.client_ca_file: {tls.client_ca_file} is not a PEM "
                     "certificate"]
        problems += found
    scheduling = config.scheduling
    if scheduling.workers_file:
        problems += _readable("scheduling.workers_file", scheduling.workers_file)
    if scheduling.prefix.tokenizer:
        where = Path(scheduling.prefix.tokenizer)
        problems += _readable("scheduling.prefix.tokenizer",
                              str(where / "tokenizer.json" if where.is_dir() else where))
    for key in ("jsonl_path", "mooncake_trace_path"):
        path = getattr(config.replay, key)
        if path:
            problems += _writable(f"replay.{key}", path)
    return problems


def port_problems(config: Config) -> list[str]:
    """Ports of the config that this host cannot bind (in use, not permitted, no such
    address), and ports the config gives twice."""
    server = config.server
    ports = {"server.grpc_port": (server.host, server.grpc_port),
             "server.http_port": (server.http_host, server.http_port)}
    if server.health_port is not None:
        ports["server.health_port"] = (server.host, server.health_port)
    problems: list[str] = []
    seen: dict[int, str] = {}
    for key, (host, port) in ports.items():
        if port == 0:
            continue
        if port in seen:
            problems.append(f"{key}: {port} is also {seen[port]}")
            continue
        seen[port] = key
        problem = _bind(host, port)
        if problem:
            problems.append(f"{key}: cannot listen on {host}:{port}: {problem}")
    return problems


def store_problems(config: Config, timeout: float = 2.0) -> list[str]:
    """The shared store does not answer a PING (only with ``state.store: redis``)."""
    if config.state.store != "redis":
        return []
    async def ping() -> None:
        client = connect(config.state.redis_url)
        try:
            await asyncio.wait_for(client.ping(), timeout)
        finally:
            await client.close()

    try:
        asyncio.run(ping())
    except Exception as exc:
        return [f"state.redis_url: {config.state.redis_url} does not answer "
                f"({type(exc).__name__}: {exc or 'timed out'})"]
    return []


def _readable(key: str, path: str) -> list[str]:
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        return [f"{key}: cannot read {path}: {exc.strerror or exc}"]
    return []


def _writable(key: str, path: str) -> list[str]:
    """Whether the file can be appended to, or created with its missing folders."""
    target = Path(path)
    if target.exists():
        if target.is_dir():
            return [f"{key}: {path} is a directory"]
        return [] if os.access(target, os.W_OK) else [f"{key}: {path} is not writable"]
    folder = target.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        return [f"{key}: {folder} is not a directory"]
    if not os.access(folder, os.W_OK | os.X_OK):
        return [f"{key}: cannot create {path}: {folder} is not writable"]
    return []


def _bind(host: str, port: int) -> str | None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        return f"no such address ({exc.strerror})"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        # As the servers bind: an address left in TIME_WAIT by a restart is not "in use".
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            return exc.strerror or str(exc)
    return None
