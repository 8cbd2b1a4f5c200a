// Addresses of both families (IPv4, IPv6): parse, format, bytes, CIDR math.
// The family is data (Family, and FAMILIES' widths and text forms), so one
// code path serves both; an Address carries its family. IPv4 also keeps its
// unsigned 32-bit form (parseIPv4, formatIPv4, Cidr), which the codecs and
// the dataplanes use. IPv6 text is read as RFC 4291 §2.2 allows and written
// in RFC 5952's canonical form. Pure; used by config, ipam, the codecs and
// the dataplanes.

const DOTTED = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})$/;

/** Parse dotted-quad IPv4; undefined when malformed (no leading zeros ambiguity: "01" rejected). */
export function parseIPv4(s: string): number | undefined {
  const m = DOTTED.exec(s);
  if (!m) return undefined;
  let v = 0;
  for (let i = 1; i <= 4; i++) {
    const part = m[i]!;
    if (part.length > 1 && part.startsWith('0')) return undefined;
    const n = Number(part);
    if (n > 255) return undefined;
    v = v * 256 + n;
  }
  return v >>> 0;
}

export function formatIPv4(v: number): string {
  return `${(v >>> 24) & 255}.${(v >>> 16) & 255}.${(v >>> 8) & 255}.${v & 255}`;
}

export function ipv4ToBytes(v: number): Buffer {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(v >>> 0, 0);
  return b;
}

export function ipv4FromBytes(b: Uint8Array, off = 0): number {
  return ((b[off]! << 24) | (b[off + 1]! << 16) | (b[off + 2]! << 8) | b[off + 3]!) >>> 0;
}

export interface Cidr { network: number; prefix: number }

export function maskOf(prefix: number): number {
  return prefix === 0 ? 0 : (0xffffffff << (32 - prefix)) >>> 0;
}

/** Parse "a.b.c.d/n"; strict: host bits must be zero unless allowHostBits. */
export function parseCidr(s: string, allowHostBits = false): Cidr | undefined {
  const n = parseNetwork(s, allowHostBits);
  return n?.family === 'IPv4' ? { network: Number(n.network), prefix: n.prefix } : undefined;
}

export function cidrContains(c: Cidr, ip: number): boolean {
  return ((ip & maskOf(c.prefix)) >>> 0) === c.network;
}

export function broadcastOf(c: Cidr): number {
  return (c.network | (~maskOf(c.prefix) >>> 0)) >>> 0;
}

export function formatMac(b: Uint8Array): string {
  return Array.from(b.subarray(0, 6), (x) => x.toString(16).padStart(2, '0')).join(':');
}

export function parseMac(s: string): Buffer | undefined {
  if (!/^([0-9a-fA-F]{2}:){5}[0-9a-fA-F]{2}$/.test(s)) return undefined;
  return Buffer.from(s.split(':').map((x) => parseInt(x, 16)));
}

/** An address family, named as Kubernetes' ipFamilies names them. */
export type Family = 'IPv4' | 'IPv6';

interface FamilyForm {
  /** Width of an address in bits (and so the longest prefix). */
  readonly bits: number;
  /** Width in bytes, in network order on the wire. */
  readonly bytes: number;
  /** What a prefix length may look like in CIDR text ("/24", "/128"). */
  readonly prefixText: RegExp;
  parse(text: string): bigint | undefined;
  format(value: bigint): string;
}

const FAMILY_FORMS: Readonly<Record<Family, FamilyForm>> = {
  IPv4: {
    bits: 32,
    bytes: 4,
    prefixText: /^\d{1,2}$/,
    parse: (text) => {
      const v = parseIPv4(text);
      return v === undefined ? undefined : BigInt(v);
    },
    format: (value) => formatIPv4(Number(value)),
  },
  IPv6: { bits: 128, bytes: 16, prefixText: /^\d{1,3}$/, parse: parseIPv6Value, format: formatIPv6Value },
};

/** Both families, IPv4 first. */
export const FAMILIES: readonly Family[] = ['IPv4', 'IPv6'];

/** The width of a family's addresses in bits: 32 or 128. */
export function familyBits(family: Family): number {
  return FAMILY_FORMS[family].bits;
}

