"""Egress as policy: the server's proxy that is a sandbox's only way out.

Sandboxes keep network ``none``. Inside each one, the agent listens on ``127.0.0.1:3128`` and hands
every accepted connection to the server over the agent channel it already has, multiplexed as
open/data/close frames with a connection id and a flow-control window. The server is the only party
that resolves a name or opens an outbound connection, and ``proxy.serve_tunnel`` is its one entry
point: it takes the connection as a ``TunnelStream`` (read / write / close) and the session's
``EgressContext``.

Why the agent channel and not a unix socket mounted into the container: gVisor (``runtime: runsc``)
refuses connecting to host unix sockets by default, and the Kubernetes backend reaches its agent
only through an attach stream, where no socket can be mounted. One transport serves every backend.

The modules, each one concept:

- ``policy``: host patterns (exact, or ``*.`` for any subdomain), ports, a session's narrowing of
  its tenant's list, and the decision with its reason slug.
- ``networks``: the address ranges never connected to (an explicit, editable list), IP literals and
  the server's own ports.
- ``resolver``: resolve once, check every address, connect to exactly a checked address.
- ``request``: the bounded, strict parser of a proxy request's head.
- ``prompt``: asking a human about an unlisted host, once per host at a time, and remembering.
- ``record``: what each attempt leaves for operators (an audit record, metrics).
- ``proxy``: the connection handler: refusals (403), ``CONNECT`` tunnels, absolute-form HTTP,
  and the bounds of a session's tunnels.

This package uses the standard library only (tests/unit/test_layers.py): the dispatch core, the
sandbox transport and the server all build on it.
"""
