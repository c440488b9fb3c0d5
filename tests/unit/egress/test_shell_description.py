"""What shell's description tells the model about the session's network."""

from __future__ import annotations

from dispatcher.egress.policy import EgressPolicy, Unknown
from dispatcher.tools.read_file import ReadFileTool
from dispatcher.tools.shell import ShellTool, describe_network


def test_nothing_reachable_is_said_plainly() -> None:
    text = describe_network(ShellTool.definition, (), EgressPolicy()).description
    assert text.startswith(ShellTool.definition.description)
    assert "Network: none. The sandbox reaches no host" in text


def test_the_allowed_hosts_and_ports_are_listed_and_prompting_is_said() -> None:
    policy = EgressPolicy(allow=("pkgs.example.com",), unknown=Unknown.PROMPT, ports=(443,))
    text = describe_network(ShellTool.definition, ("pkgs.example.com", "*.example.org"), policy).description
    assert "to these hosts on ports 443: pkgs.example.com, *.example.org" in text
    assert "other hosts are asked about: a human allows or refuses each" in text


def test_other_tools_are_left_as_they_are() -> None:
    assert describe_network(ReadFileTool.definition, (), EgressPolicy()) is ReadFileTool.definition
