"""NVIDIA Dynamo 1.6.1 for the benches: its frontend, KV router and ``mocker`` workers, run on
loopback without etcd or NATS.

``ensure_dynamo`` installs it on first use into its own virtual environment under the engines'
cache (``~/.cache/saar-extproc/engines/dynamo-1.6.1``; ``$SAAR_ENGINES`` moves it).
``pip install ai-dynamo`` cannot work here: ``ai-dynamo`` requires ``aisimulate==0.13.0``, a
placeholder that downloads from a host these machines cannot reach (only Dynamo's planner imports
it). So both 1.6.1 wheels are downloaded, ``ai-dynamo-runtime`` and ``ai-dynamo``'s other
requirements (its wheel's ``Requires-Dist``, less extras and ``aisimulate``) are installed, then
``ai-dynamo`` with ``--no-deps``. A failed install raises ``DynamoUnavailable`` whose message is
the reason a bench reports (``{"missing": reason}``).

``dynamo_pool`` starts N mocker workers (simulated engines that publish KV events; no HTTP of
their own) and Dynamo's frontend with its router, discovering each other through a file store
(``--discovery-backend file``, ``DYN_FILE_KV``), with requests over TCP and KV events over ZMQ,
all on 127.0.0.1. ``router_mode="kv"`` lets Dynamo's KV router choose the worker; ``"direct"``
leaves the choice to an outside router, which names the worker with the header
``x-dynamo-worker-instance-id`` (a request without it is refused) — the same frontend either way,
so the two are measured through the same HTTP path. The worker ids come from each mocker's log
and are checked against the file store; a request asked with ``nvext.extra_fields:
["worker_id"]`` names its worker; ``usage.prompt_tokens_details.cached_tokens`` and the
frontend's ``dynamo_frontend_cached_tokens`` / ``dynamo_frontend_input_sequence_tokens`` give
the prefix hits.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

VERSION = "1.6.1"
PACKAGES = ("ai-dynamo", "ai-dynamo-runtime")
SKIPPED_REQUIREMENTS = frozenset({"aisimulate"})
"""``ai-dynamo``'s requirements left out: ``aisimulate`` 0.13.0 is a placeholder whose build
downloads from an unreachable host; only the planner (not run here) imports it."""
INSTALL_TIMEOUT = 900.0
MARKER = ".installed"
WORKER_HEADER = "x-dynamo-worker-instance-id"
"""Names the worker an outside router chose; Dynamo's frontend then sends the request there."""
ROUTER_MODES = ("kv", "round-robin", "random", "direct")
READY_TIMEOUT = 90.0


class DynamoUnavailable(RuntimeError):
    """Dynamo could not be installed or started; the message says why."""


def engines_cache() -> Path:
    """Where the engines' environments live, outside the repo (``$SAAR_ENGINES``, as for
    ``vllm``; default ``~/.cache/saar-extproc/engines``)."""
    configured = os.environ.get("SAAR_ENGINES")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "saar-extproc" / "engines"


def install_dir(cache: Path | None = None) -> Path:
    return (cache or engines_cache()) / f"dynamo-{VERSION}"


def venv_python(directory: Path) -> Path:
    return directory / "venv" / "bin" / "python"


def install_info(cache: Path | None = None) -> dict[str, Any] | None:
    """What the finished install recorded (seconds taken, bytes), or None if not installed."""
    marker = install_dir(cache) / MARKER
    try:
        info: dict[str, Any] = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return info if info.get("version") == VERSION else None


