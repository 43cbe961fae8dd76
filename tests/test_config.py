from __future__ import annotations

import copy

import pytest

from extproc.config import ConfigError, load_config, parse_config
from tests.conftest import EXAMPLE_CONFIG


def test_example_loads_with_article_block_as_written():
    config = load_config(EXAMPLE_CONFIG)
    article = next(d for d in config.routing.decisions if d.name == "agentic_routing")
    assert article.name == "agentic_routing"
    assert [r.model for r in article.modelRefs] == ["qwen3-8b", "qwen3-32b"]
    knobs = article.algorithm.session_aware
    assert knobs.prefix_cache_weight == 0.20
    assert knobs.switch_history_weight == 0.04
    # Knobs the article leaves out keep the reference defaults.
    assert knobs.switch_margin == 0.05
    assert knobs.remaining_turn_prior_horizon == 8


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["routing"]["decisions"][0].update(modelrefs=[]), "unknown key"),
        (lambda d: d["routing"]["decisions"][0]["modelRefs"].append({"model": "gpt-9"}),
         "routing.decisions[0].modelRefs[2].model: unknown model 'gpt-9'"),
        (lambda d: d["routing"]["decisions"][3]["algorithm"]["session_aware"].update(
            idle_timeout_seconds="soon"),
         "routing.decisions[3].algorithm.session_aware.idle_timeout_seconds: "
         "must be a valid number"),
        (lambda d: d["models"]["qwen3-8b"].pop("cluster"),
         "models.qwen3-8b.cluster: required key is missing"),
        (lambda d: d["routing"]["decisions"][0]["rules"].update(regex=["(unclosed"]),
         "routing.decisions[0].rules.regex[0]"),
        (lambda d: d["routing"].update(logical_models=["qwen3-8b"]), "also a physical model"),
        (lambda d: d["limits"].update(max_body_bytes=True), "must be a valid integer"),
        (lambda d: d["routing"]["decisions"][0]["algorithm"].update(type="static"),
         "must be 'session_aware', got 'static'"),
    ],
)
def test_validation_names_file_and_key(example_data, mutate, message):
    data = copy.deepcopy(example_data)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="saar.yaml")
    assert str(info.value).startswith("saar.yaml: ")
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["models"]["qwen3-8b"].update(quality=7),
         "models.qwen3-8b.quality: must be less than or equal to 1, got 7"),
        (lambda d: d["models"]["qwen3-8b"].update(context_window=-1),
         "models.qwen3-8b.context_window: must be greater than or equal to 1, got -1"),
        (lambda d: d["server"].update(grpc_port=99999),
         "server.grpc_port: must be less than or equal to 65535, got 99999"),
        (lambda d: d.setdefault("scheduling", {}).update(scorers={"prefix": -3}),
         "scheduling.scorers.prefix: must be greater than or equal to 0, got -3"),
        (lambda d: d.setdefault("scheduling", {}).update(scrape_interval_seconds=0),
         "scheduling.scrape_interval_seconds: must be greater than or equal to 0.01, got 0"),
        (lambda d: d.setdefault("scheduling", {}).update(scrape_idle_interval_seconds=0.001),
         "scheduling.scrape_idle_interval_seconds: must be greater than or equal to 0.01, got "
         "0.001"),
        (lambda d: d.setdefault("scheduling", {}).update(
            admission={"pause_threshold": 0.7, "resume_target": 0.8}),
         "scheduling.admission.pause_threshold: must be above resume_target (0.8)"),
        (lambda d: d["memory"].update(max_sessions=0),
         "memory.max_sessions: must be greater than or equal to 1, got 0"),
        (lambda d: d["routing"]["decisions"][0]["algorithm"]["session_aware"].update(
            return_rate=1.5),
         "routing.decisions[0].algorithm.session_aware.return_rate: "
         "must be less than or equal to 1, got 1.5"),
        (lambda d: d["routing"]["decisions"][0]["algorithm"]["session_aware"].update(
            remaining_turn_prior=-2),
         "routing.decisions[0].algorithm.session_aware.remaining_turn_prior: "
         "must be greater than or equal to 0, got -2"),
        (lambda d: d.setdefault("state", {}).update(store="etcd"),
         "state.store: must be 'memory' or 'redis', got 'etcd'"),
        (lambda d: d["models"]["qwen3-8b"].update(endpoints=["no-port"]),
         "models.qwen3-8b.endpoints[0]: must be host:port, got 'no-port'"),
        (lambda d: d["routing"]["decisions"][0]["rules"].update(apis=["grpc"]),
         "routing.decisions[0].rules.apis[0]: must be 'openai_chat', 'openai_responses', "
         "'anthropic_messages' or 'openai_completions', got 'grpc'"),
        (lambda d: d["models"]["qwen3-8b"].update(
            endpoints=[], workers=[{"address": "a:1", "role": "prefil"}]),
         "models.qwen3-8b.workers[0].role: must be 'prefill', 'decode' or 'both'"),
        (lambda d: d["models"].update(lora={"cluster": "qwen3-8b", "base": "gpt-9"}),
         "models.lora.base: unknown model 'gpt-9'"),
        (lambda d: d["models"].update(lora={"cluster": "qwen3-8b", "base": "qwen3-8b"},
                                      lora2={"cluster": "qwen3-8b", "base": "lora"}),
         "models.lora2.base: 'lora' is itself an adapter (of 'qwen3-8b')"),
        (lambda d: d["models"].update(lora={"cluster": "qwen3-8b", "base": "qwen3-8b",
                                            "endpoints": ["a:1"]}),
         "models.lora: an adapter has no workers of its own"),
        (lambda d: d["models"].update(lora={"cluster": "other", "base": "qwen3-8b"}),
         "models.lora.cluster: an adapter goes to its base's cluster ('qwen3-8b')"),
        (lambda d: d.setdefault("scheduling", {}).update(
            disaggregation={"scorers": {"nope": 1}}),
         "scheduling.disaggregation.scorers.nope: unknown scorer"),
        (lambda d: d.setdefault("scheduling", {}).update(
            disaggregation={"mode": "sometimes"}),
         "scheduling.disaggregation.mode: must be 'session_aware', 'always' or 'never'"),
    ],
)
def test_values_out_of_range_are_refused_with_their_key(example_data, mutate, message):
    """Issue 9 item 18: ranges and literals, each error naming the file and dotted key."""
    data = copy.deepcopy(example_data)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="saar.yaml")
    assert f"saar.yaml: {message}" in str(info.value)


