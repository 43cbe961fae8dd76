"""The service's log lines: text for a terminal or one JSON object a line for a log stack
(``logging.format``), and the request a line is about.

Every ext_proc stream opens its own ``RequestTags`` (``open_request``, in the stream's task);
the router tags it with the replay id and the session when it names them (``tag``), and the
filter on the handlers copies both onto every line logged in that task, whatever the logger:
``{"level": "WARNING", "message": "...", "replay_id": "rp-...", "session": "s-1"}``. Outside a
stream (the command-line tools, the simulators) there is nothing to tag and ``tag`` does
nothing.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from contextvars import ContextVar
from dataclasses import dataclass

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING,
          "error": logging.ERROR, "critical": logging.CRITICAL}
FIELDS = ("replay_id", "session")
"""The request's names each line about it carries."""


@dataclass(slots=True)
class RequestTags:
    """What a stream's lines say about its request (None: not known yet)."""

    replay_id: str | None = None
    session: str | None = None


_CURRENT: ContextVar[RequestTags | None] = ContextVar("saar_request_tags", default=None)


def open_request() -> RequestTags:
    """New tags for the request handled in this task (and the tasks it starts)."""
    tags = RequestTags()
    _CURRENT.set(tags)
    return tags


def tag(replay_id: str | None = None, session: str | None = None) -> None:
    """Name the current request's replay id and session (None: leave as it is); nothing
    outside a stream."""
    tags = _CURRENT.get()
    if tags is None:
        return
    if replay_id is not None:
        tags.replay_id = replay_id
    if session is not None:
        tags.session = session


class RequestFilter(logging.Filter):
    """Puts ``replay_id`` and ``session`` on every record (None outside a request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        tags = _CURRENT.get()
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, getattr(tags, name) if tags is not None else None)
        return True


class TextFormatter(logging.Formatter):
    """``time LEVEL logger: message``, then ``replay_id=... session=...`` when about a
    request."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        about = " ".join(f"{name}={value}" for name in FIELDS
                         if (value := getattr(record, name, None)) is not None)
        if not about:
            return text
        first, newline, rest = text.partition("\n")  # after the message, before a traceback
        return f"{first} {about}{newline}{rest}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message``,
    ``replay_id`` and ``session`` when about a request, ``exception`` with its traceback."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "time": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line, ensure_ascii=False, default=str)


def configure(level: str, form: str, *, root: logging.Logger | None = None) -> None:
    """Write the root logger's lines at ``level`` (``logging.level``'s names) in ``form``
    (``text`` or ``json``), each with its request's tags: its handlers are kept (one on
    stderr when it has none) and given the formatter and the filter. Called again (SIGHUP),
    it changes both."""
    root = root or logging.getLogger()
    if not root.handlers:
        root.addHandler(logging.StreamHandler(sys.stderr))
    formatter = JsonFormatter() if form == "json" else TextFormatter()
    for handler in root.handlers:
        handler.setFormatter(formatter)
        if not any(isinstance(f, RequestFilter) for f in handler.filters):
            handler.addFilter(RequestFilter())
    root.setLevel(LEVELS[level])
