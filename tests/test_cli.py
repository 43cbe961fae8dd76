from __future__ import annotations

import json
from dataclasses import replace

import orjson
import pytest

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
    assert main(["replay", "show", routed.replay_id, "--file", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["model"] == routed.model
    assert shown["outcome"]["finish_reason"] == "stop"
    assert main(["replay", "show", "rp-missing", "--file", str(path)]) == 1
    # Without --json: a short explanation of the same record.
    assert main(["replay", "show", routed.replay_id, "--file", str(path)]) == 0
    told = capsys.readouterr().out
    assert told.startswith(f"{routed.replay_id}: session cli")
    assert f"decision {shown['base']['decision']}" in told
    assert len(told.splitlines()) <= 10


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


# --- help, version, check, one-line errors ----------------------------------------------------

def _commands(parser=None, path=()):
    """Every (sub)command of ``saar`` with its parser, depth first."""
    import argparse

    from extproc.cli import build_parser

    parser = parser or build_parser()
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_command_and_flag_has_help():
    import argparse

    missing = []
    commands = list(_commands())
    assert len(commands) > 15
    for path, parser in commands:
        where = " ".join(("saar", *path))
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                helped = {a.dest for a in action._choices_actions if a.help}
                missing += [f"{where} {name}" for name in action.choices if name not in helped]
            elif not action.help:
                missing.append(f"{where} {'/'.join(action.option_strings) or action.dest}")
    assert missing == [], missing


@pytest.mark.parametrize("path", [p for p, _ in _commands()], ids=lambda p: " ".join(p) or "saar")
def test_every_command_answers_help(path, capsys):
    with pytest.raises(SystemExit) as done:
        main([*path, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: saar")


def test_version(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"saar {version('saar-extproc')}"


def _config_file(tmp_path, **changes):
    import yaml

    from extproc.dev.harness import free_port
    from tests.conftest import EXAMPLE_CONFIG

    data = yaml.safe_load(EXAMPLE_CONFIG.read_text())
    data["server"].update({"grpc_port": free_port(), "http_port": free_port()})
    for key, value in changes.items():
        data[key] = value
    path = tmp_path / "saar.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def test_check_passes_a_usable_config(tmp_path, capsys):
    path, data = _config_file(tmp_path)
    assert main(["check", "--config", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: OK: 2 models")
    assert f"{data['server']['grpc_port']}, {data['server']['http_port']}" in out


def test_check_lists_every_problem_with_its_key(tmp_path, capsys):
    import socket

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path, data = _config_file(
        tmp_path,
        identity={"tenant_secret_file": str(tmp_path / "missing-secret")},
        admin={"token_file": str(tmp_path / "no-token")},
        replay={"jsonl_path": str(blocker / "replay.jsonl")},
        state={"store": "redis", "redis_url": "redis://127.0.0.1:9/0"})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", data["server"]["grpc_port"]))
        taken.listen()
        assert main(["check", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == f"{path}: 5 problem(s)"
    for key in ("identity.tenant_secret_file:", "admin.token_file:", "replay.jsonl_path:",
                "server.grpc_port:", "state.redis_url:"):
        assert sum(line.strip().startswith(key) for line in lines) == 1, (key, err)
    assert "Traceback" not in err


def test_check_refuses_a_config_the_schema_refuses(tmp_path, capsys):
    """A config the schema refuses is a problem ``check`` found: exit 1, the file's line."""
    path, _ = _config_file(tmp_path, limts={"max_body_bytes": 1})
    assert main(["check", "--config", str(path)]) == 1
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1)
                if text.startswith("limts:"))
    assert capsys.readouterr().err.strip() == (
        f"{path}:{line}: limts: unknown key (did you mean 'limits'?)")


def _serve_error(path) -> tuple[int, str]:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "extproc", "serve", "--config", str(path)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stderr


def test_serve_says_in_one_line_that_its_port_is_taken(tmp_path):
    import socket

    path, data = _config_file(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", data["server"]["http_port"]))
        taken.listen()
        code, err = _serve_error(path)
    assert code == 2
    assert "Traceback" not in err
    assert (f"server.http_port: cannot listen on 127.0.0.1:{data['server']['http_port']}: "
            "Address already in use") in err


def test_serve_says_in_one_line_that_its_replay_sink_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    path, _ = _config_file(tmp_path, replay={"jsonl_path": str(blocker / "r.jsonl")})
    code, err = _serve_error(path)
    assert code == 2 and "Traceback" not in err
    assert f"replay.jsonl_path: {blocker} is not a directory" in err


@pytest.mark.parametrize("args", [
    pytest.param(["demo", "--config", "{missing}"], id="demo config"),
    pytest.param(["simulate", "--trace", "{missing}"], id="simulate trace"),
    pytest.param(["replay", "what-if", "--replay", "{missing}", "--config", "{example}"],
                 id="what-if records"),
    pytest.param(["trace", "export", "--replay", "{missing}", "--out", "{tmp}/timeline.json"],
                 id="trace export records"),
    pytest.param(["replay-trace", "--trace", "{missing}", "--url", "http://127.0.0.1:9"],
                 id="replay-trace trace"),
    pytest.param(["trace", "export", "--replay", "{empty}", "--out", "{tmp}/no-dir/t.json"],
                 id="trace export out"),
])
def test_a_file_that_cannot_be_read_or_written_is_one_line(args, tmp_path, capsys):
    from tests.conftest import EXAMPLE_CONFIG

    (tmp_path / "empty.jsonl").write_text("")
    names = {"missing": tmp_path / "missing.jsonl", "example": EXAMPLE_CONFIG, "tmp": tmp_path,
             "empty": tmp_path / "empty.jsonl"}
    args = [a.format(**names) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err
    (line,) = err.splitlines()
    assert line.startswith("saar: ") and line.endswith(": No such file or directory"), err


def test_replay_show_without_a_server_is_one_line(capsys):
    from extproc.dev.harness import free_port

    url = f"http://127.0.0.1:{free_port()}"
    assert main(["replay", "show", "rp-x", "--url", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"saar: {url}: no answer") and len(err.splitlines()) == 1


def test_envoy_config_takes_processors_on_other_hosts(capsys):
    import yaml

    from tests.conftest import EXAMPLE_CONFIG

    assert main(["envoy-config", "--config", str(EXAMPLE_CONFIG), "--processor",
                 "saar-0.saar:9002", "--processor", "saar-1.saar:9003", "--fragment"]) == 0
    doc = yaml.safe_load(capsys.readouterr().out)
    cluster = doc["clusters"][0]
    lb = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"]
    assert [(e["endpoint"]["address"]["socket_address"]["address"],
             e["endpoint"]["address"]["socket_address"]["port_value"]) for e in lb] == [
        ("saar-0.saar", 9002), ("saar-1.saar", 9003)]
    assert main(["envoy-config", "--config", str(EXAMPLE_CONFIG), "--processor", "nohost"]) == 2


def test_envoy_config_says_when_tls_goes_unverified(tmp_path, capsys):
    path, _ = _config_file(tmp_path)
    assert main(["envoy-config", "--config", str(path), "--processor-ca", "/ca.pem"]) == 2
    assert "server.tls.enabled is false" in capsys.readouterr().err
    tls, _ = _config_file(tmp_path)
    import yaml

    data = yaml.safe_load(tls.read_text())
    data["server"]["tls"] = {"enabled": True}
    tls.write_text(yaml.safe_dump(data))
    assert main(["envoy-config", "--config", str(tls)]) == 0
    captured = capsys.readouterr()
    assert "without verifying the certificate" in captured.err
    assert "envoy.transport_sockets.tls" in captured.out


# --- exit codes as docs/cli.md documents them (issue 32) ------------------------------------

class _Replays:
    """A processor's HTTP port that answers every replay lookup with one status."""

    def __init__(self, status: int) -> None:
        import http.server
        import threading

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"error": "why"}).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _documented_codes() -> dict[str, int]:
    """docs/cli.md's table: what each listed case exits with."""
    import re

    from tests.conftest import ROOT

    text = (ROOT / "docs" / "cli.md").read_text()
    table = text[text.index("| exit |"):].split("\n\n")[0]
    return {case: int(code) for code, case in re.findall(r"^\| (\d) \| (.+?) \|$", table, re.M)}


EXIT_CASES = [
    # (the documented case, the arguments, the code)
    ("`check`: the config is usable", ["check", "--config", "{good}"], 0),
    ("`replay show`: the record", ["replay", "show", "{id}", "--file", "{records}"], 0),
    ("`check`: problems found, the schema's included",
     ["check", "--config", "{schema}"], 1),
    ("`check`: problems found, the schema's included",
     ["check", "--config", "{unusable}"], 1),
    ("`replay show`: no such record", ["replay", "show", "rp-none", "--file", "{records}"], 1),
    ("`replay show`: no such record", ["replay", "show", "rp-none", "--url", "{http404}"], 1),
    ("`trace export`: no records", ["trace", "export", "--replay", "{empty}", "--out",
                                    "{tmp}/t.json"], 1),
    ("bad usage", ["check"], 2),
    ("bad usage", ["bench", "peers", "--workloads", "nope"], 2),
    ("a config that does not load", ["serve", "--config", "{schema}"], 2),
    ("a config that does not load", ["replay", "what-if", "--replay", "{records}",
                                     "--config", "{schema}"], 2),
    ("a config that does not load", ["envoy-config", "--config", "{schema}"], 2),
    ("a file that cannot be read or written", ["check", "--config", "{tmp}/missing.yaml"], 2),
    ("a file that cannot be read or written", ["replay", "show", "rp-x", "--file",
                                               "{tmp}/missing.jsonl"], 2),
    ("a server that does not answer, or answers an error",
     ["replay", "show", "rp-x", "--url", "{nobody}"], 2),
    ("a server that does not answer, or answers an error",
     ["replay", "show", "rp-x", "--url", "{http403}"], 2),
]


def test_every_documented_exit_code_is_tested():
    assert {case for case, _, _ in EXIT_CASES} == set(_documented_codes())


@pytest.mark.parametrize(("case", "args", "code"), EXIT_CASES,
                         ids=[f"{c}: {' '.join(a[:2])}" for c, a, _ in EXIT_CASES])
def test_exit_codes_as_documented(case, args, code, tmp_path, config, clock, capsys):
    from extproc.dev.harness import free_port

    assert _documented_codes()[case] == code
    good, _ = _config_file(tmp_path)
    (tmp_path / "sub").mkdir()
    schema, _ = _config_file(tmp_path / "sub", limts={})
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    (tmp_path / "u").mkdir()
    unusable, _ = _config_file(tmp_path / "u", replay={"jsonl_path": str(blocker / "r.jsonl")})
    records = tmp_path / "replay.jsonl"
    parts = assemble(replace(config, replay=replace(config.replay, jsonl_path=str(records))),
                     clock=clock)
    body = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    routed = LocalDriver(parts.router).route(Api.CHAT, {"x-session-id": "codes"}, body)
    parts.close()
    (tmp_path / "empty.jsonl").write_text("")
    servers = {"http404": _Replays(404), "http403": _Replays(403)}
    names = {"good": good, "schema": schema, "unusable": unusable, "records": records,
             "id": routed.replay_id, "empty": tmp_path / "empty.jsonl", "tmp": tmp_path,
             "nobody": f"http://127.0.0.1:{free_port()}",
             **{name: server.url for name, server in servers.items()}}
    try:
        try:
            got = main([a.format(**names) for a in args])
        except SystemExit as exit_:  # argparse's usage errors
            got = exit_.code
    finally:
        for server in servers.values():
            server.close()
    err = capsys.readouterr().err
    assert got == code, err
    assert "Traceback" not in err
    if code == 2:  # one line: ``saar: ...`` (argparse: ``saar check: error: ...``)
        assert err.splitlines()[-1].startswith("saar"), err


def test_a_replay_id_the_server_does_not_know_exits_1_an_http_error_2(capsys):
    for status, code, said in ((404, 1, "replay id rp-x not found at"),
                               (403, 2, "saar: {url}/v1/replay/rp-x: HTTP 403: why")):
        server = _Replays(status)
        try:
            assert main(["replay", "show", "rp-x", "--url", server.url]) == code
        finally:
            server.close()
        assert said.format(url=server.url) in capsys.readouterr().err


@pytest.mark.parametrize(("flags", "level"), [
    ([], "warning"),  # the file's
    (["--log-level", "error"], "error"),
    (["-v"], "debug"),
])
def test_serve_takes_its_log_level_from_the_file_or_the_flags(tmp_path, flags, level):
    from extproc.cli import _serve_config, build_parser

    path, _ = _config_file(tmp_path, logging={"level": "warning", "format": "json"})
    verbose = ["-v"] if flags == ["-v"] else []
    args = build_parser().parse_args([*verbose, "serve", "--config", str(path),
                                      *[f for f in flags if f != "-v"]])
    config = _serve_config(args, reloading=True)  # reloading: the logging is left alone
    assert (config.logging.level, config.logging.format) == (level, "json")
