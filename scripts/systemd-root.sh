#!/usr/bin/env bash
# The Debian bookworm root file system that lab/systemd-container.ts
# boots with systemd-nspawn: a real systemd (PID 1) to run lb-agent.service
# under, as on a VM. Built once with debootstrap (about 80 s) and kept outside
# any checkout; every test boots a throwaway overlay of it and never writes
# into it.
#
#   scripts/systemd-root.sh            build the root when missing; print its path
#   scripts/systemd-root.sh --rebuild  build it again (after changing PACKAGES)
#
# LB_AGENT_TEST_ROOT overrides the path (default /var/cache/lb-agent-test/bookworm).
# Atomic: debootstrap writes a temporary directory beside the root, which is
# renamed into place only when complete, so a killed build leaves no half
# root; a lock lets concurrent test processes wait for one build.
set -euo pipefail
root=${LB_AGENT_TEST_ROOT:-/var/cache/lb-agent-test/bookworm}
# systemd and dbus for the init; iproute2 and nftables because the agent's
# kernel data path and the preflight run `ip` and `nft`.
PACKAGES=systemd,systemd-sysv,dbus,iproute2,nftables
# Bumped when PACKAGES changes, so an older cached root is rebuilt.
STAMP="lb-agent-test-root v1 $PACKAGES"
rebuild=0
case "${1:-}" in
  --rebuild) rebuild=1 ;;
  '') ;;
  *) echo "systemd-root.sh: unknown option $1" >&2; exit 2 ;;
esac

current() { [ -f "$root/etc/lb-agent-test-root" ] && [ "$(cat "$root/etc/lb-agent-test-root")" = "$STAMP" ]; }
if [ $rebuild = 0 ] && current; then echo "$root"; exit 0; fi

[ "$(id -u)" = 0 ] || { echo "systemd-root.sh: run as root (debootstrap)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "systemd-root.sh: debootstrap is missing: apt-get install debootstrap (scripts/setup.sh does)" >&2; exit 1; }
parent=$(dirname "$root")
mkdir -p "$parent"
exec 9>"$parent/.$(basename "$root").lock"
flock -w 600 9 || { echo "systemd-root.sh: another build of $root holds the lock for 10 min" >&2; exit 1; }
# Someone else may have built it while this process waited for the lock.
if [ $rebuild = 0 ] && current; then echo "$root"; exit 0; fi

# The machine's own Debian mirror (deb822 sources first, then sources.list).
mirror=$(sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\).*/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | grep -v security | head -1 || true)
[ -n "$mirror" ] || mirror=$(awk '$1 == "deb" && $0 !~ /security/ { print $2; exit }' /etc/apt/sources.list 2>/dev/null || true)
mirror=${mirror:-http://deb.debian.org/debian}

tmp=$(mktemp -d "$parent/.$(basename "$root").build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
start=$(date +%s)
echo "systemd-root.sh: debootstrap bookworm from $mirror into $tmp" >&2
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$tmp" "$mirror" >"$tmp.log" 2>&1 || {
  tail -20 "$tmp.log" >&2; rm -f "$tmp.log"; echo "systemd-root.sh: debootstrap failed" >&2; exit 1; }
rm -f "$tmp.log"
# A container that boots this root needs none of what a VM's first boot does.
rm -f "$tmp/etc/machine-id"; : > "$tmp/etc/machine-id"
apt_clean() { rm -rf "$tmp/var/cache/apt/archives/"*.deb "$tmp/var/lib/apt/lists/"*; }
apt_clean
echo "$STAMP" > "$tmp/etc/lb-agent-test-root"
chmod 0755 "$tmp"
old=""
if [ -e "$root" ]; then old="$parent/.$(basename "$root").old.$$"; mv -T "$root" "$old"; fi
mv -T "$tmp" "$root"
trap - EXIT
[ -z "$old" ] || rm -rf "$old"
echo "systemd-root.sh: built $root in $(( $(date +%s) - start )) s ($(du -sm "$root" | cut -f1) MB)" >&2
echo "$root"
