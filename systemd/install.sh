#!/usr/bin/env bash
# Install lb-agent on a VM from this repository (built: `npm ci && npm run build`):
# the agent and its runtime modules under /usr/lib/lb-agent (a symlink to a
# release directory under /usr/lib/lb-agent-releases, switched atomically, so
# an agent that is running while this installs never loads a file of the new
# build: Node resolves its modules through the real path), /usr/bin/lb-agent,
# the systemd unit, bash completion, the lb-agent(8) and lb-agent.yaml(5)
# man pages, the documentation under /usr/share/doc/lb-agent, an example
# config (never overwriting an existing one), and the lb-agent user; then
# enable and start the service.
#
#   sudo systemd/install.sh                  install, enable and start
#   sudo systemd/install.sh --no-start       install and enable, do not start
#   sudo systemd/install.sh --no-enable      install only (cloud-init enables it after `lb-agent check`)
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
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "install.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
root=${root%/}
node_major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
[ "$node_major" -ge 20 ] || { echo "install.sh: lb-agent needs Node.js >= 20 as \`node\` on PATH (found: $(node --version 2>/dev/null || echo none)); install your distribution's nodejs (SLES: nodejs20)" >&2; exit 1; }
[ -f "$here/dist/bundle/lb-agent.js" ] && [ -f "$here/dist/agent/config/schema-validator.js" ] || { echo "install.sh: build first: npm ci && npm run build" >&2; exit 1; }
[ -f "$here/native/build/Release/lbagent_native.node" ] || { echo "install.sh: the native addon is not built: npm ci" >&2; exit 1; }

