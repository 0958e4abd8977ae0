"""The fake-device plugin over real gRPC: its service on a unix socket in a temp dir, called by the generated client
stubs, and its registration life against a kubelet-side Registration server (also real gRPC) that, like the
kubelet, dials the plugin back when it registers."""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from atom_device_plugin import stubs
from atom_device_plugin.__main__ import parse_args
from atom_device_plugin.devices import RSD, FakeDevices
from atom_device_plugin.plugin import DevicePlugin, endpoint_for, validate_resource_name

REPO = Path(__file__).resolve().parents[2]
RESOURCE = "rebellions.ai/npu"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the plugin makes device nodes (mknod needs root)")


@pytest.fixture(scope="module")
def api() -> stubs.Api:
    return stubs.api()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # A unix socket path must fit in 108 bytes; pytest's tmp_path can be longer.
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dp-") as d:
        yield Path(d)


@pytest.fixture
def plugin(api: stubs.Api, short_tmp: Path) -> Iterator[DevicePlugin]:
    devices = FakeDevices(short_tmp / "dev", 4)
    devices.create()
    p = DevicePlugin(api, devices, RESOURCE, plugin_dir=short_tmp / "plugins")
    p.serve()
    try:
        yield p
    finally:
        p.shutdown()
        devices.remove()


@pytest.fixture
def client(api: stubs.Api, plugin: DevicePlugin) -> Iterator:
    with grpc.insecure_channel(f"unix:{plugin.socket}") as channel:
        yield api.grpc.DevicePluginStub(channel)


def test_stubs_come_from_the_pinned_kubelet_module(api: stubs.Api) -> None:
    # The kubelet the tests run is built from hack/tools/kubernetes/go.mod: the stubs must speak its proto.
    gomod = (REPO / "hack" / "tools" / "kubernetes" / "go.mod").read_text()
    pinned = re.search(r"^\s*k8s\.io/kubelet => k8s\.io/kubelet (v\S+)", gomod, re.M)
    assert pinned and pinned.group(1) == stubs.KUBELET_VERSION
    # Compiled as published: the cache entry's proto is the module's file byte for byte.
    assert (api.directory / stubs.PACKAGE / "api.proto").read_bytes() == stubs.download_proto().read_bytes()
    assert api.directory.parent == stubs.cache_root()
    assert {"Register"} <= set(api.pb.DESCRIPTOR.services_by_name["Registration"].methods_by_name)
    assert set(api.pb.DESCRIPTOR.services_by_name["DevicePlugin"].methods_by_name) == {
        "GetDevicePluginOptions", "ListAndWatch", "GetPreferredAllocation", "Allocate", "PreStartContainer"}


def test_generation_is_cached_by_content(api: stubs.Api, short_tmp: Path) -> None:
    proto = stubs.download_proto()
    first = stubs.generate(proto, short_tmp)
    assert stubs.generate(proto, short_tmp) == first  # reused, not rebuilt
    changed = short_tmp / "api.proto"
    changed.write_bytes(proto.read_bytes() + b"\n// another revision\n")
    assert stubs.generate(changed, short_tmp) != first


def test_device_nodes_are_harmless_character_devices(plugin: DevicePlugin) -> None:
    null = os.stat("/dev/null").st_rdev
    for name in [*plugin.devices.ids, RSD]:
        st = os.stat(plugin.devices.host_path(name))
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == null, name
    plugin.devices.host_path("rbln0").write_bytes(b"written into the void")
    assert plugin.devices.host_path("rbln0").read_bytes() == b""


def test_options_ask_for_no_extra_calls(api: stubs.Api, client) -> None:
    opts = client.GetDevicePluginOptions(api.pb.Empty(), timeout=5)
    assert not opts.pre_start_required and not opts.get_preferred_allocation_available


