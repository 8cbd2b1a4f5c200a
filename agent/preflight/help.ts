// Preflight, reference layer: every finding `lb-agent check` can report, by
// its stable id, with what it looks at, why it warns or fails and the fix.
// docs/troubleshooting.md is generated from this table; a check id without
// an entry does not compile (CheckId) and fails test/preflight/help.test.ts.
export const CHECK_IDS = [
  'config', 'state-dir', 'capabilities', 'macvlan', 'interface', 'pools', 'arp-sysctls', 'rp-filter', 'ip-forward',
  'dataplane', 'guest-agent', 'descriptors', 'dsr', 'dsr-backend', 'nat-engine', 'topology', 'conntrack-pickup', 'udp-flows',
  'stale-flows', 'firewall', 'drift-fight', 'dhcp-probe', 'dhcp6-probe', 'ipv6', 'networks', 'vrrp-track', 'preflight',
] as const;

export type CheckId = (typeof CHECK_IDS)[number];

export interface CheckHelp {
  /** What the check looks at, and when it runs. */
  readonly what: string;
  /** Why it warns or fails. */
  readonly cause: string;
  /** What to do (the finding's own remedy line names the exact command for this VM). */
  readonly fix: string;
}

export const CHECK_HELP: Readonly<Record<CheckId, CheckHelp>> = {
  'vrrp-track': {
    what: 'With `failover.mode: vrrp` and tracked interfaces (`failover.track.interfaces`, or a network\'s `networks.<name>.failover.track.interfaces`): each exists on this VM and is up with carrier (read from `/sys/class/net`).',
    cause: 'Warns when one is missing (a typo, or a NIC the VM does not have: it counts as down for good) or is down or without carrier now: the VRRP priority is lowered by its weight, or the routers are in fault, while that lasts.',
    fix: 'Fix the name (`ip -br link` lists the interfaces), or bring the link up. `lb-agent status` shows the priority in use and why.',
  },
  config: {
    what: 'The configuration file exists and validates (the same loader the daemon uses).',
    cause: 'Fails when the file is missing or invalid; every error is listed with its path.',
    fix: 'Fix the errors (`lb-agent validate -c FILE` prints them with line numbers). The other checks still run on the defaults.',
  },
  'state-dir': {
    what: '`stateDir` is a directory the agent can write, or can be created.',
    cause: 'Fails when it is a file, read-only, or its parent cannot be written.',
    fix: 'Create it writable by the agent\'s user, or set `stateDir` elsewhere. Under the shipped unit, `StateDirectory=lb-agent` creates `/var/lib/lb-agent`.',
  },
  capabilities: {
    what: 'CAP_NET_ADMIN and CAP_NET_RAW (and CAP_NET_BIND_SERVICE for proxy ports below 1024) in the effective set.',
    cause: 'Fails when the check runs as a user without them: it then cannot probe what the daemon will do.',
    fix: 'Run `lb-agent check` as root (the unit runs it as `ExecStartPre=+`, as root).',
  },
  macvlan: {
    what: 'Creates and deletes a macvlan in a throwaway network namespace: the definitive test (a built-in driver shows in neither `lsmod` nor `/proc/modules`). Only DHCP services need macvlans.',
    cause: 'Fails when a DHCP service exists and the kernel cannot create one; warns when none does yet. The finding says why: a minimal kernel package without the driver (SLES `kernel-default-base`, Ubuntu without `linux-modules-extra`), modules of the running kernel not installed after an upgrade, a kernel built without CONFIG_MACVLAN.',
    fix: 'Do what the finding\'s remedy says: for example `zypper in kernel-default` and reboot (SLES), `apt-get install linux-modules-extra-$(uname -r)` (Ubuntu), or reboot into the installed kernel. Then run `lb-agent check` again. Pool services work without macvlans.',
  },
  interface: {
    what: 'The parent NIC (`node.interface`, or the default route\'s NIC) exists, is up, has carrier and an IPv4 address.',
    cause: 'Fails when it is missing, down, without carrier or without an address, or when there is no default route to take it from.',
    fix: 'Set `node.interface` to the NIC on the VIPs\' LAN (`ip -br addr` lists them), and bring it up.',
  },
  pools: {
    what: 'Every pool range lies in a subnet of the parent NIC of its own family (an IPv6 range in a global IPv6 subnet).',
    cause: 'Warns for a range outside every subnet of its family: clients on the LAN would not ARP (IPv6: send a neighbour solicitation) for such VIPs on this NIC.',
    fix: 'Use ranges of the parent\'s subnet, or put the VIPs on the NIC of their subnet (`node.interface`).',
  },
  'arp-sysctls': {
    what: '`arp_ignore=1` and `arp_announce=2` on the parent and for new macvlans (ARP flux: with several addresses on one LAN, Linux answers ARP on any NIC by default).',
    cause: 'Warns when the effective value (the larger of `all` and the interface\'s) is another.',
    fix: 'Nothing is needed for the agent\'s own interfaces: the daemon writes these values. To persist them, write the lines the remedy prints to `/etc/sysctl.d/90-lb-agent.conf`.',
  },
  'rp-filter': {
    what: 'Reverse path filtering for new macvlans (DHCP services).',
    cause: 'Warns on strict mode (1): traffic to a VIP on a macvlan whose reply route leaves by the parent is dropped.',
    fix: 'Set `rp_filter` to 2 (loose) for `all` and `default`, as the remedy prints.',
  },
  'ip-forward': {
    what: '`net.ipv4.ip_forward` when the kernel data path will run (`dataplane: kernel`, or `auto` where nftables works). The proxy path does not need it.',
    cause: 'Warns when it is 0: the kernel path forwards connections to backends on other hosts. The daemon sets it to 1 itself when the kernel data path starts (and logs `enabled net.ipv4.ip_forward`), so the warning says what will change on this VM, not that the agent cannot run. With `dataplane: proxy` the daemon never sets it.',
    fix: 'Nothing, if the agent may turn forwarding on. To have it on from boot, or to keep it off, write `net.ipv4.ip_forward=1` to `/etc/sysctl.d/90-lb-agent.conf`, or set `dataplane: proxy`.',
  },
  dataplane: {
    what: 'Whether the kernel data path can run: `nft` installed and the kernel accepting a throwaway nat table like the agent\'s (with `jhash` under VRRP).',
    cause: 'Fails with `dataplane: kernel` when it cannot; warns with `auto`, which then runs the userspace proxy.',
    fix: 'Install nftables, or use a kernel with nf_tables and nft_nat; or set `dataplane: proxy`.',
  },
  'guest-agent': {
    what: 'qemu-guest-agent is installed and running (Harvester reads the VM\'s addresses through it).',
    cause: 'Warns when it is missing or stopped.',
    fix: 'Install it and `systemctl enable --now qemu-guest-agent`.',
  },
  descriptors: {
    what: 'The descriptor limit against `proxy.maxConnections` on the proxy path (each connection takes two).',
    cause: 'Warns when the configured maximum is more than the limit allows: past it the agent refuses clients.',
    fix: 'Raise `LimitNOFILE=` (the unit sets 65536) or lower `proxy.maxConnections`.',
  },
  dsr: {
    what: 'With a `sourceIP: preserve` service: the kernel accepts the direct-server-return table (netdev ingress, `fwd`, `jhash`) and whether the BPF program in front of it loads and attaches (tcx).',
    cause: 'Fails when the table is refused (the agent would refuse to start with those services) or the data path will be the proxy; warns when only the BPF program cannot run (the table forwards alone, slower).',
    fix: 'A kernel with CONFIG_NF_TABLES_NETDEV, CONFIG_NETFILTER_INGRESS, CONFIG_NFT_FWD_NETDEV, CONFIG_NFT_HASH (and 6.6+ with CONFIG_NET_XGRESS for the program); or `sourceIP: snat` on those services.',
  },
  ipv6: {
    what: 'IPv6 on the parent NIC, when a service serves an IPv6 VIP (`ipFamilies`, `ipFamilyPolicy`): `net.ipv6.conf.all.disable_ipv6` and `net.ipv6.conf.<parent>.disable_ipv6`.',
    cause: 'Fails when IPv6 is disabled there: the kernel refuses the IPv6 VIP on the parent (and the agent could not answer neighbour solicitations for it), so every IPv6 VIP stays unserved.',
    fix: 'Turn IPv6 on for the parent (`sysctl -w net.ipv6.conf.all.disable_ipv6=0 net.ipv6.conf.<parent>.disable_ipv6=0`) and persist it in `/etc/sysctl.d/90-lb-agent.conf`; a kernel booted with `ipv6.disable=1` needs that parameter removed and a reboot. Or serve IPv4 only.',
  },
  'nat-engine': {
    what: 'On the kernel path: `kernel.engine`, whether the eBPF NAT engine loads (libbpf, the clang-built object, a bpffs to pin its flow maps on, tcx) and, with services in `sourceIP: preserve`, attaches beside the DSR program at the same hook, and that `kernel.natPorts` stay outside `net.ipv4.ip_local_port_range`.',
    cause: 'Fails when `kernel.engine: ebpf` and the engine cannot load (the agent would refuse to start); warns when `auto` falls back to the nft table, or the NAT ports overlap the ephemeral range.',
    fix: 'Kernel 6.6+, CAP_BPF, CAP_PERFMON and CAP_NET_ADMIN, libbpf 1.x, `mount -t bpf bpf /sys/fs/bpf`, and `scripts/setup.sh` then `npm ci` (clang, libbpf-dev); or `kernel.engine: nft`. Move `kernel.natPorts` out of the ephemeral range.',
  },
  'dsr-backend': {
    what: 'With `backend.vips`: each VIP is on `lo`, and, for an IPv4 VIP, `arp_ignore`/`arp_announce` keep this VM from answering ARP for it (an IPv6 VIP on `lo` needs no sysctl: Linux answers neighbour solicitations only for the receiving interface\'s addresses).',
    cause: 'Fails when a backend VIP sits on an interface that answers ARP (this VM would take the clients\' traffic from the load balancer); warns on sysctls that let it announce the VIP.',
    fix: 'Remove the VIP from that interface; let the agent put it on `lo` (it raises the sysctls first).',
  },
  topology: {
    what: 'With zoned backends or `topology` set: this node\'s zone is known and has backends.',
    cause: 'Fails when a `zone-only` service would refuse every connection (zone unknown, or no backend in it); warns when `prefer-zone` always spills, or zones are set on `topology: any` services.',
    fix: 'Set `node.zone`, or write `topology.kubernetes.io/zone="<zone>"` to `node.labelsFile`; give backends their `zone`.',
  },
  'conntrack-pickup': {
    what: 'With VRRP on the kernel path: `net.netfilter.nf_conntrack_tcp_loose`, which lets a new Master pick up connections mid-flow.',
    cause: 'Warns when it is 0: every connection open at a failover is reset.',
    fix: 'Set `net.netfilter.nf_conntrack_tcp_loose=1` if the host\'s policy allows; the agent leaves it to the host.',
  },
  'udp-flows': {
    what: 'With a UDP port on the kernel path: whether ctnetlink answers, so that UDP flows of a backend that left are ended.',
    cause: 'Warns when it does not: a client sending from one port stays on a backend that left until it pauses for 120 s.',
    fix: 'Load `nf_conntrack_netlink` (`modprobe nf_conntrack_netlink`, and list it in `/etc/modules-load.d/`).',
  },
  'stale-flows': {
    what: 'With VRRP on the kernel path: whether ctnetlink answers, so that a node taking a VIP back ends the flows it routed on meanwhile.',
    cause: 'Warns when it does not: after a failback, a client reusing a source port may be reset for up to 120 s.',
    fix: 'Load `nf_conntrack_netlink`, as for `udp-flows`.',
  },
  firewall: {
    what: 'On the kernel data path: the chains of other tables (not `ip lb_agent` or `netdev lb_agent`) on the hooks VIP traffic takes, prerouting, forward and the parent\'s ingress, read from one `nft -j list ruleset`. Netfilter runs every base chain of a hook and a drop in any one is final, whatever the agent\'s own table accepts. The input hook is not read: a DNATed connection never reaches it.',
    cause: 'Warns naming each table, chain, hook and priority whose policy is drop, or which reaches a `drop` or `reject` without a condition (directly or by jump), before a rule that accepts DNATed connections (`ct status dnat accept`, or before DNAT `ip daddr` over the pools). Conditional drops, such as `ct state invalid drop`, are not findings. A hardened `nftables.conf`, Docker (`ip filter FORWARD` policy drop) and ufw close forwarding this way. Not checked on the proxy path or without `nft`.',
    fix: 'Accept the VIP traffic ahead of the drop, through the program that owns the table (firewalld, Docker\'s `DOCKER-USER` chain, ufw\'s rules, `/etc/nftables.conf`), or it writes the table again: the remedy prints the command, e.g. `nft insert rule inet filter forward ct status dnat accept`. Or remove the drop.',
  },
  'drift-fight': {
    what: 'Asks the daemon running with this config, over the control socket as `lb-agent status` does, whether its drift guard is in a fight: another program undoing the agent\'s work faster than it can repair it (a loop flushing the ruleset, deleting its table, a VIP or a macvlan).',
    cause: 'Warns naming each fight, e.g. `table ip lb_agent: 12 repairs in 60 s`; the agent then waits, doubling, between repairs. Not checked when no daemon answers (before the agent starts, for example).',
    fix: 'Find the program and stop it, or have it leave the agent\'s tables, VIPs and `02:` macvlans alone: the `drift-repaired` and `drift-backoff` events of `lb-agent status` say what was undone and, for a table, by which process and pid; `journalctl -u lb-agent -g drift` lists every repair.',
  },
  'dhcp-probe': {
    what: 'With `lb-agent check --dhcp-probe`: a DHCPDISCOVER from a throwaway macvlan, to see whether a server offers an address.',
    cause: 'Fails when no offer comes, or the probe could not run (see the macvlan, capabilities and interface findings).',
    fix: 'Make sure the VM network has a DHCP server with free addresses, or use `ipam: pool`.',
  },
  'dhcp6-probe': {
    what: 'With `lb-agent check --dhcp-probe` and IPv6 DHCP services: a DHCPv6 SOLICIT from the link-local address of a throwaway macvlan (its DUID-LL), to see whether a server advertises an address.',
    cause: 'Fails when no ADVERTISE with an address comes (no DHCPv6 server, a stateless one, or no free address), or the probe could not run (see the macvlan, capabilities, interface and ipv6 findings).',
    fix: 'Make sure the VM network has a stateful DHCPv6 server (IA_NA) with free addresses, or give the IPv6 VIPs a pool (`ipam: pool`).',
  },
  networks: {
    what: 'With `networks:` configured, every network the VM is on, the default one first: its NIC exists, is up, has carrier and an IPv4 address to send ARP and VRRP from; its `arp_ignore`/`arp_announce` (so it answers ARP only for its own VIPs: ARP flux); a macvlan can be made on it (made straight inside a throwaway namespace, so nothing appears on the VM); its pools lie in its subnet.',
    cause: 'Fails when a network\'s NIC is missing, down, without carrier or address, or cannot take a macvlan while a DHCP service is on that network (no driver, or a NIC enslaved to a bridge, bond or team: EBUSY); warns on sysctls the daemon will set, pools outside the subnet, or a macvlan failure on a network without DHCP services.',
    fix: 'Fix the network named in the finding: `networks.<name>.interface` must be a NIC of the VM on that network (`ip -br addr`), up, with an address. A NIC in a bridge or bond cannot carry macvlans: name the bridge or bond itself.',
  },
  preflight: {
    what: 'The preflight itself.',
    cause: 'Fails when gathering the facts threw an error: a bug in `lb-agent check`.',
    fix: 'Report it with the command\'s output; the other findings are missing from that run.',
  },
};
