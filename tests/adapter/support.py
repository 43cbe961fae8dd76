"""A processor in a test: the assembled parts, a state layer, and streams fed protobuf messages
as Envoy sends them, through the real codec, loop and exchange."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import orjson
from envoy.config.core.v3 import base_pb2 as core
from envoy.service.ext_proc.v3 import external_processor_pb2 as ep

from extproc.adapter.codec import Routing
from extproc.adapter.gate import ParseThread
from extproc.adapter.stream import Io, Stream
from extproc.adapter.waker import Waker
from extproc.assembly import Parts
from extproc.config import Config
from extproc.core.bodies import LargeBodies
from extproc.core.exchange import Exchange
from extproc.state import MemoryStore, Query
from extproc.state.layer import StateLayer
from extproc.state.records import owner_key

CHAT = {":method": "POST", ":path": "/v1/chat/completions", "x-session-id": "s"}
BODY = orjson.dumps({"model": "auto", "messages": [{"role": "user", "content": "refactor it"}]})
TOOLS = [{"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}}]
WITH_TOOLS = orjson.dumps({"model": "auto", "tools": TOOLS,
                           "messages": [{"role": "user", "content": "refactor it"}]})
STREAMED = orjson.dumps({"model": "auto", "stream": True, "tools": TOOLS,
                         "messages": [{"role": "user", "content": "refactor it"}]})


def headers_msg(headers: dict[str, str], end: bool = False) -> ep.ProcessingRequest:
    values = [core.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    return ep.ProcessingRequest(
        request_headers=ep.HttpHeaders(
            headers=core.HeaderMap(headers=values), end_of_stream=end))


def body_msg(body: bytes) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(request_body=ep.HttpBody(body=body, end_of_stream=True))


def response_headers(status: str, content_type: str) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_headers=ep.HttpHeaders(headers=core.HeaderMap(headers=[
        core.HeaderValue(key=":status", raw_value=status.encode()),
        core.HeaderValue(key="content-type", raw_value=content_type.encode())])))


def response_body(body: bytes, end: bool = True) -> ep.ProcessingRequest:
    return ep.ProcessingRequest(response_body=ep.HttpBody(body=body, end_of_stream=end))


def set_headers(common: ep.CommonResponse) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def saar_metadata(reply: ep.ProcessingResponse) -> dict[str, str]:
    fields = reply.dynamic_metadata.fields["saar"].struct_value.fields
    return {k: v.string_value for k, v in fields.items()}


def immediate(reply: ep.ProcessingResponse) -> tuple[int, dict, dict]:
    out = reply.immediate_response
    headers = {h.header.key: h.header.raw_value.decode() for h in out.headers.set_headers}
    return out.status.code, headers, orjson.loads(out.body)


class Driver:
    """One ext_proc stream: ``handle`` feeds a message and gives what the stream sent back
    (None: nothing; one reply; or a list, in order)."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    async def handle(self, message: ep.ProcessingRequest):
        out = [reply async for reply in self.stream.replies(message)]
        if not out:
            return None
        return out[0] if len(out) == 1 else out

    @property
    def observed(self) -> bool:
        return self.stream.done

    def close(self) -> None:
        self.stream.close()


class Replica:
    """A router and its state layer: what one processor process holds."""

    def __init__(self, parts: Parts, state: StateLayer | None = None, *,
                 bodies: LargeBodies | None = None, parser: ParseThread | None = None) -> None:
        self.parts = parts
        self.router = parts.router
        self.replay = parts.replay
        self.bodies = bodies
        config = parts.config
        self.state = state or StateLayer(MemoryStore.from_config(config, self.router.clock),
                                         None, clock=self.router.clock, metrics=parts.metrics)
        self.waker = Waker()
        self.io = Io(self.state, self.waker, parts.metrics,
                     Routing(config.routing.cluster_header, config.routing.model_header), parser)

    def stream(self, *, rendered: bool = False) -> Driver:
        """``rendered``: as the routing filter of a bootstrap we render (Envoy adds the
        diagnostic headers from the metadata)."""
        return Driver(Stream(Exchange(self.router, self.parts.options, bodies=self.bodies),
                             self.io, rendered=rendered))

    def session(self, replay_id: str, session: str = "s"):
        tenant = self.replay.get(replay_id)["session"]["tenant"]
        return self.state.local.record(f"{tenant}/{session}")

    def owner(self, replay_id: str, call_id: str):
        tenant = self.replay.get(replay_id)["session"]["tenant"]
        key = owner_key(tenant, call_id)
        return self.state.local.load_now(Query(None, (key,))).owners.get(key)

    async def held(self, count: int = 1) -> None:
        """Until ``count`` keys are waited on (the holds have begun)."""
        for _ in range(500):
            if len(self.waker) >= count:
                return
            await asyncio.sleep(0.002)
        raise AssertionError("no request was held")


def two_workers(config: Config) -> Config:
    models = dict(config.models)
    models["qwen3-32b"] = replace(models["qwen3-32b"], endpoints=("10.0.0.1:80", "10.0.0.2:80"))
    return replace(config, models=models)
