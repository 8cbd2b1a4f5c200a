// Resolution of a few fixed neighbours on one interface (driver over the
// family's socket), one loop for both families: a request for each target
// until it answers, again every refresh interval, and passive learning from
// whatever a target sends; a MAC not confirmed for three refreshes is
// forgotten. For frames we build ourselves that must go unicast to a
// neighbour - VRRP adverts to failover.peers - where the kernel's neighbour
// table is out of reach of a packet socket; and for the MAC both families'
// peers of one VM share (failover/dual.ts, a tied IPv6 VIP's hand-back).
// What is asked and what is
// learnt is the family's protocol: ARP (arp-resolver.ts) or neighbour
// discovery (ndp-resolver.ts).
import type { Clock, TimerHandle } from '../../clock';
import { realClock } from '../../clock';
import { parseMac } from '../../address';
import type { Logger } from '../../log';
import type { PacketSocket } from '../packet/packet';

/** One family's words: its socket, its request, what a frame teaches. `K` is a target as a map key. */
export interface PeerProtocol<K> {
  /** The log's `op`. */
  readonly op: string;
  /** What the resolver speaks, in log lines: `ARP`, `neighbour solicitations`. */
  readonly speaks: string;
  /** The family's socket on the interface: frames in (what `learn` reads), frames out (what `request` builds). Throws LbError. */
  open(ifindex: number, log: Logger): PacketSocket;
  /** The request for a target, as a frame. */
  request(ip: K): Buffer;
  /** The neighbour a frame names and the MAC it gives for it, or undefined (not ours to learn, or malformed). */
  learn(frame: Buffer): { readonly ip: K; readonly mac: string } | undefined;
  /** A target as text, for the log. */
  text(ip: K): string;
}

/** The timing and the dependencies; both resolvers' options extend it. */
export interface PeerResolverOptions {
  readonly ifindex: number;
  readonly log: Logger;
  readonly clock?: Clock;
  /** Until a target answers, ask every retryMs (default 1 s). */
  readonly retryMs?: number;
  /** Once known, ask again every refreshMs (default 30 s); a MAC not confirmed for 3 refreshes is forgotten. */
  readonly refreshMs?: number;
  /** Opens the socket instead of the protocol's own `open` (tests pass a fake). */
  readonly openSocket?: (ifindex: number, log: Logger) => PacketSocket;
  /** Called when a target's MAC is learnt or changes (not when it is only confirmed). */
  readonly onResolved?: (() => void) | undefined;
}

interface Entry { mac: Buffer; seen: number }

export class PeerResolver<K> {
  private readonly protocol: PeerProtocol<K>;
  private readonly targets: readonly K[];
  private readonly opts: PeerResolverOptions;
  private readonly clock: Clock;
  private readonly log: Logger;
  private readonly known = new Map<K, Entry>();
  private readonly lastAsked = new Map<K, number>();
  private socket: PacketSocket | undefined;
  private timer: TimerHandle | undefined;

  constructor(protocol: PeerProtocol<K>, targets: readonly K[], opts: PeerResolverOptions) {
    this.protocol = protocol;
    this.targets = targets;
    this.opts = opts;
    this.clock = opts.clock ?? realClock;
    this.log = opts.log.child({ module: 'net', op: protocol.op });
  }

  start(): void {
    if (this.socket) return;
    const sock = this.opts.openSocket ? this.opts.openSocket(this.opts.ifindex, this.log) : this.protocol.open(this.opts.ifindex, this.log);
    sock.on('frame', (frame: Buffer) => this.onFrame(frame));
    sock.on('error', (err: Error) => this.log.warn({ err: err.message }, `${this.protocol.speaks} resolver socket error`));
    this.socket = sock;
    this.tick();
  }

  close(): void {
    if (this.timer !== undefined) this.clock.clearTimeout(this.timer);
    this.timer = undefined;
    this.socket?.close();
    this.socket = undefined;
  }

  /** A target's MAC, when known. */
  protected lookup(ip: K): Buffer | undefined {
    return this.known.get(ip)?.mac;
  }

  private onFrame(frame: Buffer): void {
    const heard = this.protocol.learn(frame);
    if (heard === undefined || !this.targets.includes(heard.ip)) return;
    const mac = parseMac(heard.mac);
    if (!mac) return;
    const had = this.known.get(heard.ip);
    const changed = !had || !had.mac.equals(mac);
    if (changed) this.log.info({ ip: this.protocol.text(heard.ip), mac: heard.mac, was: had ? had.mac.toString('hex') : null }, 'peer resolved');
    this.known.set(heard.ip, { mac, seen: this.clock.now() });
    if (changed) this.opts.onResolved?.();
  }

  private tick(): void {
    this.timer = undefined;
    const sock = this.socket;
    if (!sock) return;
    const now = this.clock.now();
    const retry = this.opts.retryMs ?? 1000;
    const refresh = this.opts.refreshMs ?? 30_000;
    for (const ip of this.targets) {
      const e = this.known.get(ip);
      if (e && now - e.seen > 3 * refresh) {
        this.known.delete(ip);
        this.log.warn({ ip: this.protocol.text(ip) }, `peer no longer answers ${this.protocol.speaks}; unicast to it paused`);
        this.opts.onResolved?.();
      }
      const every = this.known.has(ip) ? refresh : retry;
      if (now - (this.lastAsked.get(ip) ?? -Infinity) < every) continue;
      this.lastAsked.set(ip, now);
      try {
        sock.send(this.protocol.request(ip));
      } catch (err) {
        this.log.debug({ ip: this.protocol.text(ip), err: (err as Error).message }, `${this.protocol.speaks} request failed`);
      }
    }
    this.timer = this.clock.setTimeout(() => this.tick(), retry);
  }
}
