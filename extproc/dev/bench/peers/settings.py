"""What a ``saar bench peers`` run is asked for, and the names it knows: light enough for the
CLI to read its defaults without importing the bench."""

from __future__ import annotations

from dataclasses import dataclass

WORKLOADS = ("agents", "agents_no_session", "shared_prefix", "oversubscribed")
ROUTERS = ("saar", "vllm-router:cache_aware", "vllm-router:consistent_hash",
           "vllm-router:round_robin", "sglang-router:cache_aware")
"""The standard set, in the report's order."""
DYNAMO_ROUTERS = ("saar", "dynamo:kv", "dynamo:kv_affinity")
"""What runs over Dynamo's mockers when the standard set is asked for: saar (choosing the
worker through Dynamo's frontend) and Dynamo's own KV router, without and with its session
affinity."""
BACKENDS = ("sim", "vllm", "dynamo")


@dataclass(frozen=True)
class Settings:
    backend: str = "sim"
    routers: tuple[str, ...] = ROUTERS
    workloads: tuple[str, ...] = WORKLOADS
    sessions: int = 12
    turns: int = 8
    rounds: int = 2
    seed: int = 0
    oversubscription: float = 3.0
    """Live context over the pool's KV in the oversubscribed workload."""
    workers: int = 4
    """Workers the sim backend starts."""
    c1_pairs: int = 100
    c16_seconds: float = 3.0
    concurrency: int = 16
    trace: str | None = None
    """A Mooncake JSONL file replacing the generated shared-prefix trace."""
    workdir: str | None = None
    """Keep configs and logs here (default: a temporary directory)."""
