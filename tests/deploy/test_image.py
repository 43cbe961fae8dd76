"""docker/Dockerfile built for real, by buildah (Debian's package; `docker build` takes the same
file and context): the image runs `saar` as the chart's unprivileged user, serves /healthz as
its HEALTHCHECK script reads it, and carries Envoy.

No registry is reachable where the suite runs, so the base is made here: Debian bookworm's
python3 and python3-venv, unpacked by debootstrap from the Debian mirror and committed once as
``localhost/saar-test-base:bookworm`` (kept in buildah's storage for the next run); the
Dockerfile's ``BASE`` argument names it instead of the official Python image. The build's pip
trusts what this machine trusts (a TLS-inspecting proxy's CA: the bundle is mounted into the
build's RUN steps). Needs root, buildah and debootstrap (`make system` installs them); about 3
minutes, 4 more the first time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import ROOT

BASE = "localhost/saar-test-base:bookworm"
IMAGE = "localhost/saar-extproc:test"
MIRROR = os.environ.get("SAAR_DEBIAN_MIRROR", "http://deb.debian.org/debian")
UID = "10001:10001"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("buildah") or not shutil.which("debootstrap"),
    reason="building the image needs root, buildah and debootstrap (Debian packages)")


def buildah(*args: str, timeout: float = 120) -> str:
    done = subprocess.run(["buildah", "--storage-driver", "vfs", *args], capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"buildah {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout.strip()


def _base() -> None:
    """Debian bookworm with python3 and its venv module, as an image (made once)."""
    if buildah("images", "--quiet", "--filter", f"reference={BASE}"):
        return
    container = buildah("from", "scratch")
    try:
        root = buildah("mount", container)
        subprocess.run(["debootstrap", "--variant=minbase",
                        "--include=python3,python3-venv,ca-certificates", "bookworm", root,
                        MIRROR], check=True, capture_output=True, timeout=900)
        buildah("commit", "--quiet", container, BASE, timeout=300)
    finally:
        buildah("rm", container)


def _trust(tmp: Path) -> list[str]:
    """`--volume` options that make the build's pip trust this machine's CA bundle."""
    bundle = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE") or \
        "/etc/ssl/certs/ca-certificates.crt"
    if not Path(bundle).is_file():
        return []
    conf = tmp / "pip.conf"
    conf.write_text("[global]\ncert = /run/saar-build-ca.crt\n")
    return ["--volume", f"{bundle}:/run/saar-build-ca.crt:ro",
            "--volume", f"{conf}:/etc/pip.conf:ro"]


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Iterator[str]:
    _base()
    tmp = tmp_path_factory.mktemp("image")
    buildah("bud", "--isolation", "chroot", "--format", "docker", "--layers=false",
            "--build-arg", f"BASE={BASE}", *_trust(tmp), "--file",
            str(ROOT / "docker" / "Dockerfile"), "--tag", IMAGE, str(ROOT), timeout=1200)
    try:
        yield IMAGE
    finally:
        buildah("rmi", IMAGE)


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    name = buildah("from", image)
    try:
        yield name
    finally:
        buildah("rm", name)


def run(container: str, *argv: str, user: str = UID, timeout: float = 120) -> str:
    return buildah("run", "--isolation", "chroot", "--user", user, container, "--", *argv,
                   timeout=timeout)


def test_the_image_is_configured_as_the_chart_expects(container: str) -> None:
    import json

    config = json.loads(buildah("inspect", "--type", "container", container))
    docker = config["Docker"]["config"]
    assert docker["User"] == UID
    assert docker["Entrypoint"] == ["saar"]
    assert docker["Healthcheck"]["Test"] == ["CMD", "python",
                                             "/usr/local/lib/saar/healthcheck.py"]


def test_the_image_runs_saar_and_envoy_unprivileged(container: str) -> None:
    assert run(container, "saar", "--version").startswith("saar ")
    for config in ("example.yaml", "compose.yaml"):
        out = run(container, "saar", "check", "--config", f"/etc/saar/{config}", "--no-ports",
                  "--no-store")
        assert ": OK:" in out, out
    assert "1.40.0" in run(container, "envoy", "--version")


def test_the_image_serves_health_as_its_healthcheck_reads_it(container: str) -> None:
    """`saar serve` in the image on free ports; the HEALTHCHECK's script, given that command
    line, finds /healthz answering (run inside the image, as Docker runs it)."""
    from extproc.dev.harness import free_port

    grpc_port, http_port = free_port(), free_port()
    # The port goes in through %s: printf would read "\\0" and the port's digits as octal.
    script = (
        f"saar serve --config /etc/saar/example.yaml --grpc-port {grpc_port} "
        f"--http-port {http_port} & server=$!; "
        f"printf 'saar\\0serve\\0--http-port\\0%s\\0' {http_port} > /tmp/cmdline; "
        "status=1; for i in $(seq 300); do "
        "python -c 'import sys; sys.path.insert(0, \"/usr/local/lib/saar\"); "
        "import healthcheck; sys.exit(healthcheck.main(\"/tmp/cmdline\"))' "
        "&& { status=0; break; }; sleep 0.2; done; "
        "kill $server; wait $server; echo healthcheck=$status")
    assert run(container, "sh", "-c", script, timeout=180).endswith("healthcheck=0")
