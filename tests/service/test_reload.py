"""SIGHUP (issue 32): what can change while the service runs is applied, the rest named (logged,
``saar_config_restart_pending``), a config that does not load changes nothing — in process,
then through a real ``saar serve``."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import replace

import orjson
import pytest
import yaml

from extproc.config import Config, ModelRef, Pricing
from extproc.core.router import LocalDriver
from extproc.service.app import start
from extproc.service.reload import Reloader, changes, reloadable
from extproc.types import Api

BUILT = ("prefix", "queue")


@pytest.mark.parametrize(("key", "applied"), [
    (("routing", "decisions"), True),
    (("routing", "decisions", 0, "rules", "keywords", 1), True),
    (("models", "m", "pricing", "prompt"), True),
    (("models", "m", "quality"), True),
    (("models", "m", "endpoints"), True),
    (("models", "m", "workers", 0, "role"), True),
    (("scheduling", "scorers", "prefix"), True),
    (("scheduling", "overlap_weight"), True),
    (("logging", "level"), True),
    (("logging", "format"), True),
    (("models", "new"), False),  # a model added or removed
    (("models", "m", "cluster"), False),
    (("models", "m", "context_window"), False),
    (("scheduling", "scorers", "slo"), False),  # not built at start
    (("scheduling", "cost_form"), False),
    (("server", "grpc_port"), False),
    (("server", "tls", "enabled"), False),
    (("state", "store"), False),
    (("routing", "logical_models"), False),
])
def test_what_a_reload_applies(key, applied):
    assert reloadable(key, BUILT) is applied


def test_changes_are_the_keys_that_differ():
    old = {"a": {"b": 1, "c": [1, 2]}, "d": {"x": 1}, "e": [1]}
    new = {"a": {"b": 2, "c": [1, 3]}, "d": {"y": 1}, "e": [1, 2], "f": 0}
    assert changes(old, new) == [("a", "b"), ("a", "c", 1), ("d", "x"), ("d", "y"), ("e",),
                                 ("f",)]
    assert changes(old, old) == []


def _sample(running, name: str, **labels: str) -> float | None:
    return running.parts.metrics.registry.get_sample_value(name, labels)


def _decision(running) -> Callable[[str], str]:
    driver = LocalDriver(running.parts.router)

    def decide(text: str) -> str:
        body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": text}]})
        return driver.route(Api.CHAT, {"x-session-id": f"s-{time.monotonic()}"}, body).turn.decision

    return decide


async def test_a_reload_applies_what_it_can_and_names_the_rest(config):
    running = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0)))
    parts = running.parts
    base: Config = parts.config
    files = {"now": base}
    reloader = Reloader(running, lambda: files["now"])
    try:
        decide = _decision(running)
        assert decide("a zebra") != "hard_engineering"
        hard = next(i for i, d in enumerate(base.routing.decisions)
                    if d.name == "hard_engineering")
        decisions = list(base.routing.decisions)
        rules = decisions[hard].rules
        decisions[hard] = replace(decisions[hard], rules=replace(
            rules, keywords=(*rules.keywords, "zebra")))
        small = base.models["qwen3-8b"]
        models = {**base.models, "qwen3-8b": replace(
            small, endpoints=(*small.endpoints, "127.0.0.1:8111"),
            pricing=Pricing(prompt=0.1, cached_input=0.01, completion=0.4))}
        scorers = {**base.scheduling.scorers, "prefix": 5.0}
        files["now"] = replace(
            base, models=models, routing=replace(base.routing, decisions=tuple(decisions)),
            scheduling=replace(base.scheduling, scorers=scorers),
            memory=replace(base.memory, max_sessions=5000))
        outcome = await reloader.reload()
        assert outcome.name == "partial"
        assert set(outcome.applied) == {
            f"routing.decisions[{hard}].rules.keywords", "models.qwen3-8b.endpoints",
            "models.qwen3-8b.pricing.prompt", "models.qwen3-8b.pricing.cached_input",
            "models.qwen3-8b.pricing.completion", "scheduling.scorers.prefix"}
        assert outcome.restart == ("memory.max_sessions",)
        assert decide("a zebra") == "hard_engineering"
        assert parts.router.config.models["qwen3-8b"].pricing.prompt == 0.1
        assert parts.config.memory.max_sessions == base.memory.max_sessions  # still running
        assert {w.address for w in parts.pools.registry.pool("qwen3-8b")} == {
            "127.0.0.1:8101", "127.0.0.1:8111"}
        assert parts.pools.scheduler.weights()["prefix"] == 5.0
        assert _sample(running, "saar_config_restart_pending", key="memory.max_sessions") == 1
        assert _sample(running, "saar_config_reloads_total", outcome="partial") == 1

        # A model added and named by a decision: the model needs a restart, so the decision
        # cannot run without it; nothing changes.
        added = replace(files["now"], models={**files["now"].models, "qwen3-4b": replace(
            small, cluster="qwen3-4b", endpoints=("127.0.0.1:8120",))})
        decisions[hard] = replace(decisions[hard], modelRefs=(
            *decisions[hard].modelRefs, ModelRef(model="qwen3-4b")))
        files["now"] = replace(added, routing=replace(added.routing,
                                                      decisions=tuple(decisions)))
        refused = await reloader.reload()
        assert refused.name == "rejected"
        assert "unknown model 'qwen3-4b'" in (refused.error or "")
        assert [r.model for r in parts.config.routing.decisions[hard].modelRefs] == [
            r.model for r in base.routing.decisions[hard].modelRefs]

        # The file as the process runs: nothing pending any more.
        files["now"] = replace(parts.config, memory=base.memory)
        assert (await reloader.reload()).name == "unchanged"
        assert _sample(running, "saar_config_restart_pending", key="memory.max_sessions") is None
    finally:
        await reloader.stop()
        await running.stop()


# --- a real ``saar serve`` ----------------------------------------------------------------------

class Process:
    """``saar serve`` with its output read line by line on a thread."""

    def __init__(self, path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "extproc", "serve", "--config", str(path)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def wait_for(self, found: Callable[[str], bool], seconds: float = 30.0) -> str:
        deadline, seen = time.monotonic() + seconds, []
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                continue
            seen.append(line)
            if found(line):
                return line
        raise AssertionError("not seen; saw:\n" + "\n".join(seen))

    def log(self, message: str, seconds: float = 30.0) -> dict:
        """The next JSON log line whose message starts with ``message``."""
        def match(line: str) -> bool:
            try:
                return json.loads(line).get("message", "").startswith(message)
            except ValueError:
                return False

        return json.loads(self.wait_for(match, seconds))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _get(url: str, token: str | None = None) -> str:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5) as r:
        return r.read().decode()


def _route(port: int, session: str) -> str:
    """One chat turn over the ext_proc stream, as Envoy sends it: its replay id."""
    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ep_grpc

    from tests.service.test_app import _turn

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        replies = list(ep_grpc.ExternalProcessorStub(channel).Process(iter(_turn(session)),
                                                                      timeout=10))
    fields = replies[1].dynamic_metadata.fields["saar"].struct_value.fields
    return fields["replay_id"].string_value


def test_sighup_on_a_real_serve(tmp_path):
    from extproc.dev.harness import free_port
    from tests.conftest import EXAMPLE_CONFIG

    token = "reload-admin-token-0123456789"
    (tmp_path / "token").write_text(token)
    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    grpc_port, http_port = free_port(), free_port()
    data["server"].update({"grpc_port": grpc_port, "http_port": http_port})
    data["admin"] = {"token_file": str(tmp_path / "token")}
    data["logging"] = {"format": "json"}
    path = tmp_path / "saar.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    serve = Process(path)
    base = f"http://127.0.0.1:{http_port}"
    try:
        serve.wait_for(lambda line: line.startswith("saar: ext_proc on"))

        # Endpoints, the log level and a restart-only key change; SIGHUP.
        data["models"]["qwen3-8b"]["endpoints"].append("127.0.0.1:8111")
        data["logging"]["level"] = "debug"
        data["memory"]["max_sessions"] = 5000
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        os.kill(serve.proc.pid, signal.SIGHUP)
        line = serve.log("config reloaded")
        assert line["level"] == "WARNING"
        assert "applied models.qwen3-8b.endpoints, logging.level;" in line["message"]
        assert line["message"].endswith("needs a restart (the running values stay): "
                                        "memory.max_sessions")
        workers = json.loads(_get(f"{base}/v1/workers", token))["workers"]
        assert "127.0.0.1:8111" in {w["address"] for w in workers}
        metrics = _get(f"{base}/metrics")
        assert 'saar_config_restart_pending{key="memory.max_sessions"} 1.0' in metrics
        assert 'saar_config_reloads_total{outcome="partial"} 1.0' in metrics

        # At debug now: the decision's line, naming its request.
        replay_id = _route(grpc_port, "s-reload")
        routed = serve.log("routed to")
        assert (routed["replay_id"], routed["session"]) == (replay_id, "s-reload")

        # A file that does not load: the error with its line; the running config stays.
        text = path.read_text()
        lines = text.splitlines()
        at = lines.index("  qwen3-8b:") + 2  # the model's first key, below its name
        lines.insert(at, "    quality: 0.1")
        lines.insert(at, "    quality: 0.2")
        path.write_text("\n".join(lines) + "\n")
        os.kill(serve.proc.pid, signal.SIGHUP)
        error = serve.log("config not reloaded")
        assert error["level"] == "ERROR"
        assert f"{path}:{at + 2}: models.qwen3-8b.quality: duplicate key (first at line " \
               f"{at + 1})" in error["message"]
        workers = json.loads(_get(f"{base}/v1/workers", token))["workers"]
        assert "127.0.0.1:8111" in {w["address"] for w in workers}
        assert 'saar_config_reloads_total{outcome="rejected"} 1.0' in _get(f"{base}/metrics")
        assert serve.proc.poll() is None
    finally:
        serve.stop()
    assert serve.proc.returncode == 0
