"""The container image runs unprivileged and checks its own health without curl."""

from __future__ import annotations

import http.server
import importlib.util
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ROOT

DOCKERFILE = ROOT / "docker" / "Dockerfile"
SCRIPT = ROOT / "deploy" / "docker" / "healthcheck.py"


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in lines if line and not line.startswith("#")]


def test_image_runs_as_the_charts_unprivileged_user() -> None:
    users = [arg for op, arg in _instructions() if op == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid not in ("root", "0")
    chart_values = (ROOT / "deploy" / "helm" / "saar-extproc" / "values.yaml").read_text()
    assert f"runAsUser: {uid}" in chart_values


def test_healthcheck_runs_the_shipped_script() -> None:
    ops = dict(_instructions())
    assert "curl" not in ops["HEALTHCHECK"]
    copied = [arg.split() for op, arg in _instructions() if op == "COPY"]
    target = next(dst for *srcs, dst in copied if "deploy/docker/healthcheck.py" in srcs)
    assert target in ops["HEALTHCHECK"]
    assert ops["ENTRYPOINT"] == '["saar"]'


def _module():
    spec = importlib.util.spec_from_file_location("saar_healthcheck", SCRIPT)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("argv", "env", "url"), [
    (["/usr/local/bin/python", "/usr/local/bin/saar", "serve", "--config", "/etc/saar/c.yaml"],
     {}, "http://127.0.0.1:9090/healthz"),
    (["saar", "serve", "--config", "c.yaml", "--http-port", "9191"], {},
     "http://127.0.0.1:9191/healthz"),
    (["saar", "serve"], {"SAAR_HEALTHCHECK_URL": "http://127.0.0.1:1/x"}, "http://127.0.0.1:1/x"),
    (["/usr/local/bin/python", "/usr/local/bin/saar", "sim-server", "--port", "8101"], {}, None),
    (["envoy", "-c", "/etc/envoy/compose.yaml"], {}, None),
    ([], {}, None),
])
def test_health_url_by_role(argv: list[str], env: dict[str, str], url: str | None) -> None:
    assert _module().health_url(argv, env) == url


@pytest.fixture
def health_server() -> Iterator[tuple[str, list[int]]]:
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status[0] if self.path == "/healthz" else 404)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/healthz", status
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_healthcheck_exit_status(tmp_path: Path, health_server, monkeypatch) -> None:
    url, status = health_server
    cmdline = tmp_path / "cmdline"
    cmdline.write_bytes(b"\0".join([b"/usr/local/bin/saar", b"serve", b"--config", b"c"]) + b"\0")
    module = _module()
    monkeypatch.setenv("SAAR_HEALTHCHECK_URL", url)
    assert module.main(str(cmdline)) == 0
    status[0] = 503
    assert module.main(str(cmdline)) == 1
    monkeypatch.setenv("SAAR_HEALTHCHECK_URL", "http://127.0.0.1:9/healthz")   # nothing there
    assert module.main(str(cmdline)) == 1
    cmdline.write_bytes(b"envoy\0-c\0/etc/envoy/compose.yaml\0")
    assert module.main(str(cmdline)) == 0
