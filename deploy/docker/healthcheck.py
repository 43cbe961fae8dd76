"""The container image's HEALTHCHECK: GET /healthz of `saar serve`, no curl needed.

One image runs every role (the processor, the simulated model servers, Envoy). Only
`saar serve` has the health endpoint, so the check reads PID 1's command line and passes for
the other roles. SAAR_HEALTHCHECK_URL overrides the URL (a non-default http_port).
Exit status: 0 healthy, 1 unhealthy (what Docker expects).
"""

from __future__ import annotations

import os
import sys
import urllib.request

DEFAULT_URL = "http://127.0.0.1:9090/healthz"


def health_url(argv: list[str], environ: dict[str, str]) -> str | None:
    """The URL to check for a process started with ``argv``, or None when there is none."""
    words = [os.path.basename(a) for a in argv]
    if "serve" not in words or "saar" not in words:
        return None
    if environ.get("SAAR_HEALTHCHECK_URL"):
        return environ["SAAR_HEALTHCHECK_URL"]
    if "--http-port" in argv[:-1]:
        return f"http://127.0.0.1:{argv[argv.index('--http-port') + 1]}/healthz"
    return DEFAULT_URL


def main(cmdline_path: str = "/proc/1/cmdline") -> int:
    try:
        with open(cmdline_path, "rb") as f:
            argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        argv = []
    url = health_url(argv, dict(os.environ))
    if url is None:
        return 0
    try:
        with urllib.request.urlopen(url, timeout=3) as response:
            return 0 if response.status == 200 else 1
    except OSError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
