// ARP resolution of a few fixed neighbours on one interface (driver over a
// packet socket): who-has requests for each target until it answers, again
// every refresh interval, and passive learning from any ARP frame a target
// sends (its replies, its requests, its gratuitous ARPs). For frames we
// build ourselves that must go unicast to a neighbour - VRRP adverts to
// failover.peers - where the kernel's neighbour table is out of reach of a
// packet socket.
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import { formatIPv4, parseMac } from '../../address';
import type { Logger } from '../../log';
import { ARP_OP_REQUEST, BROADCAST_MAC, ZERO_MAC, decodeArp, encodeArp } from './arp';
import { bpfArp } from '../packet/bpf';
import { ETH_P_ARP, openPacketSocket, type PacketSocket, type PacketSocketOptions } from '../packet/packet';

export interface ArpResolverOptions {
  readonly ifindex: number;
  /** Our hardware address on the interface: the requests' source, where replies come. */
  readonly mac: string;
  /** Our IPv4 address on the interface (u32): the requests' sender address. */
  readonly srcIp: number;
  /** The neighbours to resolve (u32). */
  readonly targets: readonly number[];
  readonly log: Logger;
  readonly clock?: Clock;
  /** Until a target answers, ask every retryMs (default 1 s). */
  readonly retryMs?: number;
  /** Once known, ask again every refreshMs (default 30 s); a MAC not confirmed for 3 refreshes is forgotten. */
  readonly refreshMs?: number;
  readonly openSocket?: (opts: PacketSocketOptions) => PacketSocket;
}

interface Entry { mac: Buffer; seen: number }

export class ArpResolver {
  private readonly opts: ArpResolverOptions;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly known = new Map<number, Entry>();
  private readonly lastAsked = new Map<number, number>();
  private socket: PacketSocket | undefined;
  private timer: TimerHandle | undefined;

  constructor(opts: ArpResolverOptions) {
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'net', op: 'arp-resolve' });
  }

  start(): void {
    if (this.socket) return;
    const open = this.opts.openSocket ?? openPacketSocket;
    const sock = open({ ifindex: this.opts.ifindex, protocol: ETH_P_ARP, filter: bpfArp(), log: this.log });
    sock.on('frame', (frame: Buffer) => this.onFrame(frame));
    sock.on('error', (err: Error) => this.log.warn({ err: err.message }, 'ARP resolver socket error'));
    this.socket = sock;
    this.tick();
  }

  /** The target's MAC, when known. */
  macOf(ip: number): Buffer | undefined {
    return this.known.get(ip >>> 0)?.mac;
  }

  close(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.socket?.close();
    this.socket = undefined;
  }

  private onFrame(frame: Buffer): void {
    const r = decodeArp(frame);
    if (!r.ok) return;
    const ip = r.packet.senderIp;
    if (!this.opts.targets.includes(ip)) return;
    const mac = parseMac(r.packet.senderMac);
    if (!mac) return;
    const had = this.known.get(ip);
    if (!had || !had.mac.equals(mac)) this.log.info({ ip: formatIPv4(ip), mac: r.packet.senderMac, was: had ? had.mac.toString('hex') : null }, 'peer resolved');
    this.known.set(ip, { mac, seen: this.clock.now() });
  }

  private tick(): void {
    this.timer = undefined;
    const sock = this.socket;
    if (!sock) return;
    const now = this.clock.now();
    const retry = this.opts.retryMs ?? 1000;
    const refresh = this.opts.refreshMs ?? 30_000;
    for (const ip of this.opts.targets) {
      const e = this.known.get(ip);
      if (e && now - e.seen > 3 * refresh) {
        this.known.delete(ip);
        this.log.warn({ ip: formatIPv4(ip) }, 'peer no longer answers ARP; unicast to it paused');
      }
      const every = this.known.has(ip) ? refresh : retry;
      if (now - (this.lastAsked.get(ip) ?? -Infinity) < every) continue;
      this.lastAsked.set(ip, now);
      try {
        sock.send(encodeArp({
          ethDst: BROADCAST_MAC, ethSrc: this.opts.mac, op: ARP_OP_REQUEST,
          senderMac: this.opts.mac, senderIp: this.opts.srcIp, targetMac: ZERO_MAC, targetIp: ip,
        }));
      } catch (err) {
        this.log.debug({ ip: formatIPv4(ip), err: (err as Error).message }, 'ARP request failed');
      }
    }
    this.timer = this.clock.setTimeout(() => this.tick(), retry);
  }
}
