"""What a container-per-session backend is, whichever host runs the container.

``sandbox`` (one session's ``ContainerSandbox`` over its agent), ``exec_guard`` and ``file_guard``
(the enforcement around a command and a file operation), ``host`` (the narrow interface a sandbox
has to the host that runs its container, with no engine's type in it), ``provider`` (the provider
base both hosts extend: ``sandbox_for``, start at creation, re-adoption, pause, the idle reaper),
``adopt`` (re-attaching a container after a restart, and the sandbox's side of it), ``pause``
(a sandbox's container paused, resumed or held still), ``labels`` (labels and fingerprints),
``image`` (what an image must offer), ``egress`` (the session's egress listener in its agent),
``config`` (the ``sandbox:`` section) and ``kubernetes_config`` (``sandbox.kubernetes:``).

The hosts are ``dispatcher.sandbox.docker`` and ``dispatcher.sandbox.kubernetes``: each imports
this package, neither imports the other.
"""
