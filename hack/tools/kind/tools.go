//go:build tools

// Package tools pins kind for the opt-in kind e2e.
package tools

import _ "sigs.k8s.io/kind"
