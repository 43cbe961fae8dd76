"""The LLM wire formats: a request body in, a ``RequestSummary`` out; an answer in, a
``ResponseSummary`` out; a request rendered as prompt text and cut into prefix blocks.

Each API lives in one module (``chat``, ``responses``, ``messages``, ``completions``) that
knows its shapes:
the parse of a body, the rendering of its entries, the reading of its answer. The rest of the
package knows none of them and dispatches through ``formats.FORMATS``.
"""

from .common import answer_mark, fingerprint, task_mark
from .normalise import DEFAULT_PREAMBLES, Preambles, strip_preambles
from .observer import ResponseObserver
from .parse import CHARS_PER_TOKEN, parse_request
from .prompt import chain_hashes, prompt_blocks, render_entries, render_prompt
from .rewrite import model_spans, peek_model, rewrite_model

__all__ = [
    "CHARS_PER_TOKEN",
    "DEFAULT_PREAMBLES",
    "Preambles",
    "ResponseObserver",
    "answer_mark",
    "chain_hashes",
    "fingerprint",
    "model_spans",
    "parse_request",
    "peek_model",
    "prompt_blocks",
    "render_entries",
    "render_prompt",
    "rewrite_model",
    "strip_preambles",
    "task_mark",
]
