"""The reconciler's Kubernetes client: kubernetes_asyncio's dynamic client, for the few kinds it touches.

The objects stay plain dicts, as the API server sends them: the applier compares what it applied with what it reads
back field by field, and the generated models would drop a field this client's version does not know. The kinds
are named here once (no discovery round trips at start-up); server-side apply and the watch stream are the
library's. What is worth repeating (409, 429, 5xx, a broken connection) raises :class:`TransientError` with a
short delay; every other refusal is an :class:`KubeError` (an ``ApiException`` of the library's).
"""

from __future__ import annotations

import copy
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.client.rest import RESTResponse
from kubernetes_asyncio.dynamic import DynamicClient
from kubernetes_asyncio.dynamic.resource import Resource
from kubernetes_asyncio.watch import Watch

from atom_operator.api import GROUP, PLURAL, VERSION

# kind -> (API group, version, plural); every kind here is namespaced but those in CLUSTER_SCOPED.
KINDS = {
    "ConfigMap": ("", "v1", "configmaps"),
    "Service": ("", "v1", "services"),
    "Event": ("", "v1", "events"),
    "Pod": ("", "v1", "pods"),
    "Deployment": ("apps", "v1", "deployments"),
    "NetworkPolicy": ("networking.k8s.io", "v1", "networkpolicies"),
    "Job": ("batch", "v1", "jobs"),
    "AtomDeployment": (GROUP, VERSION, PLURAL),
    # spec.routing.inferencePool: the pool (the extension's CRD), its picker's identity, and a Gateway's route.
    "InferencePool": ("inference.networking.k8s.io", "v1", "inferencepools"),
    "HTTPRoute": ("gateway.networking.k8s.io", "v1", "httproutes"),
    "ServiceAccount": ("", "v1", "serviceaccounts"),
    "Role": ("rbac.authorization.k8s.io", "v1", "roles"),
    "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    # The webhook's warnings: the nodes' NPUs and the claims that exist.
    "Node": ("", "v1", "nodes"),
    "PersistentVolumeClaim": ("", "v1", "persistentvolumeclaims"),
    # Leader election (atom_operator.lease).
    "Lease": ("coordination.k8s.io", "v1", "leases"),
}
CLUSTER_SCOPED = {"Node"}
RETRY_STATUSES = {409, 429, 500, 502, 503, 504}
RETRY_DELAY = 1.0
TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)
CONNECTIONS = 32  # requests in flight at once (the reconcile workers'); the watches have a pool of their own


class TransientError(Exception):
    """A request that may well succeed if repeated after ``delay`` seconds: a conflict, throttling, a server error
    or a broken connection."""

    def __init__(self, message: str, delay: float = RETRY_DELAY) -> None:
        super().__init__(message)
        self.delay = delay


class KubeError(ApiException):
    """The library's ApiException for a refused request, told in one line: status, reason, the server's message."""

    @classmethod
    def of(cls, error: ApiException) -> KubeError:
        out = cls(status=error.status, reason=error.reason)
        out.body, out.headers = error.body, error.headers
        return out

    @property
    def message(self) -> str:
        try:
            return str(json.loads(self.body).get("message") or self.reason)
        except (TypeError, ValueError, AttributeError):
            return str(self.body or self.reason)[:500]

    def __str__(self) -> str:
        said = self.message
        return f"{self.status} {self.reason}" + (f": {said}" if said != str(self.reason) else "")


def refusal(what: str, error: KubeError) -> KubeError | TransientError:
    """What a refused request raises: a :class:`TransientError` where repeating it may succeed (a 409 conflict
    among them, so a caller that expects conflicts catches that, not the KubeError), else the error itself."""
    if error.status in RETRY_STATUSES:
        transient = TransientError(f"{what}: {error}", delay=RETRY_DELAY)
        transient.__cause__ = error
        return transient
    return error


