"""The grpc.aio server that carries the servicer: its channel options and bounds, health and
reflection beside the service, and the TLS credentials it binds with."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from dispatcher.config.sections import ServerOptions, TlsFiles
from dispatcher.server.rpc.servicer import DispatcherServicer
from dispatcher.v1 import dispatcher_pb2 as pb
from dispatcher.v1 import dispatcher_pb2_grpc as pb_grpc

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["ToolDispatcher"].full_name


def grpc_server(
    opts: ServerOptions,
    *,
    interceptors: list[grpc.aio.ServerInterceptor],
    servicer: DispatcherServicer,
    health: health_aio.HealthServicer,
) -> grpc.aio.Server:
    """The grpc.aio server (not bound yet) serving ``servicer``, health and reflection."""
    server = grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", opts.max_request_bytes),
            ("grpc.max_send_message_length", opts.max_message_bytes),
            ("grpc.keepalive_time_ms", int(opts.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(opts.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 5000),
            ("grpc.max_concurrent_streams", opts.max_concurrent_streams),
            ("grpc.so_reuseport", 0),
        ],
    )
    pb_grpc.add_ToolDispatcherServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health, server)
    reflection.enable_server_reflection(
        (
            SERVICE_NAME,
            health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
            reflection.SERVICE_NAME,
        ),
        server,
    )
    return server


def server_credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """The server's key and certificate; with ``client_ca_file``, clients must present one it signed."""
    client_ca = tls.client_ca_file.read_bytes() if tls.client_ca_file else None
    return grpc.ssl_server_credentials(
        [(tls.key_file.read_bytes(), tls.cert_file.read_bytes())],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )
