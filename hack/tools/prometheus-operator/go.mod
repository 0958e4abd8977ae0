// Not built: tests read prometheus-operator's CRDs (example/prometheus-operator-crd) from this module's files,
// which Go's module cache keeps (atom_localcluster.tools.module_dir).
module atom.dev/hack/tools/prometheus-operator

go 1.26.0

require github.com/prometheus-operator/prometheus-operator v0.85.0