class Kube:
    """Requests to one API server: a pool for the reconcile workers, another for the long-lived watches."""

    def __init__(self, configuration: client.Configuration, agent: str = "atom-operator") -> None:
        """``agent``: the User-Agent, which audit logs record (each replica names itself in it)."""
        configuration.connection_pool_maxsize = CONNECTIONS
        self._api = client.ApiClient(configuration)
        self._api.user_agent = agent
        watching = copy.deepcopy(configuration)
        watching.connection_pool_maxsize = 0  # unbounded: the watches never take the workers' connections
        self._watch_api = client.ApiClient(watching)
        self._watch_api.user_agent = agent
        # Constructed, not awaited: no discovery, as the resources are named in KINDS.
        self.dynamic, self._watching = DynamicClient(self._api), DynamicClient(self._watch_api)
        self._resources = {kind: self.resource(kind) for kind in KINDS}

    @classmethod
    async def login(cls, agent: str = "atom-operator") -> Kube:
        """In the cluster: its service account (the token re-read as it rotates); outside: the kubeconfig."""
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            try:
                await config.load_kube_config(client_configuration=configuration)
            except config.ConfigException as e:
                raise RuntimeError(f"no Kubernetes credentials: neither in-cluster nor a kubeconfig: {e}") from e
        return cls(configuration, agent)

    def resource(self, kind: str, watching: bool = False) -> Resource:
        group, version, plural = KINDS[kind]
        return Resource(
            prefix="apis" if group else "api",
            group=group,
            api_version=version,
            kind=kind,
            name=plural,
            namespaced=kind not in CLUSTER_SCOPED,
            client=self._watching if watching else self.dynamic,
        )

    async def close(self) -> None:
        await self._api.close()
        await self._watch_api.close()

    async def _call(self, what: str, method: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        # serialize=False: the raw answer, whose status this checks itself. The dynamic client of kubernetes_asyncio
        # 36.1.0 reads every answer unchecked (its requests skip the REST layer's status check), so a refusal
        # would come back as if it were the object.
        try:
            response = await method(*args, serialize=False, _request_timeout=TIMEOUT, **kwargs)
            async with response:
                data = await response.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise TransientError(f"{what}: {e!r}", delay=RETRY_DELAY) from e
        if response.status >= 400:
            error = KubeError(http_resp=RESTResponse(response, data))
            error.body = data.decode(errors="replace")
            raise refusal(what, error)
        return json.loads(data) if data else {}

    async def request(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        """Any request, by URL path (``params`` as the dynamic client's: body, content_type, field_manager, ...)."""
        return await self._call(f"{method} {path}", self.dynamic.request, method, path, **params)

    async def serves(self, kind: str) -> bool:
        """Whether the API server serves ``kind`` (its CRD may not be installed): one discovery request."""
        group, version, plural = KINDS[kind]
        try:
            found = await self.request("GET", f"/apis/{group}/{version}" if group else f"/api/{version}")
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return any(r.get("name") == plural for r in found.get("resources", []))

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self._call(f"get {kind}", self.dynamic.get, self._resources[kind], name, namespace)
        except KubeError as e:
            if e.status == 404:
                return None
            raise

    async def apply(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply, forced: the fields in ``obj`` become ours; fields we applied before and left out go."""
        return await self._call(
            f"apply {obj['kind']}",
            self.dynamic.server_side_apply,
            self._resources[obj["kind"]],
            obj,
            field_manager=manager,
            force_conflicts=True,
        )

    async def patch_status(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        path = self._resources[kind].path(name, namespace) + "/status"
        return await self.request("PATCH", path, body=patch, content_type="application/merge-patch+json")

    async def patch_json(
        self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]], manager: str
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902): replaces a whole field, which server-side apply cannot do where the field is
        a granular map or list that another manager added to."""
        path = self._resources[kind].path(name, namespace)
        return await self.request(
            "PATCH", path, body=ops, content_type="application/json-patch+json", field_manager=manager
        )

    async def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete (in the background); False when it was already gone. ``uid``: only that incarnation."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self._call(f"delete {kind}", self.dynamic.delete, self._resources[kind], name, namespace, body=body)
        except KubeError as e:
            if e.status == 404:
                return False
            raise
        return True

    async def replace(self, obj: dict[str, Any]) -> dict[str, Any]:
        """A PUT of the whole object: refused with 409 (a TransientError) unless its resourceVersion is current."""
        meta = obj["metadata"]
        return await self._call(
            f"replace {obj['kind']}", self.dynamic.replace, self._resources[obj["kind"]], obj, meta["name"],
            meta["namespace"],
        )

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        return await self._call(f"create {obj['kind']}", self.dynamic.create, self._resources[obj["kind"]], obj)

    async def list(
        self,
        kind: str,
        namespace: str | None,
        label_selector: str | None = None,
        page: int = 100,
        keep: Callable[[dict[str, Any]], dict[str, Any] | None] = lambda item: item,
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of ``kind`` (in pages) and the collection's resourceVersion, the point a watch starts from.

        ``keep`` makes each item what the caller holds (None: drop it) as its page arrives, so a large listing
        (every pod, with its managedFields) is never held whole as sent."""
        items: list[dict[str, Any]] = []
        more: str | None = None
        while True:
            out = await self._call(
                f"list {kind}",
                self.dynamic.get,
                self._resources[kind],
                namespace=namespace,
                label_selector=label_selector,
                limit=page,
                _continue=more,
            )
            # A list's items carry no apiVersion and kind; give them those of a single object, as a GET has.
            for i in out.pop("items", None) or []:
                kept = keep({"apiVersion": out.get("apiVersion"), "kind": kind, **i})
                if kept is not None:
                    items.append(kept)
            more = (out.get("metadata") or {}).get("continue")
            if not more:
                return items, (out.get("metadata") or {}).get("resourceVersion", "")

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events of ``kind`` after ``resource_version`` (bookmarks included), until the server ends the
        watch (after ``timeout_seconds``). A broken connection or a refused watch raises :class:`TransientError`;
        a version too old to watch from (410 Gone, as an ERROR event) an :class:`KubeError`."""
        stream = Watch().stream(
            self.resource(kind, watching=True).get,
            namespace=namespace,
            label_selector=label_selector,
            resource_version=resource_version,
            timeout_seconds=timeout_seconds,
            query_params=[("allowWatchBookmarks", "true")],
            serialize=False,
            # No total limit: a watch lasts timeout_seconds; silence for longer than that means a dead link.
            _request_timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=timeout_seconds + 30),
        )
        try:
            async with stream:
                async for event in stream:
                    yield {"type": event["type"], "object": event["raw_object"]}
        except ApiException as e:  # an ERROR event, or the Status of a refused watch
            error = KubeError.of(e)
            if e.status == 410:
                raise error from e
            raise TransientError(f"watch {kind}: {error}", delay=RETRY_DELAY) from e
        except (TimeoutError, aiohttp.ClientError) as e:
            raise TransientError(f"watch {kind}: {e!r}", delay=RETRY_DELAY) from e
