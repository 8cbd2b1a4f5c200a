// IPv4 addresses as unsigned 32-bit numbers: parse, format, CIDR math.
// Pure; used by config, ipam, the codecs and the dataplanes.

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
  const slash = s.indexOf('/');
  if (slash < 0) return undefined;
  const ip = parseIPv4(s.slice(0, slash));
  const pstr = s.slice(slash + 1);
  if (ip === undefined || !/^\d{1,2}$/.test(pstr)) return undefined;
  const prefix = Number(pstr);
  if (prefix > 32) return undefined;
  const network = (ip & maskOf(prefix)) >>> 0;
  if (!allowHostBits && network !== ip) return undefined;
  return { network, prefix };
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
