from __future__ import annotations

import json
from dataclasses import replace

import orjson

from extproc.assembly import assemble
from extproc.cli import main
from extproc.core.router import LocalDriver
from extproc.types import Api, ResponseSummary


def test_replay_show_reads_the_jsonl_sink(config, clock, tmp_path, capsys):
    path = tmp_path / "replay.jsonl"
    parts = assemble(replace(config, replay=replace(config.replay, jsonl_path=str(path))),
                     clock=clock)
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})
    driver = LocalDriver(parts.router)
    routed = driver.route(Api.CHAT, {"x-session-id": "cli"}, body)
    driver.respond(routed, ResponseSummary(status=200, finish_reason="stop"))
    parts.close()
    assert main(["replay", "show", routed.replay_id, "--file", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] == routed.model
    assert shown["outcome"]["finish_reason"] == "stop"
    assert main(["replay", "show", "rp-missing", "--file", str(path)]) == 1


def test_envoy_config_command_renders_the_checked_in_file(capsys):
    from tests.conftest import EXAMPLE_CONFIG, ROOT

    assert main(["envoy-config", "--config", str(EXAMPLE_CONFIG)]) == 0
    assert capsys.readouterr().out == (ROOT / "envoy" / "envoy.yaml").read_text()


def test_envoy_config_flags(capsys):
    """Issue 9, item 19: loopback by default, and the processor's port can follow serve's."""
    import yaml

    from tests.conftest import EXAMPLE_CONFIG

    assert main(["envoy-config", "--config", str(EXAMPLE_CONFIG), "--processor-port", "9100",
                 "--listen-host", "0.0.0.0", "--listen-port", "10001"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    listener = doc["static_resources"]["listeners"][0]["address"]["socket_address"]
    assert (listener["address"], listener["port_value"]) == ("0.0.0.0", 10001)
    processor = next(c for c in doc["static_resources"]["clusters"]
                     if c["name"] == "saar_extproc")
    endpoint = processor["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["port_value"] == 9100


def test_serve_warns_when_its_port_is_not_the_configs_and_says_where_it_listens_once(
        tmp_path):
    import signal
    import subprocess
    import sys
    import time

    import yaml

    from extproc.dev.harness import free_port
    from tests.conftest import EXAMPLE_CONFIG

    config = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    config["server"].update({"grpc_port": free_port(), "http_port": free_port()})
    path = tmp_path / "saar.yaml"
    path.write_text(yaml.safe_dump(config))
    other = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "extproc", "serve", "--config", str(path),
                             "--grpc-port", str(other)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        lines: list[str] = []
        assert proc.stdout is not None
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            lines.append(line)
            if line.startswith("saar: ext_proc on"):
                break
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert text.count("saar: ext_proc on") == 1
    assert f"127.0.0.1:{other}" in text
    assert f"--grpc-port {other} differs from server.grpc_port" in text
    assert f"--processor-port {other}" in text
