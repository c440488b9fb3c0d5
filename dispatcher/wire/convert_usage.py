"""A session's usage (``GetSessionUsage``) between proto and the domain's ``SessionUsage``."""

from __future__ import annotations

from dispatcher.core.provider_api import SessionUsage
from dispatcher.v1 import dispatcher_pb2 as pb

__all__ = ["usage_from_pb", "usage_to_pb"]


def usage_to_pb(used: SessionUsage) -> pb.GetSessionUsageResponse:
    msg = pb.GetSessionUsageResponse(
        cpu_seconds=used.cpu_seconds,
        cpu_percent=used.cpu_percent,
        memory_bytes=used.memory_bytes,
        memory_limit_bytes=used.memory_limit_bytes,
        disk_bytes=used.disk_bytes,
        disk_limit_bytes=used.disk_limit_bytes,
        pids=used.pids,
        egress_bytes_sent=used.egress_bytes_sent,
        egress_bytes_received=used.egress_bytes_received,
        running=used.running,
    )
    msg.sample_time.FromNanoseconds(int(used.sample_time * 1e9))
    return msg


def usage_from_pb(msg: pb.GetSessionUsageResponse) -> SessionUsage:
    return SessionUsage(
        cpu_seconds=msg.cpu_seconds,
        cpu_percent=msg.cpu_percent,
        memory_bytes=msg.memory_bytes,
        memory_limit_bytes=msg.memory_limit_bytes,
        disk_bytes=msg.disk_bytes,
        disk_limit_bytes=msg.disk_limit_bytes,
        pids=msg.pids,
        egress_bytes_sent=msg.egress_bytes_sent,
        egress_bytes_received=msg.egress_bytes_received,
        sample_time=msg.sample_time.ToNanoseconds() / 1e9,
        running=msg.running,
    )
