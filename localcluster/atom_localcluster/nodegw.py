"""What pods on the real node need from the host, served on the node bridge's gateway address only.

* **API relay**: the API server listens on 127.0.0.1, which a pod cannot reach. It advertises the gateway address
  instead (so the ``kubernetes`` Service's endpoint is ``<gateway>:<port>`` and kube-proxy sends 10.96.0.1:443
  there), and this relay carries those connections to 127.0.0.1:<port>. TLS passes through untouched.
* **Cluster DNS**: a small authoritative server for ``<service>.<namespace>.svc.cluster.local`` (the subset of the
  Kubernetes DNS spec the product uses): a ClusterIP Service answers its ClusterIP, a headless one the addresses of
  its ready endpoints (EndpointSlices); any other name is NXDOMAIN. CoreDNS would need an image we cannot pull.
  The kubelet's ``clusterDNS`` points pods here.

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
from pathlib import Path

from kubernetes.client import CoreV1Api, DiscoveryV1Api
from kubernetes.client.exceptions import ApiException
from kubernetes.config import new_client_from_config

DOMAIN = "svc.cluster.local"
TTL = 5  # seconds: endpoints change during rollouts, and resolvers re-ask soon
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


class Dns(asyncio.DatagramProtocol):
    def __init__(self, api: Api) -> None:
        self.api = api

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        asyncio.get_running_loop().create_task(self.answer(data, addr))

    async def answer(self, data: bytes, addr: tuple[str, int]) -> None:
        try:
            _, _, name, qtype, _ = parse_question(data)
        except (ValueError, IndexError, UnicodeDecodeError, struct.error):
            return  # not a query we can even echo: drop it, the client retries or gives up
        try:
            reply = await asyncio.to_thread(self.lookup, data, name, qtype)
        except Exception as e:  # noqa: BLE001 - the API may be briefly unreachable; tell the client to retry
            print(f"dns name={name} error={e!r}", flush=True)
            reply = response(data, SERVFAIL)
        self.transport.sendto(reply, addr)

    def lookup(self, data: bytes, name: str, qtype: int) -> bytes:
        parts = name.removesuffix("." + DOMAIN).split(".") if name.endswith("." + DOMAIN) else []
        if len(parts) != 2:
            return response(data, NXDOMAIN)
        addresses = self.api.addresses(parts[0], parts[1])
        if addresses is None:
            return response(data, NXDOMAIN)
        print(f"dns name={name} qtype={qtype} answers={addresses}", flush=True)
        return response(data, NOERROR, addresses if qtype == A else [])


async def serve(listen: str, api_port: int, dns_port: int, kubeconfig: Path) -> None:
    ipaddress.IPv4Address(listen)  # refuse a hostname or a wildcard: this serves the node bridge only
    loop = asyncio.get_running_loop()
    server = await asyncio.start_server(relay(("127.0.0.1", api_port)), listen, api_port)
    await loop.create_datagram_endpoint(lambda: Dns(Api(kubeconfig)), local_addr=(listen, dns_port))
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
