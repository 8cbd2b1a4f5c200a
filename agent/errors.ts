// Error codes: every error a user or a caller can see carries one of these
// stable codes, so callers match on `code`, never on wording (the undici /
// fastify pattern). Add new codes here, grouped by area, and nowhere else.

export const ERROR_CODES = [
  // config/
  'LB_ERR_CONFIG_INVALID',
  // cli/
  'LB_ERR_CLI_USAGE',
  // daemon/
  'LB_ERR_DAEMON_LOCKED',
  'LB_ERR_DAEMON_START',
  // control/
  'LB_ERR_CONTROL_UNREACHABLE',
  'LB_ERR_CONTROL_PROTOCOL',
  // state/
  'LB_ERR_STATE_WRITE',
  'LB_ERR_STATE_READ',
  'LB_ERR_STATE_CORRUPT',
  // net/
  'LB_ERR_NET_NO_INTERFACE',
  'LB_ERR_NET_NO_CAPABILITY',
  'LB_ERR_NET_NETLINK',
  'LB_ERR_NET_MACVLAN_UNSUPPORTED',
  'LB_ERR_NET_SOCKET',
  'LB_ERR_NET_SYSCTL',
  'LB_ERR_NET_NATIVE_MISSING',
  'LB_ERR_NET_CONNTRACK',
  // forward/
  'LB_ERR_FORWARD_NFT',
  'LB_ERR_FORWARD_NFT_MISSING',
  'LB_ERR_FORWARD_LISTEN',
  'LB_ERR_FORWARD_DSR_UNSUPPORTED',
  'LB_ERR_FORWARD_DSR_BPF',
  'LB_ERR_FORWARD_NAT_BPF',
  // failover/
  'LB_ERR_VRRP_SOCKET',
  'LB_ERR_VRRP_INVALID',
  // metrics/
  'LB_ERR_METRICS_LISTEN',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/**
 * What each code means for whoever meets it: the usual cause and the fix.
 * docs/troubleshooting.md is generated from this table; a code without an
 * entry does not compile.
 */
export const ERROR_HELP: Readonly<Record<ErrorCode, { readonly cause: string; readonly fix: string }>> = {
  LB_ERR_CONFIG_INVALID: {
    cause: 'The configuration file does not validate: an unknown key, a value out of range, a broken Share IP or pool rule, or YAML that does not parse. Every error names the key\'s path and line.',
    fix: 'Run `lb-agent validate -c FILE`, fix each error it lists, and start or reload again. A refused reload keeps the running config.',
  },
  LB_ERR_CLI_USAGE: {
    cause: 'Options that do not go together (for example `status --watch --json`), or a missing argument.',
    fix: 'Read the message and `lb-agent help COMMAND`.',
  },
  LB_ERR_DAEMON_LOCKED: {
    cause: 'Another `lb-agent run` holds the instance lock of the same `stateDir`.',
    fix: 'Stop the other one (`systemctl stop lb-agent`), use `lb-agent run --replace` for a planned hand-over, or give this one another `stateDir`.',
  },
  LB_ERR_DAEMON_START: {
    cause: 'The daemon could not start: the lock file could not be created, or a `--replace` hand-over of listening sockets from the running agent failed.',
    fix: 'Check that `stateDir` exists and is writable by the agent; after a failed hand-over, start the agent again (the old one was asked to stop).',
  },
  LB_ERR_CONTROL_UNREACHABLE: {
    cause: '`status`, `reload` or `withdraw` found no daemon answering on the control socket: it is not running, is still starting, or uses another `control.socket`.',
    fix: '`systemctl status lb-agent`; pass the same `-c FILE` the daemon runs with (the socket path is read from it) or `--socket PATH`.',
  },
  LB_ERR_CONTROL_PROTOCOL: {
    cause: 'The daemon refused a control request, or its answer could not be read (a CLI and a daemon of different versions).',
    fix: 'Use the `lb-agent` of the installed release (`/usr/bin/lb-agent`); after an upgrade, restart the daemon.',
  },
  LB_ERR_STATE_WRITE: {
    cause: 'A lease, claim or health file could not be written under `stateDir`: the directory is missing, read-only, or full.',
    fix: 'Make `stateDir` writable by the agent\'s user (the unit\'s `StateDirectory=` does it for `/var/lib/lb-agent`) and free space.',
  },
  LB_ERR_STATE_READ: {
    cause: 'A file under `stateDir` exists but cannot be read (permissions).',
    fix: 'Give the agent\'s user read access, or remove the file to start that service fresh.',
  },
  LB_ERR_STATE_CORRUPT: {
    cause: 'A file under `stateDir` is not what the agent wrote (not JSON, or another document).',
    fix: 'Remove the file named in the message; the service then asks for a new lease or claim.',
  },
  LB_ERR_NET_NO_INTERFACE: {
    cause: 'The parent NIC (`node.interface`, or the default route\'s NIC) or an interface the agent needs does not exist or went away.',
    fix: 'Check `ip link`; set `node.interface` to the NIC that carries the VIPs\' LAN. `lb-agent check` (finding `interface`) says which.',
  },
  LB_ERR_NET_NO_CAPABILITY: {
    cause: 'A netlink, sysctl or socket call was refused: the process lacks CAP_NET_ADMIN or CAP_NET_RAW.',
    fix: 'Run under the shipped unit (it grants them), or as root. `lb-agent check` (finding `capabilities`) lists what is missing.',
  },
  LB_ERR_NET_NETLINK: {
    cause: 'The kernel refused or did not answer a link or address change (an address that already exists, a timeout).',
    fix: 'Read the message; `ip link` and `ip addr` show the state. Another tool managing the same addresses is the usual cause.',
  },
  LB_ERR_NET_MACVLAN_UNSUPPORTED: {
    cause: 'The kernel cannot create a macvlan: the driver is not built, not installed (a minimal kernel package) or not loaded.',
    fix: 'Run `lb-agent check`: its `macvlan` finding names the package to install (for example `kernel-default` instead of `kernel-default-base` on SLES, `linux-modules-extra` on Ubuntu) or the reboot needed. Pool services need no macvlan.',
  },
  LB_ERR_NET_SOCKET: {
    cause: 'A packet socket (DHCP, ARP, VRRP) could not be opened or used, or the interface went down.',
    fix: 'Check that the interface is up and that the process has CAP_NET_RAW; frames resume when the interface is up again.',
  },
  LB_ERR_NET_SYSCTL: {
    cause: 'A sysctl the agent sets (`ip_forward`, `arp_ignore`, `arp_announce`, `rp_filter`, `send_redirects`) could not be written.',
    fix: 'Run under the shipped unit (CAP_NET_ADMIN, `ProtectKernelTunables` off) or as root, or set the values in `/etc/sysctl.d/` as `lb-agent check` prints them.',
  },
  LB_ERR_NET_NATIVE_MISSING: {
    cause: 'The native addon (`native/build/Release/lbagent_native.node`) is missing or older than the JavaScript.',
    fix: 'Rebuild it with `npm ci` (node-gyp) and reinstall with `systemd/install.sh`.',
  },
  LB_ERR_NET_CONNTRACK: {
    cause: 'The conntrack table could not be read or changed through ctnetlink (`nf_conntrack_netlink` not loaded, or no CAP_NET_ADMIN).',
    fix: 'Load `nf_conntrack_netlink` (`modprobe nf_conntrack_netlink`). `lb-agent check` (findings `udp-flows`, `stale-flows`) tells whether it answers.',
  },
  LB_ERR_FORWARD_NFT: {
    cause: '`nft -f` refused the agent\'s table (a kernel without an nftables feature it uses); the previous rule set stays in force.',
    fix: 'Read the first line of nft\'s error in the message; `lb-agent check` (finding `dataplane`) probes the same; `dataplane: proxy` avoids nftables.',
  },
  LB_ERR_FORWARD_NFT_MISSING: {
    cause: 'The `nft` binary is not installed and the kernel data path was asked for.',
    fix: 'Install the nftables package, or set `dataplane: proxy` (or `auto`, which then picks the proxy).',
  },
  LB_ERR_FORWARD_LISTEN: {
    cause: 'The proxy could not listen on a VIP:port: another process holds the port, or the port is below 1024 without CAP_NET_BIND_SERVICE.',
    fix: 'Free the port (`ss -ltnp`), or run under the shipped unit (it grants CAP_NET_BIND_SERVICE).',
  },
  LB_ERR_FORWARD_DSR_UNSUPPORTED: {
    cause: 'A service asks for `sourceIP: preserve` (direct server return) and this kernel lacks nftables\' netdev family, `fwd` or `jhash`.',
    fix: 'Use `sourceIP: snat` on those services, or a kernel with CONFIG_NF_TABLES_NETDEV, CONFIG_NETFILTER_INGRESS, CONFIG_NFT_FWD_NETDEV and CONFIG_NFT_HASH. `lb-agent check` (finding `dsr`) names what is missing.',
  },
  LB_ERR_FORWARD_DSR_BPF: {
    cause: 'The BPF program that forwards direct server return could not be created or loaded (no bpf(2) permission, no tcx, a verifier refusal).',
    fix: 'Nothing is needed: the nftables table forwards alone (slower) and `lbagent_forward_dsr_engine_info` says so. For the program: kernel 6.6+, CAP_BPF, and bpf(2) allowed by the unit\'s seccomp filter.',
  },
  LB_ERR_FORWARD_NAT_BPF: {
    cause: 'The eBPF full-NAT engine (`kernel.engine: ebpf`) could not be loaded, filled or attached: the object native/build/Release/nat.bpf.o not built, libbpf.so.1 missing, no BPF file system to pin its flow maps on, no tcx, or a verifier refusal.',
    fix: 'With `kernel.engine: auto` the nft table forwards alone. For the engine: kernel 6.6+, CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, libbpf 1.x, a bpffs at /sys/fs/bpf, and the object built (scripts/setup.sh installs clang and libbpf-dev, then npm ci). `lb-agent check` (finding `nat-engine`) says which is missing.',
  },
  LB_ERR_VRRP_SOCKET: {
    cause: 'A VRRP router could not open or reuse its packet socket on the failover interface.',
    fix: 'Check `failover.interface` (or `node.interface`), CAP_NET_RAW, and that `RestrictAddressFamilies=` of the unit keeps AF_PACKET.',
  },
  LB_ERR_VRRP_INVALID: {
    cause: 'A VRRP value out of RFC 5798\'s ranges (virtual router id, priority, interval), or an advert that cannot be encoded.',
    fix: 'Use `vrid` 1-255, `priority` 1-254 and `advertInterval` 0.01-40.95; `lb-agent validate` checks them.',
  },
  LB_ERR_METRICS_LISTEN: {
    cause: 'The metrics endpoint could not listen on `metrics.listen`: the port is taken or the address is not on this VM.',
    fix: 'Choose another `metrics.listen` (a reload applies it) or `""` to turn the endpoint off.',
  },
};

/** An error with a stable code and, optionally, where it happened. */
export class LbError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'LbError';
    this.code = code;
    this.details = details;
  }
}

export function isLbError(err: unknown, code?: ErrorCode): err is LbError {
  return err instanceof LbError && (code === undefined || err.code === code);
}

/** The message of anything thrown, for logs and status lines. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

/** errnos that say this process (or host) ran out of descriptors or socket buffers: never a peer's fault. */
export const LOCAL_EXHAUSTION_CODES = ['EMFILE', 'ENFILE', 'ENOBUFS'] as const;
export type LocalExhaustionCode = (typeof LOCAL_EXHAUSTION_CODES)[number];

/** The err's code when it is one of LOCAL_EXHAUSTION_CODES, else undefined. */
export function localExhaustionCode(err: unknown): LocalExhaustionCode | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return (LOCAL_EXHAUSTION_CODES as readonly unknown[]).includes(code) ? code as LocalExhaustionCode : undefined;
}
