"""A stand-in Kubernetes API server on loopback that replays recorded answers.

The official client talks to it as to a real one (its URL building, query parameters, JSON
decoding into ``V1Pod`` and its watch loop all run): each API path has a script of answers,
taken in order — a JSON document for a list, or a recorded watch stream (JSON lines, as the
API server sends them, one event per line). When a path's script runs out, a watch is held
open without events (a quiet cluster) and a list answers 503. Every request is logged.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict, deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

RECORDINGS = Path(__file__).parent / "recordings"


class Answer:
    def __init__(self, status: int = 200, body: bytes = b"", stream: bool = False) -> None:
        self.status, self.body, self.stream = status, body, stream


def listed(name: str) -> Answer:
    return Answer(body=(RECORDINGS / name).read_bytes())


def watched(name: str) -> Answer:
    return Answer(body=(RECORDINGS / name).read_bytes(), stream=True)


def failure(status: int) -> Answer:
    body = json.dumps({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                       "message": "recorded failure", "reason": "InternalError", "code": status})
    return Answer(status, body.encode())


class FakeApiServer:
    def __init__(self) -> None:
        self.scripts: dict[tuple[str, bool], deque[Answer]] = defaultdict(deque)
        self.requests: list[tuple[str, dict[str, str]]] = []
        self._closed = threading.Event()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                url = urlparse(self.path)
                query = {k: v[0] for k, v in parse_qs(url.query).items()}
                server.requests.append((url.path, query))
                watch = query.get("watch") == "true"
                script = server.scripts[(url.path, watch)]
                answer = script.popleft() if script else None
                if answer is None and watch:
                    self._hold()
                    return
                answer = answer or failure(503)
                self.send_response(answer.status)
                self.send_header("Content-Type", "application/json")
                if answer.stream:
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    for line in answer.body.splitlines(keepends=True):
                        self._chunk(line)
                        time.sleep(0.01)
                    self._chunk(b"")
                else:
                    self.send_header("Content-Length", str(len(answer.body)))
                    self.end_headers()
                    self.wfile.write(answer.body)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            def _hold(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                server._closed.wait(30)

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._http.server_address[1]}"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def script(self, path: str, *answers: Answer, watch: bool = False) -> None:
        self.scripts[(path, watch)].extend(answers)

    def __enter__(self) -> FakeApiServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._closed.set()
        self._http.shutdown()
        self._http.server_close()

    def client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.ApiClient(configuration)