def test_a_bad_config_fails_the_cli_without_a_traceback(tmp_path, capsys):
    from extproc.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("models: {m: {cluster: m, quality: 7}}\n")
    assert main(["serve", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"saar: {bad}: models.m.quality: must be less than or equal to 1")
    assert "Traceback" not in err


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.yaml: cannot read YAML"):
        load_config(bad)


@pytest.mark.parametrize(("routing", "own", "strips"), [
    ({}, None, True),  # on by default: the workers are self-hosted engines
    ({"strip_upstream": False}, None, False),
    ({}, False, False),  # a model that is a hosted API keeps the line
    ({"strip_upstream": False}, True, True),
])
def test_volatile_preambles_are_stripped_upstream_by_default(example_data, routing, own, strips):
    data = copy.deepcopy(example_data)
    data["routing"]["prompt_normalisation"] = routing
    if own is not None:
        data["models"]["qwen3-8b"]["strip_volatile_preambles"] = own
    config = parse_config(data)
    assert config.strips_preambles("qwen3-8b") is strips
    normalisation = config.routing.prompt_normalisation
    assert config.strips_preambles("qwen3-32b") is normalisation.strip_upstream
    assert "x-anthropic-billing-header" in normalisation.volatile_preambles[0]


def test_a_bad_preamble_pattern_names_its_key(example_data):
    data = copy.deepcopy(example_data)
    data["routing"]["prompt_normalisation"] = {"volatile_preambles": ["ok", "(unclosed"]}
    where = r"saar\.yaml: routing\.prompt_normalisation\.volatile_preambles\[1\]"
    with pytest.raises(ConfigError, match=where):
        parse_config(data, source="saar.yaml")
