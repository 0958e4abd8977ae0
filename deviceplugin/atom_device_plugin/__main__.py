"""``atom-device-plugin``: run the fake-device plugin until SIGTERM or SIGINT."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from atom_device_plugin.devices import FakeDevices
from atom_device_plugin.plugin import DEFAULT_PLUGIN_DIR, DEFAULT_RESOURCE, DevicePlugin, validate_resource_name
from atom_device_plugin.stubs import KUBELET_VERSION, StubsError, api


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _resource(text: str) -> str:
    try:
        return validate_resource_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="atom-device-plugin", description=__doc__)
    p.add_argument("--resource-name", type=_resource, default=DEFAULT_RESOURCE,
                   help=f"the extended resource to advertise (default {DEFAULT_RESOURCE})")
    p.add_argument("--devices", type=_positive, default=4, help="how many fake NPUs (default 4)")
    p.add_argument("--device-dir", type=Path, required=True,
                   help="a directory the plugin owns, where it makes the devices' character nodes")
    p.add_argument("--plugin-dir", type=Path, default=DEFAULT_PLUGIN_DIR,
                   help=f"the kubelet's device-plugin directory, holding kubelet.sock (default {DEFAULT_PLUGIN_DIR})")
    p.add_argument("--endpoint", help="the plugin socket's file name in --plugin-dir (default from the resource)")
    p.add_argument("--kubelet-version", default=KUBELET_VERSION,
                   help=f"the k8s.io/kubelet module whose proto the stubs come from (default {KUBELET_VERSION})")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    try:
        stubs = api(args.kubelet_version)
    except StubsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    plugin = DevicePlugin(stubs, FakeDevices(args.device_dir, args.devices), args.resource_name, args.plugin_dir,
                          args.endpoint)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    plugin.run(stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
