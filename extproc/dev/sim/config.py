"""Simulator settings and their command-line flags (``saar sim-server ...``)."""

from __future__ import annotations

import argparse
import re
import secrets
from dataclasses import dataclass, fields

_INSTANCE_ID = re.compile(r"[!#-\[\]-~]+")
"""Printable ASCII without space, quote or backslash: safe inside ids, JSON and headers."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One simulated vLLM instance. Defaults keep a typical request well under 50 ms."""

    host: str = "127.0.0.1"
    port: int = 8101
    model: str = "qwen3-8b"
    served_aliases: tuple[str, ...] = ()
    instance_id: str = ""
    """Tag inside every id this instance issues; defaults to ``sim-<port>``."""
    block_size: int = 16
    num_gpu_blocks: int = 2048
    max_num_seqs: int = 64
    max_model_len: int = 131072
    prefill_tokens_per_s: float = 100_000.0
    decode_tokens_per_s: float = 2_000.0
    output_tokens: int = 16
    fail_every: int = 0
    """Every Nth API request gets a 503; 0 disables."""
    time_scale: float = 1.0
    """Multiplies every simulated delay; 0 answers without sleeping."""
    max_body_bytes: int = 32 * 1024 * 1024
    tokenizer: str | None = None
    """Path of a ``tokenizer.json``, or of a model directory (its tokenizer and chat template):
    the prefix cache then works on real token ids, and with a template a chat request's tokens,
    counts and cached blocks are the ones vLLM computes for it."""
    kv_events_endpoint: str | None = None
    """ZMQ endpoint to bind a PUB socket on and publish vLLM KV events (needs ``tokenizer``)."""
    kv_events_topic: str = ""
    """vLLM's default: the empty topic."""
    num_cpu_blocks: int = 0
    """Host-memory KV tier, in blocks: what the router's demote hints move there (0: none)."""
    cpu_tokens_per_s: float = 400_000.0
    """Host-to-device copy rate: a prompt's blocks found in host memory cost this, not a
    prefill."""
    record_dir: str | None = None
    """Write every API request (path, headers without secrets, body) here as NNNNN.json: how
    the agent CLIs' fixtures under tests/apis/recorded were captured."""
    role: str = "both"
    """``prefill``, ``decode`` or ``both``. A decode (or both) worker plays llm-d's routing
    sidecar: a request carrying ``x-prefiller-host-port`` is prefilled there first, and its KV
    comes over at ``kv_transfer_tokens_per_s``."""
    kv_transfer_tokens_per_s: float = 1_000_000.0
    lora_modules: tuple[str, ...] = ()
    """LoRA adapters of the model it serves (vLLM ``--lora-modules NAME=path``)."""
    max_loras: int = 4
    """Adapters in GPU slots at once (vLLM ``--max-loras``); loading one costs
    ``lora_load_seconds``, evicting the least recently used idle one."""
    lora_load_seconds: float = 0.05

    def __post_init__(self) -> None:
        if not self.instance_id:
            tag = str(self.port) if self.port else secrets.token_hex(3)
            object.__setattr__(self, "instance_id", f"sim-{tag}")
        if not _INSTANCE_ID.fullmatch(self.instance_id):
            raise ValueError(f"instance_id must match {_INSTANCE_ID.pattern}: {self.instance_id!r}")
        if min(self.block_size, self.num_gpu_blocks, self.max_num_seqs, self.max_model_len) < 1:
            raise ValueError("block_size, num_gpu_blocks, max_num_seqs, max_model_len must be >= 1")
        if self.num_cpu_blocks < 0:
            raise ValueError("num_cpu_blocks must be >= 0")
        rates = (self.prefill_tokens_per_s, self.decode_tokens_per_s, self.cpu_tokens_per_s)
        if min(rates) <= 0 or self.time_scale < 0:
            raise ValueError("token rates must be positive and time_scale non-negative")
        if self.role not in ("prefill", "decode", "both"):
            raise ValueError(f"role must be prefill, decode or both: {self.role!r}")
        if self.max_loras < 1 or self.kv_transfer_tokens_per_s <= 0 or self.lora_load_seconds < 0:
            raise ValueError("max_loras, kv_transfer_tokens_per_s must be positive")
        if self.kv_events_endpoint and not self.tokenizer:
            raise ValueError("kv_events_endpoint needs a tokenizer: events carry token ids")

    @property
    def served_names(self) -> tuple[str, ...]:
        return (self.model, *self.served_aliases, *self.lora_modules)

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> SimConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in vars(args).items() if k in known and v is not None}
        for name in ("served_aliases", "lora_modules"):
            if name in values:
                values[name] = tuple(values[name])
        return cls(**values)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``sim-server`` flags; every one maps onto a ``SimConfig`` field of the same name."""
    d = SimConfig(instance_id="defaults")
    parser.add_argument("--host", default=d.host, help=f"address to listen on (default {d.host})")
    parser.add_argument("--port", type=int, default=d.port, help=f"port (default {d.port})")
    parser.add_argument("--model", default=d.model, help="served model name")
    parser.add_argument(
        "--served-alias",
        dest="served_aliases",
        action="append",
        metavar="NAME",
        help="another name the model answers to (repeatable)",
    )
    parser.add_argument("--instance-id", help="tag in issued ids (default sim-<port>)")
    parser.add_argument("--block-size", type=int, default=d.block_size,
                        help="tokens per KV block (vLLM --block-size)")
    parser.add_argument("--num-gpu-blocks", type=int, default=d.num_gpu_blocks,
                        help="device KV pool in blocks")
    parser.add_argument("--max-num-seqs", type=int, default=d.max_num_seqs,
                        help="sequences decoded at once; more wait")
    parser.add_argument("--max-model-len", type=int, default=d.max_model_len,
                        help="context window in tokens (GET /v1/models max_model_len)")
    parser.add_argument("--prefill-tokens-per-s", type=float, default=d.prefill_tokens_per_s,
                        help="prompt tokens computed per second (cached ones are free)")
    parser.add_argument("--decode-tokens-per-s", type=float, default=d.decode_tokens_per_s,
                        help="output tokens per second per sequence")
    parser.add_argument("--output-tokens", type=int, default=d.output_tokens,
                        help="tokens in an answer without max_tokens")
    parser.add_argument("--fail-every", type=int, default=d.fail_every, metavar="N",
                        help="answer every Nth request with 503 (0: never)")
    parser.add_argument("--time-scale", type=float, default=d.time_scale,
                        help="multiply every simulated delay (0: answer at once)")
    parser.add_argument("--tokenizer", metavar="PATH",
                        help="tokenizer.json, or a model directory (its chat template too), "
                             "for real token ids")
    parser.add_argument(
        "--kv-events-endpoint",
        metavar="ENDPOINT",
        help="bind a ZMQ PUB socket here (e.g. tcp://127.0.0.1:5557) and publish vLLM KV events",
    )
    parser.add_argument("--kv-events-topic", default=d.kv_events_topic,
                        help="topic of the KV events (vLLM kv_events_config.topic)")
    parser.add_argument("--num-cpu-blocks", type=int, default=d.num_cpu_blocks,
                        help="host-memory KV tier in blocks, filled by demote hints (0: none)")
    parser.add_argument("--cpu-tokens-per-s", type=float, default=d.cpu_tokens_per_s,
                        help="host-to-device KV copy rate")
    parser.add_argument("--record-dir", metavar="DIR",
                        help="write every API request (headers without secrets, body) here, as "
                        "INSTANCE-NNNNN.json: several simulators may share DIR")
    parser.add_argument("--role", default=d.role, choices=("prefill", "decode", "both"),
                        help="its phase in a disaggregated pool (a decode worker honours "
                             "x-prefiller-host-port as llm-d's sidecar does)")
    parser.add_argument("--kv-transfer-tokens-per-s", type=float,
                        default=d.kv_transfer_tokens_per_s,
                        help="KV transfer rate from a prefill worker (tokens per second)")
    parser.add_argument("--lora-module", dest="lora_modules", action="append", metavar="NAME",
                        help="a LoRA adapter it serves (repeatable)")
    parser.add_argument("--max-loras", type=int, default=d.max_loras,
                        help="adapters held in GPU slots at once (vLLM --max-loras)")
    parser.add_argument("--lora-load-seconds", type=float, default=d.lora_load_seconds,
                        help="what loading an adapter into a slot costs")
