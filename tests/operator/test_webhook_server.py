"""The admission webhook's server on loopback, without an API server: an AdmissionReview in, its answer out."""

from __future__ import annotations

import json
import ssl
from pathlib import Path
from typing import Any

import aiohttp
from atom_localcluster.cluster import free_port
from atom_operator import webhook
from atom_operator.admission import Verdict, review
from atom_operator.config import WebhookSettings


def admission_review(obj: Any, operation: str = "CREATE") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "0f1e2d3c-0000-4000-8000-000000000001", "operation": operation, "namespace": "ns",
                        "object": obj, "oldObject": None}}  # fmt: skip


def atomdeployment(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "serving.atom.dev/v1alpha1", "kind": "AtomDeployment",
            "metadata": {"name": "llm", "namespace": "ns"}, "spec": {"model": {"source": "builtin:tiny"}, **spec}}


async def served(tmp_path: Path, body: str) -> tuple[int, Any]:
    ca, cert, key = webhook.make_certificates(tmp_path, ["127.0.0.1"])
    settings = WebhookSettings(addr="127.0.0.1", port=free_port(), cert=str(cert), key=str(key), ca=str(ca))
    seen: list[str | None] = []

    def judge(obj: Any, old: Any, namespace: str | None) -> Verdict:
        seen.append(namespace)
        return review(obj, old=old, claims=set())

    server = webhook.WebhookServer(settings, judge)
    await server.start()
    try:
        trust = ssl.create_default_context(cafile=str(ca))
        async with aiohttp.ClientSession() as http, http.post(
            f"https://127.0.0.1:{settings.port}{webhook.REVIEW_PATH}", data=body, ssl=trust,
            headers={"Content-Type": "application/json"},
        ) as r:
            text = await r.text()
            return r.status, json.loads(text) if r.status == 200 else text
    finally:
        await server.stop()


async def test_a_valid_object_is_allowed_with_the_reviews_warnings(tmp_path: Path) -> None:
    volume = {"persistentVolumeClaim": {"claimName": "gone"}}
    status, out = await served(tmp_path, json.dumps(admission_review(
        atomdeployment(model={"source": "/models/x", "volume": volume}))))
    assert status == 200 and out["kind"] == "AdmissionReview"
    assert out["response"]["uid"] == "0f1e2d3c-0000-4000-8000-000000000001" and out["response"]["allowed"] is True
    assert any("'gone' does not exist" in w for w in out["response"]["warnings"])


async def test_an_invalid_object_is_refused_with_422_and_the_reasons(tmp_path: Path) -> None:
    status, out = await served(tmp_path, json.dumps(admission_review(atomdeployment(decode={"replicas": -1}))))
    assert status == 200 and out["response"]["allowed"] is False
    assert out["response"]["status"]["code"] == 422 and "spec.decode.replicas" in out["response"]["status"]["message"]


async def test_an_object_nested_too_deep_for_json_is_refused_not_a_500(tmp_path: Path) -> None:
    text = json.dumps(admission_review(atomdeployment(affinity={"x": "DEEP"})))
    text = text.replace('"DEEP"', '{"x": ' * 3000 + "{}" + "}" * 3000)
    status, out = await served(tmp_path, text)
    assert status == 200 and out["response"]["allowed"] is False
    assert out["response"]["uid"] == "0f1e2d3c-0000-4000-8000-000000000001"
    assert "nested at most" in out["response"]["status"]["message"]


async def test_what_is_no_admission_review_gets_a_400(tmp_path: Path) -> None:
    assert (await served(tmp_path, "{not json"))[0] == 400
    assert (await served(tmp_path, json.dumps({"request": {"object": {}}})))[0] == 400


async def test_a_delete_is_allowed_unread(tmp_path: Path) -> None:
    status, out = await served(tmp_path, json.dumps(admission_review(None, operation="DELETE")))
    assert status == 200 and out["response"]["allowed"] is True
