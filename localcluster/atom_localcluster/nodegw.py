"""What pods on the real node need from the host, served on the node bridge's gateway address only.

* **API relay**: the API server listens on 127.0.0.1, which a pod cannot reach. It advertises the gateway address
  instead (so the ``kubernetes`` Service's endpoint is ``<gateway>:<port>`` and kube-proxy sends 10.96.0.1:443
  there), and this relay carries those connections to 127.0.0.1:<port>. TLS passes through untouched.
* **Cluster DNS**: a small authoritative server for ``<service>.<namespace>.svc.cluster.local`` (the subset of the
  Kubernetes DNS spec the product uses): a ClusterIP Service answers its ClusterIP, a headless one the addresses of
  its ready endpoints (EndpointSlices); any other name is NXDOMAIN. CoreDNS would need an image we cannot pull.
  The kubelet's ``clusterDNS`` points pods here. Like CoreDNS, it answers from what it has read, not with an API
  read per query (:class:`Answers`).

Run as ``python -m atom_localcluster.nodegw --listen <gateway> --api-port <port> --kubeconfig <admin kubeconfig>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import socket
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kubernetes.client import CoreV1Api, DiscoveryV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.config import new_client_from_config

DOMAIN = "svc.cluster.local"
TTL = 5  # seconds: endpoints change during rollouts, and resolvers re-ask soon
PATIENCE = 2.0  # seconds a query waits for a read before a stale answer will do: a resolver gives up at 5
STALE = 60.0  # seconds an answer may be served past its TTL while the API does not answer
A, AAAA, IN = 1, 28, 1
NOERROR, FORMERR, SERVFAIL, NXDOMAIN = 0, 1, 2, 3


# ---- API relay -------------------------------------------------------------------------------------------------
async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def relay(target: tuple[str, int]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*target)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))

    return handle


# ---- cluster DNS -----------------------------------------------------------------------------------------------
class Api:
    """Reads of Services and EndpointSlices with the kubeconfig's credentials (blocking; called from a thread)."""

    def __init__(self, kubeconfig: Path) -> None:
        client = new_client_from_config(str(kubeconfig))
        self.core, self.discovery = CoreV1Api(client), DiscoveryV1Api(client)

    def addresses(self, service: str, namespace: str) -> list[str] | None:
        """IPv4 answers for a Service, or None when it does not exist."""
        try:
            svc = self.core.read_namespaced_service(service, namespace, _request_timeout=5)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        cluster_ip = svc.spec.cluster_ip
        if cluster_ip and cluster_ip != "None":
            return [cluster_ip]
        selector = f"kubernetes.io/service-name={service}"
        slices = self.discovery.list_namespaced_endpoint_slice(namespace, label_selector=selector, _request_timeout=5)
        out: list[str] = []
        for s in slices.items:
            if s.address_type != "IPv4":
                continue
            for ep in s.endpoints or []:
                if ep.conditions is None or ep.conditions.ready is not False:  # unset: ready, as the API says
                    out += [a for a in ep.addresses or [] if a not in out]
        return out


def parse_question(packet: bytes) -> tuple[int, int, str, int, int]:
    """(id, flags, name, qtype, end offset of the question) of a query with one question."""
    ident, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if qdcount != 1:
        raise ValueError("one question expected")
    labels, i = [], 12
    while packet[i]:
        n = packet[i]
        if n & 0xC0:
            raise ValueError("compressed name in a question")
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii").lower())
        i += 1 + n
    qtype, _qclass = struct.unpack("!HH", packet[i + 1 : i + 5])
    return ident, flags, ".".join(labels), qtype, i + 5


def response(query: bytes, rcode: int, answers: list[str] = ()) -> bytes:  # type: ignore[assignment]
    ident, flags, _, _, end = parse_question(query)
    # QR, opcode copied, AA, RD copied; RA unset: we answer only for our own zone.
    out_flags = 0x8000 | (flags & 0x7800) | 0x0400 | (flags & 0x0100) | rcode
    header = struct.pack("!HHHHHH", ident, out_flags, 1, len(answers), 0, 0)
    body = b"".join(struct.pack("!HHHIH", 0xC00C, A, IN, TTL, 4) + socket.inet_aton(a) for a in answers)
    return header + query[12:end] + body


Reader = Callable[[str, str], "list[str] | None"]


@dataclass
class _Read:
    addresses: list[str] | None
    at: float


