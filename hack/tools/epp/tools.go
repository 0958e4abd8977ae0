//go:build tools

// Package tools pins the Gateway API Inference Extension's endpoint picker (EPP): v1.5.0 is the last release
// with cmd/epp. It picks a decode pod per request (prefix-cache and load aware) for Envoy's ext_proc filter.
package tools

import _ "sigs.k8s.io/gateway-api-inference-extension/cmd/epp"
