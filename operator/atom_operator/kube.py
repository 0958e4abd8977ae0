"""A small asyncio Kubernetes client on aiohttp, logged in with kopf's own login functions.

kopf ships no client for arbitrary requests; this one knows the few kinds the reconciler touches and turns
retryable API answers (409, 429, 5xx, connection errors) into :class:`kopf.TemporaryError` with a short delay.
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import kopf

from atom_operator.api import GROUP, PLURAL, VERSION

# kind -> (API path prefix, plural)
KINDS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Event": ("/api/v1", "events"),
    "Pod": ("/api/v1", "pods"),
    "Deployment": ("/apis/apps/v1", "deployments"),
    "NetworkPolicy": ("/apis/networking.k8s.io/v1", "networkpolicies"),
    "Job": ("/apis/batch/v1", "jobs"),
    "AtomDeployment": (f"/apis/{GROUP}/{VERSION}", PLURAL),
}
RETRY_STATUSES = {409, 429, 500, 502, 503, 504}
RETRY_DELAY = 1.0
TIMEOUT = aiohttp.ClientTimeout(total=30, connect=10)


class ApiError(Exception):
    def __init__(self, status: int, body: dict[str, Any] | str) -> None:
        self.status = status
        self.reason = body.get("reason", "") if isinstance(body, dict) else ""
        self.message = body.get("message", "") if isinstance(body, dict) else str(body)[:500]
        super().__init__(f"{status} {self.reason}: {self.message}")


@dataclass
class Failpoint:
    """Test hook: exit the process right after the n-th successful write into one namespace.

    ``ATOM_FAILPOINT=exit-after-write:<n>:<namespace>`` lets the tests kill the operator at exact points of a
    create (a SIGKILL from outside could not hit a point between two writes a millisecond apart).
    """

    after: int
    namespace: str
    seen: int = 0

    @classmethod
    def from_env(cls) -> Failpoint | None:
        spec = os.environ.get("ATOM_FAILPOINT", "")
        if not spec.startswith("exit-after-write:"):
            return None
        _, n, namespace = spec.split(":", 2)
        return cls(int(n), namespace)

    def wrote(self, namespace: str | None) -> None:
        if namespace == self.namespace:
            self.seen += 1
            if self.seen >= self.after:
                os._exit(137)  # as abrupt as SIGKILL: no cleanup, nothing flushed


def path(kind: str, namespace: str | None, name: str | None = None, subresource: str | None = None) -> str:
    """The object's (or, without a name, the collection's) URL path; ``namespace`` None: every namespace."""
    prefix, plural = KINDS[kind]
    out = f"{prefix}/namespaces/{quote(namespace)}/{plural}" if namespace is not None else f"{prefix}/{plural}"
    if name:
        out += f"/{quote(name)}"
    if subresource:
        out += f"/{subresource}"
    return out


class Kube:
    """Authenticated requests to one API server; writes count towards the failpoint."""

    def __init__(self, info: kopf.ConnectionInfo) -> None:
        self.server = info.server.rstrip("/")
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=32, ssl=info.as_ssl_context()),
            headers={**info.as_http_headers(), "User-Agent": "atom-operator"},
            timeout=TIMEOUT,
        )
        self.failpoint = Failpoint.from_env()
        self._info = info
        self._watch_session: aiohttp.ClientSession | None = None

    @classmethod
    async def login(cls, settings: kopf.OperatorSettings) -> Kube:
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials: neither in-cluster nor a kubeconfig")
        return cls(info)

    async def close(self) -> None:
        await self.session.close()
        if self._watch_session is not None:
            await self._watch_session.close()

    async def request(
        self,
        method: str,
        url: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        params: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        if params:
            url += "?" + urlencode(params)
        data = None if body is None else json.dumps(body)
        headers = {"Content-Type": content_type} if body is not None else {}
        try:
            async with self.session.request(method, self.server + url, data=data, headers=headers) as resp:
                text = await resp.text()
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as e:
            raise kopf.TemporaryError(f"{method} {url}: {e!r}", delay=RETRY_DELAY) from e
        payload: Any
        try:
            payload = json.loads(text) if text else {}
        except ValueError:
            payload = text
        if status >= 400:
            error = ApiError(status, payload)
            if status in RETRY_STATUSES:
                raise kopf.TemporaryError(f"{method} {url}: {error}", delay=RETRY_DELAY) from error
            raise error
        return payload

    def _wrote(self, namespace: str) -> None:
        if self.failpoint is not None:
            self.failpoint.wrote(namespace)

    async def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", path(kind, namespace, name))
        except ApiError as e:
            if e.status == 404:
                return None
            raise

    async def apply(self, obj: dict[str, Any], manager: str) -> dict[str, Any]:
        """Server-side apply, forced: the fields in ``obj`` become ours; fields we applied before and left out go."""
        meta = obj["metadata"]
        out = await self.request(
            "PATCH",
            path(obj["kind"], meta["namespace"], meta["name"]),
            obj,
            content_type="application/apply-patch+yaml",
            params={"fieldManager": manager, "force": "true"},
        )
        self._wrote(meta["namespace"])
        return out

    async def patch_status(self, kind: str, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        out = await self.request(
            "PATCH", path(kind, namespace, name, "status"), patch, content_type="application/merge-patch+json"
        )
        self._wrote(namespace)
        return out

    async def patch_json(
        self, kind: str, namespace: str, name: str, ops: list[dict[str, Any]], manager: str
    ) -> dict[str, Any]:
        """A JSON patch (RFC 6902): replaces a whole field, which server-side apply cannot do where the field is
        a granular map or list that another manager added to."""
        out = await self.request(
            "PATCH",
            path(kind, namespace, name),
            ops,
            content_type="application/json-patch+json",
            params={"fieldManager": manager},
        )
        self._wrote(namespace)
        return out

    async def delete(self, kind: str, namespace: str, name: str, uid: str | None = None) -> bool:
        """Delete (in the background); False when it was already gone. ``uid``: only that incarnation."""
        body: dict[str, Any] = {"propagationPolicy": "Background"}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request("DELETE", path(kind, namespace, name), body)
        except ApiError as e:
            if e.status == 404:
                return False
            raise
        self._wrote(namespace)
        return True

    async def create(self, obj: dict[str, Any]) -> dict[str, Any]:
        meta = obj["metadata"]
        out = await self.request("POST", path(obj["kind"], meta["namespace"]), obj)
        self._wrote(meta["namespace"])
        return out

    async def list(
        self, kind: str, namespace: str | None, label_selector: str | None = None, page: int = 500
    ) -> tuple[list[dict[str, Any]], str]:
        """Every object of ``kind`` (in pages) and the collection's resourceVersion, the point a watch starts from."""
        items: list[dict[str, Any]] = []
        params = {"limit": str(page)}
        if label_selector:
            params["labelSelector"] = label_selector
        while True:
            out = await self.request("GET", path(kind, namespace), params=params)
            # A list's items carry no apiVersion and kind; give them those of a single object, as a GET has.
            items.extend({"apiVersion": out.get("apiVersion"), "kind": kind, **i} for i in out.get("items") or [])
            more = (out.get("metadata") or {}).get("continue")
            if not more:
                return items, (out.get("metadata") or {}).get("resourceVersion", "")
            params["continue"] = more

    async def watch(
        self,
        kind: str,
        namespace: str | None,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """The watch events of ``kind`` after ``resource_version``, until the server ends the watch (after
        ``timeout_seconds``) or the connection breaks (``kopf.TemporaryError``). Long-lived, so on a session of
        its own: the watches never take the connections the reconcile workers need."""
        if self._watch_session is None:
            self._watch_session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, ssl=self._info.as_ssl_context()),
                headers=dict(self.session.headers),
                # No total limit: a watch lasts timeout_seconds; silence for longer than that means a dead link.
                timeout=aiohttp.ClientTimeout(total=None, connect=10, sock_read=timeout_seconds + 30),
            )
        params = {
            "watch": "1",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            params["labelSelector"] = label_selector
        url = self.server + path(kind, namespace) + "?" + urlencode(params)
        try:
            async with self._watch_session.get(url) as resp:
                if resp.status >= 400:
                    text = await resp.text()
                    try:
                        body: Any = json.loads(text)
                    except ValueError:
                        body = text
                    raise kopf.TemporaryError(f"watch {kind}: {ApiError(resp.status, body)}", delay=RETRY_DELAY)
                buffer = b""
                # Line by line, whatever the size of an object (aiohttp's readline stops at 64 KiB).
                async for chunk in resp.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for line in lines:
                        if line.strip():
                            yield json.loads(line)
        except (TimeoutError, aiohttp.ClientError) as e:
            raise kopf.TemporaryError(f"watch {kind}: {e!r}", delay=RETRY_DELAY) from e
