"""NVIDIA Dynamo 1.6.1 as the benches run it: installed on first use into its own environment,
two mocker workers behind Dynamo's frontend on loopback, without etcd or NATS.

End to end: the worker ids the pool reports are the ones the file store lists and the ones
responses name (``nvext.worker_id``); ``x-dynamo-worker-instance-id`` pins a request to a worker,
in the KV router's mode and in ``direct`` mode (where the frontend never chooses and a request
without the header is refused); a repeated prompt comes back with cached tokens, and the
frontend's counters add up to what the responses said; nothing is left running after.
Skipped only when Dynamo cannot be installed here, with the reason.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from extproc.dev.engines import dynamo

MODEL = "tiny-dynamo"
PROMPT = "You are a careful coding agent. Read the repository before you change it. " * 6


@pytest.fixture(scope="module")
def dynamo_python() -> Path:
    try:
        return dynamo.ensure_dynamo()
    except dynamo.DynamoUnavailable as error:
        print(f"dynamo unavailable: {error}")
        pytest.skip(f"dynamo {dynamo.VERSION} unavailable: {error}")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A hand-written byte-level tokenizer: one token a byte."""
    return dynamo.minimal_model_dir(tmp_path_factory.mktemp("dynamo-model"))


@pytest.fixture(scope="module")
def tiny_model_dir(dynamo_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project's tiny model (the tokenizer and template a real vLLM serves) without weights."""
    return dynamo.mocker_model_dir(tmp_path_factory.mktemp("tiny-model"), dynamo_python)


def stream_chat(pool: dynamo.DynamoPool, text: str, headers: dict[str, str] | None = None,
                ) -> tuple[int, set[int], dict[str, Any] | None, float]:
    """One streamed chat completion on a new connection: status, the workers the chunks name,
    the usage, and seconds to the first chunk."""
    body = dynamo.probe_body(pool.model, text, max_tokens=4, stream=True)
    served: set[int] = set()
    usage = None
    started = time.perf_counter()
    first = 0.0
    with httpx.Client(timeout=30) as client, client.stream(
            "POST", f"{pool.url}/v1/chat/completions", json=body, headers=headers or {}) as reply:
        if reply.status_code != 200:
            reply.read()
            return reply.status_code, served, None, 0.0
        for line in reply.iter_lines():
            if not line.startswith("data: {"):
                continue
            first = first or time.perf_counter() - started
            chunk = json.loads(line.removeprefix("data: "))
            worker = dynamo.served_by(chunk)
            if worker is not None:
                served.add(worker)
            usage = chunk.get("usage") or usage
    return 200, served, usage, first


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_requirements_come_from_the_wheel_less_aisimulate_extras_and_the_runtime() -> None:
    metadata = "\n".join([
        "Metadata-Version: 2.4", "Name: ai-dynamo", "Version: 1.6.1",
        "Requires-Dist: ai-dynamo-runtime==1.6.1",
        "Requires-Dist: aiohttp<4.0,>=3.14.3",
        "Requires-Dist: aisimulate==0.13.0; python_version >= '3.11' and python_version < '3.14'",
        "Requires-Dist: transformers>=4.56.0",
        "Requires-Dist: tomli; python_version < '3.11'",
        "Requires-Dist: vllm[flashinfer]==0.31.0; extra == 'vllm'",
        "", "Requires-Dist: not-a-header-but-description",
    ])
    assert dynamo.requirements_of(metadata) == [
        "aiohttp<4.0,>=3.14.3", "transformers>=4.56.0", "tomli; python_version < '3.11'"]


def test_a_failed_install_raises_the_reason_and_leaves_no_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def failing(directory: Path, log: Any) -> None:
        (directory / "venv").mkdir()
        dynamo._step([sys.executable, "-c", "import sys; sys.exit('no route to host')"],
                     "download the wheels", log)

    monkeypatch.setattr(dynamo, "_install", failing)
    with pytest.raises(dynamo.DynamoUnavailable, match="download the wheels failed "
                       r"\(exit 1\): no route to host"):
        dynamo.ensure_dynamo(tmp_path)
    assert dynamo.install_info(tmp_path) is None
    assert not (dynamo.install_dir(tmp_path) / "venv").exists()
    assert "no route to host" in (dynamo.install_dir(tmp_path) / "install.log").read_text()


def test_prometheus_samples_are_summed_over_labels() -> None:
    text = "\n".join(['# HELP x', 'dynamo_frontend_cached_tokens_sum{model="a"} 256',
                      'dynamo_frontend_cached_tokens_sum{model="b"} 16', 'up 1'])
    assert dynamo.sum_samples(text) == {"dynamo_frontend_cached_tokens_sum": 272.0, "up": 1.0}
    assert dynamo.served_by({"nvext": {"worker_id": {"decode_worker_id": 7}}}) == 7
    assert dynamo.served_by({"choices": []}) is None


def test_kv_router_pool_pins_workers_and_reports_cached_tokens(
        dynamo_python: Path, tiny_model_dir: Path, tmp_path: Path) -> None:
    with dynamo.dynamo_pool(tiny_model_dir, workers=2, router_mode="kv", model_name=MODEL,
                            workdir=tmp_path / "kv", python=dynamo_python) as pool:
        first, second = pool.worker_ids
        assert first != second
        assert sorted(pool.registered_instances()) == sorted(pool.worker_ids)
        assert all(alive(pid) for pid in pool.pids)
        print(f"dynamo up in {pool.started_s:.2f}s: {pool.url} workers {pool.worker_ids} "
              f"pids {pool.pids}")
        before = pool.prefix_hits()
        cached_seen = 0
        prompt_seen = 0
        prompt_tokens = 0
        for target in (first, second, second, first):
            status, served, usage, ttft = stream_chat(pool, PROMPT, pool.headers_for(target))
            assert status == 200
            assert served == {target}
            assert usage is not None
            cached_seen += usage["prompt_tokens_details"]["cached_tokens"]
            prompt_tokens = usage["prompt_tokens"]
            prompt_seen += prompt_tokens
            print(f"pinned to {target}: cached {usage['prompt_tokens_details']} "
                  f"of {usage['prompt_tokens']}, ttft {ttft * 1000:.1f} ms")
        # The second request on each worker finds the prompt's full blocks cached there.
        full_blocks = prompt_tokens // pool.block_size * pool.block_size
        assert cached_seen == 2 * full_blocks
        # Left to the KV router, the same prompt goes where it is cached (both workers hold it).
        status, served, usage, _ = stream_chat(pool, PROMPT)
        assert status == 200 and served <= {first, second} and len(served) == 1
        assert usage is not None and usage["prompt_tokens_details"]["cached_tokens"] == full_blocks
        hits = pool.prefix_hits() - before
        assert hits.cached_tokens == cached_seen + full_blocks
        assert hits.prompt_tokens == prompt_seen + usage["prompt_tokens"]
        assert hits.requests == 5
        samples = pool.metrics()
        assert samples["dynamo_frontend_model_kv_cache_block_size"] == pool.block_size
        assert "dynamo_router_overhead_total_ms_sum" in samples
        pids, store = pool.pids, pool.store
    assert not any(alive(pid) for pid in pids)
    assert dynamo.registered_instances(store) == []


def test_direct_mode_leaves_the_choice_to_the_header(
        dynamo_python: Path, model_dir: Path, tmp_path: Path) -> None:
    with dynamo.dynamo_pool(model_dir, workers=2, router_mode="direct", model_name=MODEL,
                            workdir=tmp_path / "direct", python=dynamo_python) as pool:
        status, _, _, _ = stream_chat(pool, "no header")
        assert status == 400
        for target in reversed(pool.worker_ids):
            status, served, usage, _ = stream_chat(pool, PROMPT, pool.headers_for(target))
            assert status == 200 and served == {target}
        status, served, usage, _ = stream_chat(pool, PROMPT, pool.headers_for(target))
        assert served == {target} and usage is not None
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0
        pids = pool.pids
    assert not any(alive(pid) for pid in pids)
