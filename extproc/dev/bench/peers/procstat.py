"""A router's processes as ``/proc`` sees them: their CPU time and their RSS (Linux)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc")


def _stat_fields(pid: int) -> list[str]:
    # The command may hold spaces and parentheses: the fields start after the last ')'.
    return (PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()


def with_descendants(pids: Iterable[int]) -> list[int]:
    """``pids`` and every live process under them."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int(_stat_fields(int(entry.name))[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    out: list[int] = []
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in out:
            out.append(pid)
            todo += children.get(pid, [])
    return out


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU seconds the processes have used so far, every thread (a process
    that has gone counts nothing)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = _stat_fields(pid)
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def rss_mib(pids: Iterable[int], *, peak: bool = True) -> float:
    """The processes' RSS summed, in MiB: each one's peak (``VmHWM``) or its current
    (``VmRSS``)."""
    key = "VmHWM:" if peak else "VmRSS:"
    total_kib = 0
    for pid in pids:
        try:
            lines = (PROC / str(pid) / "status").read_text().splitlines()
        except OSError:
            continue
        total_kib += next((int(line.split()[1]) for line in lines if line.startswith(key)), 0)
    return total_kib / 1024
