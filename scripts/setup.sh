#!/usr/bin/env bash
# One-time set-up on a fresh Debian/Ubuntu VM, as root: the Debian packages
# the agent, its tests, the demo and the benchmarks use, then `npm ci` (which
# builds the native addon from source), the TypeScript build, and the cached
# root file system the systemd tests boot (scripts/systemd-root.sh).
# Idempotent: packages already present are not reinstalled.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "setup.sh: run as root (it installs Debian packages; the tests create network namespaces)" >&2
  exit 1
fi

node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
if [ "$node_major" -lt 20 ]; then
  echo "setup.sh: Node.js >= 20 is required (found: $(node --version 2>/dev/null || echo none)); install nodejs 20 from your distribution" >&2
  exit 1
fi

# package -> a file it provides (to skip apt when present)
declare -A pkgs=(
  [iproute2]=/usr/sbin/ip
  [nftables]=/usr/sbin/nft
  [dnsmasq-base]=/usr/sbin/dnsmasq
  [kea-dhcp4-server]=/usr/sbin/kea-dhcp4
  [kea-dhcp6-server]=/usr/sbin/kea-dhcp6
  [keepalived]=/usr/sbin/keepalived
  [libcap2-bin]=/usr/sbin/capsh
  [iputils-ping]=/usr/bin/ping
  [tcpdump]=/usr/bin/tcpdump
  [prometheus]=/usr/bin/prometheus
  [cloud-init]=/usr/bin/cloud-init
  [systemd]=/usr/bin/systemd-analyze
  [haproxy]=/usr/sbin/haproxy
  [nginx-light]=/usr/sbin/nginx
  [libnginx-mod-stream]=/usr/lib/nginx/modules/ngx_stream_module.so
  [wrk]=/usr/bin/wrk
  [iperf3]=/usr/bin/iperf3
  [strace]=/usr/bin/strace
  [linux-perf]=/usr/bin/perf
  [busybox]=/usr/bin/busybox
  [isc-dhcp-client]=/usr/sbin/dhclient
  [make]=/usr/bin/make
  [g++]=/usr/bin/g++
  # The eBPF NAT engine: clang builds native/bpf/nat.c for the BPF target
  # beside the addon; libbpf-dev's headers build the addon's loader, which
  # opens libbpf.so.1 (libbpf1) at run time.
  [clang]=/usr/bin/clang
  [libbpf-dev]=/usr/include/bpf/libbpf.h
  [python3]=/usr/bin/python3
  [systemd-container]=/usr/bin/systemd-nspawn
  [debootstrap]=/usr/sbin/debootstrap
  [conntrack]=/usr/sbin/conntrack
  [curl]=/usr/bin/curl
  [procps]=/usr/sbin/sysctl
  [util-linux]=/usr/bin/unshare
  [tmux]=/usr/bin/tmux
  [openssl]=/usr/bin/openssl
)
missing=()
for p in "${!pkgs[@]}"; do
  [ -e "${pkgs[$p]}" ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  # Services some of these packages start on install (nginx, haproxy,
  # prometheus, keepalived) are not wanted: the tests start their own.
  printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d
  trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# node-gyp builds native/ against the running Node's headers; point it at the
# installed ones so it never tries to download them (no network but registries).
node_inc=$(dirname "$(dirname "$(command -v node)")")/include/node
if [ -f "$node_inc/node_api.h" ]; then
  export npm_config_nodedir=${node_inc%/include/node}
else
  echo "setup.sh: Node's headers ($node_inc/node_api.h) are missing: install the headers package matching node $(node --version)" >&2
  exit 1
fi

npm ci --no-audit --no-fund
npm run build

# The Debian root that test/privileged/service-systemd.test.ts boots under a
# real systemd (lab/systemd-container.ts); built here once so tests
# do not pay for debootstrap (the harness still builds it when missing).
scripts/systemd-root.sh >/dev/null
