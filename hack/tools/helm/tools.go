//go:build tools

// Package tools pins helm for the chart tests.
package tools

import _ "helm.sh/helm/v4/cmd/helm"
