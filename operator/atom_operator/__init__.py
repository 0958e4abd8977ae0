"""atom-operator: reconciles AtomDeployments into prefill and decode workloads on NPU nodes."""

__version__ = "0.1.0"
