// Neighbour discovery of a few fixed IPv6 neighbours on one interface (driver
// over a packet socket), the IPv6 twin of arp-resolver.ts: a solicitation to
// each target's solicited-node group (RFC 4861 §7.2.2) until it answers,
// again every refresh interval, and passive learning from what a target
// sends (its advertisements, and the source link-layer option of its
// solicitations). For frames we build ourselves that must go unicast to a
// neighbour - IPv6 VRRP adverts to failover.peers - where the kernel's
// neighbour cache is out of reach of a packet socket. The targets'
// solicited-node groups are not joined: the answer to our solicitation comes
// unicast to our MAC.
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import { formatAddress, parseMac } from '../../address';
import type { Logger } from '../../log';
import type { PacketSocket, PacketSocketOptions } from '../packet/packet';
import { openPacketSocket } from '../packet/packet';
import { bpfNdp } from '../packet/bpf';
import { ETHERTYPE_IPV6 } from '../packet/inet';
import { decodeNdp, encodeNdp, ndpSolicitation } from './ndp';
import { ipv6Value } from './ndp-driver';

export interface NdpResolverOptions {
  readonly ifindex: number;
  /** Our hardware address on the interface: the solicitations' source and link-layer option. */
  readonly mac: string;
  /** Our IPv6 address on the interface (the link-local one): the solicitations' source. */
  readonly src: string;
  /** The neighbours to resolve, IPv6 text. */
  readonly targets: readonly string[];
  readonly log: Logger;
  readonly clock?: Clock;
  /** Until a target answers, ask every retryMs (default 1 s). */
  readonly retryMs?: number;
  /** Once known, ask again every refreshMs (default 30 s); a MAC not confirmed for 3 refreshes is forgotten. */
  readonly refreshMs?: number;
  readonly openSocket?: (opts: PacketSocketOptions) => PacketSocket;
}

interface Entry { mac: Buffer; seen: number }

export class NdpResolver {
  private readonly opts: NdpResolverOptions;
  private readonly clock: Clock;
  private readonly log: Logger;
  /** Target value -> its text as configured. */
  private readonly targets: ReadonlyMap<bigint, string>;
  private readonly known = new Map<bigint, Entry>();
  private readonly lastAsked = new Map<bigint, number>();
  private socket: PacketSocket | undefined;
  private timer: TimerHandle | undefined;

  constructor(opts: NdpResolverOptions) {
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'net', op: 'ndp-resolve' });
    this.targets = new Map(opts.targets.map((t) => [ipv6Value(t), t]));
  }

  start(): void {
    if (this.socket) return;
    const open = this.opts.openSocket ?? openPacketSocket;
    const sock = open({ ifindex: this.opts.ifindex, protocol: ETHERTYPE_IPV6, filter: bpfNdp(), log: this.log });
    sock.on('frame', (frame: Buffer) => this.onFrame(frame));
    sock.on('error', (err: Error) => this.log.warn({ err: err.message }, 'NDP resolver socket error'));
    this.socket = sock;
    this.tick();
  }

  /** The target's MAC, when known (any IPv6 text of it). */
  macOf(ip: string): Buffer | undefined {
    try { return this.known.get(ipv6Value(ip))?.mac; } catch { return undefined; }
  }

  close(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.socket?.close();
    this.socket = undefined;
  }

  private onFrame(frame: Buffer): void {
    const r = decodeNdp(frame);
    if (!r.ok) return;
    const p = r.packet;
    // RFC 4861 §7.2.5: an advertisement names its target and (usually) its MAC;
    // §7.2.3: a solicitation from the target carries its MAC in the source option.
    const [ip, macText] = p.kind === 'advertisement' ? [p.target, p.targetMac ?? p.ethSrc] : [p.src, p.sourceMac];
    if (macText === undefined || !this.targets.has(ip)) return;
    const mac = parseMac(macText);
    if (!mac) return;
    const had = this.known.get(ip);
    if (!had || !had.mac.equals(mac)) this.log.info({ ip: this.targets.get(ip), mac: macText, was: had ? had.mac.toString('hex') : null }, 'peer resolved');
    this.known.set(ip, { mac, seen: this.clock.now() });
  }

  private tick(): void {
    this.timer = undefined;
    const sock = this.socket;
    if (!sock) return;
    const now = this.clock.now();
    const retry = this.opts.retryMs ?? 1000;
    const refresh = this.opts.refreshMs ?? 30_000;
    const src = ipv6Value(this.opts.src);
    for (const ip of this.targets.keys()) {
      const e = this.known.get(ip);
      if (e && now - e.seen > 3 * refresh) {
        this.known.delete(ip);
        this.log.warn({ ip: formatAddress({ family: 'IPv6', value: ip }) }, 'peer no longer answers neighbour solicitations; unicast to it paused');
      }
      const every = this.known.has(ip) ? refresh : retry;
      if (now - (this.lastAsked.get(ip) ?? -Infinity) < every) continue;
      this.lastAsked.set(ip, now);
      try {
        sock.send(encodeNdp(ndpSolicitation(this.opts.mac, src, ip)));
      } catch (err) {
        this.log.debug({ ip: this.targets.get(ip), err: (err as Error).message }, 'neighbour solicitation failed');
      }
    }
    this.timer = this.clock.setTimeout(() => this.tick(), retry);
  }
}
