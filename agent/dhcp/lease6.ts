// DHCPv6 lease (pure): what a REPLY grants in one IA_NA, with T1/T2 per
// RFC 8415 §14.2 and §21.4, and its on-disk form. As in lease.ts, times in
// memory are milliseconds on the client's clock and wall-clock epoch
// milliseconds on disk, converted with the offset between the two; parsing a
// stored lease never throws: a file that does not hold a usable lease is no lease.
import { isoTime } from '../clock';
import { parseAddress } from '../address';
import { leaseFileName } from './lease';
import { INFINITE_LIFETIME, Status6, formatIPv6, type Dhcp6Fields, type IaAddress } from './codec6';

export interface Lease6 {
  readonly address: bigint;
  readonly iaid: number;
  /** The granting server's DUID: RENEW, RELEASE and DECLINE name it (RFC 8415 §18.2.4). */
  readonly serverId: Buffer;
  readonly dns: readonly bigint[];
  /** Seconds, as granted; INFINITE_LIFETIME for infinity (§7.7). */
  readonly preferredSeconds: number;
  readonly validSeconds: number;
  readonly t1Seconds: number;
  readonly t2Seconds: number;
  /** Lifetimes count from when the answered message was sent: never later than the server's own clock says. */
  readonly obtainedAt: number;
  readonly renewAt: number;
  readonly rebindAt: number;
  /** End of the preferred lifetime: the address is deprecated (RFC 4862 §5.5.4) but still valid. */
  readonly deprecatedAt: number;
  /** End of the valid lifetime: the address is withdrawn. Infinity for an infinite lease. */
  readonly expiresAt: number;
}

/** Why a REPLY's IA_NA grants no lease. */
export type IaProblem = 'no-ia' | 'bad-t1-t2' | 'no-address' | 'NoAddrsAvail' | 'NoBinding' | 'NotOnLink' | 'UnspecFail' | 'status';

/**
 * RFC 8415 §21.4: T1 and T2 as the server gave them; when it gave 0 the
 * client chooses, and §14.2 recommends 0.5 and 0.8 times the shortest
 * preferred lifetime (a preferred lifetime of 0 leaves the valid one). T2
 * stays before expiry and T1 no later than T2, whatever the server said.
 */
export function lease6Times(t1: number, t2: number, preferred: number, valid: number): { t1: number; t2: number } {
  if (valid === INFINITE_LIFETIME && (preferred === INFINITE_LIFETIME || preferred === 0) && t1 === 0 && t2 === 0) {
    return { t1: INFINITE_LIFETIME, t2: INFINITE_LIFETIME };
  }
  const base = preferred > 0 ? preferred : valid;
  const wantT2 = t2 > 0 ? t2 : 0.8 * base;
  // A T2 at or past the valid lifetime would leave no time to rebind: 0.8 x valid instead.
  const t2s = valid !== INFINITE_LIFETIME && wantT2 >= valid ? 0.8 * valid : wantT2;
  const t1s = Math.min(t1 > 0 ? t1 : 0.5 * base, t2s);
  return { t1: t1s, t2: t2s };
}

const STATUS_NAMES: Readonly<Record<number, IaProblem>> = {
  [Status6.UnspecFail]: 'UnspecFail', [Status6.NoAddrsAvail]: 'NoAddrsAvail', [Status6.NoBinding]: 'NoBinding', [Status6.NotOnLink]: 'NotOnLink',
};

/**
 * The usable address of our IA_NA in a reply, or why there is none. RFC 8415
 * §21.6: an IAADDR whose preferred lifetime exceeds its valid one is
 * discarded; a valid lifetime of 0 is an address being taken away. §21.4: an
 * IA_NA with T1 > T2 (both non-zero) is discarded. `want`: the address we
 * hold or asked for, preferred when the server lists several.
 */
export function usableAddress(f: Dhcp6Fields, iaid: number, want: bigint | undefined): { ok: true; ia: Dhcp6Fields['iaNa'][number]; address: IaAddress } | { ok: false; problem: IaProblem; detail?: string } {
  const ia = f.iaNa.find((x) => x.iaid === iaid >>> 0);
  if (ia === undefined) return { ok: false, problem: 'no-ia' };
  if (ia.status !== undefined && ia.status.code !== Status6.Success) {
    return { ok: false, problem: STATUS_NAMES[ia.status.code] ?? 'status', detail: ia.status.message };
  }
  if (ia.t1 > 0 && ia.t2 > 0 && ia.t1 > ia.t2) return { ok: false, problem: 'bad-t1-t2' };
  const good = ia.addresses.filter((a) => a.valid > 0 && a.preferred <= a.valid && (a.status === undefined || a.status.code === Status6.Success));
  const address = good.find((a) => a.address === want) ?? good[0];
  if (address === undefined) return { ok: false, problem: 'no-address' };
  return { ok: true, ia, address };
}

