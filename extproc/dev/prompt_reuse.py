"""How much of each recorded request one engine's prefix cache could serve, with the bodies as
the client sent them and with their volatile preambles cut (``apis.strip_preambles``): the
engine-side effect of prompt normalisation, for requests that land on one worker.

    python -m extproc.dev.prompt_reuse DIR [DIR ...]   # directories of ``sim-server --record-dir``

Requests are replayed in order (directories in the order given, files by name) into two
simulated vLLM prefix caches, one per variant, each request's reply left out (a new session's
first request is what the figure is about). Prints one line per request and the totals.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..apis import Preambles, parse_request, render_prompt, strip_preambles
from ..types import API_PATHS
from .sim.prefix_cache import PrefixCache, tokenize

BLOCK_SIZE = 16


def replay(paths: list[Path], preambles: Preambles) -> list[dict[str, object]]:
    caches = {"raw": PrefixCache(block_size=BLOCK_SIZE, num_gpu_blocks=1 << 20),
              "stripped": PrefixCache(block_size=BLOCK_SIZE, num_gpu_blocks=1 << 20)}
    rows: list[dict[str, object]] = []
    for path in paths:
        doc = json.loads(path.read_text())
        api = API_PATHS[doc["path"].split("?", 1)[0]]
        raw = doc["body"].encode()
        bodies = {"raw": raw, "stripped": strip_preambles(api, raw, preambles) or raw}
        row: dict[str, object] = {"request": f"{path.parent.name}/{path.name}"}
        for variant, body in bodies.items():
            tokens = tokenize(render_prompt(parse_request(api, body, max_body_bytes=1 << 26)))
            row[f"{variant}_prompt"] = len(tokens)
            row[f"{variant}_cached"] = caches[variant].lookup_and_insert(tokens)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("dirs", nargs="+", type=Path)
    args = parser.parse_args(argv)
    paths = [p for d in args.dirs for p in sorted(d.glob("*.json"))]
    for row in replay(paths, Preambles()):
        print(f"{row['request']:<40} prompt {row['raw_prompt']:>6}  cached as sent "
              f"{row['raw_cached']:>6} ({_share(row, 'raw')})  stripped "
              f"{row['stripped_cached']:>6} ({_share(row, 'stripped')})")


def _share(row: dict[str, object], variant: str) -> str:
    cached, prompt = row[f"{variant}_cached"], row[f"{variant}_prompt"]
    assert isinstance(cached, int) and isinstance(prompt, int)
    return f"{cached / max(prompt, 1):.0%}"


if __name__ == "__main__":
    main()
