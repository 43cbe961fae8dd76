"""The models list Envoy answers: each model's context window as clients read it; a logical
model's is the longest context every decision can serve."""

from __future__ import annotations

import pytest

from extproc.apis.models import WINDOW_FIELDS, context_window, model_list
from extproc.config import parse_config


def _config(windows: dict[str, int], decisions: list[list[str]],
            logical: tuple[str, ...] = ("auto",)):
    return parse_config({
        "models": {name: {"cluster": name, "context_window": w} for name, w in windows.items()},
        "routing": {"logical_models": list(logical), "decisions": [
            {"name": f"d{i}", "modelRefs": [{"model": m} for m in refs]}
            for i, refs in enumerate(decisions)]},
    })


@pytest.mark.parametrize(("windows", "decisions", "auto"), [
    ({"a": 8192}, [["a"]], 8192),
    ({"a": 8192, "b": 131072}, [["a", "b"]], 131072),        # it switches up when it outgrows
    ({"a": 8192, "b": 131072}, [["a", "b"], ["a"]], 8192),   # one decision reaches a only
    ({"a": 32768, "b": 65536, "c": 131072}, [["a", "c"], ["b"], ["a", "b"]], 65536),
])
def test_a_logical_window_is_the_smallest_of_the_largest_per_decision(windows, decisions, auto):
    config = _config(windows, decisions)
    assert context_window(config, "auto") == auto
    for name, window in windows.items():
        assert context_window(config, name) == window


def test_the_list_names_logical_models_first_with_every_window_field():
    config = _config({"a": 8192, "b": 131072}, [["a", "b"]], logical=("auto", "fast"))
    listing = model_list(config)
    assert listing["object"] == "list"
    assert [m["id"] for m in listing["data"]] == ["auto", "fast", "a", "b"]
    for card in listing["data"]:
        assert card["object"] == "model" and isinstance(card["created"], int)
        assert card["owned_by"]
        assert {card[f] for f in WINDOW_FIELDS} == {context_window(config, card["id"])}
    assert set(WINDOW_FIELDS) == {"max_model_len", "context_length", "context_window"}
