"""A minimal ``external.metrics.k8s.io`` server for tests: the real HPA controller of the harness's
kube-controller-manager reads a value the test sets, through the API server's aggregator.

Loopback only: an ``ExternalName`` Service pointing at ``localhost`` (the aggregator then dials
``https://localhost:<port>``; its availability check probes endpoints only for ClusterIP Services), an
``APIService`` with the harness CA as its caBundle, and a TLS server on localhost whose certificate, signed by
that CA, names ``<service>.<namespace>.svc`` (the server name the aggregator checks). It ignores the client's
identity, which the harness's API server does not forward anyway.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ssl
import threading
from typing import Any

from aiohttp import web
from atom_localcluster.cluster import free_port

GROUP, VERSION = "external.metrics.k8s.io", "v1beta1"
SERVICE, NAMESPACE = "atom-test-external-metrics", "default"


class ExternalMetrics:
    def __init__(self, cluster: Any) -> None:  # noqa: ANN401 - the harness's Cluster
        self.cluster = cluster
        self.values: dict[str, float] = {}
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> ExternalMetrics:
        pair = self.cluster.ca.issue(
            "external-metrics", f"{SERVICE}.{NAMESPACE}.svc", hosts=(f"{SERVICE}.{NAMESPACE}.svc", "localhost"),
            server=True,
        )  # fmt: skip
        tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        tls.load_cert_chain(str(pair.cert), str(pair.key))
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(tls), self._loop).result(30)
        ca = base64.b64encode(self.cluster.ca_file.read_bytes()).decode()
        meta = {"name": SERVICE, "namespace": NAMESPACE}
        self.cluster.apply({"apiVersion": "v1", "kind": "Service", "metadata": meta,
                            "spec": {"type": "ExternalName", "externalName": "localhost"}})  # fmt: skip
        self.cluster.apply({
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService", "metadata": {"name": f"{VERSION}.{GROUP}"},
            "spec": {"group": GROUP, "version": VERSION, "caBundle": ca, "groupPriorityMinimum": 100,
                     "versionPriority": 100, "service": {"name": SERVICE, "namespace": NAMESPACE, "port": self.port}},
        })  # fmt: skip
        return self

    def __exit__(self, *_exc: object) -> None:
        self.cluster.kubectl("delete", "apiservice", f"{VERSION}.{GROUP}", "--ignore-not-found", check=False)
        self.cluster.kubectl("delete", "service", SERVICE, "-n", NAMESPACE, "--ignore-not-found", check=False)
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self, tls: ssl.SSLContext) -> None:
        app = web.Application()
        app.router.add_get(f"/apis/{GROUP}/{VERSION}", self._resources)
        app.router.add_get(f"/apis/{GROUP}/{VERSION}/namespaces/{{namespace}}/{{metric}}", self._value)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "localhost", self.port, ssl_context=tls).start()

    async def _resources(self, _request: web.Request) -> web.Response:
        return web.json_response({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": f"{GROUP}/{VERSION}",
            "resources": [{"name": name, "singularName": "", "namespaced": True, "kind": "ExternalMetricValueList",
                           "verbs": ["get"]} for name in self.values],
        })  # fmt: skip

    async def _value(self, request: web.Request) -> web.Response:
        name = request.match_info["metric"]
        if name not in self.values:
            return web.json_response({"kind": "Status", "status": "Failure", "code": 404}, status=404)
        now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        item = {"metricName": name, "metricLabels": {}, "timestamp": now, "value": f"{int(self.values[name] * 1000)}m"}
        return web.json_response({"kind": "ExternalMetricValueList", "apiVersion": f"{GROUP}/{VERSION}",
                                  "metadata": {}, "items": [item]})  # fmt: skip
