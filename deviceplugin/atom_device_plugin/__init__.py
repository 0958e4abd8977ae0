"""A fake-device plugin for the kubelet: NPUs as the RBLN device plugin exposes them, for nodes that have none.

It speaks the kubelet's device-plugin API v1beta1 (gRPC over unix sockets, stubs generated from the pinned
k8s.io/kubelet proto, see :mod:`atom_device_plugin.stubs`): it registers a resource (``rebellions.ai/npu`` by
default), lists N devices ``rbln0..rbln<N-1>`` backed by harmless character devices it creates, and answers
Allocate with ``/dev/rbln<N>`` and ``/dev/rsd0`` device specs as the real plugin does. The real-node test tier runs
it next to the kubelet, so pods get their "NPUs" from the kubelet's device manager, as on an ATOM cluster.

Run it: ``atom-device-plugin --devices 4 --device-dir /run/atom-fake-npu`` (root: it makes device nodes).
"""
