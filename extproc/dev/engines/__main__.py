"""``python -m extproc.dev.engines`` (``make engines``): install, once, what the suite and
``saar bench peers`` run beside saar, each in its own environment outside the checkout: vLLM's
CPU build and the tiny model it serves (the suite needs them: a failure fails the command),
NVIDIA Dynamo and the peers' routers (a failure is printed; the bench reports them missing)."""

from __future__ import annotations

import sys
import time

from ..bench.peers.install import PeerMissing, ensure
from ..bench.peers.routers import SGLANG_ROUTER, VLLM_ROUTER
from . import dynamo, vllm


def main() -> int:
    started = time.monotonic()
    vllm.install()
    print(f"vllm {vllm.VERSION}: {vllm.venv()}; tiny model: {vllm.tiny_model()}")
    try:
        print(f"dynamo: {dynamo.ensure_dynamo()}")
    except dynamo.DynamoUnavailable as exc:
        print(f"dynamo missing: {exc}", file=sys.stderr)
    for peer in (VLLM_ROUTER, SGLANG_ROUTER):
        try:
            print(f"{peer.dist} {peer.version}: {ensure(peer.dist, peer.version)}")
        except PeerMissing as exc:
            print(f"{peer.dist} missing: {exc}", file=sys.stderr)
    print(f"engines ready in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
