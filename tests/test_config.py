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
    assert err.startswith(f"saar: {bad}:1: models.m.quality: must be less than or equal to 1")
    assert "Traceback" not in err


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.yaml:1: cannot read YAML: while parsing a "
                       r"flow sequence; expected ',' or '\]'"):
        load_config(bad)
    with pytest.raises(ConfigError, match=r"missing\.yaml: cannot read: No such file"):
        load_config(tmp_path / "missing.yaml")


# --- issue 32: duplicate keys, file:line, did you mean ----------------------------------------

_MODELS = """\
models:
  m:
    cluster: m
    endpoints: [a:1]
    quality: 0.5
  n:
    cluster: n
routing:
  logical_models: [auto]
  decisions:
    - name: only
      modelRefs:
        - model: m
        - model: n
"""
"""A config whose keys sit on known lines (models.m.quality: line 5; the decision: line 11)."""


def _with(old: str, new: str) -> str:
    assert _MODELS.count(old) == 1, old
    return _MODELS.replace(old, new)


@pytest.mark.parametrize(("text", "message"), [
    pytest.param(_with("    quality: 0.5\n", "    quality: 0.5\n    endpoints: [b:2]\n"),
                 "saar.yaml:6: models.m.endpoints: duplicate key (first at line 4)",
                 id="a model's endpoints twice"),
    pytest.param(_MODELS + "models: {}\n", "saar.yaml:15: models: duplicate key (first at line 1)",
                 id="a section twice"),
    pytest.param(_with("    - name: only\n", "    - name: only\n      name: again\n"),
                 "saar.yaml:12: routing.decisions[0].name: duplicate key (first at line 11)",
                 id="in a list's item"),
    pytest.param(_with("    quality: 0.5", "    qualty: 0.5"),
                 "saar.yaml:5: models.m.qualty: unknown key (did you mean 'quality'?)",
                 id="did you mean, in a model"),
    pytest.param(_MODELS + "limts: {max_body_bytes: 1}\n",
                 "saar.yaml:15: limts: unknown key (did you mean 'limits'?)",
                 id="did you mean, at the top"),
    pytest.param(_with("    - name: only\n",
                       "    - name: only\n      algorithm: {session_aware: {stay_bais: 1}}\n"),
                 "saar.yaml:12: routing.decisions[0].algorithm.session_aware.stay_bais: unknown "
                 "key (did you mean 'stay_bias'?)", id="did you mean, deep in a list"),
    pytest.param(_MODELS + "scheduling: {prefix: {mdoe: precise}}\n",
                 "saar.yaml:15: scheduling.prefix.mdoe: unknown key (did you mean 'mode'?)",
                 id="did you mean, in a section"),
    pytest.param(_MODELS + "frobnicate: 1\n", "saar.yaml:15: frobnicate: unknown key",
                 id="no near miss"),
    pytest.param(_with("    quality: 0.5", "    quality: 7"),
                 "saar.yaml:5: models.m.quality: must be less than or equal to 1, got 7",
                 id="a value out of range"),
    pytest.param(_with("    cluster: n\n", "    quality: 0.5\n"),
                 "saar.yaml:6: models.n.cluster: required key is missing",
                 id="a missing key: its mapping's line"),
    pytest.param(_with("        - model: n\n", "        - model: gpt-9\n"),
                 "saar.yaml:14: routing.decisions[0].modelRefs[1].model: unknown model 'gpt-9'",
                 id="a reference"),
    pytest.param(_MODELS + "scheduling:\n  scorers:\n    prefx: 1\n",
                 "saar.yaml:17: scheduling.scorers.prefx: unknown scorer (did you mean "
                 "'prefix'?)", id="a scorer's name"),
    pytest.param(_MODELS + "logging: {format: yaml}\n",
                 "saar.yaml:15: logging.format: must be 'text' or 'json', got 'yaml'",
                 id="the log format"),
    pytest.param("models:\n  m: {cluster: m\n", "saar.yaml:3: cannot read YAML",
                 id="YAML that does not parse"),
])
def test_a_config_error_names_the_file_line_and_key(tmp_path, text, message):
    path = tmp_path / "saar.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    first = str(info.value).splitlines()[0]
    assert first.startswith(f"{tmp_path}/{message}"), first


def test_a_merge_key_is_no_duplicate_and_the_explicit_key_wins(tmp_path):
    path = tmp_path / "saar.yaml"
    path.write_text("_tier: &tier {cluster: m, quality: 0.2}\n" + _MODELS.replace(
        "  m:\n    cluster: m\n", "  m:\n    <<: *tier\n"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:1: _tier: unknown key"  # and nothing about models.m
    path.write_text(_MODELS.replace("  m:\n    cluster: m\n", "  m:\n    <<: {cluster: m, "
                                    "quality: 0.2}\n"))
    assert load_config(path).models["m"].quality == 0.5


def test_the_logging_section_defaults_to_text_at_info(example_data):
    logging = parse_config(example_data).logging
    assert (logging.level, logging.format) == ("info", "text")


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


def test_the_drain_defaults_and_the_deprecated_drain_seconds(example_data):
    """``server.drain_seconds`` (the old single number) keeps loading as the drain's notice;
    given beside ``drain.notice_seconds`` it is refused, not silently picked."""
    example_data.setdefault("server", {}).pop("drain_seconds", None)
    server = parse_config(example_data).server
    assert (server.notice_seconds, server.drain.timeout_seconds) == (1.0, 25.0)
    example_data["server"]["drain_seconds"] = 0.2
    assert parse_config(example_data).server.notice_seconds == 0.2
    example_data["server"]["drain"] = {"notice_seconds": 3, "timeout_seconds": 40}
    with pytest.raises(ConfigError, match="drain_seconds is the deprecated name"):
        parse_config(example_data)
    del example_data["server"]["drain_seconds"]
    server = parse_config(example_data).server
    assert (server.notice_seconds, server.drain.timeout_seconds) == (3, 40)