/** One address and its family; value is the address as an unsigned integer of familyBits(family) bits. */
export interface Address {
  readonly family: Family;
  readonly value: bigint;
}

/** A network in CIDR form: the address with its host bits zero, and the prefix length. */
export interface Network {
  readonly family: Family;
  readonly network: bigint;
  readonly prefix: number;
}

/**
 * The family an address text (or a CIDR text, "address/prefix") is written
 * in; undefined when it is neither. By syntax alone: "::ffff:192.0.2.1" is
 * IPv6 text.
 */
export function familyOf(text: string): Family | undefined {
  const slash = text.indexOf('/');
  const a = parseAddress(slash < 0 ? text : text.slice(0, slash));
  return a?.family;
}

/**
 * Parse an address of either family; undefined when malformed. IPv4 is
 * parseIPv4's dotted quad. IPv6 follows RFC 4291 §2.2: eight groups of one to
 * four hex digits, at most one "::" standing for one or more zero groups,
 * optionally a dotted quad as the last 32 bits. A zone ("fe80::1%eth0",
 * RFC 4007 §11) is refused: an address the agent holds or is configured with
 * names no scope, and the interface comes from elsewhere.
 */
export function parseAddress(text: string): Address | undefined {
  for (const family of FAMILIES) {
    const value = FAMILY_FORMS[family].parse(text);
    if (value !== undefined) return { family, value };
  }
  return undefined;
}

/** The canonical text: dotted quad for IPv4, RFC 5952 for IPv6. */
export function formatAddress(a: Address): string {
  return FAMILY_FORMS[a.family].format(a.value);
}

/** The address in network byte order: 4 or 16 bytes. */
export function addressToBytes(a: Address): Buffer {
  const n = FAMILY_FORMS[a.family].bytes;
  const b = Buffer.alloc(n);
  let v = a.value;
  for (let i = n - 1; i >= 0; i--) {
    b[i] = Number(v & 0xffn);
    v >>= 8n;
  }
  return b;
}

/** The address of a family read from bytes in network order at off. */
export function addressFromBytes(family: Family, b: Uint8Array, off = 0): Address {
  const n = FAMILY_FORMS[family].bytes;
  if (off < 0 || off + n > b.length) throw new RangeError(`${family} address needs ${n} bytes at offset ${off}, have ${b.length - off}`);
  let value = 0n;
  for (let i = 0; i < n; i++) value = (value << 8n) | BigInt(b[off + i]!);
  return { family, value };
}

/** The IPv4 address of an unsigned 32-bit number (parseIPv4's form). */
export function ipv4Address(v: number): Address {
  return { family: 'IPv4', value: BigInt(v >>> 0) };
}

/** The unsigned 32-bit number of an IPv4 address; undefined for IPv6. */
export function ipv4Number(a: Address): number | undefined {
  return a.family === 'IPv4' ? Number(a.value) : undefined;
}

/** ::ffff:0:0/96, IPv4-mapped IPv6 addresses (RFC 4291 §2.5.5.2). */
const MAPPED_PREFIX = 0xffffn << 32n;

/** True for an IPv4-mapped IPv6 address (::ffff:a.b.c.d). */
export function isIPv4Mapped(a: Address): boolean {
  return a.family === 'IPv6' && a.value >> 32n === 0xffffn;
}

/**
 * The IPv4 address an IPv4-mapped IPv6 address stands for (what a dual-stack
 * socket reports for an IPv4 peer); any other address unchanged.
 */
export function unmapIPv4(a: Address): Address {
  return isIPv4Mapped(a) ? { family: 'IPv4', value: a.value & 0xffffffffn } : a;
}

/** The IPv4-mapped IPv6 form of an IPv4 address. */
export function mapIPv4(a: Address): Address {
  return a.family === 'IPv4' ? { family: 'IPv6', value: MAPPED_PREFIX | a.value } : a;
}

/** True when both are the same address of the same family. */
export function sameAddress(a: Address, b: Address): boolean {
  return a.family === b.family && a.value === b.value;
}

/** The netmask of a prefix length in a family, as an address value. */
export function prefixMask(family: Family, prefix: number): bigint {
  const bits = BigInt(FAMILY_FORMS[family].bits);
  const all = (1n << bits) - 1n;
  return all ^ ((1n << (bits - BigInt(prefix))) - 1n);
}

