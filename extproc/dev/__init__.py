"""Not the service: the simulator, evaluations, benchmarks, the harness and the demo."""

from pathlib import Path

EXAMPLE_CONFIG = Path(__file__).resolve().parents[2] / "config" / "example.yaml"
"""The checkout's ``config/example.yaml``, the demo's and the benchmarks' default (found from
any working directory)."""
