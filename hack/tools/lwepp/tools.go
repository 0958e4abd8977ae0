//go:build tools

// Package tools pins the Gateway API Inference Extension's lightweight endpoint picker (lwepp, v1.6.0): a
// round-robin picker speaking the same ext_proc protocol as the EPP, the cache-blind baseline of bench-routing.
package tools

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/lwepp"
