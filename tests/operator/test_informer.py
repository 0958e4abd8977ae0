"""What the controller makes of the informers' listings and events, without an API server (the cluster tests in
test_chaos.py run the real informers against one)."""

from __future__ import annotations

from typing import Any

from atom_operator.api import GROUP, KIND
from atom_operator.children import Defaults
from atom_operator.controller import Controller
from atom_operator.informer import Listing, controlled_by, labelled
from atom_operator.workqueue import WorkQueue

OWNER = ("ns", "llm")


def child(kind: str, name: str, version: int, namespace: str = "ns", owner: str | None = "llm") -> dict[str, Any]:
    refs = [{"apiVersion": f"{GROUP}/v1alpha1", "kind": KIND, "name": owner, "uid": "u", "controller": True}]
    meta = {"name": name, "namespace": namespace, "resourceVersion": str(version), "labels": {}}
    return {"kind": kind, "metadata": {**meta, "ownerReferences": refs if owner else []}}


def controller() -> Controller:
    return Controller(kube=None, defaults=Defaults(), workers=0)  # type: ignore[arg-type] - no reconcile runs


def listing(kind: str, version: int, *items: dict[str, Any], namespace: str | None = None) -> Listing:
    return Listing(kind, namespace, [(i, OWNER) for i in items], str(version))


async def test_a_child_missing_from_a_listing_was_deleted_unseen_and_its_owner_is_reconciled() -> None:
    c = controller()
    c.relisted(listing("Service", 10, child("Service", "llm", 5)))
    c.queue = WorkQueue()  # forget the listing's own enqueue
    c.relisted(listing("Service", 20))  # deleted while no watch was connected: no DELETED event ever came
    assert c.stores["Service"].get("ns", "llm") is None
    assert OWNER in c.queue


async def test_a_child_written_after_the_listing_was_taken_is_not_a_tombstone() -> None:
    c = controller()
    c.stores["Service"].put(child("Service", "llm", 30), OWNER)  # the answer to our own create
    c.relisted(listing("Service", 20))
    assert c.stores["Service"].get("ns", "llm") is not None


async def test_a_listing_of_one_namespace_leaves_the_others_alone() -> None:
    c = controller()
    c.stores["ConfigMap"].put(child("ConfigMap", "llm-decode-config", 5, namespace="other"), ("other", "llm"))
    c.relisted(listing("ConfigMap", 20, namespace="ns"))
    assert c.stores["ConfigMap"].get("other", "llm-decode-config") is not None


async def test_a_vanished_deployment_leaves_status_without_it_and_pods_missing_from_a_listing_go() -> None:
    c = controller()
    deployment = {**child("Deployment", "llm-decode", 5), "status": {"readyReplicas": 1}}
    c.relisted(listing("Deployment", 10, deployment))
    pod = {"kind": "Pod", "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "6", "labels": {}}}
    c.relisted(listing("Pod", 10, pod))
    assert "llm-decode" in c.stores["Deployment"].owned_by(OWNER) and "p" in c.stores["Pod"].owned_by(OWNER)
    c.relisted(listing("Deployment", 20))
    c.relisted(listing("Pod", 20))
    # nothing of it left, and no owner: forgotten
    assert not c.stores["Deployment"].owned_by(OWNER) and not c.stores["Pod"].owned_by(OWNER)


async def test_an_atomdeployment_deleted_unseen_is_forgotten() -> None:
    c = controller()
    body = {"kind": KIND, "metadata": {"name": "llm", "namespace": "ns", "uid": "u", "resourceVersion": "3"}}
    c.relisted(Listing(KIND, None, [(body, OWNER)], "5"))
    assert c.stores[KIND].get(*OWNER) is not None
    c.relisted(Listing(KIND, None, [], "9"))
    assert c.stores[KIND].get(*OWNER) is None


def test_children_are_matched_by_their_controller_reference_not_a_label() -> None:
    owner_of = controlled_by(KIND, GROUP)
    unlabelled = child("Service", "llm", 1)
    assert owner_of(unlabelled) == OWNER
    assert owner_of(child("Service", "llm", 1, owner=None)) is None
    someone_elses = child("Service", "x", 1)
    someone_elses["metadata"]["ownerReferences"][0]["apiVersion"] = "example.com/v1"
    assert owner_of(someone_elses) is None
    assert labelled("serving.atom.dev/deployment")(unlabelled) is None