class Answers:
    """What a Service resolves to, read from the API at most once per name per TTL.

    One read per query made every lookup wait behind the reads before it on a small thread pool: a burst of
    lookups (a client that resolves per request) could queue past the resolver's timeout, and a queue that answers
    only timed-out queries never drains while they keep coming. So a name's answer is kept for its TTL, queries
    for a name being read share that read, and when the API is slow or failing an answer up to ``stale`` seconds
    old is served (CoreDNS answers from its informers' caches the same way).
    """

    def __init__(self, read: Reader, *, fresh: float = TTL, patience: float = PATIENCE, stale: float = STALE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.read, self.fresh, self.patience, self.stale, self.clock = read, fresh, patience, stale, clock
        self._known: dict[tuple[str, str], _Read] = {}
        self._reading: dict[tuple[str, str], asyncio.Future[list[str] | None]] = {}

    async def get(self, service: str, namespace: str) -> tuple[list[str] | None, str]:
        """(addresses or None for no such Service, how: ``cached``, ``read`` or ``stale``); raises the read's error
        when no answer is young enough to stand in."""
        key = (service, namespace)
        known = self._known.get(key)
        if known is not None and self.clock() - known.at < self.fresh:
            return known.addresses, "cached"
        reading = self._reading.get(key)
        if reading is None:
            reading = asyncio.ensure_future(asyncio.to_thread(self.read, service, namespace))
            self._reading[key] = reading
            reading.add_done_callback(lambda done: self._keep(key, done))
        try:
            return await asyncio.wait_for(asyncio.shield(reading), self.patience), "read"
        except Exception:
            if known is not None and self.clock() - known.at < self.fresh + self.stale:
                return known.addresses, "stale"
            if not reading.done():
                return await reading, "read"  # nothing to stand in: the read is the only answer there is
            raise

    def _keep(self, key: tuple[str, str], done: asyncio.Future[list[str] | None]) -> None:
        del self._reading[key]
        if not done.cancelled() and done.exception() is None:
            self._known[key] = _Read(done.result(), self.clock())


def service_of(name: str) -> tuple[str, str] | None:
    """(service, namespace) of ``<service>.<namespace>.svc.cluster.local``, or None for any other name."""
    if not name.endswith("." + DOMAIN):
        return None
    parts = name.removesuffix("." + DOMAIN).split(".")
    return (parts[0], parts[1]) if len(parts) == 2 else None


class Dns(asyncio.DatagramProtocol):
    def __init__(self, answers: Answers) -> None:
        self.answers = answers

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        asyncio.get_running_loop().create_task(self.answer(data, addr))

    async def answer(self, data: bytes, addr: tuple[str, int]) -> None:
        received = time.monotonic()
        try:
            _, _, name, qtype, _ = parse_question(data)
        except (ValueError, IndexError, UnicodeDecodeError, struct.error):
            return  # not a query we can even echo: drop it, the client retries or gives up
        wanted = service_of(name)
        how, addresses = "shape", None
        try:
            if wanted is not None:
                addresses, how = await self.answers.get(*wanted)
            if addresses is None:
                reply = response(data, NXDOMAIN)
            else:
                reply = response(data, NOERROR, addresses if qtype == A else [])
        except Exception as e:  # noqa: BLE001 - the API may be briefly unreachable; tell the client to retry
            how, reply = f"error={e!r}", response(data, SERVFAIL)
        self.transport.sendto(reply, addr)
        # Every query, with who asked and how long it waited: a client's failed lookup can be read against this.
        print(f"dns from={addr[0]} name={name} qtype={qtype} answers={addresses} how={how} "
              f"ms={(time.monotonic() - received) * 1000:.1f}", flush=True)


async def serve(listen: str, api_port: int, dns_port: int, kubeconfig: Path) -> None:
    ipaddress.IPv4Address(listen)  # refuse a hostname or a wildcard: this serves the node bridge only
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(relay(("127.0.0.1", api_port)), listen, api_port)
    await loop.create_datagram_endpoint(lambda: Dns(Answers(Api(kubeconfig).addresses)), local_addr=(listen, dns_port))
    print(f"nodegw ready relay={listen}:{api_port}->127.0.0.1:{api_port} dns={listen}:{dns_port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m atom_localcluster.nodegw", description=__doc__.split("\n")[0])
    p.add_argument("--listen", required=True, help="the node bridge's gateway address")
    p.add_argument("--api-port", type=int, required=True)
    p.add_argument("--dns-port", type=int, default=53)
    p.add_argument("--kubeconfig", type=Path, required=True)
    args = p.parse_args(argv)
    asyncio.run(serve(args.listen, args.api_port, args.dns_port, args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