/** The lease our IA_NA in a REPLY grants; `sentAt`: when the answered message was sent. */
export function leaseFromReply(f: Dhcp6Fields, iaid: number, want: bigint | undefined, sentAt: number): { ok: true; lease: Lease6 } | { ok: false; problem: IaProblem; detail?: string } {
  const u = usableAddress(f, iaid, want);
  if (!u.ok) return u;
  if (f.serverId === undefined) return { ok: false, problem: 'status', detail: 'no server identifier' };
  const { preferred, valid } = u.address;
  const { t1, t2 } = lease6Times(u.ia.t1, u.ia.t2, preferred, valid);
  const at = (s: number): number => (s === INFINITE_LIFETIME ? Infinity : sentAt + s * 1000);
  return {
    ok: true,
    lease: {
      address: u.address.address, iaid: iaid >>> 0, serverId: f.serverId, dns: f.dns,
      preferredSeconds: preferred, validSeconds: valid, t1Seconds: t1, t2Seconds: t2,
      obtainedAt: sentAt, renewAt: at(t1), rebindAt: at(t2), deprecatedAt: at(preferred), expiresAt: at(valid),
    },
  };
}

/** The lease file, `dhcp6-<sanitised key>.json` under stateDir. */
export interface StoredLease6 {
  readonly version: 1;
  readonly service: string;
  /** The DUID the lease belongs to, hex: a lease of another DUID is not ours. */
  readonly duid: string;
  readonly address: string;
  readonly iaid: number;
  readonly serverId: string;
  readonly dns: string[];
  readonly preferredSeconds: number;
  readonly validSeconds: number;
  readonly t1Seconds: number;
  readonly t2Seconds: number;
  /** Wall-clock ISO 8601, for people reading the file. */
  readonly obtained: string;
  readonly obtainedAtMs: number;
  /** Wall-clock epoch ms; null for infinity. */
  readonly renewAtMs: number | null;
  readonly rebindAtMs: number | null;
  readonly deprecatedAtMs: number | null;
  readonly expiresAtMs: number | null;
}

/** State file name for a service key: leaseFileName's rule, `dhcp6-` beside the DHCPv4 lease's `dhcp-`. */
export function lease6FileName(serviceKey: string): string {
  return leaseFileName(serviceKey).replace(/^dhcp-/, 'dhcp6-');
}

/** `wallOffset` = clock.wallNow() - clock.now(). */
export function toStored6(lease: Lease6, service: string, duid: Buffer, wallOffset: number): StoredLease6 {
  const wall = (t: number): number | null => (Number.isFinite(t) ? Math.round(t + wallOffset) : null);
  return {
    version: 1, service, duid: duid.toString('hex'),
    address: formatIPv6(lease.address), iaid: lease.iaid, serverId: lease.serverId.toString('hex'), dns: lease.dns.map(formatIPv6),
    preferredSeconds: lease.preferredSeconds, validSeconds: lease.validSeconds, t1Seconds: lease.t1Seconds, t2Seconds: lease.t2Seconds,
    obtained: isoTime(lease.obtainedAt + wallOffset), obtainedAtMs: Math.round(lease.obtainedAt + wallOffset),
    renewAtMs: wall(lease.renewAt), rebindAtMs: wall(lease.rebindAt), deprecatedAtMs: wall(lease.deprecatedAt), expiresAtMs: wall(lease.expiresAt),
  };
}

const HEX_RE = /^(?:[0-9a-f]{2}){3,130}$/;

/** A stored lease back on the client's clock; undefined when it is not a lease of this service and DUID. */
export function fromStored6(doc: unknown, service: string, duid: Buffer, wallOffset: number): Lease6 | undefined {
  if (typeof doc !== 'object' || doc === null) return undefined;
  const d = doc as Record<string, unknown>;
  if (d.version !== 1 || d.service !== service || d.duid !== duid.toString('hex')) return undefined;
  const ip6 = (v: unknown): bigint | undefined => {
    const a = typeof v === 'string' ? parseAddress(v) : undefined;
    return a?.family === 'IPv6' ? a.value : undefined;
  };
  const num = (v: unknown): number | undefined => (typeof v === 'number' && Number.isFinite(v) && v >= 0 ? v : undefined);
  const time = (v: unknown): number | undefined => (v === null ? Infinity : num(v) === undefined ? undefined : (v as number) - wallOffset);
  const address = ip6(d.address);
  const dns = Array.isArray(d.dns) ? d.dns.map(ip6) : undefined;
  const serverId = typeof d.serverId === 'string' && HEX_RE.test(d.serverId) ? Buffer.from(d.serverId, 'hex') : undefined;
  const iaid = num(d.iaid);
  const preferredSeconds = num(d.preferredSeconds);
  const validSeconds = num(d.validSeconds);
  const t1Seconds = num(d.t1Seconds);
  const t2Seconds = num(d.t2Seconds);
  const obtainedAtMs = num(d.obtainedAtMs);
  const renewAt = time(d.renewAtMs);
  const rebindAt = time(d.rebindAtMs);
  const deprecatedAt = time(d.deprecatedAtMs);
  const expiresAt = time(d.expiresAtMs);
  if (address === undefined || address === 0n || dns === undefined || !dns.every((x): x is bigint => x !== undefined) || serverId === undefined
    || iaid === undefined || iaid > 0xffffffff || preferredSeconds === undefined || validSeconds === undefined || t1Seconds === undefined || t2Seconds === undefined
    || obtainedAtMs === undefined || renewAt === undefined || rebindAt === undefined || deprecatedAt === undefined || expiresAt === undefined) {
    return undefined;
  }
  if (!(renewAt <= rebindAt && rebindAt <= expiresAt)) return undefined;
  return {
    address, iaid, serverId, dns, preferredSeconds, validSeconds, t1Seconds, t2Seconds,
    obtainedAt: obtainedAtMs - wallOffset, renewAt, rebindAt, deprecatedAt, expiresAt,
  };
}