/**
 * Parse "address/prefix" of either family; strict: host bits must be zero
 * unless allowHostBits (then they are cleared).
 */
export function parseNetwork(text: string, allowHostBits = false): Network | undefined {
  const slash = text.indexOf('/');
  if (slash < 0) return undefined;
  const a = parseAddress(text.slice(0, slash));
  if (a === undefined) return undefined;
  const form = FAMILY_FORMS[a.family];
  const pstr = text.slice(slash + 1);
  if (!form.prefixText.test(pstr)) return undefined;
  const prefix = Number(pstr);
  if (prefix > form.bits) return undefined;
  const network = a.value & prefixMask(a.family, prefix);
  if (!allowHostBits && network !== a.value) return undefined;
  return { family: a.family, network, prefix };
}

/** "network/prefix" in canonical text. */
export function formatNetwork(n: Network): string {
  return `${formatAddress({ family: n.family, value: n.network })}/${n.prefix}`;
}

/** True when the address is inside the network (an address of the other family never is). */
export function networkContains(n: Network, a: Address): boolean {
  return a.family === n.family && (a.value & prefixMask(n.family, n.prefix)) === n.network;
}

/** The network's last address: IPv4's broadcast, the top of an IPv6 prefix. */
export function lastAddressOf(n: Network): Address {
  const all = (1n << BigInt(FAMILY_FORMS[n.family].bits)) - 1n;
  return { family: n.family, value: n.network | (all ^ prefixMask(n.family, n.prefix)) };
}

const HEX_GROUP = /^[0-9a-fA-F]{1,4}$/;

/** RFC 4291 §2.2 text to a 128-bit value; undefined when malformed. */
function parseIPv6Value(text: string): bigint | undefined {
  if (!text.includes(':') || text.includes('%')) return undefined;
  const gap = text.indexOf('::');
  if (gap >= 0 && text.indexOf('::', gap + 1) >= 0) return undefined;
  const split = (part: string): string[] => (part === '' ? [] : part.split(':'));
  const head = gap < 0 ? text.split(':') : split(text.slice(0, gap));
  const tail = gap < 0 ? [] : split(text.slice(gap + 2));
  const groups: number[][] = [[], []];
  const sides = [head, tail];
  for (let s = 0; s < 2; s++) {
    const side = sides[s]!;
    for (let i = 0; i < side.length; i++) {
      const g = side[i]!;
      const last = i === side.length - 1 && (s === 1 || gap < 0);
      if (last && g.includes('.')) {
        const v4 = parseIPv4(g);
        if (v4 === undefined) return undefined;
        groups[s]!.push(v4 >>> 16, v4 & 0xffff);
      } else if (HEX_GROUP.test(g)) {
        groups[s]!.push(parseInt(g, 16));
      } else {
        return undefined;
      }
    }
  }
  const count = groups[0]!.length + groups[1]!.length;
  if (gap < 0 ? count !== 8 : count > 7) return undefined;
  const all = [...groups[0]!, ...new Array<number>(8 - count).fill(0), ...groups[1]!];
  let value = 0n;
  for (const g of all) value = (value << 16n) | BigInt(g);
  return value;
}

/**
 * RFC 5952 §4: lower case, no leading zeros, the longest run of two or more
 * zero groups as "::" (the first of equal runs), never one group alone;
 * §5: an IPv4-mapped address ends in its dotted quad.
 */
function formatIPv6Value(value: bigint): string {
  if (value >> 32n === 0xffffn) return `::ffff:${formatIPv4(Number(value & 0xffffffffn))}`;
  const groups: number[] = [];
  for (let i = 7; i >= 0; i--) groups.push(Number((value >> BigInt(i * 16)) & 0xffffn));
  let bestAt = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (groups[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && groups[j] === 0) j++;
    if (j - i > bestLen) { bestAt = i; bestLen = j - i; }
    i = j;
  }
  const hex = (gs: number[]): string => gs.map((g) => g.toString(16)).join(':');
  if (bestAt < 0) return hex(groups);
  return `${hex(groups.slice(0, bestAt))}::${hex(groups.slice(bestAt + bestLen))}`;
}
