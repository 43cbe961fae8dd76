"""The model's own tokenizer, loaded from a local ``tokenizer.json``.

Precise prefix scoring compares the router's token blocks with the blocks a server reports in its
KV events, so the router must tokenize exactly as the server does: same file, no hub download.
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer as _HFTokenizer


class Tokenizer:
    """A Hugging Face ``tokenizers`` tokenizer; ``encode`` takes an already rendered prompt."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer file not found: {path}")
        self.path = path
        self._tokenizer = _HFTokenizer.from_file(str(path))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``. No special tokens are added: the chat template already
        rendered them into the text, as vLLM does for chat requests."""
        return self._tokenizer.encode(text, add_special_tokens=False).ids
