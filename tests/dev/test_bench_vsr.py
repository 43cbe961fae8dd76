"""The vsr runner maps every header the Semantic Router's script reads, and only to names
our contract defines. Their script is not in this project: the tests run on a stand-in with
its record shape and the header names it reads (``SAAR_VSR_SCRIPT`` names the real one)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from extproc.adapter.contract import DIAGNOSTIC_HEADERS
from extproc.dev.bench.vsr import HEADER_MAP, load_script, verdict

SCRIPT = Path(os.environ.get("SAAR_VSR_SCRIPT", Path(__file__).with_name("vsr_standin.py")))


def test_every_mapped_name_is_one_of_our_diagnostic_headers() -> None:
    for theirs, ours in HEADER_MAP.items():
        assert ours is None or ours in DIAGNOSTIC_HEADERS, (theirs, ours)


def test_mapping_covers_every_header_their_script_reads() -> None:
    read = set(re.findall(r'"(x-vsr-[a-z-]+)"', SCRIPT.read_text()))
    assert read and read <= set(HEADER_MAP)


def test_our_headers_reach_their_script_under_their_names() -> None:
    module = load_script(SCRIPT)
    ours = {v: f"value-{k}" for k, v in HEADER_MAP.items() if v is not None}
    record = module.response_record(200, ours, "{}", 0.0)
    for theirs, name in HEADER_MAP.items():
        if name is not None:
            assert record["headers"][theirs] == ours[name]


@pytest.mark.parametrize(("overhead", "success", "portability", "met"), [
    (4.4, 1.0, 0, True),
    (4.6, 1.0, 0, False),   # over the balanced target
    (4.4, 0.5, 0, False),   # the 400s of a simulator that refuses chained chat ids
    (4.4, 1.0, 1, False),   # a switch while provider state was carried
])
def test_verdict_needs_the_overhead_full_success_and_no_violation(
        tmp_path: Path, overhead: float, success: float, portability: int, met: bool) -> None:
    (tmp_path / "baseline").mkdir()
    (tmp_path / "comparison.json").write_text(json.dumps({
        "router_overhead_ms": {"p95": overhead},
        "router_violations": {"tool_loop": 0, "context_portability": portability}}))
    for folder, rate in ((tmp_path, success), (tmp_path / "baseline", 1.0)):
        (folder / "summary.json").write_text(json.dumps(
            {"success_rate": rate, "latency_ms": {"p95": 9.0}}))
    found = verdict("balanced", tmp_path)
    assert found["met"] is met
    assert (found["p95_overhead_ms"], found["target_p95_ms"]) == (overhead, 4.5)
