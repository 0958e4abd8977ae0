// CoreDNS for the local kind node image: the release kubeadm v1.34 pins (constants.CoreDNSVersion), built with
// the plugins kubeadm's default Corefile uses (plus log and hosts for debugging), the way CoreDNS documents
// compiling a subset of its plugins, instead of all ~60 (cloud DNS providers and their SDKs included).
package main

import (
	_ "github.com/coredns/caddy/onevent"
	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/forward"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/hosts"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/loop"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"
)

// dnsserver.Directives keeps its full upstream order; a directive with no registered plugin is simply never set up.
var _ = dnsserver.Directives

func main() {
	coremain.Run()
}
