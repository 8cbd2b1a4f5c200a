// DHCP lease (pure): what an ACK grants, with its timers computed per RFC 2131
// §4.4.5, and its on-disk form. In memory, times are milliseconds on the
// client's clock (monotonic, Clock.now()); on disk they are wall-clock epoch
// milliseconds, converted with the offset between the two at that moment, so
// a lease survives a restart or a reboot. Parsing a stored lease never throws:
// a file that does not hold a usable lease is simply no lease.
import { isoTime } from '../clock';
import { formatIPv4, parseIPv4 } from '../address';
import type { DhcpFields } from './codec';

/** RFC 2131 §3.3: 0xffffffff seconds means an infinite lease. */
export const INFINITE_LEASE = 0xffffffff;

export interface Lease {
  readonly address: number;
  /** Prefix from option 1 (status only: the VIP itself goes on the macvlan as a /32). */
  readonly prefix: number | undefined;
  readonly serverId: number;
  /**
   * Where unicast to the server goes: the source MAC of the frame that carried
   * the ACK (the server, or the relay agent's router when the server is
   * elsewhere - the right next hop either way). RENEWING and RELEASE use it.
   */
  readonly serverMac: string | undefined;
  readonly routers: readonly number[];
  readonly dns: readonly number[];
  readonly leaseSeconds: number;
  readonly t1Seconds: number;
  readonly t2Seconds: number;
  /** RFC 2131 §4.4.1: lease times count from when the REQUEST was sent, not from the ACK. */
  readonly obtainedAt: number;
  readonly renewAt: number;
  readonly rebindAt: number;
  /** Infinity for an infinite lease. */
  readonly expiresAt: number;
}

/**
 * RFC 2131 §4.4.5: T1 defaults to 0.5 x lease, T2 to 0.875 x lease. Server
 * values are used when they are consistent (T1 <= T2 < lease); otherwise the
 * defaults, as dhclient does, so a bad option cannot make us renew after expiry.
 */
export function leaseTimes(leaseSeconds: number, t1Opt: number | undefined, t2Opt: number | undefined): { t1: number; t2: number } {
  if (leaseSeconds === INFINITE_LEASE) return { t1: INFINITE_LEASE, t2: INFINITE_LEASE };
  const t2 = t2Opt !== undefined && t2Opt < leaseSeconds ? t2Opt : 0.875 * leaseSeconds;
  const t1 = t1Opt !== undefined && t1Opt <= t2 ? t1Opt : Math.min(0.5 * leaseSeconds, t2);
  return { t1, t2 };
}

/** The lease an ACK grants; undefined when the ACK carries no lease time (RFC 2131 §4.3.1 requires one). */
export function leaseFromAck(yiaddr: number, f: DhcpFields, serverMac: string | undefined, fallbackServerId: number | undefined, requestSentAt: number): Lease | undefined {
  if (f.leaseSeconds === undefined || yiaddr === 0) return undefined;
  const serverId = f.serverId ?? fallbackServerId;
  if (serverId === undefined) return undefined;
  const { t1, t2 } = leaseTimes(f.leaseSeconds, f.t1Seconds, f.t2Seconds);
  const infinite = f.leaseSeconds === INFINITE_LEASE;
  return {
    address: yiaddr,
    prefix: f.prefix,
    serverId,
    serverMac,
    routers: f.routers,
    dns: f.dns,
    leaseSeconds: f.leaseSeconds,
    t1Seconds: t1,
    t2Seconds: t2,
    obtainedAt: requestSentAt,
    renewAt: infinite ? Infinity : requestSentAt + t1 * 1000,
    rebindAt: infinite ? Infinity : requestSentAt + t2 * 1000,
    expiresAt: infinite ? Infinity : requestSentAt + f.leaseSeconds * 1000,
  };
}

/** The lease file, `dhcp-<sanitised key>.json` under stateDir. */
export interface StoredLease {
  readonly version: 1;
  readonly service: string;
  readonly mac: string;
  readonly address: string;
  readonly prefix: number | null;
  readonly serverId: string;
  readonly serverMac: string | null;
  readonly routers: string[];
  readonly dns: string[];
  readonly leaseSeconds: number;
  readonly t1Seconds: number;
  readonly t2Seconds: number;
  /** Wall-clock ISO 8601, for people reading the file. */
  readonly obtained: string;
  /** Wall-clock epoch ms; null for an infinite lease. */
  readonly obtainedAtMs: number;
  readonly renewAtMs: number | null;
  readonly rebindAtMs: number | null;
  readonly expiresAtMs: number | null;
}

/** State file name for a service key: only [A-Za-z0-9._-] survive (StateStore's rule), '/' becomes '_'. */
export function leaseFileName(serviceKey: string): string {
  const safe = serviceKey.replace(/[^A-Za-z0-9._-]/g, '_').slice(0, 180);
  return `dhcp-${safe}.json`;
}