# A release directory of its own; /usr/lib/lb-agent points at it once it is complete.
releases=$root/usr/lib/lb-agent-releases
id=$(date -u +%Y%m%dT%H%M%SZ)-$$
lib=$releases/$id
install -d -m 0755 "$releases" "$lib" "$root/usr/bin" "$root/lib/systemd/system" "$root/usr/lib/sysusers.d" "$root/etc/lb-agent" "$root/usr/share/doc/lb-agent"
cp -a "$here/dist" "$lib/dist"
rm -rf "$lib/dist/test" "$lib/dist/bench" "$lib/dist/lab"
install -d "$lib/native/build/Release"
install -m 0755 "$here/native/build/Release/lbagent_native.node" "$lib/native/build/Release/"
# The eBPF NAT engine's object and the header its map layouts are read from (kernel.engine).
install -m 0644 "$here/native/build/Release/nat.bpf.o" "$lib/native/build/Release/"
install -d "$lib/native/bpf"
install -m 0644 "$here/native/bpf/nat.h" "$lib/native/bpf/"
install -m 0644 "$here/package.json" "$here/package-lock.json" "$lib/"
# Runtime dependencies only: every package of the lockfile not marked dev,
# read with node itself (npm is not needed on the VM: Debian ships it apart
# from nodejs). Each package is copied without its own node_modules; nested
# runtime packages are lockfile entries of their own.
deps=$(cd "$here" && node -e '
  const fs = require("fs");
  const lock = JSON.parse(fs.readFileSync("package-lock.json", "utf8"));
  if (!lock.packages) { console.error("install.sh: package-lock.json has no \"packages\" (lockfileVersion >= 2 needed)"); process.exit(1); }
  for (const [p, m] of Object.entries(lock.packages)) {
    if (p === "" || m.dev || m.link) continue;
    if (!fs.existsSync(p)) { if (m.optional) continue; console.error(`install.sh: ${p} is missing: run npm ci`); process.exit(1); }
    console.log(p);
  }')
for rel in $deps; do
  install -d "$lib/$rel"
  (cd "$here/$rel" && tar --exclude=./node_modules -cf - .) | tar -xf - -C "$lib/$rel"
done
# Switch /usr/lib/lb-agent to the new release in one rename(2). A tree from
# an install before releases existed is moved aside first (an agent running
# from it may load its files through the new link once; every later upgrade
# is clean). The release the link pointed at stays (an agent started from it
# may still be running, until the restart below); older ones go.
current=$root/usr/lib/lb-agent
previous=
if [ -L "$current" ]; then
  previous=$(basename "$(readlink "$current")")
elif [ -d "$current" ]; then
  previous=legacy-$id
  mv -T "$current" "$releases/$previous"
fi
ln -sfn "lb-agent-releases/$id" "$current.new-$$"
mv -T "$current.new-$$" "$current"
for old in "$releases"/*; do
  name=$(basename "$old")
  [ "$name" = "$id" ] || [ "$name" = "$previous" ] || rm -rf "$old"
done
cat > "$root/usr/bin/lb-agent.new-$$" <<'SH'
#!/bin/sh
exec node /usr/lib/lb-agent/dist/bundle/lb-agent.js "$@"
SH
chmod 0755 "$root/usr/bin/lb-agent.new-$$"
mv -T "$root/usr/bin/lb-agent.new-$$" "$root/usr/bin/lb-agent"
# Bash completion, lb-agent(8) and lb-agent.yaml(5), generated by the
# installed CLI from its own definition and the config schema, so they match
# the command and the file they describe.
# Without a code cache: the installer's root would otherwise make
# /var/cache/lb-agent, the unit's CacheDirectory=, before systemd does.
export LB_AGENT_CODE_CACHE=off
install -d -m 0755 "$root/usr/share/bash-completion/completions" "$root/usr/share/man/man8" "$root/usr/share/man/man5"
node "$lib/dist/bundle/lb-agent.js" completion bash > "$root/usr/share/bash-completion/completions/lb-agent"
node "$lib/dist/bundle/lb-agent.js" man > "$root/usr/share/man/man8/lb-agent.8"
node "$lib/dist/bundle/lb-agent.js" man config > "$root/usr/share/man/man5/lb-agent.yaml.5"
chmod 0644 "$root/usr/share/bash-completion/completions/lb-agent" "$root/usr/share/man/man8/lb-agent.8" "$root/usr/share/man/man5/lb-agent.yaml.5"
install -m 0644 "$here/systemd/lb-agent.service" "$root/lib/systemd/system/lb-agent.service"
# The unit's User=lb-agent, for systemd-sysusers (packages, images) and below.
install -m 0644 "$here/systemd/lb-agent.sysusers" "$root/usr/lib/sysusers.d/lb-agent.conf"
[ -e "$root/etc/lb-agent/config.yaml" ] || install -m 0644 "$here/examples/config.yaml" "$root/etc/lb-agent/config.yaml"
install -m 0644 "$here/examples/config.yaml" "$root/usr/share/doc/lb-agent/config.example.yaml"
# The documentation the unit's Documentation= names: the README and docs/,
# side by side as in the repository so that the README's links resolve.
install -d -m 0755 "$root/usr/share/doc/lb-agent/docs"
install -m 0644 "$here/README.md" "$root/usr/share/doc/lb-agent/README.md"
install -m 0644 "$here"/docs/*.md "$root/usr/share/doc/lb-agent/docs/"

if [ "$root" != "" ]; then
  # A scratch root (an image, a test container) boots without running
  # systemd-sysusers (its unit only runs after an /usr update), so
  # User=lb-agent would fail with 217/USER: create the user in it now, and
  # enable the unit as systemctl does offline.
  if [ "$(id -u)" = 0 ] && command -v systemd-sysusers >/dev/null; then
    systemd-sysusers --root="$root" "$root/usr/lib/sysusers.d/lb-agent.conf"
  else
    echo "install.sh: not creating the lb-agent user in $root (needs root and systemd-sysusers): run systemd-sysusers --root=$root before booting it" >&2
  fi
  if [ $enable = 1 ]; then systemctl --root="$root" enable lb-agent.service; fi
else
  if ! getent passwd lb-agent >/dev/null; then
    if command -v systemd-sysusers >/dev/null; then systemd-sysusers /usr/lib/sysusers.d/lb-agent.conf
    else useradd --system --no-create-home --home-dir /var/lib/lb-agent --shell /usr/sbin/nologin lb-agent; fi
  fi
  if command -v systemctl >/dev/null && [ -d /run/systemd/system ]; then
    systemctl daemon-reload
    [ $enable = 1 ] && systemctl enable lb-agent.service
    [ $start = 1 ] && systemctl restart lb-agent.service
  fi
fi
echo "lb-agent installed under ${root:-/}"
