"""Issue 15's lines as ``saar bench overhead`` prints them: each variant against its floor in the
same run (saar against the pass-through, the Redis variant against saar)."""

from __future__ import annotations

import pytest

from extproc.dev.bench.load import LoadResult
from extproc.dev.bench.overhead import Cell, Report, verdicts


def cell(variant: str, body: str, concurrency: int, p50_ms: float, requests: int,
         non_200: int = 0, round_: int = 0) -> Cell:
    """A cell measured over 10 s: ``requests`` / 10 is its req/s."""
    return Cell(variant, body, concurrency, LoadResult(requests, non_200, 10.0, p50_ms, 2 * p50_ms),
                {}, round_)


def lines(*cells: Cell) -> list[str]:
    return verdicts(Report("wrk", "canned", list(cells)))


@pytest.mark.parametrize(("saar_p50", "verdict"), [(2.19, "met"), (2.50, "met"), (2.51, "MISSED")])
def test_saar_at_c1_is_judged_by_the_p50_it_adds_over_the_pass_through(saar_p50: float,
                                                                      verdict: str) -> None:
    out = lines(cell("envoy", "2kb", 1, 0.3, 5000), cell("passthrough", "2kb", 1, 2.0, 4000),
                cell("saar", "2kb", 1, saar_p50, 3000))
    assert out == [f"saar 2kb c=1: p50 {saar_p50 - 2.0:+.2f} ms over passthrough "
                   f"(line: <= 0.5 ms): {verdict}"]


@pytest.mark.parametrize(("saar_requests", "share", "verdict"),
                         [(7000, "70%", "met"), (6990, "70%", "MISSED"), (3900, "39%", "MISSED")])
def test_saar_at_c16_is_judged_by_its_share_of_the_pass_through_s_rate(
        saar_requests: int, share: str, verdict: str) -> None:
    out = lines(cell("passthrough", "64kb", 16, 9.0, 10000),
                cell("saar", "64kb", 16, 20.0, saar_requests))
    assert out == [f"saar 64kb c=16: {saar_requests / 10:.0f} req/s, {share} of passthrough's "
                   f"1000 (line: >= 70%): {verdict}"]


def test_the_redis_variant_is_judged_against_saar_not_the_pass_through() -> None:
    out = lines(cell("passthrough", "2kb", 1, 1.0, 9000), cell("saar", "2kb", 1, 3.0, 3000),
                cell("saar-redis", "2kb", 1, 3.2, 2900),
                cell("passthrough", "2kb", 16, 10.0, 15000), cell("saar", "2kb", 16, 25.0, 6000),
                cell("saar-redis", "2kb", 16, 30.0, 5000))
    assert out == [
        "saar 2kb c=1: p50 +2.00 ms over passthrough (line: <= 0.5 ms): MISSED",
        "saar 2kb c=16: 600 req/s, 40% of passthrough's 1500 (line: >= 70%): MISSED",
        "saar-redis 2kb c=1: p50 +0.20 ms over saar (line: <= 0.3 ms): met",
        "saar-redis 2kb c=16: 500 req/s, 83% of saar's 600 (line: >= 85%): MISSED",
    ]


def test_failed_requests_never_meet_a_line_and_cells_without_a_floor_are_not_judged() -> None:
    out = lines(cell("passthrough", "2kb", 1, 2.0, 4000), cell("saar", "2kb", 1, 2.1, 3000, 5),
                cell("saar", "64kb", 1, 2.1, 3000),  # no pass-through at 64 KB
                cell("passthrough", "1mb", 1, 5.0, 900), cell("saar", "1mb", 1, 5.1, 800),
                cell("saar-route-only", "2kb", 1, 2.1, 3000))
    assert out == ["saar 2kb c=1: p50 +0.10 ms over passthrough with 5 non-200 "
                   "(line: <= 0.5 ms): MISSED"]


def test_over_rounds_each_is_judged_against_the_floor_of_its_own_round_and_the_median_decides(
) -> None:
    # The pass-through's second round was slow: against it, saar's second round looks fine,
    # while against the other rounds' floors it would not.
    out = lines(cell("passthrough", "2kb", 1, 2.0, 4000, round_=0),
                cell("saar", "2kb", 1, 3.0, 3000, round_=0),
                cell("passthrough", "2kb", 1, 4.0, 4000, round_=1),
                cell("saar", "2kb", 1, 4.3, 3000, round_=1),
                cell("passthrough", "2kb", 1, 2.0, 4000, round_=2),
                cell("saar", "2kb", 1, 2.4, 3000, round_=2),
                cell("passthrough", "2kb", 16, 10.0, 10000, round_=0),
                cell("saar", "2kb", 16, 20.0, 6000, round_=0),
                cell("passthrough", "2kb", 16, 10.0, 8000, round_=1),
                cell("saar", "2kb", 16, 20.0, 7200, round_=1),
                cell("passthrough", "2kb", 16, 10.0, 10000, round_=2),
                cell("saar", "2kb", 16, 20.0, 7500, round_=2))
    assert out == [
        "saar 2kb c=1: p50 +0.40 ms over passthrough, median of +1.00 / +0.30 / +0.40 "
        "(line: <= 0.5 ms): met",
        "saar 2kb c=16: 720 req/s, 75% of passthrough's 1000, median of 60% / 90% / 75% "
        "(line: >= 70%): met",
    ]