def test_list_and_watch_sends_the_devices_then_every_health_change(api: stubs.Api, plugin: DevicePlugin,
                                                                   client) -> None:
    stream = client.ListAndWatch(api.pb.Empty(), timeout=30)
    first = next(stream)
    assert [(d.ID, d.health) for d in first.devices] == [(f"rbln{i}", "Healthy") for i in range(4)]

    assert plugin.service is not None
    assert not plugin.service.refresh_health()  # nothing changed: nothing is sent
    plugin.devices.host_path("rbln2").unlink()  # the node vanished: that device is no longer usable
    assert plugin.service.refresh_health()
    assert {d.ID: d.health for d in next(stream).devices} == {
        "rbln0": "Healthy", "rbln1": "Healthy", "rbln2": "Unhealthy", "rbln3": "Healthy"}
    plugin.devices.create()
    assert plugin.service.refresh_health()
    assert {d.health for d in next(stream).devices} == {"Healthy"}

    plugin.shutdown()  # the stream ends: what the kubelet sees when the plugin stops
    assert list(stream) == []
    assert not plugin.socket.exists()


def test_allocate_gives_rsd0_and_each_device_node_read_write_and_nothing_else(api: stubs.Api, plugin: DevicePlugin,
                                                                              client) -> None:
    request = api.pb.AllocateRequest(container_requests=[
        api.pb.ContainerAllocateRequest(devices_ids=["rbln1", "rbln3"]),
        api.pb.ContainerAllocateRequest(devices_ids=["rbln0"]),
    ])
    out = client.Allocate(request, timeout=5)
    assert len(out.container_responses) == 2
    first, second = out.container_responses
    d = plugin.devices.directory
    assert [(s.container_path, s.host_path, s.permissions) for s in first.devices] == [
        ("/dev/rsd0", str(d / "rsd0"), "rw"), ("/dev/rbln1", str(d / "rbln1"), "rw"),
        ("/dev/rbln3", str(d / "rbln3"), "rw")]
    assert [s.container_path for s in second.devices] == ["/dev/rsd0", "/dev/rbln0"]
    for response in out.container_responses:  # as the RBLN plugin: device specs only, no environment
        assert not response.envs and not response.mounts and not response.cdi_devices and not response.annotations


