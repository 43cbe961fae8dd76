"""The peers' routers, taken from PyPI on first use into environments of their own, outside
the checkout (``$SAAR_PEERS_HOME``, else ``~/.cache/saar-extproc/peers``): ``NAME-VERSION``,
made with ``python -m venv`` and pip, marked complete by a ``.installed`` file. An install that
fails leaves nothing behind and says why: the peer is then reported missing."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

INSTALL_TIMEOUT_S = 900.0
Runner = Callable[[Sequence[str]], None]
"""Runs one command, raising ``subprocess.CalledProcessError`` (its output attached) on
failure: ``pip`` in tests is replaced through it."""


class PeerMissing(Exception):
    """A peer that could not be installed; the message says why."""


_FAILED: dict[Path, str] = {}
"""Environments whose install failed in this process, and why: not tried again."""


def peers_home() -> Path:
    explicit = os.environ.get("SAAR_PEERS_HOME")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "saar-extproc" / "peers"


def _run(argv: Sequence[str]) -> None:
    subprocess.run(list(argv), check=True, capture_output=True, text=True,
                   timeout=INSTALL_TIMEOUT_S,
                   env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


@contextlib.contextmanager
def _locked(home: Path) -> Iterator[None]:
    """One installer at a time (two benches, or a test beside a run)."""
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def ensure(dist: str, version: str, *, home: Path | None = None,
           run: Runner = _run) -> Path:
    """The environment holding ``dist==version``, installed now if it is not yet; raises
    ``PeerMissing`` with pip's last words when it cannot be."""
    home = home or peers_home()
    target = home / f"{dist}-{version}"
    marker = target / ".installed"
    if target in _FAILED:
        raise PeerMissing(_FAILED[target])
    with _locked(home):
        if marker.exists():
            return target
        shutil.rmtree(target, ignore_errors=True)
        try:
            run([sys.executable, "-m", "venv", str(target)])
            run([str(target / "bin" / "python"), "-m", "pip", "install", "--quiet",
                 f"{dist}=={version}"])
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
            shutil.rmtree(target, ignore_errors=True)
            why = _last_words(exc) if isinstance(exc, subprocess.CalledProcessError) else exc
            _FAILED[target] = f"pip install {dist}=={version} failed: {why}"
            raise PeerMissing(_FAILED[target]) from None
        marker.write_text(f"{dist}=={version}\n")
    return target


def _last_words(exc: subprocess.CalledProcessError) -> str:
    text = "\n".join(str(part) for part in (exc.stderr, exc.stdout) if part)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or [f"exit status {exc.returncode}"])[-1][:300]
