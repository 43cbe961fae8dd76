"""``saar eval matrix`` and ``saar eval experiment``: arguments, run, print. Heavy imports wait
until a command runs."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace


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


def add_experiment_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--script", required=True,
        help="their bench/agentic_routing_experiment.py (vLLM Semantic Router), run from where "
        "it is",
    )
    parser.add_argument("--json", action="store_true", help="last stdout line is one JSON object")
    parser.add_argument(
        "--seeds", type=_integers, default=None, help="comma-separated; default: their --matrix's"
    )
    parser.add_argument("--sessions", type=int, default=None, help="per seed (default 40)")
    parser.add_argument("--turns", type=int, default=None, help="per session (default 18)")
    parser.add_argument("--scenarios", default=None, help="default: their DEFAULT_SCENARIOS")
    parser.add_argument(
        "--policies", default=None,
        help="ours, from saar eval matrix (default single_turn,saar,no_tool_lock,"
        "no_step_down_pricing)",
    )
    parser.add_argument(
        "--knob", action="append", type=_knob, default=[], metavar="NAME=VALUE",
        help="a SAAR knob in every decision (repeatable), e.g. return_rate=0.4",
    )
    parser.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="pieces run in parallel processes"
    )


def _knob(text: str) -> tuple[str, object]:
    import yaml

    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"not NAME=VALUE: {text!r}")
    return name.strip(), yaml.safe_load(value)


def _integers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated integers: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("at least one seed")
    return values


def run_experiment(args: argparse.Namespace) -> int:
    from .experiment import ExperimentError, Spec
    from .experiment import run_experiment as run_it
    from .experiment_report import table
    from .policies import POLICIES

    spec = Spec(args.script)
    if args.policies:
        spec = replace(spec, policies=tuple(p for p in args.policies.split(",") if p))
    unknown = [p for p in spec.policies if p not in POLICIES]
    if unknown:
        print(f"unknown policies {', '.join(unknown)}; known: {', '.join(POLICIES)}",
              file=sys.stderr)
        return 2
    if args.seeds:
        spec = replace(spec, seeds=args.seeds)
    if args.scenarios:
        spec = replace(spec, scenarios=tuple(args.scenarios.split(",")))
    spec = replace(spec, sessions=args.sessions or spec.sessions, turns=args.turns or spec.turns,
                   knobs=tuple(args.knob))
    started = time.perf_counter()
    try:
        summary = run_it(spec, jobs=args.jobs)
    except ExperimentError as error:
        print(f"saar eval experiment: {error}", file=sys.stderr)
        return 2
    elapsed = time.perf_counter() - started
    print(table(summary))
    print(f"run time: {elapsed:.1f} s ({args.jobs} jobs)")
    if args.json:
        sys.stdout.flush()
        print(json.dumps(summary, separators=(",", ":")))
    return 0
