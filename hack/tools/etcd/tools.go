//go:build tools

// Package tools pins etcd for the test harness.
package tools

import _ "go.etcd.io/etcd/server/v3"
