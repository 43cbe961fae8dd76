"""The harness's port picks: never the same port twice in a row (Envoy's listener and admin
once got one port between them, and Envoy failed to bind)."""

from __future__ import annotations

import socket

from extproc.dev import harness


def test_ports_picked_in_a_row_are_distinct_even_when_the_kernel_repeats_one(monkeypatch):
    offered = iter([41001, 41001, 41001, 41002, 41002, 41003, 41004])

    class Socket:
        def __init__(self) -> None:
            self.port = 0

        def __enter__(self) -> Socket:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def bind(self, address: tuple[str, int]) -> None:
            self.port = next(offered)

        def getsockname(self) -> tuple[str, int]:
            return ("127.0.0.1", self.port)

    monkeypatch.setattr(harness, "_HANDED_OUT", type(harness._HANDED_OUT)())
    monkeypatch.setattr(harness.socket, "socket", Socket)
    assert [harness.free_port(), harness.free_port()] == [41001, 41002]
    assert harness.free_ports(2) == [41003, 41004]


def test_real_picks_are_distinct_and_bindable():
    ports = [harness.free_port() for _ in range(50)] + harness.free_ports(50)
    assert len(set(ports)) == 100
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))
