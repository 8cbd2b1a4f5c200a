#!/usr/bin/env bash
# Install lb-agent on a VM from this repository (built: `npm ci && npm run build`):
# the agent and its runtime modules under /usr/lib/lb-agent, /usr/bin/lb-agent,
# the systemd unit, an example config (never overwriting an existing one), and
# the lb-agent user; then enable and start the service.
#
#   sudo systemd/install.sh                  install, enable and start
#   sudo systemd/install.sh --no-start       install and enable, do not start
#   systemd/install.sh --root DIR --no-start install into a scratch root (packaging, tests)
#
# Nothing is downloaded: everything comes from this checkout (node_modules
# included), so a VM without registry access can be installed from a copy.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
root=/
start=1
enable=1
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root=$2; shift 2 ;;
    --no-start) start=0; shift ;;
    --no-enable) enable=0; start=0; shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
root=${root%/}
[ -f "$here/dist/agent/cli/main.js" ] || { echo "install.sh: build first: npm ci && npm run build" >&2; exit 1; }
[ -f "$here/native/build/Release/lbagent_native.node" ] || { echo "install.sh: the native addon is not built: npm ci" >&2; exit 1; }

lib=$root/usr/lib/lb-agent
install -d -m 0755 "$lib" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/lb-agent" "$root/usr/share/doc/lb-agent"
rm -rf "$lib/dist" "$lib/node_modules" "$lib/native"
cp -a "$here/dist" "$lib/dist"
rm -rf "$lib/dist/test" "$lib/dist/bench"
install -d "$lib/native/build/Release"
install -m 0755 "$here/native/build/Release/lbagent_native.node" "$lib/native/build/Release/"
install -m 0644 "$here/package.json" "$here/package-lock.json" "$lib/"
install -m 0644 "$here/README.md" "$lib/"
# Runtime dependencies only.
(cd "$here" && npm ls --omit=dev --parseable --all 2>/dev/null | tail -n +2) | while read -r dep; do
  rel=${dep#"$here/"}
  install -d "$lib/$(dirname "$rel")"
  cp -a "$dep" "$lib/$rel"
done
cat > "$root/usr/bin/lb-agent" <<'SH'
#!/bin/sh
exec node /usr/lib/lb-agent/dist/agent/cli/main.js "$@"
SH
chmod 0755 "$root/usr/bin/lb-agent"
install -m 0644 "$here/systemd/lb-agent.service" "$root/lib/systemd/system/lb-agent.service"
[ -e "$root/etc/lb-agent/config.yaml" ] || install -m 0644 "$here/examples/config.yaml" "$root/etc/lb-agent/config.yaml"
install -m 0644 "$here/examples/config.yaml" "$root/usr/share/doc/lb-agent/config.example.yaml"

if [ "$root" = "" ]; then
  getent passwd lb-agent >/dev/null || useradd --system --no-create-home --home-dir /var/lib/lb-agent --shell /usr/sbin/nologin lb-agent
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    [ $enable = 1 ] && systemctl enable lb-agent.service
    [ $start = 1 ] && systemctl restart lb-agent.service
  fi
fi
echo "lb-agent installed under ${root:-/}"
