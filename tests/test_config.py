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
         "routing.decisions[3].algorithm.session_aware.idle_timeout_seconds: expected a number"),
        (lambda d: d["models"]["qwen3-8b"].pop("cluster"),
         "models.qwen3-8b.cluster: required key is missing"),
        (lambda d: d["routing"]["decisions"][0]["rules"].update(regex=["(unclosed"]),
         "routing.decisions[0].rules.regex[0]"),
        (lambda d: d["routing"].update(logical_models=["qwen3-8b"]), "also a physical model"),
        (lambda d: d["limits"].update(max_body_bytes=True), "expected an integer"),
        (lambda d: d["routing"]["decisions"][0]["algorithm"].update(type="static"),
         "only 'session_aware'"),
    ],
)
def test_validation_names_file_and_key(example_data, mutate, message):
    data = copy.deepcopy(example_data)
    mutate(data)
    with pytest.raises(ConfigError) as info:
        parse_config(data, source="saar.yaml")
    assert str(info.value).startswith("saar.yaml: ")
    assert message in str(info.value)


def test_unreadable_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed")
    with pytest.raises(ConfigError, match=r"bad\.yaml: cannot read YAML"):
        load_config(bad)
