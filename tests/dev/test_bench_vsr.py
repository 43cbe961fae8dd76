"""The vsr runner maps every header the Semantic Router's script reads, and only to names
our contract defines. Their script is not in this project: the tests run on a stand-in with
its record shape and the header names it reads (``SAAR_VSR_SCRIPT`` names the real one)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from extproc.adapter.contract import DIAGNOSTIC_HEADERS
from extproc.dev.bench.vsr import HEADER_MAP, load_script

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
