//go:build tools

// Package tools pins kwok, which fakes NPU nodes for the test harness.
package tools

import _ "sigs.k8s.io/kwok/cmd/kwok"
