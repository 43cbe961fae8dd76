"""A stand-in Kubernetes API server on loopback that keeps Secrets and ConfigMaps in memory.

The official client talks to it as to a real one (its URL building, JSON bodies, status codes:
404 for a missing object, 409 for a create of one that exists), so ``saar provision`` runs
against it unchanged. Every request is logged as (method, path).
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_PATH = re.compile(r"^/api/v1/namespaces/([^/]+)/(secrets|configmaps)(?:/([^/?]+))?")
KINDS = {"secrets": "Secret", "configmaps": "ConfigMap"}


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message,
            "reason": reason, "code": code}


class FakeApiServer:
    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        """(namespace, plural, name) → the object as stored."""
        self.requests: list[tuple[str, str]] = []
        self.unseen: set[str] = set()
        """Names a GET says are missing though they exist: another writer's create, racing."""
        self._lock = threading.Lock()
        self._versions = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, code: int, body: dict[str, Any]) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict[str, Any]:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"{}")

            def _handle(self, method: str) -> None:
                server.requests.append((method, self.path))
                match = _PATH.match(self.path)
                if match is None:
                    self._answer(404, _status(404, "NotFound", f"no route {self.path}"))
                    return
                namespace, plural, name = match.groups()
                body = self._body() if method in ("POST", "PUT") else {}
                code, answer = server.act(method, namespace, plural, name, body)
                self._answer(code, answer)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

            def do_PUT(self) -> None:
                self._handle("PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def act(self, method: str, namespace: str, plural: str, name: str | None,
            body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if method == "POST":
                name = body["metadata"]["name"]
                key = (namespace, plural, name)
                if key in self.objects:
                    return 409, _status(409, "AlreadyExists", f"{plural} {name!r} already exists")
                return 201, self._store(key, body)
            key = (namespace, plural, name or "")
            if key not in self.objects or (method == "GET" and name in self.unseen):
                return 404, _status(404, "NotFound", f"{plural} {name!r} not found")
            if method == "PUT":
                return 200, self._store(key, body)
            return 200, self.objects[key]

    def _store(self, key: tuple[str, str, str], body: dict[str, Any]) -> dict[str, Any]:
        self._versions += 1
        stored = json.loads(json.dumps(body))
        stored.setdefault("apiVersion", "v1")
        stored["kind"] = KINDS[key[1]]
        stored["metadata"]["namespace"] = key[0]
        stored["metadata"]["resourceVersion"] = str(self._versions)
        self.objects[key] = stored
        return stored

    def put(self, namespace: str, obj: dict[str, Any]) -> None:
        """Store an object as if someone had created it before the test."""
        plural = {v: k for k, v in KINDS.items()}[obj["kind"]]
        self._store((namespace, plural, obj["metadata"]["name"]), obj)

    def core_api(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.url
        return client.CoreV1Api(client.ApiClient(configuration))

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@contextmanager
def fake_api() -> Iterator[FakeApiServer]:
    server = FakeApiServer()
    server.start()
    try:
        yield server
    finally:
        server.close()
