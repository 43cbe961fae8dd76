"""The Grafana dashboard and the Prometheus alert rules in deploy/: every metric they name is one
the service exports, and the rules behave as their unit tests say (the real promtool)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from dataclasses import replace

import httpx
import pytest
import yaml

from extproc.service.app import start
from tests.conftest import ROOT

DASHBOARD = ROOT / "deploy" / "grafana" / "saar-dashboard.json"
RULES = ROOT / "deploy" / "prometheus" / "saar-alerts.yaml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "saar-alerts.test.yaml"
NAME = re.compile(r"\b((?:saar|inference_objective|inference_pool|gen_ai)_[a-z0-9_]+)")
"""Our own names and the upstream-named ones (the Inference Extension's, the GenAI ones)."""
LABELS = re.compile(r"\{[^}]*\}|\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)")
"""Label matchers and grouping clauses: the label names in them are not metrics."""


def metric_names(expr: str) -> set[str]:
    return set(NAME.findall(LABELS.sub(" ", expr)))
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",), "summary": ("", "_sum", "_count")}


async def exported(config) -> set[str]:
    """The series names a running service's registry exports (the runtime gauges included)."""
    running = await start(replace(config, server=replace(config.server, grpc_port=0,
                                                         http_port=0)))
    try:
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{running.http_port}/metrics")).is_success
        families = list(running.parts.metrics.registry.collect())
    finally:
        await running.stop()
    names = set()
    for family in families:
        names.update(family.name + suffix for suffix in SUFFIXES[family.type])
    return names


def dashboard_exprs() -> list[str]:
    document = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in document["panels"] for t in panel.get("targets", ())]
    exprs += [v["query"]["query"] for v in document["templating"]["list"] if v["type"] == "query"]
    return exprs


def rule_exprs() -> list[str]:
    return [rule["expr"] for group in yaml.safe_load(RULES.read_text())["groups"]
            for rule in group["rules"]]


@pytest.mark.parametrize("source", ["dashboard", "rules"])
async def test_every_metric_named_is_exported(source, config):
    exprs = dashboard_exprs() if source == "dashboard" else rule_exprs()
    named = {name for expr in exprs for name in metric_names(expr)}
    assert named, "the file names no metric at all"
    assert named - await exported(config) == set()


def test_the_dashboard_covers_what_operators_ask_for():
    named = {name for expr in dashboard_exprs() for name in metric_names(expr)}
    for wanted in ("saar_scheduling_plugin_seconds_bucket", "saar_router_overhead_seconds_bucket",
                   "saar_session_duration_seconds_bucket", "saar_session_turns_sum",
                   "saar_session_tool_seconds_bucket", "saar_session_switches_sum",
                   "saar_session_locked_turns_sum", "saar_store_seconds_bucket",
                   "saar_store_errors_total", "saar_holds_total", "saar_asyncio_tasks",
                   "saar_table_entries", "saar_gc_seconds_bucket", "saar_tokens_total",
                   "gen_ai_client_token_usage_sum",
                   "gen_ai_server_request_duration_seconds_bucket",
                   "inference_pool_average_kv_cache_utilization",
                   "inference_pool_per_pod_queue_size", "inference_objective_request_total",
                   "inference_objective_request_error_total"):
        assert wanted in named, wanted
    document = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in document["panels"]]
    assert len(ids) == len(set(ids))
    datasources = {t["datasource"]["uid"] for panel in document["panels"]
                   for t in panel.get("targets", ())}
    assert datasources == {"${datasource}"}, "the Prometheus data source is a variable"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    assert promtool, "promtool comes with Debian's prometheus package (`make install`)"
    return subprocess.run([promtool, *args], cwd=RULES.parent, capture_output=True, text=True)


def test_promtool_checks_the_rules():
    checked = _promtool("check", "rules", RULES.name)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "10 rules found" in checked.stdout


def test_promtool_unit_tests_of_the_rules_pass():
    tested = _promtool("test", "rules", RULE_TESTS.name)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    alerts = {t["alertname"] for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for t in group["alert_rule_test"]}
    assert {"SaarRouterOverheadHigh", "SaarSchedulingPluginSlow", "SaarErrorRatioHigh",
            "SaarStoreDown", "SaarStoreWritesDropped", "SaarProcessorDown"} <= alerts
