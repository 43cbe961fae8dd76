"""``saar eval matrix``: arguments, run, print. Heavy imports wait until the command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="last stdout line is one JSON object")
    parser.add_argument("--seeds", type=int, default=5, help="seeds per workload (default 5)")
    parser.add_argument("--sessions", type=int, default=40, help="sessions per workload and seed")
    parser.add_argument("--turns", type=int, default=18, help="turns per session")
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="policies run in parallel processes"
    )


def run(args: argparse.Namespace) -> int:
    from .report import summarize, table
    from .runner import MatrixSpec, run_matrix

    spec = MatrixSpec(seeds=args.seeds, sessions=args.sessions, turns=args.turns)
    started = time.perf_counter()
    summary = summarize(run_matrix(spec, jobs=args.jobs))
    elapsed = time.perf_counter() - started
    print(table(summary))
    print(f"run time: {elapsed:.1f} s ({args.jobs} jobs)")
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary, separators=(",", ":")))
    return 0
