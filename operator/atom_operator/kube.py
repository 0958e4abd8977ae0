"""A small asyncio Kubernetes client on aiohttp, logged in with kopf's own login functions.

kopf ships no client for arbitrary requests; this one knows the few kinds the reconciler touches and turns
retryable API answers (409, 429, 5xx, connection errors) into :class:`kopf.TemporaryError` with a short delay.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import kopf
from atom_engine.api import GROUP, PLURAL, VERSION

# kind -> (API path prefix, plural)
KINDS = {
    "ConfigMap": ("/api/v1", "configmaps"),
    "Service": ("/api/v1", "services"),
    "Event": ("/api/v1", "events"),
    "Pod": ("/api/v1", "pods"),
    "Deployment": ("/apis/apps/v1", "deployments"),
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


def path(kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
    prefix, plural = KINDS[kind]
    out = f"{prefix}/namespaces/{quote(namespace)}/{plural}"
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

    @classmethod
    async def login(cls, settings: kopf.OperatorSettings) -> Kube:
        info = kopf.login_with_service_account(settings=settings) or kopf.login_with_kubeconfig(settings=settings)
        if info is None:
            raise kopf.PermanentError("no Kubernetes credentials: neither in-cluster nor a kubeconfig")
        return cls(info)

    async def close(self) -> None:
        await self.session.close()

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
