"""The device plugin itself: the v1beta1 DevicePlugin service over a unix socket, and its life with the kubelet.

The kubelet's side of the protocol (k8s.io/kubernetes v1.34.4 pkg/kubelet/cm/devicemanager) decides what this
code must do:

* the plugin serves first and registers second: on Register the kubelet dials ``<plugin dir>/<endpoint>`` at once
  and opens ListAndWatch (plugin/v1beta1/server.go Register -> connectClient);
* the kubelet's device manager removes every socket in its plugin directory when it starts
  (manager.go CleanupPluginDirectory), so a restarted kubelet shows as a new ``kubelet.sock`` and our socket gone:
  the plugin then serves afresh and registers again;
* when ListAndWatch ends the kubelet marks the resource's devices unhealthy, so allocatable drops to 0 at once,
  and forgets the resource 5 minutes later (manager.go PluginDisconnected, GetCapacity; types.go
  endpointStopGracePeriod);
* the kubelet picks the devices itself and never allocates one that is Unhealthy or already held: the plugin is
  told the IDs and answers with what the container needs for them.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc

from atom_device_plugin.devices import AllocationError, FakeDevices
from atom_device_plugin.stubs import Api

API_VERSION = "v1beta1"  # k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/constants.go Version
KUBELET_SOCKET = "kubelet.sock"  # constants.go KubeletSocket, relative to the plugin directory
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")  # constants.go DevicePluginPath
DEFAULT_RESOURCE = "rebellions.ai/npu"  # the RBLN plugin's generic name (pkg/consts/consts.go GenericResourceName)
# An extended resource name: a DNS subdomain prefix and a qualified name (what the kubelet's Register validates).
_RESOURCE = re.compile(r"^(?=.{1,253}/)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                       r"/[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

log = logging.getLogger("atom_device_plugin")


def validate_resource_name(name: str) -> str:
    if not _RESOURCE.match(name) or name.split("/", 1)[0].endswith("kubernetes.io"):
        raise ValueError(
            f"resource name {name!r} is not an extended resource name (<vendor domain>/<name>, e.g. {DEFAULT_RESOURCE})"
        )
    return name


def endpoint_for(resource_name: str) -> str:
    """The socket's file name in the plugin directory, one per resource (``rebellions.ai/npu`` -> ...npu.sock)."""
    return "atom-fake-" + re.sub(r"[^a-z0-9]+", "-", resource_name.lower()) + ".sock"