/** `wallOffset` = clock.wallNow() - clock.now(). */
export function toStored(lease: Lease, service: string, mac: string, wallOffset: number): StoredLease {
  const wall = (t: number): number | null => (Number.isFinite(t) ? Math.round(t + wallOffset) : null);
  return {
    version: 1,
    service,
    mac,
    address: formatIPv4(lease.address),
    prefix: lease.prefix ?? null,
    serverId: formatIPv4(lease.serverId),
    serverMac: lease.serverMac ?? null,
    routers: lease.routers.map(formatIPv4),
    dns: lease.dns.map(formatIPv4),
    leaseSeconds: lease.leaseSeconds,
    t1Seconds: lease.t1Seconds,
    t2Seconds: lease.t2Seconds,
    obtained: isoTime(lease.obtainedAt + wallOffset),
    obtainedAtMs: Math.round(lease.obtainedAt + wallOffset),
    renewAtMs: wall(lease.renewAt),
    rebindAtMs: wall(lease.rebindAt),
    expiresAtMs: wall(lease.expiresAt),
  };
}

const MAC_RE = /^([0-9a-f]{2}:){5}[0-9a-f]{2}$/;

/**
 * A stored lease back on the client's clock; undefined when the document is
 * not a lease of this service and MAC (an edited, foreign or older file).
 */
export function fromStored(doc: unknown, service: string, mac: string, wallOffset: number): Lease | undefined {
  if (typeof doc !== 'object' || doc === null) return undefined;
  const d = doc as Record<string, unknown>;
  if (d.version !== 1 || d.service !== service || d.mac !== mac) return undefined;
  const ip = (v: unknown): number | undefined => (typeof v === 'string' ? parseIPv4(v) : undefined);
  const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
  const time = (v: unknown): number | undefined => (v === null ? Infinity : num(v) === undefined ? undefined : (v as number) - wallOffset);
  const list = (v: unknown): number[] | undefined => {
    if (!Array.isArray(v)) return undefined;
    const out = v.map(ip);
    return out.every((x): x is number => x !== undefined) ? out : undefined;
  };
  const address = ip(d.address);
  const serverId = ip(d.serverId);
  const leaseSeconds = num(d.leaseSeconds);
  const t1Seconds = num(d.t1Seconds);
  const t2Seconds = num(d.t2Seconds);
  const obtainedAtMs = num(d.obtainedAtMs);
  const renewAt = time(d.renewAtMs);
  const rebindAt = time(d.rebindAtMs);
  const expiresAt = time(d.expiresAtMs);
  const routers = list(d.routers);
  const dns = list(d.dns);
  const prefix = d.prefix === null ? undefined : num(d.prefix);
  const serverMac = d.serverMac === null ? undefined : typeof d.serverMac === 'string' && MAC_RE.test(d.serverMac) ? d.serverMac : null;
  if (address === undefined || address === 0 || serverId === undefined || leaseSeconds === undefined || t1Seconds === undefined || t2Seconds === undefined
    || obtainedAtMs === undefined || renewAt === undefined || rebindAt === undefined || expiresAt === undefined
    || routers === undefined || dns === undefined || serverMac === null || (d.prefix !== null && (prefix === undefined || prefix > 32))) {
    return undefined;
  }
  if (!(renewAt <= rebindAt && rebindAt <= expiresAt)) return undefined;
  return {
    address, prefix, serverId, serverMac, routers, dns, leaseSeconds, t1Seconds, t2Seconds,
    obtainedAt: obtainedAtMs - wallOffset, renewAt, rebindAt, expiresAt,
  };
}

/**
 * The saved lease of a service from the state store, on the client's clock.
 * Never throws: an unreadable or foreign file is no lease, and `problem`
 * says why for the caller's log.
 */
export function readSavedLease(store: { read<T>(name: string): T | undefined }, service: string, mac: string, wallOffset: number): { lease: Lease | undefined; problem: string | undefined } {
  let doc: unknown;
  try {
    doc = store.read<unknown>(leaseFileName(service));
  } catch (err) {
    return { lease: undefined, problem: `saved lease unreadable (${err instanceof Error ? err.message : String(err)}); starting without it` };
  }
  if (doc === undefined) return { lease: undefined, problem: undefined };
  const lease = fromStored(doc, service, mac, wallOffset);
  return { lease, problem: lease ? undefined : 'saved lease is not a usable lease of this service; ignoring it' };
}

/** Status details of a lease for `lb-agent status` (wall-clock ISO times). */
export function leaseDetails(lease: Lease, wallOffset: number): Record<string, unknown> {
  const iso = (t: number): string | null => (Number.isFinite(t) ? isoTime(t + wallOffset) : null);
  return {
    address: formatIPv4(lease.address),
    prefix: lease.prefix ?? null,
    server: formatIPv4(lease.serverId),
    leaseSeconds: lease.leaseSeconds === INFINITE_LEASE ? 'infinite' : lease.leaseSeconds,
    obtained: iso(lease.obtainedAt),
    renewAt: iso(lease.renewAt),
    rebindAt: iso(lease.rebindAt),
    expiresAt: iso(lease.expiresAt),
    routers: lease.routers.map(formatIPv4),
    dns: lease.dns.map(formatIPv4),
  };
}
