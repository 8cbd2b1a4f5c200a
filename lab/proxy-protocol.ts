// A strict PROXY protocol receiver for tests, written from HAProxy's
// doc/proxy-protocol.txt (2020/03/05) and independent of the agent's encoder
// (agent/forward/proxy-protocol.ts), so that a test backend checks what the
// agent sends against the spec, not against itself. It accepts only what a
// receiver configured for one version must accept ("MUST not try to guess")
// and names the first rule a header breaks.

export interface ParsedProxyHeader {
  readonly version: 1 | 2;
  /** v2: PROXY (relayed) or LOCAL (the proxy's own connection, health checks). v1 is always PROXY. */
  readonly command: 'PROXY' | 'LOCAL';
  /** v1: TCP4 | TCP6 | UNKNOWN; v2: tcp4 | udp4 | tcp6 | udp6 | unspec. */
  readonly transport: string;
  readonly source?: string;
  readonly destination?: string;
  readonly sourcePort?: number;
  readonly destinationPort?: number;
  /** Bytes the header took; what follows is the payload. */
  readonly length: number;
}

export type ParseResult = { readonly header: ParsedProxyHeader } | { readonly more: true } | { readonly error: string };

const V2_SIG = Buffer.from('0d0a0d0a000d0a515549540a', 'hex');

/** Dotted decimal, four numbers 0-255, no leading zeros (2.1: "Heading zeroes are not permitted"). */
function canonicalV4(s: string): boolean {
  const parts = s.split('.');
  return parts.length === 4 && parts.every((p) => /^(0|[1-9][0-9]{0,2})$/.test(p) && Number(p) <= 255);
}

/**
 * IPv6 as 2.1 puts it: groups of (up to) 4 hex digits separated by colons,
 * at most one "::" standing for the zero groups, exactly 128 bits.
 */
function validV6(s: string): boolean {
  if (!/^[0-9a-fA-F:]+$/.test(s)) return false;
  const halves = s.split('::');
  if (halves.length > 2) return false;
  const groups = halves.map((h) => (h === '' ? [] : h.split(':')));
  if (groups.some((g) => g.some((x) => !/^[0-9a-fA-F]{1,4}$/.test(x)))) return false;
  const n = groups.reduce((k, g) => k + g.length, 0);
  return halves.length === 2 ? n < 8 : n === 8;
}

/** 16 bytes as eight 4-digit lower-case hex groups joined by colons (no "::": a form both sides can compare by parsing). */
function v6Text(b: Buffer, o: number): string {
  const g: string[] = [];
  for (let i = 0; i < 8; i++) g.push(b.readUInt16BE(o + 2 * i).toString(16));
  return g.join(':');
}

function canonicalPort(s: string): boolean {
  return /^(0|[1-9][0-9]{0,4})$/.test(s) && Number(s) <= 65535;
}

/** Parse a v1 line at the start of `buf` (2.1). */
export function parseV1(buf: Buffer): ParseResult {
  const prefix = Buffer.from('PROXY ');
  const n = Math.min(buf.length, prefix.length);
  if (!buf.subarray(0, n).equals(prefix.subarray(0, n))) return { error: 'does not start with "PROXY "' };
  if (buf.length < 8) return { more: true };
  const crlf = buf.indexOf('\r\n');
  if (crlf < 0) return buf.length >= 107 ? { error: 'no CRLF in the first 107 bytes' } : { more: true };
  if (crlf + 2 > 107) return { error: 'line longer than 107 bytes' };
  const line = buf.subarray(0, crlf).toString('latin1');
  if (/[\r\n]/.test(line)) return { error: 'a lone CR or LF inside the line' };
  const f = line.split(' ');
  if (f[1] === 'UNKNOWN') return { header: { version: 1, command: 'PROXY', transport: 'UNKNOWN', length: crlf + 2 } };
  if (f.length !== 6) return { error: `expected 6 fields separated by single spaces, got ${JSON.stringify(line)}` };
  const [, proto, src, dst, sport, dport] = f as [string, string, string, string, string, string];
  if (proto !== 'TCP4' && proto !== 'TCP6') return { error: `protocol ${JSON.stringify(proto)} (only TCP4 and TCP6 are expected here)` };
  if (proto === 'TCP4' && (!canonicalV4(src) || !canonicalV4(dst))) return { error: `addresses not in canonical IPv4 form: ${src} ${dst}` };
  if (proto === 'TCP6' && (!validV6(src) || !validV6(dst))) return { error: `addresses not in IPv6 form: ${src} ${dst}` };
  if (!canonicalPort(sport) || !canonicalPort(dport)) return { error: `ports not canonical decimal 0-65535: ${sport} ${dport}` };
  return { header: { version: 1, command: 'PROXY', transport: proto, source: src, destination: dst, sourcePort: Number(sport), destinationPort: Number(dport), length: crlf + 2 } };
}

/** Parse a v2 header at the start of `buf` (2.2). */
export function parseV2(buf: Buffer): ParseResult {
  const n = Math.min(buf.length, 12);
  if (!buf.subarray(0, n).equals(V2_SIG.subarray(0, n))) return { error: 'the 12-byte v2 signature does not match' };
  if (buf.length < 16) return { more: true };
  const verCmd = buf[12]!;
  if ((verCmd & 0xf0) !== 0x20) return { error: `version nibble 0x${(verCmd >> 4).toString(16)}, must be 0x2` };
  const cmd = verCmd & 0x0f;
  if (cmd > 1) return { error: `command 0x${cmd.toString(16)} is unassigned` };
  const fam = buf[13]!;
  const len = buf.readUInt16BE(14);
  if (buf.length < 16 + len) return { more: true };
  const command = cmd === 1 ? 'PROXY' : 'LOCAL';
  const total = 16 + len;
  if (fam === 0x00) return { header: { version: 2, command, transport: 'unspec', length: total } };
  if (fam === 0x21 || fam === 0x22) {
    if (len < 36) return { error: `address length ${len} is shorter than the 36 bytes of IPv6 addresses and ports` };
    return {
      header: {
        version: 2, command, transport: fam === 0x21 ? 'tcp6' : 'udp6',
        source: v6Text(buf, 16), destination: v6Text(buf, 32), sourcePort: buf.readUInt16BE(48), destinationPort: buf.readUInt16BE(50), length: total,
      },
    };
  }
  if (fam !== 0x11 && fam !== 0x12) return { error: `family/protocol 0x${fam.toString(16).padStart(2, '0')} (only 0x11 TCP4, 0x12 UDP4, 0x21 TCP6 and 0x22 UDP6 are expected here)` };
  if (len < 12) return { error: `address length ${len} is shorter than the 12 bytes of IPv4 addresses and ports` };
  const ip = (o: number): string => `${buf[o]}.${buf[o + 1]}.${buf[o + 2]}.${buf[o + 3]}`;
  return {
    header: {
      version: 2, command, transport: fam === 0x11 ? 'tcp4' : 'udp4',
      source: ip(16), destination: ip(20), sourcePort: buf.readUInt16BE(24), destinationPort: buf.readUInt16BE(26), length: total,
    },
  };
}

/** The header a receiver configured for `version` must find first. */
export function parseProxyHeader(version: 1 | 2, buf: Buffer): ParseResult {
  return version === 1 ? parseV1(buf) : parseV2(buf);
}