class DevicePluginService:
    """The DevicePlugin gRPC service for a set of fake devices (its methods bear the proto's rpc names)."""

    def __init__(self, api: Api, devices: FakeDevices) -> None:
        self._pb = api.pb
        self._devices = devices
        self._changed = threading.Condition()
        self._health = devices.health()
        self._generation = 0
        self._closed = False

    # ---- health ----------------------------------------------------------------------------------------------
    def refresh_health(self) -> bool:
        """Re-read every device's health; True (and every ListAndWatch stream sends the new list) if any changed."""
        health = self._devices.health()
        with self._changed:
            if health == self._health:
                return False
            self._health = health
            self._generation += 1
            self._changed.notify_all()
        log.info("event=health_changed %s", " ".join(f"{k}={v}" for k, v in sorted(health.items())))
        return True

    def close(self) -> None:
        """End every ListAndWatch stream (the kubelet takes that as the plugin going away)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def _device_list(self) -> list:
        return [self._pb.Device(ID=name, health=health) for name, health in sorted(self._health.items())]

    # ---- rpcs ------------------------------------------------------------------------------------------------
    def GetDevicePluginOptions(self, request, context):
        # Neither PreStartContainer nor GetPreferredAllocation is needed: the kubelet's own pick is as good as any
        # for identical fake devices, and nothing has to happen to a device before a container starts.
        return self._pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)

    def ListAndWatch(self, request, context) -> Iterator:
        with self._changed:
            generation, devices = self._generation, self._device_list()
        yield self._pb.ListAndWatchResponse(devices=devices)
        while True:
            with self._changed:
                self._changed.wait_for(lambda seen=generation: self._generation != seen or self._closed, timeout=1.0)
                if self._closed or not context.is_active():
                    return
                if self._generation == generation:
                    continue
                generation, devices = self._generation, self._device_list()
            yield self._pb.ListAndWatchResponse(devices=devices)

    def Allocate(self, request, context):
        responses = []
        for container in request.container_requests:
            try:
                specs = self._devices.specs(list(container.devices_ids))
            except AllocationError as e:
                log.warning("event=allocate_refused devices=%s reason=%r", ",".join(container.devices_ids), str(e))
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            responses.append(self._pb.ContainerAllocateResponse(devices=[
                self._pb.DeviceSpec(container_path=s.container_path, host_path=s.host_path, permissions=s.permissions)
                for s in specs
            ]))
            log.info("event=allocated devices=%s", ",".join(container.devices_ids))
        return self._pb.AllocateResponse(container_responses=responses)

    def GetPreferredAllocation(self, request, context):
        # Not advertised (see GetDevicePluginOptions); if asked anyway, an empty preference per container leaves
        # the choice to the kubelet, as the RBLN plugin does when it has none (plugin.go GetPreferredAllocation).
        return self._pb.PreferredAllocationResponse(container_responses=[
            self._pb.ContainerPreferredAllocationResponse() for _ in request.container_requests
        ])

    def PreStartContainer(self, request, context):
        return self._pb.PreStartContainerResponse()


class DevicePlugin:
    """Serves :class:`DevicePluginService` on ``<plugin_dir>/<endpoint>`` and keeps it registered with the kubelet."""

    def __init__(self, api: Api, devices: FakeDevices, resource_name: str = DEFAULT_RESOURCE,
                 plugin_dir: Path = DEFAULT_PLUGIN_DIR, endpoint: str | None = None,
                 poll_interval: float = 1.0) -> None:
        self.api = api
        self.devices = devices
        self.resource_name = validate_resource_name(resource_name)
        self.plugin_dir = Path(plugin_dir)
        self.endpoint = endpoint or endpoint_for(resource_name)
        self.poll_interval = poll_interval
        self.service: DevicePluginService | None = None
        self._server: grpc.Server | None = None

    @property
    def socket(self) -> Path:
        return self.plugin_dir / self.endpoint

    @property
    def kubelet_socket(self) -> Path:
        return self.plugin_dir / KUBELET_SOCKET

    # ---- the server ------------------------------------------------------------------------------------------
    def serve(self) -> None:
        """Listen on the plugin socket (a stale one from an earlier run is replaced)."""
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        self.socket.unlink(missing_ok=True)
        self.service = DevicePluginService(self.api, self.devices)
        # ListAndWatch holds a worker for as long as the kubelet watches: leave room for the unary calls.
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="device-plugin"))
        self.api.grpc.add_DevicePluginServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix:{self.socket}")
        server.start()
        self._server = server

    def shutdown(self) -> None:
        """Stop serving: open streams end (the kubelet sees the plugin go), the socket is removed."""
        if self.service is not None:
            self.service.close()
        if self._server is not None:
            # A grace period lets the streams close() just ended send their OK status; with none, gRPC cancels
            # them first when its threads are slow (a loaded node), and the kubelet reads UNAVAILABLE instead.
            self._server.stop(grace=5.0).wait()
            self._server = None
        self.socket.unlink(missing_ok=True)

    def register(self, timeout: float = 10.0) -> None:
        """Register the resource with the kubelet (raises grpc.RpcError when it refuses or cannot be reached)."""
        pb = self.api.pb
        options = pb.DevicePluginOptions(pre_start_required=False, get_preferred_allocation_available=False)
        request = pb.RegisterRequest(version=API_VERSION, endpoint=self.endpoint, resource_name=self.resource_name,
                                     options=options)
        with grpc.insecure_channel(f"unix:{self.kubelet_socket}") as channel:
            self.api.grpc.RegistrationStub(channel).Register(request, timeout=timeout, wait_for_ready=True)
        log.info("event=registered resource=%s endpoint=%s devices=%s", self.resource_name, self.endpoint,
                 ",".join(self.devices.ids))

    # ---- the life with the kubelet ---------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        """Until ``stop``: make the device nodes, serve, register, and register again whenever the kubelet restarts."""
        self.devices.create()
        log.info("event=devices_created dir=%s devices=%s", self.devices.directory, ",".join(self.devices.ids))
        try:
            while not stop.is_set():
                kubelet = self._wait_for_kubelet(stop)
                if kubelet is None:
                    break
                self.serve()
                try:
                    self.register()
                except grpc.RpcError as e:
                    log.warning("event=register_failed code=%s detail=%r", e.code().name, e.details())
                    self.shutdown()
                    stop.wait(self.poll_interval)
                    continue
                self._watch(kubelet, stop)
                self.shutdown()
        finally:
            self.shutdown()
            self.devices.remove()
            log.info("event=stopped resource=%s", self.resource_name)

    def _wait_for_kubelet(self, stop: threading.Event) -> tuple[int, int] | None:
        while not stop.is_set():
            ident = _identity(self.kubelet_socket)
            if ident is not None:
                return ident
            stop.wait(self.poll_interval)
        return None

    def _watch(self, kubelet: tuple[int, int], stop: threading.Event) -> None:
        """While registered: refresh health; return when the kubelet restarted (or ``stop``)."""
        assert self.service is not None
        while not stop.wait(self.poll_interval):
            self.service.refresh_health()
            if _identity(self.kubelet_socket) != kubelet or not self.socket.exists():
                log.info("event=kubelet_restarted action=register_again")
                return


def _identity(path: Path) -> tuple[int, int] | None:
    """The file's inode and change time: a recreated socket has a new one."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_ctime_ns
