"""Peers' environments: made once, marked complete, removed and reported when pip fails."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from extproc.dev.bench.peers import install
from extproc.dev.bench.peers.install import PeerMissing, ensure


def test_an_install_runs_once_and_is_marked(tmp_path):
    calls: list[list[str]] = []

    def run(argv: Sequence[str]) -> None:
        calls.append(list(argv))
        if "venv" in argv:
            (tmp_path / "peer-1.0" / "bin").mkdir(parents=True)

    target = ensure("peer", "1.0", home=tmp_path, run=run)
    assert target == tmp_path / "peer-1.0"
    assert (target / ".installed").read_text() == "peer==1.0\n"
    assert calls[1][-3:] == ["install", "--quiet", "peer==1.0"]
    assert ensure("peer", "1.0", home=tmp_path, run=run) == target
    assert len(calls) == 2


def test_a_failed_install_leaves_nothing_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(install, "_FAILED", {})
    tries = []

    def run(argv: Sequence[str]) -> None:
        tries.append(argv)
        if "venv" in argv:
            (tmp_path / "gone-2.0").mkdir()
            return
        raise subprocess.CalledProcessError(
            1, list(argv), output="", stderr="Looking in indexes...\n"
            "ERROR: No matching distribution found for gone==2.0\n")

    with pytest.raises(PeerMissing, match=r"No matching distribution found for gone==2\.0"):
        ensure("gone", "2.0", home=tmp_path, run=run)
    assert not (tmp_path / "gone-2.0").exists()
    with pytest.raises(PeerMissing, match="No matching distribution"):  # not tried again
        ensure("gone", "2.0", home=tmp_path, run=run)
    assert len(tries) == 2


def test_the_home_is_outside_the_checkout(monkeypatch, tmp_path):
    monkeypatch.delenv("SAAR_PEERS_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert install.peers_home() == tmp_path / "saar-extproc" / "peers"
    monkeypatch.setenv("SAAR_PEERS_HOME", str(tmp_path / "x"))
    assert install.peers_home() == tmp_path / "x"
