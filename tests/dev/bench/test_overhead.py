"""Smoke tests of ``saar bench overhead``: the machinery runs end to end, tiny and fast."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest
import yaml

from extproc.adapter.bootstrap import EnvoyPorts, bootstrap
from extproc.cli import main
from extproc.config import parse_config
from extproc.dev import EXAMPLE_CONFIG
from extproc.dev.bench.bodies import SIZES, body
from extproc.dev.bench.load import Load, run_load
from extproc.dev.bench.overhead import HEADERS
from extproc.dev.bench.upstream import canned_upstream
from extproc.dev.bench.variants import TRANSFORMS, pointed_at

pytestmark = pytest.mark.e2e
RESULT_KEYS = {"variant", "body", "concurrency", "round", "p50_ms", "p99_ms", "rps", "requests",
               "non_200", "cpu_ms"}


def test_bodies_have_exact_sizes() -> None:
    for name, size in SIZES.items():
        for model in ("auto", "qwen3-8b"):
            raw = body(name, model)
            assert len(raw) == size
            assert json.loads(raw)["model"] == model


def test_variants_differ_only_in_filters_and_upstream() -> None:
    config = parse_config(yaml.safe_load(EXAMPLE_CONFIG.read_text()))

    def names(variant: str) -> list[str]:
        doc = pointed_at("127.0.0.1:1", TRANSFORMS[variant])(bootstrap(config, EnvoyPorts()))
        hcm = doc["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        for cluster in doc["static_resources"]["clusters"][2:]:  # after both processor ones
            endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
            assert endpoint["address"]["socket_address"]["port_value"] == 1
        return [f["name"] for f in hcm["typed_config"]["http_filters"]]

    assert names("envoy") == ["envoy.filters.http.router"]
    assert names("passthrough") == ["passthrough", "envoy.filters.http.router"]
    assert names("saar") == ["saar", "saar-observe", "envoy.filters.http.router"]


def test_overhead_json_all_variants_200(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["bench", "overhead", "--json", "--client", "python", "--warmup", "0.05",
            "--duration", "0.3", "--bodies", "2kb,256kb,2kb-stream", "--concurrency", "1,4",
            "--rounds", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["client"] == "python"
    results = report["results"]
    cells = [(r["round"], r["variant"], r["body"], r["concurrency"]) for r in results]
    assert sorted(cells) == sorted((n, v, b, c) for n in (0, 1)
                                   for v in ("envoy", "passthrough", "saar")
                                   for b in ("2kb", "256kb", "2kb-stream") for c in (1, 4))
    assert [r for r, *_ in cells] == sorted(r for r, *_ in cells)  # every variant each round
    judged = [line.split(":")[0] for line in out if "(line: " in line]
    assert judged == ["saar 2kb c=1", "saar 2kb c=4"]  # the 256 KB body has no line
    for result in results:
        assert set(result) == RESULT_KEYS
        assert result["requests"] > 0 and result["non_200"] == 0, result
        assert result["p99_ms"] >= result["p50_ms"] > 0 and result["rps"] > 0
        assert set(result["cpu_ms"]) == {"processor", "envoy"}  # no store in these variants
        assert all(ms >= 0 for ms in result["cpu_ms"].values())
    envoy = sum(r["cpu_ms"]["envoy"] * r["requests"] for r in results)
    assert envoy > 0, "Envoy's CPU time is read while it serves"


@pytest.mark.skipif(not shutil.which("wrk"), reason="wrk not installed")
def test_wrk_client_against_the_canned_upstream() -> None:
    with tempfile.TemporaryDirectory() as tmp, canned_upstream(Path(tmp)) as address:
        load = Load(f"http://{address}/v1/chat/completions", body("2kb", "qwen3-8b"), HEADERS,
                    concurrency=2, warmup_s=0, duration_s=1)
        result = run_load(load, "wrk")
    assert result.requests > 0 and result.non_200 == 0
    assert result.p99_ms >= result.p50_ms > 0


def test_a_busy_pass_through_is_the_pass_through_s_config_and_burns_its_time() -> None:
    import asyncio
    import time

    from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

    from extproc.dev.bench.passthrough import PassThrough, command
    from extproc.dev.bench.variants import passthrough, transform

    assert transform("busy-450") is passthrough
    assert transform("saar") is TRANSFORMS["saar"]
    for wrong in ("busy-", "busy-fast", "nope"):
        with pytest.raises(ValueError, match="unknown variant"):
            transform(wrong)
    argv = command("busy-450")
    assert argv is not None and argv(7)[-4:] == ["--port", "7", "--busy-us", "450"]

    messages = [ep.ProcessingRequest(request_headers=ep.HttpHeaders()),
                ep.ProcessingRequest(request_body=ep.HttpBody(body=b"{}", end_of_stream=True))]

    async def replies(servicer: PassThrough) -> tuple[list[ep.ProcessingResponse], float]:
        async def requests():  # type: ignore[no-untyped-def]
            for message in messages:
                yield message

        started = time.process_time()
        out = [r async for r in servicer.Process(requests(), None)]  # type: ignore[arg-type]
        return out, time.process_time() - started

    plain, _ = asyncio.run(replies(PassThrough()))
    busy, spent = asyncio.run(replies(PassThrough(busy_seconds=0.05)))
    assert busy == plain  # the same empty CONTINUEs
    assert spent >= 0.05  # CPU, not a sleep: the body's 50 ms were burned
