from __future__ import annotations

import extproc.apis as apis


def test_public_surface_is_pinned():
    """What callers may import from ``extproc.apis``; the API modules stay behind it."""
    assert apis.__all__ == [
        "CHARS_PER_TOKEN", "DEFAULT_PREAMBLES", "Preambles", "ResponseObserver", "answer_mark",
        "chain_hashes", "fingerprint", "model_spans", "parse_request", "peek_model",
        "prompt_blocks", "render_entries", "render_prompt", "rewrite_model", "strip_preambles",
        "task_mark",
    ]
    for name in apis.__all__:
        assert getattr(apis, name) is not None
