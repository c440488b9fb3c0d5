"""``python3 -I agent.pyz`` (this package as a zipapp) or ``python3 -I dispatcher/sandbox/agent``
(the directory, as the local backend runs it): start the agent."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys

if not __package__:
    # Run as a zipapp or a directory, this file is the main script and its zip or directory is
    # sys.path[0]. That location becomes the package ``agent`` (PEP 366), so the modules' relative
    # imports work; and it leaves sys.path, so no module of the agent can shadow one of the
    # standard library (or of the image) by name.
    spec = importlib.machinery.ModuleSpec("agent", None, is_package=True)
    spec.submodule_search_locations = [sys.path.pop(0)]
    sys.modules["agent"] = importlib.util.module_from_spec(spec)
    __package__ = "agent"

from .agent import main  # after the package above exists

sys.exit(main())
