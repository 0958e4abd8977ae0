"""The real node's cluster DNS (nodegw) answers pods from what it read of the API, not with a read per query.

Run against the session's real API server over a real UDP socket. The reader is the DNS server's own ``Api``;
the tests only count its calls, and for the outage case make it fail or stall as an unreachable API would.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
import time

import pytest
from atom_localcluster.cluster import Cluster
from atom_localcluster.nodegw import AAAA, NOERROR, NXDOMAIN, SERVFAIL, A, Answers, Api, Dns

pytestmark = pytest.mark.cluster


def query(name: str, qtype: int = A, ident: int = 7) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + struct.pack("!HH", qtype, 1)


def parse_answer(reply: bytes) -> tuple[int, int, list[str]]:
    """(id, rcode, IPv4 addresses) of a reply to one of ``query``'s packets."""
    ident, flags, _qd, ancount, _ns, _ar = struct.unpack("!HHHHHH", reply[:12])
    i = 12
    while reply[i]:
        i += 1 + reply[i]
    i += 5
    addresses = []
    for _ in range(ancount):
        _ptr, _type, _cls, _ttl, length = struct.unpack("!HHHIH", reply[i : i + 12])
        addresses.append(socket.inet_ntoa(reply[i + 12 : i + 12 + length]))
        i += 12 + length
    return ident, flags & 0xF, addresses


class CountedReads:
    """The server's own API reads, counted; ``failing``/``stalling`` stand for an API that errs or hangs."""

    def __init__(self, api: Api) -> None:
        self.api, self.calls, self.failing, self.stalling = api, 0, False, 0.0
        self._lock = threading.Lock()

    def __call__(self, service: str, namespace: str) -> list[str] | None:
        with self._lock:
            self.calls += 1
        if self.stalling:
            time.sleep(self.stalling)
        if self.failing:
            raise ConnectionRefusedError("the API server does not answer")
        return self.api.addresses(service, namespace)


async def ask_many(port: int, packets: list[bytes], timeout: float = 10.0) -> list[tuple[int, int, list[str]]]:
    """Send every packet at once from its own socket (as many resolvers would) and collect the replies."""
    loop = asyncio.get_running_loop()

    async def one(packet: bytes) -> tuple[int, int, list[str]]:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.setblocking(False)
            s.connect(("127.0.0.1", port))
            await loop.sock_sendall(s, packet)
            return parse_answer(await asyncio.wait_for(loop.sock_recv(s, 4096), timeout))

    return await asyncio.gather(*(one(p) for p in packets))


async def serving(answers: Answers) -> tuple[asyncio.DatagramTransport, int]:
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: Dns(answers), local_addr=("127.0.0.1", 0))
    return transport, transport.get_extra_info("sockname")[1]  # type: ignore[return-value]


@pytest.fixture
def service(cluster: Cluster, namespace: str) -> tuple[str, str]:
    """A ClusterIP Service in the test's namespace: (its DNS name, its ClusterIP)."""
    cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": namespace},
                   "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}})
    ip = cluster.kubectl("get", "service", "web", "-n", namespace, "-o", "jsonpath={.spec.clusterIP}").stdout
    return f"web.{namespace}.svc.cluster.local", ip


def test_a_burst_of_lookups_is_answered_from_one_read_per_ttl(cluster: Cluster, service: tuple[str, str]) -> None:
    name, ip = service
    reads = CountedReads(Api(cluster.kubeconfig))

    async def scenario() -> None:
        transport, port = await serving(Answers(reads, fresh=1.0))
        try:
            burst = [query(name, A, i) for i in range(20)] + [query(name, AAAA, 100 + i) for i in range(20)]
            replies = await ask_many(port, burst)
            assert [r[0] for r in replies] == [*range(20), *range(100, 120)]  # each reply carries its query's id
            assert {(rcode, tuple(a)) for _, rcode, a in replies[:20]} == {(NOERROR, (ip,))}
            assert {(rcode, tuple(a)) for _, rcode, a in replies[20:]} == {(NOERROR, ())}  # IPv4 only
            assert reads.calls == 1

            # Names outside the zone's shape (a resolver's search list) are answered without asking the API.
            search = [query(f"web.{name}"), query("web.svc.cluster.local"), query("example.com")]
            assert {rcode for _, rcode, _ in await ask_many(port, search)} == {NXDOMAIN}
            assert reads.calls == 1

            await asyncio.sleep(1.1)  # past the TTL: the next lookup reads again
            assert (await ask_many(port, [query(name)]))[0][1:] == (NOERROR, [ip])
            assert reads.calls == 2

            missing = name.replace("web.", "nothere.")
            assert {r[1] for r in await ask_many(port, [query(missing)] * 5)} == {NXDOMAIN}
            assert reads.calls == 3
        finally:
            transport.close()

    asyncio.run(scenario())


def test_an_answer_stands_in_while_the_api_fails_or_stalls_and_none_without_one(
        cluster: Cluster, service: tuple[str, str]) -> None:
    name, ip = service
    reads = CountedReads(Api(cluster.kubeconfig))

    async def scenario() -> None:
        transport, port = await serving(Answers(reads, fresh=0.2, patience=0.5, stale=30.0))
        try:
            assert (await ask_many(port, [query(name)]))[0][1:] == (NOERROR, [ip])
            await asyncio.sleep(0.3)

            reads.failing = True  # the API errs: the last answer stands in
            assert (await ask_many(port, [query(name)]))[0][1:] == (NOERROR, [ip])

            reads.failing, reads.stalling = False, 3.0  # the API hangs: the last answer within the patience
            started = time.monotonic()
            assert (await ask_many(port, [query(name)] * 3))[0][1:] == (NOERROR, [ip])
            assert time.monotonic() - started < 2.0

            # A name never read before has nothing to stand in: a failing API is a SERVFAIL (retry), and a
            # stalled one is waited for rather than answered wrongly.
            other = name.replace("web.", "other.")
            reads.stalling, reads.failing = 0.0, True
            assert (await ask_many(port, [query(other)]))[0][1] == SERVFAIL
            reads.failing, reads.stalling = False, 1.0
            started = time.monotonic()
            assert (await ask_many(port, [query(other)]))[0][1] == NXDOMAIN
            assert time.monotonic() - started >= 1.0
        finally:
            transport.close()

    asyncio.run(scenario())
