"""The ``saar.v1.Replay`` gRPC service (``protos/saar/v1/replay.proto``) over the replay records,
behind the same credential as the HTTP API, sent as metadata (``authorization: Bearer …``)."""

from __future__ import annotations

import grpc
from google.protobuf import struct_pb2

from .._proto import replay_pb2, replay_pb2_grpc
from ..observability.replay import Record
from ..observability.shared_replay import ReplayLookup
from .admin import AdminAuth, Caller, Denied

_CODES = {401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}


def _struct(record: Record) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(record)
    return message


class ReplayService(replay_pb2_grpc.ReplayServicer):
    def __init__(self, lookup: ReplayLookup, auth: AdminAuth) -> None:
        self._lookup = lookup
        self._auth = auth

    async def _caller(self, context: grpc.aio.ServicerContext) -> Caller:
        metadata = {k.lower(): v for k, v in context.invocation_metadata() or ()
                    if isinstance(v, str)}
        try:
            return self._auth.caller(metadata)
        except Denied as denied:
            await context.abort(_CODES[denied.status], denied.message)
            raise  # abort raised already

    async def GetRecord(
        self, request: replay_pb2.GetRecordRequest, context: grpc.aio.ServicerContext
    ) -> struct_pb2.Struct:
        caller = await self._caller(context)
        record = await self._lookup.get(request.replay_id)
        if record is None or not caller.sees(record):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown replay id {request.replay_id}")
        assert record is not None  # abort raised
        return _struct(record)

    async def ListSession(
        self, request: replay_pb2.ListSessionRequest, context: grpc.aio.ServicerContext
    ) -> replay_pb2.RecordList:
        caller = await self._caller(context)
        records = await self._lookup.for_session(request.session_id, caller.scope(None))
        return replay_pb2.RecordList(records=[_struct(r) for r in records])
