//go:build tools

// The provisioner's main package is the module root, built as a dependency of this module (see localcluster/atom_localcluster/tools.py).
package tools

import _ "github.com/rancher/local-path-provisioner"
