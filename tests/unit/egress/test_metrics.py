"""The server's Prometheus metrics for egress, fed by the proxy over loopback sockets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from prometheus_client import generate_latest

from dispatcher.egress.policy import EgressPolicy
from dispatcher.server.observability.metrics import Metrics
from tests.unit.egress.conftest import LOOPBACK_OPEN, Harness, Origin
from tests.unit.egress.test_proxy import connect


async def test_connections_and_bytes_are_counted_by_tenant_decision_and_direction(
    harness: Callable[..., Any], origin: Origin
) -> None:
    origin.reply = b"HTTP/1.1 204 No Content\r\n\r\n"
    metrics = Metrics(["acme"])
    policy = EgressPolicy(allow=("origin.test",), ports=(origin.port,), deny_networks=LOOPBACK_OPEN)
    h: Harness = await harness(policy, answers={"origin.test": ["127.0.0.1"]}, observer=metrics)
    await h.request(connect("evil.example", origin.port))
    head = f"GET http://origin.test:{origin.port}/ HTTP/1.1\r\n\r\n".encode()
    assert await h.request(head) == origin.reply
    await h.settled(2)
    text = generate_latest(metrics.registry).decode()
    assert 'dispatcher_egress_connections_total{decision="refused",tenant="acme"} 1.0' in text
    assert 'dispatcher_egress_connections_total{decision="allowed",tenant="acme"} 1.0' in text
    sent = len(f"GET / HTTP/1.1\r\nHost: origin.test:{origin.port}\r\nConnection: close\r\n\r\n")
    assert f'dispatcher_egress_bytes_total{{direction="out",tenant="acme"}} {float(sent)}' in text
    assert f'dispatcher_egress_bytes_total{{direction="in",tenant="acme"}} {float(len(origin.reply))}' in text
