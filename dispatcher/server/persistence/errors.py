"""The persistence package's one error: the state under ``<home>`` cannot be used."""

from __future__ import annotations

from dispatcher.core.errors import ConfigError


class StateError(ConfigError):
    """The state under ``<home>`` cannot be used (damaged, newer, or held by another server)."""
