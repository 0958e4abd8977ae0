"""The project's local Kubernetes: etcd, kube-apiserver, controller-manager, scheduler, kwok NPU nodes, a real
kubelet node, kind, the images; used by the tests, the demo, the benchmarks and the make targets."""
