"""The ``metrics:`` and ``tracing:`` config sections (both off by default).

metrics: {listen: 127.0.0.1:9464}             # Prometheus text at http://HOST:PORT/metrics
tracing: {otlp_endpoint: http://127.0.0.1:4317}  # OTLP/gRPC; needs `pip install dispatcher[otel]`
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from dispatcher.core.errors import ConfigError

__all__ = ["ObserveConfig", "check_metrics_listen", "parse_observe"]

OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


@dataclass(frozen=True, slots=True)
class ObserveConfig:
    metrics_listen: str | None = None
    """HOST:PORT of the ``/metrics`` endpoint; None: no metrics."""
    otlp_endpoint: str | None = None
    """Where spans are exported (OTLP over gRPC); None: no tracing."""


def parse_observe(data: Mapping[str, Any]) -> ObserveConfig:
    """Validate the two sections of the top-level config mapping.

    Raises:
        ConfigError: naming the key; also when tracing is asked for without the otel extra.
    """
    metrics = _section(data, "metrics", {"listen"})
    listen = metrics.get("listen")
    if listen is not None:
        check_metrics_listen(listen)
    tracing = _section(data, "tracing", {"otlp_endpoint"})
    endpoint = tracing.get("otlp_endpoint")
    if endpoint is not None:
        _check_endpoint(endpoint)
    return ObserveConfig(metrics_listen=listen, otlp_endpoint=endpoint)


def check_metrics_listen(value: Any, where: str = "metrics.listen") -> str:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6), as ``listen`` is parsed.

    Raises:
        ConfigError: not of that form.
    """
    if not isinstance(value, str):
        raise ConfigError(f"{where}: expected HOST:PORT, got {value!r}")
    host, sep, port = value.rpartition(":")
    if (
        not sep
        or not host
        or not port.isdigit()
        or not 0 <= int(port) <= 65535
        or any(c.isspace() for c in value)
    ):
        raise ConfigError(f"{where}: expected HOST:PORT, got {value!r}")
    return value


def otel_missing() -> str | None:
    """The first module of the otel extra that is not installed, or None."""
    for name in OTEL_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:
            return name
    return None


def _check_endpoint(value: Any) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"tracing.otlp_endpoint: expected a URL like http://127.0.0.1:4317, got {value!r}")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"tracing.otlp_endpoint: expected a URL like http://127.0.0.1:4317, got {value!r}")
    missing = otel_missing()
    if missing is not None:
        raise ConfigError(
            f"tracing: needs the otel extra ({missing} is not installed): pip install 'dispatcher[otel]'"
        )


def _section(data: Mapping[str, Any], key: str, allowed: set[str]) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{key}: must be a mapping")
    unknown = sorted(str(k) for k in value if k not in allowed)
    if unknown:
        raise ConfigError(f"{key}.{unknown[0]}: unknown key (allowed: {', '.join(sorted(allowed))})")
    return value