@pytest.mark.parametrize(
    ("ids", "message"),
    [(["rbln9"], "unknown device 'rbln9': this plugin manages rbln0, rbln1, rbln2, rbln3"),
     ([], "container request does not include any device IDs")],
)
def test_allocate_refuses_what_it_does_not_manage(api: stubs.Api, client, ids: list[str], message: str) -> None:
    request = api.pb.AllocateRequest(container_requests=[api.pb.ContainerAllocateRequest(devices_ids=ids)])
    with pytest.raises(grpc.RpcError) as err:
        client.Allocate(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == message


def test_allocate_fails_for_a_missing_device_node(api: stubs.Api, plugin: DevicePlugin, client) -> None:
    plugin.devices.host_path("rbln1").unlink()
    request = api.pb.AllocateRequest(container_requests=[api.pb.ContainerAllocateRequest(devices_ids=["rbln1"])])
    with pytest.raises(grpc.RpcError) as err:
        client.Allocate(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details() == f"device node {plugin.devices.host_path('rbln1')} is missing"


def test_preferred_allocation_and_prestart_answer_empty(api: stubs.Api, client) -> None:
    pref = client.GetPreferredAllocation(api.pb.PreferredAllocationRequest(container_requests=[
        api.pb.ContainerPreferredAllocationRequest(available_deviceIDs=["rbln0", "rbln1"], allocation_size=1)] * 2),
        timeout=5)
    assert [list(r.deviceIDs) for r in pref.container_responses] == [[], []]
    assert client.PreStartContainer(api.pb.PreStartContainerRequest(devices_ids=["rbln0"]), timeout=5) == \
        api.pb.PreStartContainerResponse()


class Kubelet:
    """The kubelet's Registration service on ``kubelet.sock``; on Register it dials the plugin and lists its devices,
    as the kubelet's device manager does (plugin/v1beta1/server.go Register -> connectClient)."""

    def __init__(self, api: stubs.Api, plugin_dir: Path) -> None:
        self.api = api
        self.plugin_dir = plugin_dir
        self.registered: list = []
        self.listed: list[list[str]] = []
        self.server: grpc.Server | None = None

    def Register(self, request, context):  # the rpc's name
        with grpc.insecure_channel(f"unix:{self.plugin_dir / request.endpoint}") as channel:
            first = next(self.api.grpc.DevicePluginStub(channel).ListAndWatch(self.api.pb.Empty(), timeout=5))
        self.listed.append([d.ID for d in first.devices])
        self.registered.append(request)
        return self.api.pb.Empty()

    def start(self) -> None:
        # What a starting kubelet does first: clean its plugin directory of every socket, then listen.
        for sock in self.plugin_dir.glob("*"):
            if stat.S_ISSOCK(sock.lstat().st_mode):
                sock.unlink()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        self.api.grpc.add_RegistrationServicer_to_server(self, self.server)
        self.server.add_insecure_port(f"unix:{self.plugin_dir / 'kubelet.sock'}")
        self.server.start()

    def stop(self) -> None:
        assert self.server is not None
        self.server.stop(grace=None).wait()
        (self.plugin_dir / "kubelet.sock").unlink(missing_ok=True)


def _until(probe, what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not probe():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.05)


def test_registers_and_registers_again_after_a_kubelet_restart(api: stubs.Api, short_tmp: Path) -> None:
    plugin_dir = short_tmp / "plugins"
    plugin_dir.mkdir()
    plugin = DevicePlugin(api, FakeDevices(short_tmp / "dev", 2), "rebellions.ai/ATOM", plugin_dir=plugin_dir,
                          poll_interval=0.1)
    stop = threading.Event()
    runner = threading.Thread(target=plugin.run, args=(stop,))
    runner.start()  # before the kubelet: the plugin waits for kubelet.sock
    kubelet = Kubelet(api, plugin_dir)
    try:
        time.sleep(0.3)
        assert kubelet.registered == []
        kubelet.start()
        _until(lambda: len(kubelet.registered) == 1, "the first registration")
        (req,) = kubelet.registered
        assert (req.version, req.endpoint, req.resource_name) == ("v1beta1", endpoint_for("rebellions.ai/ATOM"),
                                                                  "rebellions.ai/ATOM")
        assert not req.options.pre_start_required and not req.options.get_preferred_allocation_available
        assert kubelet.listed == [["rbln0", "rbln1"]]  # it served before it registered

        kubelet.stop()
        kubelet.start()  # a new kubelet.sock, and the plugin's socket removed
        _until(lambda: len(kubelet.registered) == 2, "the registration with the restarted kubelet")
        assert kubelet.listed[1] == ["rbln0", "rbln1"] and plugin.socket.exists()
    finally:
        stop.set()
        runner.join(10)
        if kubelet.server is not None:
            kubelet.stop()
    assert not runner.is_alive()
    assert not plugin.socket.exists() and not plugin.devices.directory.exists()  # nothing left behind


def test_bad_settings_are_refused_naming_the_value() -> None:
    with pytest.raises(ValueError, match="resource name 'npu' is not an extended resource name"):
        validate_resource_name("npu")
    with pytest.raises(ValueError, match="kubernetes.io"):
        validate_resource_name("kubernetes.io/npu")
    assert validate_resource_name("furiosa.ai/rngd-2core.12gb") == "furiosa.ai/rngd-2core.12gb"
    with pytest.raises(SystemExit):
        parse_args(["--device-dir", "/tmp/x", "--devices", "0"])
    with pytest.raises(ValueError, match="device count must be >= 1, got 0"):
        FakeDevices(Path("/tmp/x"), 0)
