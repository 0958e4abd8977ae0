"""A real local Kubernetes control plane for the tests: etcd, kube-apiserver, controller-manager, scheduler, kwok."""
