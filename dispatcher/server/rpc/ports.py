"""The port RPCs: ConnectPort's byte stream to a sandbox port (``sessions/ports.py``), OpenPort and
ClosePort's preview URLs (``preview/opening.py``)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from dispatcher.server.preview import opening as preview_opening
from dispatcher.server.preview.opening import Previews
from dispatcher.server.requests.errors import InvalidRequest
from dispatcher.server.rpc.handlers import Ctx, RpcArea, stream, unary
from dispatcher.server.sessions import ports as session_ports
from dispatcher.server.sessions.ports import PortObserver
from dispatcher.server.tenancy.auth import current_tenant
from dispatcher.v1 import dispatcher_pb2 as pb


class PortRpcs(RpcArea):
    """ConnectPort, OpenPort and ClosePort."""

    _port_observer: PortObserver | None
    _previews: Previews | None

    @stream
    async def ConnectPort(
        self, request_iterator: AsyncIterator[pb.ConnectPortRequest], context: Ctx
    ) -> AsyncIterator[pb.ConnectPortResponse]:
        requests = aiter(request_iterator)
        first = await anext(requests, None)
        if first is None or not first.session_id or first.data or first.close_write:
            raise InvalidRequest("the first ConnectPortRequest carries session_id and port, and no data")
        items = session_ports.connect_port(
            self._sessions,
            current_tenant(),
            first.session_id,
            first.port,
            _port_bytes(requests),
            self._port_observer,
        )
        async for item in items:
            if item == "connected":
                yield pb.ConnectPortResponse(connected=True)
            elif item == "eof":
                yield pb.ConnectPortResponse(eof=True)
            else:
                yield pb.ConnectPortResponse(data=item)

    @unary
    async def OpenPort(self, request: pb.OpenPortRequest, context: Ctx) -> pb.OpenPortResponse:
        opened = await preview_opening.open_port(
            self._sessions,
            self._previews,
            current_tenant(),
            request.session_id,
            request.port,
            request.expires_in_seconds,
            request.public,
        )
        response = pb.OpenPortResponse(url=opened.url, token=opened.token)
        if opened.expire_time is not None:
            response.expire_time.FromNanoseconds(int(opened.expire_time * 1e9))
        return response

    @unary
    async def ClosePort(self, request: pb.ClosePortRequest, context: Ctx) -> pb.ClosePortResponse:
        await preview_opening.close_port(
            self._sessions, self._previews, current_tenant(), request.session_id, request.port
        )
        return pb.ClosePortResponse()


async def _port_bytes(requests: AsyncIterator[pb.ConnectPortRequest]) -> AsyncIterator[bytes | None]:
    """ConnectPort's later messages as bytes, then None for the half-close."""
    async for request in requests:
        if request.session_id or request.port:
            raise InvalidRequest("only the first ConnectPortRequest carries session_id and port")
        if request.data:
            yield request.data
        if request.close_write:
            yield session_ports.CLOSE_WRITE
            return
