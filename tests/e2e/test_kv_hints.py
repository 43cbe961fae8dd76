"""Issue 11 end to end: admission pauses a session, the router's KV hints demote its blocks to
the worker's host memory and prefetch them back, as the workers' own KV events show, and its
next turn hits the cache on the device. The real Envoy, the processor and two simulated
workers (precise prefix mode: real token ids, vLLM KV events over ZMQ)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
import zmq
from openai import OpenAI

from extproc.dev.harness import run_stack
from extproc.scheduling.kv_events import CPU, DEVICE, PreciseKVIndex, decode_frames
from tests.e2e.test_workers import VOCABULARY, context, scheduling_config

pytestmark = pytest.mark.e2e
MODEL = "qwen3-8b"


class Watcher:
    """The workers' KV events as a second subscriber hears them (the router has its own)."""

    def __init__(self, endpoints: dict[str, str]) -> None:
        self.index = PreciseKVIndex(block_size=16)
        self.moves: list[tuple[str, str, int, bool]] = []
        """(worker, tier, blocks, stored) of every change, in order."""
        self.index.listeners.append(lambda *change: self.moves.append(
            (change[0], change[1], len(change[2]), change[3])))
        self._context = zmq.Context()
        self._sockets = {}
        for worker, endpoint in endpoints.items():
            socket = self._context.socket(zmq.SUB)
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(endpoint)
            self._sockets[worker] = socket

    def until(self, check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"never: {what}"
            for worker, socket in self._sockets.items():
                while socket.poll(10):
                    _, seq, batch = decode_frames(socket.recv_multipart())
                    self.index.apply(worker, batch, seq)

    def close(self) -> None:
        self._context.destroy(linger=0)


def tokenizer_file(tmp_path: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator([" ".join(VOCABULARY) + " step continue system user"],
                                  trainers.WordLevelTrainer(special_tokens=["[UNK]"]))
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def test_a_paused_session_is_demoted_prefetched_and_hits_the_cache(tmp_path):
    admission = {"enabled": True, "tick_seconds": 0.1, "pause_threshold": 0.3,
                 "resume_target": 0.2, "demote_threshold": 0.2, "hysteresis": 0.1,
                 "forced_resume_seconds": 1.0}
    config = scheduling_config(admission=admission, hints={"enabled": True})
    sim_args = ["--num-gpu-blocks", "400", "--num-cpu-blocks", "400"]
    with run_stack(config, workers_per_model=2, sim_args=sim_args,
                   kv_events_tokenizer=tokenizer_file(tmp_path), workdir=tmp_path) as stack:
        written = yaml.safe_load(stack.config_path.read_text())
        watcher = Watcher({w["address"]: w["kv_events"]
                           for w in written["models"][MODEL]["workers"]})
        try:
            for url in stack.sims[MODEL]:  # both publishers heard before the session starts
                httpx.post(f"{url}/v1/chat/completions", json={
                    "model": MODEL, "messages": [{"role": "user", "content": "alpha beta"}]})
            watcher.until(lambda: all(watcher.index.last_seq(w) is not None
                                      for w in watcher._sockets), "both workers publish")
            client = OpenAI(base_url=f"{stack.url}/v1", api_key="k", max_retries=0,
                            default_headers={"x-session-id": "big"})
            history = [{"role": "system", "content": context(7, words=2500)},
                       {"role": "user", "content": "step 0: continue"}]
            first = client.chat.completions.with_raw_response.create(model=MODEL,
                                                                     messages=history)
            worker = first.headers["x-saar-worker"]
            index = watcher.index
            watcher.until(lambda: index.block_count(worker, CPU) > 100,
                          "the paused session's blocks demoted to host memory")
            demoted = index.block_count(worker, CPU)
            watcher.until(lambda: index.block_count(worker, CPU) == 0
                          and index.block_count(worker, DEVICE) >= demoted,
                          "the resumed session's blocks prefetched back to the device")
            runs: list[list[object]] = []  # consecutive changes of one kind, merged
            for w, tier, n, up in watcher.moves:
                if w == worker and runs and runs[-1][:2] == [tier, up]:
                    runs[-1][2] += n  # type: ignore[operator]
                elif w == worker:
                    runs.append([tier, up, n])
            moves = [(tier, up) for tier, up, n in runs if n > 100]  # type: ignore[operator]
            assert moves == [(DEVICE, True), (CPU, True), (DEVICE, False),  # turn, demote
                             (DEVICE, True), (CPU, False)], moves  # prefetch
            history += [{"role": "assistant", "content": first.parse().choices[0].message.content},
                        {"role": "user", "content": "step 1: continue"}]
            second = client.chat.completions.with_raw_response.create(model=MODEL,
                                                                      messages=history)
            assert second.headers["x-saar-worker"] == worker, "the resumed turn followed its KV"
            assert int(second.headers["x-sim-cached-tokens"]) > 2400
            assert second.headers["x-sim-loaded-tokens"] == "0", "on the device, not loaded"
            metrics = httpx.get(f"{stack.processor_http}/metrics").text
            for kind in ("demote", "prefetch"):
                assert f'saar_kv_hints_total{{kind="{kind}",outcome="delivered"}}' in metrics
            assert 'saar_kv_hints_total{kind="demote",outcome="failed"}' not in metrics
        finally:
            watcher.close()
