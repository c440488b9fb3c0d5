"""A module whose import fails with something other than ImportError."""

raise RuntimeError("this module is broken")
