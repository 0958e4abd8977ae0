"""The kind node image's recipe agrees with the pinned kubeadm: every image kubeadm will run is one the image
pre-loads, under exactly that name (else the kubelet would try to pull it, which fails offline)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from atom_localcluster import kindnode, tools


def _kubeadm_images(tmp_path: Path) -> list[str]:
    """``kubeadm config images list`` for kind's ClusterConfiguration with :func:`cluster_config`'s patch."""
    (patch,) = kindnode.cluster_config()["kubeadmConfigPatches"]
    config = {"apiVersion": "kubeadm.k8s.io/v1beta4", "kubernetesVersion": tools.toolset_of("kubeadm").version,
              **json.loads(patch)}
    path = tmp_path / "kubeadm.json"
    path.write_text(json.dumps(config))
    out = subprocess.run([str(tools.path("kubeadm")), "config", "images", "list", "--config", str(path)],
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.split()


def test_kubeadm_asks_for_exactly_the_preloaded_images(tmp_path: Path) -> None:
    wanted = [i for i in _kubeadm_images(tmp_path) if "/pause:" not in i]  # the sandbox is containerd's (below)
    assert sorted(wanted) == sorted(kindnode.image_refs().values())


def test_versions_are_the_pinned_ones() -> None:
    refs = kindnode.image_refs()
    assert refs["kube-apiserver"].endswith(":" + tools.toolset_of("kube-apiserver").version)
    assert refs["etcd"].endswith(":" + tools.toolset_of("etcd").version)
    assert refs["coredns"].endswith(":" + tools.toolset_of("coredns").version)


def test_the_bridge_cni_is_refused_for_several_nodes() -> None:
    with pytest.raises(ValueError, match="one node; got nodes=3"):
        kindnode.cluster_config(nodes=3)


def test_containerd_config_is_kinds_with_our_pause_and_restricted_oom_score(tmp_path: Path) -> None:
    """kind's containerd config with only the sandbox image replaced (the pause image the node pre-loads) and
    restrict_oom_score_adj on (no CAP_SYS_RESOURCE here)."""
    files = kindnode.kind_files()
    root = tmp_path / "rootfs"
    kindnode._install_kind_files(root, files, "atom.local/pause:abc")
    ours = (root / "etc/containerd/config.toml").read_text().splitlines()
    theirs = (files / "etc/containerd/config.toml").read_text().splitlines()
    changed = [(a, b) for a, b in zip(theirs, ours, strict=True) if a != b]
    assert [b.strip() for _, b in changed] == ['sandbox_image = "atom.local/pause:abc"',
                                               "restrict_oom_score_adj = true"]
    assert (root / "usr/local/bin/entrypoint").stat().st_mode & 0o777 == 0o755


def test_the_storage_manifest_is_kinds_with_the_images_built_here() -> None:
    docs = [d for d in yaml.safe_load_all(kindnode.storage_manifest()) if d]
    kinds = [d["kind"] for d in docs]
    assert {"Deployment", "StorageClass", "ConfigMap", "Namespace"} <= set(kinds)
    (deploy,) = (d for d in docs if d["kind"] == "Deployment")
    container = deploy["spec"]["template"]["spec"]["containers"][0]
    refs = kindnode.storage_refs()
    assert container["image"] == refs["storageProvisionerImage"]
    assert container["command"][container["command"].index("--helper-image") + 1] == refs["storageHelperImage"]
    (config,) = (d for d in docs if d["kind"] == "ConfigMap")
    assert yaml.safe_load(config["data"]["helperPod.yaml"])["spec"]["containers"][0]["image"] == \
        refs["storageHelperImage"]
