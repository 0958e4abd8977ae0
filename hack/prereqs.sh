#!/usr/bin/env bash
# Install the Debian packages the test suite needs, once per machine (a no-op when they are there).
#   docker.io                      dockerd, containerd and runc: image builds and the real node's runtime
#   debootstrap                    the local base image (no image can be pulled here)
#   containernetworking-plugins    bridge/host-local/portmap/loopback CNI plugins for the real node
#   nftables iptables              kube-proxy (nftables mode) and the bridge's FORWARD rules
#   gcc libc6-dev                  the static pause image
#   gcc-aarch64-linux-gnu          furiosa-torch's compiler shells out to aarch64-linux-gnu-gcc (the rngd backend's
#   libc6-dev-arm64-cross          tests compile for real); the wheel declares neither. Without the arm64 libc headers
#                                  the compile fails late: "bits/wordsize.h: No such file or directory"
#   libtcmalloc-minimal4           the engine's malloc (engine/atom_engine/malloc.py) and vLLM's tuned one in
#                                  make bench-engine
#   prometheus                     its promtool: the chart's alert rules' unit tests (tests/observability)
set -euo pipefail
packages=(docker.io debootstrap containernetworking-plugins nftables iptables gcc libc6-dev curl gcc-aarch64-linux-gnu
  libc6-dev-arm64-cross libtcmalloc-minimal4 prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "prereqs: missing ${missing[*]}; install them as root: apt-get install ${missing[*]}" >&2
  exit 1
fi
echo "prereqs: installing ${missing[*]}"
apt-get update -q
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
