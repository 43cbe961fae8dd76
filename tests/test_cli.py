from __future__ import annotations

import json
from dataclasses import replace

import orjson

from extproc.cli import main
from extproc.core.router import LocalDriver, Router
from extproc.types import Api, ResponseSummary


def test_replay_show_reads_the_jsonl_sink(config, clock, tmp_path, capsys):
    path = tmp_path / "replay.jsonl"
    router = Router(replace(config, replay=replace(config.replay, jsonl_path=str(path))),
                    clock=clock)
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor"}]})
    driver = LocalDriver(router)
    routed = driver.route(Api.CHAT, {"x-session-id": "cli"}, body)
    driver.respond(routed, ResponseSummary(status=200, finish_reason="stop"))
    router.close()
    assert main(["replay", "show", routed.replay_id, "--file", str(path)]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] == routed.model
    assert shown["outcome"]["finish_reason"] == "stop"
    assert main(["replay", "show", "rp-missing", "--file", str(path)]) == 1


def test_envoy_config_command_renders_the_checked_in_file(capsys):
    from tests.conftest import EXAMPLE_CONFIG, ROOT

    assert main(["envoy-config", "--config", str(EXAMPLE_CONFIG)]) == 0
    assert capsys.readouterr().out == (ROOT / "envoy" / "envoy.yaml").read_text()
