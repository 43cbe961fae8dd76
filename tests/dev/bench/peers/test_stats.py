"""The figures: percentiles, and a router's entry over its rounds."""

from __future__ import annotations

import pytest

from extproc.dev.bench.peers.stats import FIGURES, Measure, Overhead, details, figures, percentile


@pytest.mark.parametrize(("values", "pct", "expected"), [
    ([], 50, None),
    ([7.0], 99, 7.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.5),
    ([4.0, 1.0, 3.0, 2.0], 0, 1.0),
    ([4.0, 1.0, 3.0, 2.0], 100, 4.0),
    ([float(v) for v in range(1, 101)], 90, 90.1),
    ([float(v) for v in range(1, 101)], 99, 99.01),
    ([10.0, 20.0], 25, 12.5),
])
def test_percentile_interpolates_between_closest_ranks(values, pct, expected):
    got = percentile(values, pct)
    assert got == (None if expected is None else pytest.approx(expected))


def test_percentile_refuses_out_of_range():
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_figures_pool_the_rounds():
    one = Measure(0, hit_tokens=90, query_tokens=100, ttfts_s=[0.1, 0.2], output_tokens=100,
                  wall_s=2.0, requests=2, rss_mib=80.0,
                  overhead=Overhead(added_p50_ms_c1=1.0, rps_c16=100, cpu_ms_per_req_c16=2.0))
    two = Measure(1, hit_tokens=10, query_tokens=100, ttfts_s=[0.3], output_tokens=300,
                  wall_s=1.0, requests=1, errors={"http 504": 1}, rss_mib=90.0,
                  overhead=Overhead(added_p50_ms_c1=3.0, rps_c16=300, cpu_ms_per_req_c16=4.0,
                                    errors=2))
    got = figures([one, two])
    assert list(got) == list(FIGURES)
    assert got == {"prefix_hit": 0.5, "ttft_p50_s": 0.2, "ttft_p90_s": 0.28, "ttft_p99_s": 0.298,
                   "throughput_tok_s": 175.0, "added_p50_ms_c1": 2.0,
                   "cpu_ms_per_req_c16": 3.0, "rss_mib": 90.0}
    assert details([one, two]) == {"requests": 3, "errors": 1, "error_kinds": {"http 504": 1},
                                   "overhead_errors": 2, "rps_c16": 200.0, "rounds": 2}


def test_figures_without_samples_are_null():
    got = figures([Measure(0)])
    assert got["prefix_hit"] is None and got["ttft_p50_s"] is None
    assert got["added_p50_ms_c1"] is None and got["throughput_tok_s"] == 0.0
