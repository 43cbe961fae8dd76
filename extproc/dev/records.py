"""Replay records for the offline tools (``saar trace export``, ``saar replay what-if``): from a
JSONL sink file, or from a running processor's admin API with the admin token."""

from __future__ import annotations

import json
import os
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..observability.replay import Record, read_records

TOKEN_ENV = "SAAR_ADMIN_TOKEN"


def admin_token(token_file: str | None) -> str | None:
    """The admin token: the file's content, else ``$SAAR_ADMIN_TOKEN``."""
    if token_file:
        return Path(token_file).read_text().strip()
    return os.environ.get(TOKEN_ENV) or None


def _get(url: str, token: str | None) -> Any:
    headers = {"authorization": f"Bearer {token}"} if token else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers),
                                timeout=10) as response:
        return json.load(response)


def fetch_records(url: str, token: str | None, session: str | None = None,
                  limit: int = 500) -> list[Record]:
    """Records from the processor at ``url`` (its HTTP port): one session's, or those of the
    ``limit`` most recent sessions it routed."""
    base = url.rstrip("/")
    if session is not None:
        query = urllib.parse.urlencode({"session_id": session})
        return list(_get(f"{base}/v1/replay?{query}", token)["records"])
    records: list[Record] = []
    for summary in _get(f"{base}/v1/sessions?limit={limit}", token)["sessions"]:
        query = urllib.parse.urlencode({"session_id": summary["session_id"],
                                        "tenant": summary["tenant"]})
        records += _get(f"{base}/v1/replay?{query}", token)["records"]
    return records


def load_records(replay: str | None, url: str | None, token_file: str | None,
                 session: str | None = None) -> list[Record]:
    """From the file ``replay``, else from the processor at ``url``; ``session`` keeps only
    that session's records."""
    if replay is not None:
        records = read_records(replay)
        if session is not None:
            records = [r for r in records if (r.get("session") or {}).get("id") == session]
        return records
    assert url is not None
    return fetch_records(url, admin_token(token_file), session)
