"""The ``metrics:`` and ``tracing:`` config sections (both off by default).

metrics: {listen: 127.0.0.1:9464}             # Prometheus text at http://HOST:PORT/metrics
tracing: {otlp_endpoint: http://127.0.0.1:4317}  # OTLP/gRPC; needs `pip install dispatcher[otel]`
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field

from dispatcher.config_base import HostPort, Section, validate_section
from dispatcher.core.errors import ConfigError

__all__ = ["MetricsSection", "ObserveConfig", "TracingSection", "parse_observe"]

OTEL_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


def _otlp_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected a URL like http://127.0.0.1:4317, got {value!r}")
    return value


class MetricsSection(Section):
    """``metrics:``: Prometheus text at ``http://HOST:PORT/metrics`` (off by default)."""

    listen: HostPort | None = None
    """HOST:PORT of the ``/metrics`` endpoint; ``--metrics-listen`` overrides it."""


class TracingSection(Section):
    """``tracing:``: OTLP/gRPC spans (off by default); needs ``pip install dispatcher[otel]``."""

    otlp_endpoint: Annotated[str, Field(strict=True), AfterValidator(_otlp_url)] | None = None
    """Where spans are exported, like http://127.0.0.1:4317."""


@dataclass(frozen=True, slots=True)
class ObserveConfig:
    metrics_listen: str | None = None
    """HOST:PORT of the ``/metrics`` endpoint; None: no metrics."""
    otlp_endpoint: str | None = None
    """Where spans are exported (OTLP over gRPC); None: no tracing."""

    @classmethod
    def of(cls, metrics: MetricsSection, tracing: TracingSection) -> ObserveConfig:
        """From the two validated sections.

        Raises:
            ConfigError: tracing is asked for without the otel extra installed.
        """
        if tracing.otlp_endpoint is not None and (missing := otel_missing()) is not None:
            raise ConfigError(
                f"tracing: needs the otel extra ({missing} is not installed): pip install 'dispatcher[otel]'"
            )
        return cls(metrics_listen=metrics.listen, otlp_endpoint=tracing.otlp_endpoint)


def parse_observe(data: Mapping[str, Any]) -> ObserveConfig:
    """Validate the two sections of the top-level config mapping.

    Raises:
        ConfigError: naming the key; also when tracing is asked for without the otel extra.
    """
    return ObserveConfig.of(
        validate_section(MetricsSection, data.get("metrics"), "metrics"),
        validate_section(TracingSection, data.get("tracing"), "tracing"),
    )


def otel_missing() -> str | None:
    """The first module of the otel extra that is not installed, or None."""
    for name in OTEL_MODULES:
        try:
            if importlib.util.find_spec(name) is None:
                return name
        except ModuleNotFoundError:
            return name
    return None
