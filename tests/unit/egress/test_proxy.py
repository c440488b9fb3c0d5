"""The proxy end to end on loopback sockets: refusals, relays, bounds, prompts, records.

Destinations that must be refused are loopback servers that record every byte (they must receive
none) or stub-resolved names whose connection attempts the guard connector records.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from dispatcher.egress.networks import OwnEndpoints
from dispatcher.egress.policy import EgressPolicy, Unknown
from dispatcher.egress.prompt import PromptAnswer, PromptVerdict
from dispatcher.egress.proxy import EgressLimits
from tests.polling import until
from tests.unit.egress.conftest import LOOPBACK_OPEN, Harness, Origin

Make = Callable[..., Any]


def status_line(answer: bytes) -> str:
    return answer.split(b"\r\n", 1)[0].decode()


def body(answer: bytes) -> str:
    return answer.split(b"\r\n\r\n", 1)[1].decode()


def connect(host: str, port: int) -> bytes:
    return f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode()


def loopback_policy(port: int, **kwargs: Any) -> EgressPolicy:
    """A tenant that lists ``origin.test`` and has taken 127.0.0.0/8 out of deny_networks."""
    return EgressPolicy(
        **{"allow": ("origin.test",), "ports": (80, 443, port), "deny_networks": LOOPBACK_OPEN, **kwargs}
    )


async def test_an_unlisted_host_is_refused_at_once_without_a_lookup(harness: Make) -> None:
    h: Harness = await harness(EgressPolicy(allow=("pkgs.example.com",)))
    answer = await h.request(connect("evil.example", 443))
    expected = (
        "egress refused: evil.example:443: evil.example is not on this session's egress allow list "
        "(allowed: pkgs.example.com)"
    )
    assert status_line(answer) == f"HTTP/1.1 403 {expected}"
    assert body(answer) == expected + "\n"
    assert h.resolver.lookups == [] and h.connector.attempts == []  # not even DNS leaves
    [record] = await h.settled(1)
    assert record["decision"] == "refused" and record["reason"] == "not_listed"
    assert (record["tenant"], record["session_id"], record["host"], record["port"]) == (
        "acme",
        "ses_1",
        "evil.example",
        443,
    )
    assert record["address"] is None and record["bytes_out"] == record["bytes_in"] == 0
    assert h.metrics.connections == [("acme", "refused")]


async def test_the_default_policy_reaches_nothing(harness: Make) -> None:
    h: Harness = await harness()
    answer = await h.request(connect("pkgs.example.com", 443))
    assert "no host is allowed: this sandbox has no network access" in status_line(answer)


async def test_a_port_not_listed_is_refused(harness: Make) -> None:
    h: Harness = await harness(EgressPolicy(allow=("pkgs.example.com",)))
    answer = await h.request(connect("pkgs.example.com", 8443))
    assert status_line(answer).endswith("port 8443 is not allowed (allowed ports: 80, 443)")
    assert (await h.settled(1))[0]["reason"] == "port_not_allowed"


async def test_a_name_resolving_to_loopback_is_refused_and_the_target_gets_nothing(
    harness: Make, origin: Origin
) -> None:
    h: Harness = await harness(
        EgressPolicy(allow=("origin.test",), ports=(origin.port,)), answers={"origin.test": ["127.0.0.1"]}
    )
    answer = await h.request(connect("origin.test", origin.port))
    assert status_line(answer).startswith("HTTP/1.1 403 egress refused: origin.test:")
    assert "127.0.0.1 (in 127.0.0.0/8) is in a refused address range (deny_networks)" in status_line(answer)
    assert h.connector.attempts == []
    assert origin.accepted == 0 and origin.received == b""
    assert (await h.settled(1))[0]["reason"] == "address_refused"


async def test_private_and_metadata_answers_are_refused_before_any_connection(harness: Make) -> None:
    answers = {
        "internal.test": ["10.0.0.5"],
        "metadata.test": ["169.254.169.254"],
        "cgnat.test": ["100.64.1.1"],
        "v6.test": ["fd00::5"],
        "mapped.test": ["::ffff:192.168.1.1"],
        "mixed.test": ["203.0.113.5", "10.0.0.5"],  # one refused address refuses the name
    }
    h: Harness = await harness(EgressPolicy(allow=("*.test",)), answers=answers)
    for host in answers:
        answer = await h.request(connect(host, 443))
        assert "is in a refused address range" in status_line(answer), host
    assert h.connector.attempts == []
    assert {r["reason"] for r in await h.settled(len(answers))} == {"address_refused"}


async def test_ip_literals_are_checked_without_a_lookup(harness: Make, origin: Origin) -> None:
    h: Harness = await harness(
        EgressPolicy(allow=("127.0.0.1", "::ffff:127.0.0.1", "10.1.2.3"), ports=(origin.port, 443))
    )
    for target in (f"127.0.0.1:{origin.port}", f"[::ffff:127.0.0.1]:{origin.port}", "10.1.2.3:443"):
        answer = await h.request(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode())
        assert "refused address range" in status_line(answer), target
    assert h.resolver.lookups == [] and h.connector.attempts == []
    assert origin.accepted == 0


async def test_the_servers_own_port_is_refused_even_with_loopback_open(harness: Make, origin: Origin) -> None:
    own = OwnEndpoints.of([f"127.0.0.1:{origin.port}"])  # the origin stands in for the gRPC port
    h: Harness = await harness(loopback_policy(origin.port), answers={"origin.test": ["127.0.0.1"]}, own=own)
    answer = await h.request(connect("origin.test", origin.port))
    assert status_line(answer).endswith("that is the dispatcher server's own port")
    assert origin.accepted == 0 and h.connector.attempts == []


async def test_connect_relays_bytes_both_ways_and_records_them(harness: Make, origin: Origin) -> None:
    origin.echo = True
    h: Harness = await harness(loopback_policy(origin.port), answers={"origin.test": ["127.0.0.1"]})
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10) == (
        b"HTTP/1.1 200 Connection established\r\n\r\n"
    )
    writer.write(b"hello through the tunnel")
    assert await asyncio.wait_for(reader.readexactly(24), 10) == b"hello through the tunnel"
    writer.write_eof()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    [record] = await h.settled(1)
    assert record["decision"] == "allowed" and record["reason"] == "listed"
    assert (record["address"], record["bytes_out"], record["bytes_in"]) == ("127.0.0.1", 24, 24)
    assert record["end"] == "closed" and record["method"] == "CONNECT"
    assert h.metrics.bytes == {("acme", "out"): 24, ("acme", "in"): 24}
    assert h.ctx.bytes_used == 48 and h.ctx.open_tunnels == 0


async def test_absolute_form_is_forwarded_in_origin_form(harness: Make, origin: Origin) -> None:
    origin.reply = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
    h: Harness = await harness(loopback_policy(origin.port), answers={"origin.test": ["127.0.0.1"]})
    answer = await h.request(
        f"GET http://origin.test:{origin.port}/dists/Release HTTP/1.1\r\n"
        f"Host: origin.test\r\nProxy-Authorization: Basic c2VjcmV0\r\nAccept: */*\r\n\r\n".encode()
    )
    assert answer == origin.reply
    assert (
        bytes(origin.received)
        == (
            f"GET /dists/Release HTTP/1.1\r\nHost: origin.test:{origin.port}\r\nAccept: */*\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
    )
    [record] = await h.settled(1)
    assert record["method"] == "GET" and record["decision"] == "allowed"


async def test_concurrent_connections_are_bounded_per_session(harness: Make, origin: Origin) -> None:
    h: Harness = await harness(
        loopback_policy(origin.port, max_connections=1), answers={"origin.test": ["127.0.0.1"]}
    )
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    answer = await h.request(connect("origin.test", origin.port))
    assert status_line(answer).endswith(
        "the session's quota is reached: 1 connections are open (max_connections)"
    )
    assert origin.accepted == 1
    writer.close()
    assert {r["reason"] for r in await h.settled(2)} == {"connections_quota", "listed"}


async def test_bytes_are_bounded_per_session_both_directions_together(harness: Make, origin: Origin) -> None:
    origin.echo = True
    h: Harness = await harness(
        loopback_policy(origin.port, max_bytes=1000), answers={"origin.test": ["127.0.0.1"]}
    )
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.write(b"x" * 400)
    assert len(await asyncio.wait_for(reader.readexactly(400), 10)) == 400  # 800 of 1000 used
    writer.write(b"y" * 400)  # would pass 1000 on the way out: the tunnel ends
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    [record] = await h.settled(1)
    assert record["end"] == "bytes_quota" and h.ctx.bytes_used <= 1000
    answer = await h.request(connect("origin.test", origin.port))
    assert "(max_bytes)" in status_line(answer)


async def test_an_answer_bigger_than_the_quota_in_one_chunk_is_relayed_up_to_the_quota(
    harness: Make, origin: Origin
) -> None:
    # The origin's whole answer arrives as one read (far under the read chunk), 4x the quota: the
    # sandbox gets the head and the body's start, exactly what the quota allows, then the end.
    origin.reply = b"HTTP/1.1 200 OK\r\nContent-Length: 4000\r\n\r\n" + b"z" * 4000
    h: Harness = await harness(
        loopback_policy(origin.port, max_bytes=1000), answers={"origin.test": ["127.0.0.1"]}
    )
    reader, writer = await h.connect()
    request = b"GET http://origin.test:%d/big HTTP/1.1\r\nHost: origin.test\r\n\r\n" % origin.port
    writer.write(request)
    got = await asyncio.wait_for(reader.read(), 10)  # to the end: the tunnel is cut at the quota
    writer.close()
    assert got.startswith(b"HTTP/1.1 200 OK\r\n") and 0 < len(got) <= 1000
    [record] = await h.settled(1)
    assert record["end"] == "bytes_quota"
    assert record["bytes_in"] + record["bytes_out"] == h.ctx.bytes_used == 1000


async def test_a_request_head_too_large_is_431(harness: Make) -> None:
    h: Harness = await harness(EgressPolicy(allow=("pkgs.example.com",)), limits=EgressLimits(head_bytes=512))
    answer = await h.request(b"CONNECT pkgs.example.com:443 HTTP/1.1\r\nX-Pad: " + b"a" * 1000 + b"\r\n\r\n")
    assert status_line(answer) == "HTTP/1.1 431 bad proxy request: request head over 512 bytes"
    assert (await h.settled(1))[0]["decision"] == "failed"


async def test_an_idle_tunnel_is_closed(harness: Make, origin: Origin) -> None:
    h: Harness = await harness(
        loopback_policy(origin.port),
        answers={"origin.test": ["127.0.0.1"]},
        limits=EgressLimits(idle_timeout=0.2),
    )
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    assert await asyncio.wait_for(reader.read(), 10) == b""  # nothing sent: the proxy closes it
    writer.close()
    assert (await h.settled(1))[0]["end"] == "idle_timeout"


async def test_closing_the_session_ends_its_tunnels(harness: Make, origin: Origin) -> None:
    h: Harness = await harness(loopback_policy(origin.port), answers={"origin.test": ["127.0.0.1"]})
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    h.ctx.close()
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    assert (await h.settled(1))[0]["end"] == "cancelled"
    assert "the session is closed" in status_line(await h.request(connect("origin.test", origin.port)))


class Human:
    """Answers egress prompts as told, recording what it was asked."""

    def __init__(self, answer: PromptAnswer | None) -> None:
        self.answer = answer
        self.asked: list[tuple[str, int, str | None]] = []
        self.release = asyncio.Event()

    async def __call__(self, host: str, port: int, tool_use_id: str | None) -> PromptAnswer:
        self.asked.append((host, port, tool_use_id))
        await self.release.wait()
        return self.answer or PromptAnswer(PromptVerdict.TIMEOUT)


async def _prompted(harness: Make, origin: Origin, human: Human) -> Harness:
    h: Harness = await harness(
        loopback_policy(origin.port, allow=(), unknown=Unknown.PROMPT),
        allow=(),
        answers={"origin.test": ["127.0.0.1"], "inside.test": ["10.0.0.1"]},
        ask=human,
        running_calls=lambda: ("toolu_1",),
    )
    return h


async def test_a_prompt_allowed_lets_the_connection_through(harness: Make, origin: Origin) -> None:
    human = Human(PromptAnswer(PromptVerdict.ALLOW))
    human.release.set()
    h = await _prompted(harness, origin, human)
    reader, writer = await h.connect()
    writer.write(connect("origin.test", origin.port))
    assert b" 200 " in await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    writer.close()
    assert human.asked == [("origin.test", origin.port, "toolu_1")]
    [record] = await h.settled(1)
    assert (record["reason"], record["tool_use_id"]) == ("approved", "toolu_1")
    human.asked.clear()
    await h.request(connect("origin.test", origin.port))  # not remembered: asked again
    assert len(human.asked) == 1


async def test_a_prompt_denied_or_timed_out_is_refused(harness: Make, origin: Origin) -> None:
    for verdict, reason, text in (
        (PromptVerdict.DENY, "prompt_denied", "a human denied the connection"),
        (PromptVerdict.TIMEOUT, "prompt_timeout", "nobody answered the confirmation request in time"),
    ):
        human = Human(PromptAnswer(verdict))
        human.release.set()
        h = await _prompted(harness, origin, human)
        answer = await h.request(connect("origin.test", origin.port))
        assert text in status_line(answer) and status_line(answer).startswith("HTTP/1.1 403 ")
        assert (await h.settled(1))[0]["reason"] == reason
    assert origin.accepted == 0


async def test_a_remembered_allow_holds_for_the_session_and_concurrent_asks_share_one_question(
    harness: Make, origin: Origin
) -> None:
    human = Human(PromptAnswer(PromptVerdict.ALLOW, remember=True))
    h = await _prompted(harness, origin, human)
    waiting = [asyncio.ensure_future(h.request(connect("origin.test", origin.port))) for _ in range(3)]
    await until(lambda: bool(human.asked), "the question")
    human.release.set()
    for answer in await asyncio.gather(*waiting):
        assert b" 200 " in answer.split(b"\r\n", 1)[0]
    assert len(human.asked) == 1
    await h.request(connect("origin.test", origin.port))
    assert len(human.asked) == 1 and h.ctx.prompts.allowed == {"origin.test"}
    reasons = [r["reason"] for r in await h.settled(4)]
    assert reasons.count("remembered") >= 1


async def test_no_answer_opens_a_refused_range_or_a_closed_port(harness: Make, origin: Origin) -> None:
    human = Human(PromptAnswer(PromptVerdict.ALLOW, remember=True))
    human.release.set()
    h = await _prompted(harness, origin, human)
    assert "refused address range" in status_line(await h.request(connect("inside.test", origin.port)))
    assert "port 22 is not allowed" in status_line(await h.request(connect("origin.test", 22)))
    assert "refused address range" in status_line(await h.request(connect("10.0.0.9", origin.port)))
    assert [a[0] for a in human.asked] == ["inside.test"]  # the literal and the port: nobody asked
    assert h.connector.attempts == []