def ensure_dynamo(cache: Path | None = None) -> Path:
    """The Python of an environment holding Dynamo 1.6.1, installed there first if needed.

    One install at a time (a lock file beside it); an unfinished one is wiped and redone. pip's
    output goes to ``install.log`` in the install directory. Raises ``DynamoUnavailable`` with
    the reason when the install fails (the partial environment is removed, the log kept)."""
    directory = install_dir(cache)
    python = venv_python(directory)
    if install_info(cache) is not None and python.exists():
        return python
    directory.parent.mkdir(parents=True, exist_ok=True)
    with (directory.parent / f"dynamo-{VERSION}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if install_info(cache) is not None and python.exists():
            return python
        started = time.monotonic()
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        with (directory / "install.log").open("w") as log:
            try:
                _install(directory, log)
            except (DynamoUnavailable, OSError, subprocess.SubprocessError,
                    zipfile.BadZipFile, KeyError, StopIteration) as error:
                shutil.rmtree(directory / "venv", ignore_errors=True)
                if isinstance(error, DynamoUnavailable):
                    raise
                raise DynamoUnavailable(f"dynamo {VERSION} install failed: "
                                        f"{type(error).__name__}: {error}") from error
            finally:
                shutil.rmtree(directory / "wheels", ignore_errors=True)
        info = {"version": VERSION, "seconds": round(time.monotonic() - started, 1),
                "bytes": _size(directory / "venv")}
        (directory / MARKER).write_text(json.dumps(info) + "\n")
    return python


def _install(directory: Path, log: IO[str]) -> None:
    wheels = directory / "wheels"
    _step([sys.executable, "-m", "venv", str(directory / "venv")], "create venv", log)
    python = str(venv_python(directory))
    pip = [python, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _step([*pip, "download", "--no-deps", "-d", str(wheels),
           *(f"{name}=={VERSION}" for name in PACKAGES)], "download the wheels", log)
    frontend = _wheel(wheels, "ai_dynamo-")
    runtime = _wheel(wheels, "ai_dynamo_runtime-")
    requirements = wheel_requirements(frontend)
    _step([*pip, "install", str(runtime), *requirements], "install ai-dynamo-runtime and the "
          "requirements of ai-dynamo", log)
    _step([*pip, "install", "--no-deps", str(frontend)], "install ai-dynamo", log)
    _step([python, "-c", "import dynamo.frontend, dynamo.mocker, dynamo.llm"],
          "import dynamo", log)


def _wheel(wheels: Path, prefix: str) -> Path:
    found = sorted(path for path in wheels.glob(f"{prefix}{VERSION}-*.whl"))
    if not found:
        raise DynamoUnavailable(f"pip download left no {prefix}{VERSION} wheel in {wheels}")
    return found[0]


_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def wheel_requirements(wheel: Path) -> list[str]:
    """The wheel's ``Requires-Dist`` lines, less extras, itself, the runtime (installed from its
    wheel) and ``SKIPPED_REQUIREMENTS``; markers kept for pip to judge."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(item for item in archive.namelist()
                    if item.endswith(".dist-info/METADATA") and item.count("/") == 1)
        metadata = archive.read(name).decode()
    return requirements_of(metadata)


def requirements_of(metadata: str) -> list[str]:
    kept: list[str] = []
    for line in metadata.splitlines():
        if not line:
            break  # the headers end at the first blank line; the description follows
        if not line.startswith("Requires-Dist:"):
            continue
        requirement = line.split(":", 1)[1].strip()
        marker = requirement.split(";", 1)[1] if ";" in requirement else ""
        if re.search(r"\bextra\s*==", marker):
            continue
        match = _NAME.match(requirement)
        if match is None:
            continue
        name = re.sub(r"[-_.]+", "-", match.group(1)).lower()
        if name in SKIPPED_REQUIREMENTS or name in PACKAGES:
            continue
        kept.append(requirement)
    return kept


def _step(argv: Sequence[str], what: str, log: IO[str]) -> None:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True,
                              timeout=INSTALL_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as error:
        raise DynamoUnavailable(f"dynamo {VERSION}: {what} timed out after "
                                f"{INSTALL_TIMEOUT:.0f}s") from error
    log.write(f"$ {' '.join(argv)}\n{done.stdout}{done.stderr}\n")
    log.flush()
    if done.returncode != 0:
        tail = " | ".join(line.strip() for line in
                          (done.stderr or done.stdout).strip().splitlines()[-3:])
        raise DynamoUnavailable(f"dynamo {VERSION}: {what} failed "
                                f"(exit {done.returncode}): {tail}")


def _size(path: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += (Path(root) / name).lstat().st_size
    return total


CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{%- if messages and messages[0].role == 'system' %}"
    "{{ messages[0].content }}\n\n{%- endif %}# Tools\n<tools>\n{%- for tool in tools %}\n"
    "{{ tool | tojson }}{%- endfor %}\n</tools><|im_end|>\n{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (tools and loop.first and message.role == 'system') %}"
    "<|im_start|>{{ message.role }}\n"
    "{%- if message.content is string %}{{ message.content }}"
    "{%- elif message.content %}{%- for part in message.content %}"
    "{%- if part.text is defined %}{{ part.text }}{%- endif %}{%- endfor %}{%- endif %}"
    "<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>")


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes (what a byte-level BPE's vocab holds)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    shifted = 0
    out: dict[int, str] = {}
    for byte in range(256):
        if byte in printable:
            out[byte] = chr(byte)
        else:
            out[byte] = chr(256 + shifted)
            shifted += 1
    return [out[byte] for byte in range(256)]


def minimal_model_dir(directory: Path, *, max_len: int = 32768) -> Path:
    """A model directory with no weights that Dynamo's mocker and frontend accept: a Qwen2
    ``config.json``, a byte-level BPE ``tokenizer.json`` with no merges (one token a byte) and
    a ChatML template. Written by hand, no library needed; for when the project's tiny model
    builder is not at hand."""
    directory.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    vocab = {symbol: index for index, symbol in enumerate(alphabet)}
    added = [{"id": 256 + index, "content": token, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for index, token in enumerate(SPECIAL_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": True}
    tokenizer: dict[str, Any] = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": None, "pre_tokenizer": byte_level, "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": []},
    }
    vocab_size = 256 + len(SPECIAL_TOKENS)
    eos = 256 + SPECIAL_TOKENS.index("<|im_end|>")
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": vocab_size,
        "hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
        "max_position_embeddings": max_len, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
        "torch_dtype": "bfloat16", "tie_word_embeddings": True, "bos_token_id": 256,
        "eos_token_id": eos,
    }
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": max_len,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "chat_template": CHATML_TEMPLATE,
        "added_tokens_decoder": {str(item["id"]): {key: value for key, value in item.items()
                                                   if key != "id"} for item in added},
    }
    generation = {"bos_token_id": 256, "eos_token_id": [eos, 256]}
    for name, content in (("config.json", config), ("tokenizer.json", tokenizer),
                          ("tokenizer_config.json", tokenizer_config),
                          ("generation_config.json", generation)):
        (directory / name).write_text(json.dumps(content, indent=1, ensure_ascii=False) + "\n")
    return directory


_TINY_TOKENIZER = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import tiny_model
from tokenizers import Tokenizer
directory = Path(sys.argv[2])
directory.mkdir(parents=True, exist_ok=True)
tiny_model.build_tokenizer(directory)
tokens = Tokenizer.from_file(str(directory / "tokenizer.json"))
bos, eos = tokens.token_to_id("<|endoftext|>"), tokens.token_to_id("<|im_end|>")
config = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
          "vocab_size": tokens.get_vocab_size(), "hidden_size": 256, "intermediate_size": 512,
          "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 64, "max_position_embeddings": tiny_model.MAX_MODEL_LEN,
          "tie_word_embeddings": True, "torch_dtype": "float32", "bos_token_id": bos,
          "eos_token_id": eos}
(directory / "config.json").write_text(json.dumps(config, indent=1) + "\\n")
(directory / "generation_config.json").write_text(
    json.dumps({"bos_token_id": bos, "eos_token_id": eos}) + "\\n")
"""


def mocker_model_dir(directory: Path, python: Path | None = None) -> Path:
    """The project's tiny model (``tiny_model``: its tokenizer, chat template and Qwen2 shape)
    without weights, which the mocker does not read: built by Dynamo's own environment, which has
    ``tokenizers`` but no torch. Token counts then match a real vLLM serving the tiny model."""
    python = python or ensure_dynamo()
    done = subprocess.run([str(python), "-c", _TINY_TOKENIZER, str(Path(__file__).parent),
                           str(directory)], capture_output=True, text=True, timeout=300,
                          check=False)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise DynamoUnavailable(f"the tiny model's tokenizer could not be built: {tail}")
    return directory


@dataclass(frozen=True)
class Worker:
    """One mocker worker: its instance id (what ``x-dynamo-worker-instance-id`` names and
    ``nvext.worker_id`` reports) and its process."""

    instance_id: int
    pid: int
    log: Path


@dataclass(frozen=True)
class PrefixHits:
    """The frontend's running totals of prompt tokens and of those found cached on the serving
    worker (``dynamo_frontend_cached_tokens_sum``, ``dynamo_frontend_input_sequence_tokens_sum``);
    take the difference of two readings for a run."""

    cached_tokens: float
    prompt_tokens: float
    requests: float

    def __sub__(self, other: PrefixHits) -> PrefixHits:
        return PrefixHits(self.cached_tokens - other.cached_tokens,
                          self.prompt_tokens - other.prompt_tokens,
                          self.requests - other.requests)

    @property
    def ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class DynamoPool:
    """A running frontend and its mocker workers (see ``dynamo_pool``)."""

    url: str
    """The frontend's base URL, ``http://127.0.0.1:PORT`` (OpenAI paths under ``/v1``)."""
    model: str
    router_mode: str
    frontend_pid: int
    workers: list[Worker]
    workdir: Path
    store: Path
    """The file store (``DYN_FILE_KV``) through which the processes find each other."""
    started_s: float
    """Seconds from the first process started to every worker answering through the frontend."""
    block_size: int
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def worker_ids(self) -> list[int]:
        return [worker.instance_id for worker in self.workers]

    @property
    def pids(self) -> list[int]:
        """The frontend's process id first, then the workers'."""
        return [self.frontend_pid, *(worker.pid for worker in self.workers)]

    def headers_for(self, instance_id: int) -> dict[str, str]:
        """What an outside router adds to send a request to that worker."""
        return {WORKER_HEADER: str(instance_id)}

    def metrics_text(self, timeout: float = 5.0) -> str:
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=timeout) as response:
            return str(response.read().decode())

    def metrics(self) -> dict[str, float]:
        """The frontend's Prometheus samples, summed over labels, by name."""
        return sum_samples(self.metrics_text())

    def prefix_hits(self) -> PrefixHits:
        samples = self.metrics()
        return PrefixHits(samples.get("dynamo_frontend_cached_tokens_sum", 0.0),
                          samples.get("dynamo_frontend_input_sequence_tokens_sum", 0.0),
                          samples.get("dynamo_frontend_input_sequence_tokens_count", 0.0))

    def registered_instances(self) -> list[int]:
        """The worker instances the file store lists now (the ``generate`` endpoint's)."""
        return registered_instances(self.store)


def sum_samples(text: str) -> dict[str, float]:
    """Prometheus text: each sample's value added up by metric name, over its labels."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)[0], line.rsplit("}", 1)[1].split()
        else:
            name, *rest = line.split()
        with contextlib.suppress(ValueError, IndexError):
            totals[name] = totals.get(name, 0.0) + float(rest[0])
    return totals


def registered_instances(store: Path) -> list[int]:
    found: list[int] = []
    for path in sorted((store / "v1" / "instances").glob("*")):
        with contextlib.suppress(OSError, ValueError):
            entry = json.loads(path.read_text())
            if entry.get("endpoint") == "generate" and entry.get("component") == "backend":
                found.append(int(entry["instance_id"]))
    return found


def _env(store: Path) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("DYN_", "ETCD_", "NATS_"))}
    env.update({
        "DYN_FILE_KV": str(store),
        "DYN_TCP_RPC_HOST": "127.0.0.1",
        "DYN_TCP_RESPONSE_STREAM_HOST": "127.0.0.1",
        "DYN_EVENT_PLANE_HOST": "127.0.0.1",
        "HF_HUB_OFFLINE": "1",
        "NO_COLOR": "1",
        "PYTHONUNBUFFERED": "1",
    })
    return env


PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_WORKER_ID = re.compile(r"KvEventPublisher for worker (\d+)|FPM direct publisher started "
                        r"worker_id=(\d+)")


def _worker_id_in_log(log: Path) -> int | None:
    with contextlib.suppress(OSError):
        match = _WORKER_ID.search(_ANSI.sub("", log.read_text(errors="replace")))
        if match:
            return int(match.group(1) or match.group(2))
    return None


@contextlib.contextmanager
def dynamo_pool(model_dir: Path, *, workers: int = 2, router_mode: str = "kv",
                model_name: str = "tiny", workdir: Path | None = None, block_size: int = 16,
                speedup_ratio: float = 1.0, port: int | None = None,
                mocker_args: Sequence[str] = (), frontend_args: Sequence[str] = (),
                env: Mapping[str, str] | None = None, python: Path | None = None,
                ready_timeout: float = READY_TIMEOUT) -> Iterator[DynamoPool]:
    """Start ``workers`` mocker workers serving ``model_dir`` as ``model_name`` and Dynamo's
    frontend on 127.0.0.1 routing with ``router_mode``; yield the pool once every worker has
    answered a request pinned to it through the frontend; stop every process group on exit.

    ``router_mode`` is the frontend's ``--router-mode``: ``kv`` (Dynamo's KV router chooses),
    or ``round-robin`` / ``random`` / ``direct`` for a frontend that does not choose by KV, so
    that an outside router names the worker with ``x-dynamo-worker-instance-id`` (it overrides
    any mode).
    ``direct``: the frontend never chooses; a request without the header is refused (400).
    Readiness sends one one-token request pinned to each worker (counted in the frontend's
    metrics: read ``prefix_hits`` before and after a run). Installs Dynamo first if needed
    (``DynamoUnavailable`` if it cannot, or if a process exits before the pool is ready)."""
    if router_mode not in ROUTER_MODES:
        raise ValueError(f"router_mode {router_mode!r} not in {ROUTER_MODES}")
    python = python or ensure_dynamo()
    from ..harness import free_port

    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dynamo-")))
        workdir.mkdir(parents=True, exist_ok=True)
        store = workdir / "store"
        shutil.rmtree(store, ignore_errors=True)
        store.mkdir()
        environment = _env(store)
        environment.update(env or {})
        procs: list[subprocess.Popen[bytes]] = []
        stack.callback(stop_processes, procs)
        started = time.monotonic()

        def spawn(name: str, argv: list[str]) -> subprocess.Popen[bytes]:
            with (workdir / f"{name}.log").open("wb") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, cwd=workdir,
                                        env=environment, start_new_session=True)
            procs.append(proc)
            return proc

        mockers = [spawn(f"mocker-{index}", [
            str(python), "-m", "dynamo.mocker", "--model-path", str(model_dir),
            "--model-name", model_name, "--block-size", str(block_size),
            "--speedup-ratio", str(speedup_ratio), *PLANES, *mocker_args])
            for index in range(workers)]
        http_port = port or free_port()
        frontend = spawn("frontend", [
            str(python), "-m", "dynamo.frontend", "--http-host", "127.0.0.1",
            "--http-port", str(http_port), "--router-mode", router_mode, *PLANES,
            *frontend_args])
        url = f"http://127.0.0.1:{http_port}"
        found = _wait_workers(workdir, store, mockers, procs, workers, ready_timeout)
        pool = DynamoPool(url=url, model=model_name, router_mode=router_mode,
                          frontend_pid=frontend.pid, workers=found, workdir=workdir,
                          store=store, started_s=0.0, block_size=block_size, procs=procs)
        _wait_served(pool, procs, started + ready_timeout)
        pool.started_s = round(time.monotonic() - started, 3)
        yield pool


def _check_alive(procs: Sequence[subprocess.Popen[bytes]], workdir: Path) -> None:
    for proc in procs:
        if proc.poll() is not None:
            args = [str(arg) for arg in proc.args] if isinstance(proc.args, list) else []
            name = next((arg for arg in args if arg.startswith("dynamo.")), "dynamo")
            logs = sorted(workdir.glob("*.log"))
            tail = ""
            for log in logs:
                with contextlib.suppress(OSError):
                    text = _ANSI.sub("", log.read_text(errors="replace")).strip().splitlines()
                    errors = [line for line in text if "ERROR" in line or "Error" in line]
                    if errors:
                        tail = errors[-1][-300:]
            raise DynamoUnavailable(f"{name} (pid {proc.pid}) exited with {proc.returncode}"
                                    + (f": {tail}" if tail else f"; logs in {workdir}"))


def _wait_workers(workdir: Path, store: Path, mockers: Sequence[subprocess.Popen[bytes]],
                  procs: Sequence[subprocess.Popen[bytes]], count: int,
                  timeout: float) -> list[Worker]:
    deadline = time.monotonic() + timeout
    while True:
        _check_alive(procs, workdir)
        ids = {index: _worker_id_in_log(workdir / f"mocker-{index}.log")
               for index in range(count)}
        registered = set(registered_instances(store))
        if all(value is not None and value in registered for value in ids.values()):
            return [Worker(instance_id=int(ids[index] or 0), pid=mockers[index].pid,
                           log=workdir / f"mocker-{index}.log") for index in range(count)]
        if time.monotonic() > deadline:
            raise DynamoUnavailable(f"dynamo workers did not register in {timeout:.0f}s "
                                    f"(logs: {ids}, store: {sorted(registered)}; {workdir})")
        time.sleep(0.05)


def probe_body(model: str, text: str, *, max_tokens: int = 1,
               stream: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": text}],
                            "max_tokens": max_tokens, "stream": stream,
                            "nvext": {"extra_fields": ["worker_id"]}}
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


def served_by(answer: Mapping[str, Any]) -> int | None:
    """The worker that served a response (or chunk) asked with
    ``nvext.extra_fields: ["worker_id"]``: its decode worker's instance id."""
    nvext = answer.get("nvext")
    if not isinstance(nvext, Mapping):
        return None
    worker = nvext.get("worker_id")
    if isinstance(worker, Mapping):
        worker = worker.get("decode_worker_id", worker.get("prefill_worker_id"))
    return int(worker) if isinstance(worker, int | str) and str(worker).isdigit() else None


def _wait_served(pool: DynamoPool, procs: Sequence[subprocess.Popen[bytes]],
                 deadline: float) -> None:
    """Until a request pinned to each worker comes back from that worker through the
    frontend (the frontend has discovered the model and every worker)."""
    pending = list(pool.worker_ids)
    last = ""
    while pending:
        _check_alive(procs, pool.workdir)
        instance = pending[0]
        body = json.dumps(probe_body(pool.model, "ping")).encode()
        request = urllib.request.Request(
            f"{pool.url}/v1/chat/completions", data=body, method="POST",
            headers={"content-type": "application/json", **pool.headers_for(instance)})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                answer = json.loads(response.read())
            if served_by(answer) == instance:
                pending.pop(0)
                continue
            last = f"served by {served_by(answer)}, not {instance}"
        except (OSError, ValueError) as error:
            last = str(error)
        if time.monotonic() > deadline:
            raise DynamoUnavailable(f"dynamo frontend at {pool.url} did not serve worker "
                                    f"{instance}: {last} (logs in {pool.workdir})")
        time.sleep(0.1)


def stop_processes(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 10.0) -> None:
    """SIGTERM each process group (each was started in its own session), wait, then SIGKILL
    whatever group is left."""
    for proc in reversed(procs):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.wait()
