"""The fake NPUs: device nodes in a directory the plugin owns, and what a container gets for a set of them.

What the container sees follows the RBLN device plugin (RBLN-SW/k8s-device-plugin, cmd/rbln-device-plugin):

* device IDs are the devices' names, ``rbln0``, ``rbln1``, ... (inventory.go toPluginDevice: ``ID: device.Info.Name``),
  listed sorted (inventory.go clonePluginDevices / sortedDeviceIDs);
* Allocate gives one DeviceSpec for ``/dev/rsd0`` first, then one per device, ``/dev/<name>``, each with permissions
  ``rw`` and no environment variables (plugin.go deviceSpecsForDevices and newDeviceSpec);
* an unknown device ID or an empty request is refused (plugin.go allocateContainer / selectedDevices), and a device
  node that is missing on the host fails the allocation (plugin.go newDeviceSpec -> waitForDeviceNode).

Where this differs, because the real part cannot exist here: the real host nodes are the driver's ``/dev/rbln<N>``
and an RSD group device that the plugin recreates per allocation (rsdgroup.RecreateRsdGroup); here every node is a
character device with the major/minor of ``/dev/null`` (harmless to open, read and write) in the plugin's own
directory, and one ``rsd0`` node serves every allocation. The real plugin also adds a CDI annotation
(``rebellions.ai/npu=runtime``, cdi.go RuntimeAnnotations) whose spec the RBLN container toolkit writes; no such spec
exists on this node and the node's containerd has no CDI support, so the fake sends none rather than one that
resolves to nothing.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

HEALTHY = "Healthy"  # k8s.io/kubelet pkg/apis/deviceplugin/v1beta1/constants.go
UNHEALTHY = "Unhealthy"
RSD = "rsd0"


class AllocationError(ValueError):
    """A container request the plugin cannot satisfy; the message names the device and why."""


@dataclass(frozen=True)
class DeviceSpec:
    """One device node for a container: where it appears inside, where it is on the host, cgroup permissions."""

    container_path: str
    host_path: str
    permissions: str = "rw"


class FakeDevices:
    """``count`` fake NPUs named ``rbln0..rbln<count-1>`` plus ``rsd0``, as character devices under ``directory``."""

    def __init__(self, directory: Path, count: int, template: str = "/dev/null") -> None:
        if count < 1:
            raise ValueError(f"device count must be >= 1, got {count}")
        self.directory = Path(directory)
        self.count = count
        self.rdev = os.stat(template).st_rdev  # the major/minor every fake node copies
        if not stat.S_ISCHR(os.stat(template).st_mode):
            raise ValueError(f"template {template} is not a character device")

    @property
    def ids(self) -> list[str]:
        return sorted(f"rbln{i}" for i in range(self.count))

    def host_path(self, name: str) -> Path:
        return self.directory / name

    def create(self) -> None:
        """Make (or remake) every node; an existing one that is not our character device is replaced."""
        self.directory.mkdir(parents=True, exist_ok=True)
        for name in [*self.ids, RSD]:
            path = self.host_path(name)
            if self._is_ours(path):
                continue
            path.unlink(missing_ok=True)
            os.mknod(path, stat.S_IFCHR | 0o666, self.rdev)
            os.chmod(path, 0o666)  # mknod's mode passes through the umask

    def remove(self) -> None:
        for name in [*self.ids, RSD]:
            self.host_path(name).unlink(missing_ok=True)
        try:
            self.directory.rmdir()
        except OSError:
            pass  # not empty (someone else's files) or already gone: leave it

    def _is_ours(self, path: Path) -> bool:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return False
        return stat.S_ISCHR(st.st_mode) and st.st_rdev == self.rdev

    def health(self) -> dict[str, str]:
        """Each device's health: Healthy while its node exists as our character device, else Unhealthy."""
        return {name: HEALTHY if self._is_ours(self.host_path(name)) else UNHEALTHY for name in self.ids}

    def specs(self, device_ids: list[str]) -> list[DeviceSpec]:
        """The DeviceSpecs of one container's allocation: ``/dev/rsd0`` first, then ``/dev/rbln<N>`` per device."""
        if not device_ids:
            raise AllocationError("container request does not include any device IDs")
        known = set(self.ids)
        for device_id in device_ids:
            if device_id not in known:
                raise AllocationError(f"unknown device {device_id!r}: this plugin manages {', '.join(self.ids)}")
        out = []
        for name in [RSD, *device_ids]:
            path = self.host_path(name)
            if not self._is_ours(path):
                raise AllocationError(f"device node {path} is missing")
            out.append(DeviceSpec(container_path=f"/dev/{name}", host_path=str(path)))
        return out
