"""A tiny random-weight model that a real vLLM serves, made offline: nothing from a hub.

Qwen2's shape (4 layers, hidden 256, 4 heads of 64, 2 KV heads, 8,192-token vocabulary), a
byte-level BPE tokenizer trained on the Python standard library's own sources (the same text on
every machine with this Python), and a ChatML template with tools (``chatml.jinja``) whose tool
calls vLLM's ``hermes`` parser reads. The answers are random text; what the router depends on —
tokenization, the chat template, prefix caching, metrics, KV events — is the real engine's.

Run by the engine environment's interpreter (it needs ``torch``, ``transformers`` and
``tokenizers``, which the router's environment does not carry): ``python tiny_model.py DIR``.
"""

from __future__ import annotations

import json
import sys
import sysconfig
from pathlib import Path

VOCAB = 8192
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>",
           "<tool_response>", "</tool_response>"]
CORPUS = ["argparse.py", "textwrap.py", "json/__init__.py", "json/decoder.py",
          "logging/__init__.py", "asyncio/base_events.py", "asyncio/tasks.py", "http/client.py",
          "email/message.py",
          "pathlib.py", "subprocess.py", "typing.py", "dataclasses.py", "functools.py",
          "collections/__init__.py", "unittest/case.py", "pydoc_data/topics.py"]
"""Standard-library files the tokenizer learns from: English docstrings and Python code, as
an agent's context mostly is."""
MAX_MODEL_LEN = 8192
SPLIT = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
         r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
"""Qwen2's pre-tokenizer pattern: transformers rebuilds a ``qwen2`` model's tokenizer with it
whatever ``tokenizer.json`` says, so the tokenizer is trained with it and the two agree."""
TEMPLATE = Path(__file__).with_name("chatml.jinja")


def _corpus() -> list[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [(stdlib / name).read_text(encoding="utf-8") for name in CORPUS
            if (stdlib / name).is_file()]


def build_tokenizer(directory: Path) -> None:
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIAL, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": MAX_MODEL_LEN,
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "additional_special_tokens": SPECIAL[1:],
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "chat_template": TEMPLATE.read_text(encoding="utf-8"),
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (directory / "special_tokens_map.json").write_text(json.dumps(
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "additional_special_tokens": SPECIAL[1:]}, indent=2) + "\n")


def build_weights(directory: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tokens = Tokenizer.from_file(str(directory / "tokenizer.json"))
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=64,
        max_position_embeddings=MAX_MODEL_LEN, tie_word_embeddings=True,
        bos_token_id=tokens.token_to_id("<|endoftext|>"),
        eos_token_id=tokens.token_to_id("<|im_end|>"), torch_dtype="float32")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(str(directory), safe_serialization=True)
    GenerationConfig(eos_token_id=config.eos_token_id,
                     bos_token_id=config.bos_token_id).save_pretrained(str(directory))


def build(directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    build_tokenizer(directory)
    build_weights(directory)
    (directory / ".built").write_text("tiny-qwen2\n")
    return directory


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tiny_model.py DIR")
    print(build(Path(sys.argv[1])))
