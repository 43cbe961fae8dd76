"""The model's chat template, rendered as vLLM renders it (the rules, as a table; the real
engine's ``/tokenize`` checks the same in tests/e2e/test_vllm.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models, pre_tokenizers

from extproc.apis import parse_request
from extproc.scheduling.tokenizer import Tokenizer
from extproc.types import Api

TEMPLATE = Path(__file__).parents[2] / "extproc" / "dev" / "engines" / "chatml.jinja"
TOOL = {"function": {"parameters": {"type": "object"}, "name": "ls"}, "type": "function"}
CALL = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"a":1}'}}


def _directory(tmp_path: Path, template: str | None) -> Path:
    vocab = {chr(c): c - 31 for c in range(32, 127)} | {"[UNK]": 0}
    hf = HFTokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    hf.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    hf.save(str(tmp_path / "tokenizer.json"))
    config: dict[str, Any] = {"eos_token": "<|im_end|>"}
    if template is not None:
        config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.fixture
def chatml(tmp_path: Path) -> Tokenizer:
    return Tokenizer(_directory(tmp_path, TEMPLATE.read_text()))


CASES = [
    ("plain", [{"role": "user", "content": "hi"}], None,
     "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
    ("content parts, to a template that loops over them",
     [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
     None, "<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"),
    ("tool keys in the engine's order, null where absent", [{"role": "user", "content": "q"}],
     [TOOL], '<|im_start|>system\n# Tools\n\nYou may call one or more functions to assist with '
     'the user query.\n\n<tools>\n{"type": "function", "function": {"name": "ls", "description": '
     'null, "parameters": {"type": "object"}}}\n</tools>\n\nFor each call, return a JSON object '
     "with the function name and arguments within <tool_call></tool_call> tags.<|im_end|>\n"
     "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"),
    ("arguments parsed, then dumped",
     [{"role": "assistant", "content": None, "tool_calls": [CALL]}], None,
     '<|im_start|>assistant\n\n<tool_call>\n{"name": "ls", "arguments": {"a": 1}}\n'
     "</tool_call><|im_end|>\n<|im_start|>assistant\n"),
    ("arguments that are not JSON: an empty object",
     [{"role": "assistant", "content": "", "tool_calls": [
         {**CALL, "function": {"name": "ls", "arguments": "{oops"}}]}],
     None, '<|im_start|>assistant\n\n<tool_call>\n{"name": "ls", "arguments": {}}\n'
     "</tool_call><|im_end|>\n<|im_start|>assistant\n"),
    ("non-ASCII kept", [{"role": "tool", "tool_call_id": "c1", "content": "ä “x”"}], None,
     "<|im_start|>user\n<tool_response>\nä “x”\n</tool_response><|im_end|>\n"
     "<|im_start|>assistant\n"),
]


@pytest.mark.parametrize(("name", "messages", "tools", "rendered"), CASES,
                         ids=[c[0] for c in CASES])
def test_a_chat_body_renders_as_the_engine_renders_it(
        chatml: Tokenizer, name: str, messages: list[Any], tools: list[Any] | None,
        rendered: str) -> None:
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if tools:
        body["tools"] = tools
    assert chatml.render_chat(body) == rendered
    summary = parse_request(Api.CHAT, json.dumps(body).encode(), max_body_bytes=1 << 20)
    assert chatml.prompt_tokens(summary) == chatml.encode(rendered)


def test_a_template_that_takes_strings_gets_parts_joined_by_newlines(tmp_path: Path) -> None:
    plain = "{% for m in messages %}[{{ m.content }}]{% endfor %}"
    tokenizer = Tokenizer(_directory(tmp_path, plain))
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
                                                      {"type": "text", "text": "b"}]}]}
    assert tokenizer.render_chat(body) == "[a\nb]"


def test_without_a_template_the_router_counts_nothing(tmp_path: Path) -> None:
    tokenizer = Tokenizer(_directory(tmp_path, None))
    summary = parse_request(Api.CHAT, b'{"model":"m","messages":[{"role":"user","content":"x"}]}',
                            max_body_bytes=1 << 20)
    assert not tokenizer.templated
    assert tokenizer.prompt_tokens(summary) is None
    assert Tokenizer(tmp_path / "tokenizer.json").encode("ab") == [66, 67]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer(tmp_path)


@pytest.mark.parametrize(("prompt", "tokens"), [
    ("hi!", [73, 74, 2]),  # no template wraps it
    ([[9, 8, 7]], [9, 8, 7]),  # the ids it sent, a batch of one
    ([5, 6], [5, 6]),
    (["a", "b"], None),  # a batch: several sequences, none of them the request's
])
def test_a_completions_prompt_is_its_own_tokens(chatml: Tokenizer, prompt: Any, tokens: Any):
    body = json.dumps({"model": "m", "prompt": prompt}).encode()
    summary = parse_request(Api.COMPLETIONS, body, max_body_bytes=1 << 20)
    assert chatml.prompt_tokens(summary) == tokens
