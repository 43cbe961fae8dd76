"""The ``saar.v1.Replay`` gRPC service (``protos/saar/v1/replay.proto``) over the replay store."""

from __future__ import annotations

import grpc
from google.protobuf import struct_pb2

from .._proto import replay_pb2, replay_pb2_grpc
from ..observability.replay import Record, ReplayStore


def _struct(record: Record) -> struct_pb2.Struct:
    message = struct_pb2.Struct()
    message.update(record)
    return message


class ReplayService(replay_pb2_grpc.ReplayServicer):
    def __init__(self, store: ReplayStore) -> None:
        self._store = store

    async def GetRecord(
        self, request: replay_pb2.GetRecordRequest, context: grpc.aio.ServicerContext
    ) -> struct_pb2.Struct:
        record = self._store.get(request.replay_id)
        if record is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown replay id {request.replay_id}")
        assert record is not None  # abort raised
        return _struct(record)

    async def ListSession(
        self, request: replay_pb2.ListSessionRequest, context: grpc.aio.ServicerContext
    ) -> replay_pb2.RecordList:
        records = self._store.for_session(request.session_id)
        return replay_pb2.RecordList(records=[_struct(r) for r in records])
