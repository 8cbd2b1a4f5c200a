// forward/ layer: the PROXY protocol header, pure encoding, no
// I/O. The userspace proxy sends it to a backend before the first byte of a
// relayed connection so the backend sees the client's address and port and
// the VIP's (HAProxy's `send-proxy` / `send-proxy-v2`); health checks send
// it only when asked (healthCheck.proxyProtocol).
//
// The spec is HAProxy's doc/proxy-protocol.txt (2020/03/05):
// - v1 (2.1): one US-ASCII line "PROXY TCP4 <src> <dst> <sport> <dport>\r\n"
//   (TCP6 for IPv6), addresses in their canonical form (IPv4 dotted decimal
//   without leading zeros; IPv6 hex groups with at most one "::", here
//   RFC 5952's form), ports in decimal, no leading zeros (56 bytes at most for
//   TCP4, 104 for TCP6). v1 has no UDP.
// - v2 (2.2): the 12-byte signature \r\n\r\n\0\r\nQUIT\n, then ver_cmd (0x2 in
//   the high nibble; command 0x1 PROXY or 0x0 LOCAL), then family/protocol
//   (0x11 TCP over IPv4, 0x12 UDP over IPv4, 0x21 TCP over IPv6, 0x22 UDP
//   over IPv6, 0x00 UNSPEC), then the address length in network order (12
//   for IPv4: src, dst, sport, dport; 36 for IPv6: 16-byte src, 16-byte dst,
//   sport, dport; all network order). 28 bytes for IPv4, 52 for IPv6, 16 for
//   LOCAL. No TLVs are sent.
// - Health checks (2.1, 2.2): "When a load balancing proxy has to send health
//   checks to a server, it SHOULD build a valid PROXY line which it will fill
//   with a getsockname()/getpeername() pair" (v1), and v2 has the LOCAL command
//   for a connection "established on purpose by the proxy without being
//   relayed ... when the proxy sends health-checks".
// The client and the VIP are of one family (a VIP's listener takes clients of
// its own family only); an IPv4-mapped "::ffff:a.b.c.d" counts as IPv4. An
// address that does not parse, or a pair of two families, is refused by a
// throw: the callers hand over what the kernel reported for one socket.
import { addressToBytes, formatAddress, parseAddress, unmapIPv4, type Address } from '../address';
import type { ProxyProtocolVersion } from '../config/types';

export type { ProxyProtocolVersion };

/** The connection a header describes: the client (source) and the address it connected to (destination). */
export interface ProxiedConnection {
  readonly source: string;
  readonly sourcePort: number;
  readonly destination: string;
  readonly destinationPort: number;
}

/** The v2 signature (spec 2.2). */
export const PROXY_V2_SIGNATURE: Buffer = Buffer.from([0x0d, 0x0a, 0x0d, 0x0a, 0x00, 0x0d, 0x0a, 0x51, 0x55, 0x49, 0x54, 0x0a]);
const V2_VERSION = 0x20;
const V2_CMD_LOCAL = 0x00;
const V2_CMD_PROXY = 0x01;
const V2_TCP4 = 0x11;
const V2_UDP4 = 0x12;
const V2_TCP6 = 0x21;
const V2_UDP6 = 0x22;
const V2_HEADER = 16;
const V2_IPV4_ADDRESSES = 12;
const V2_IPV6_ADDRESSES = 36;

function address(text: string, what: string): Address {
  const a = parseAddress(text);
  if (a === undefined) throw new TypeError(`PROXY protocol: ${what} ${JSON.stringify(text)} is not an IPv4 or IPv6 address`);
  return unmapIPv4(a);
}

/** Both ends, of one family. */
function pair(c: ProxiedConnection): { src: Address; dst: Address } {
  const src = address(c.source, 'source');
  const dst = address(c.destination, 'destination');
  if (src.family !== dst.family) throw new TypeError(`PROXY protocol: source ${c.source} is ${src.family} and destination ${c.destination} is ${dst.family}; a header carries one family`);
  return { src, dst };
}

function port(p: number, what: string): number {
  if (!Number.isInteger(p) || p < 0 || p > 65535) throw new TypeError(`PROXY protocol: ${what} ${p} is not a port`);
  return p;
}

/** The v1 line for a TCP connection (spec 2.1): TCP4 or TCP6 by the addresses' family. */
export function proxyHeaderV1(c: ProxiedConnection): string {
  const { src, dst } = pair(c);
  // Canonical forms: re-rendered from the parsed values, so no leading zeros slip through.
  const proto = src.family === 'IPv4' ? 'TCP4' : 'TCP6';
  return `PROXY ${proto} ${formatAddress(src)} ${formatAddress(dst)} ${port(c.sourcePort, 'source port')} ${port(c.destinationPort, 'destination port')}\r\n`;
}

/** The v2 header for a TCP (or, per datagram, UDP) flow of either family (spec 2.2). */
export function proxyHeaderV2(c: ProxiedConnection, transport: 'tcp' | 'udp' = 'tcp'): Buffer {
  const { src, dst } = pair(c);
  const sport = port(c.sourcePort, 'source port');
  const dport = port(c.destinationPort, 'destination port');
  if (src.family === 'IPv4') {
    const b = Buffer.allocUnsafe(PROXY_V2_IPV4_LENGTH);
    writeV2Into(b, 0, Number(src.value), sport, Number(dst.value), dport, transport);
    return b;
  }
  const b = proxyHeaderV2Template6(addressToBytes(dst), dport, transport);
  writeV2Source6(b, 0, addressToBytes(src), sport);
  return b;
}

/** Length of a v2 header for IPv4. */
export const PROXY_V2_IPV4_LENGTH = V2_HEADER + V2_IPV4_ADDRESSES;

/** Length of a v2 header for IPv6. */
export const PROXY_V2_IPV6_LENGTH = V2_HEADER + V2_IPV6_ADDRESSES;

/** The longest v1 line (spec 2.1: 107 bytes, "PROXY UNKNOWN" with IPv6 addresses); room enough for any header sent here. */
export const PROXY_V1_MAX_LENGTH = 107;

/**
 * Write a v2 IPv4 header at `offset` from numeric addresses (host-order u32):
 * the proxy's hot path fills a buffer without building strings.
 */
export function writeV2Into(b: Buffer, offset: number, src: number, sport: number, dst: number, dport: number, transport: 'tcp' | 'udp'): void {
  PROXY_V2_SIGNATURE.copy(b, offset);
  b[offset + 12] = V2_VERSION | V2_CMD_PROXY;
  b[offset + 13] = transport === 'udp' ? V2_UDP4 : V2_TCP4;
  b.writeUInt16BE(V2_IPV4_ADDRESSES, offset + 14);
  b.writeUInt32BE(src >>> 0, offset + 16);
  b.writeUInt32BE(dst >>> 0, offset + 20);
  b.writeUInt16BE(sport, offset + 24);
  b.writeUInt16BE(dport, offset + 26);
}

/**
 * The part of a v2 IPv4 header that is the same for every connection to one
 * VIP:port (signature, version/command, family, length, destination): the
 * proxy builds it once per route and per connection only copies it and
 * fills in the client (writeV2Source).
 */
export function proxyHeaderV2Template(dst: number, dport: number, transport: 'tcp' | 'udp'): Buffer {
  const b = Buffer.alloc(PROXY_V2_IPV4_LENGTH);
  writeV2Into(b, 0, 0, 0, dst, port(dport, 'destination port'), transport);
  return b;
}

/** Fill the client's address and port into a v2 IPv4 header at `offset` (a copy of a template). */
export function writeV2Source(b: Buffer, offset: number, src: number, sport: number): void {
  b.writeUInt32BE(src >>> 0, offset + 16);
  b.writeUInt16BE(sport, offset + 24);
}

/** proxyHeaderV2Template for an IPv6 VIP (16 bytes, network order): 52 bytes, the client left zero for writeV2Source6. */
export function proxyHeaderV2Template6(dst: Uint8Array, dport: number, transport: 'tcp' | 'udp'): Buffer {
  if (dst.length !== 16) throw new TypeError(`PROXY protocol: an IPv6 destination has 16 bytes, not ${dst.length}`);
  const b = Buffer.alloc(PROXY_V2_IPV6_LENGTH);
  PROXY_V2_SIGNATURE.copy(b, 0);
  b[12] = V2_VERSION | V2_CMD_PROXY;
  b[13] = transport === 'udp' ? V2_UDP6 : V2_TCP6;
  b.writeUInt16BE(V2_IPV6_ADDRESSES, 14);
  b.set(dst, 32);
  b.writeUInt16BE(port(dport, 'destination port'), 50);
  return b;
}

/** Fill the client's IPv6 address (16 bytes, network order) and port into a v2 IPv6 header at `offset`. */
export function writeV2Source6(b: Buffer, offset: number, src: Uint8Array, sport: number): void {
  b.set(src.subarray(0, 16), offset + 16);
  b.writeUInt16BE(sport, offset + 48);
}

/** The v2 LOCAL header (no addresses): what a health check sends (spec 2.2, "LOCAL"). */
export function proxyHeaderV2Local(): Buffer {
  const b = Buffer.alloc(V2_HEADER);
  PROXY_V2_SIGNATURE.copy(b, 0);
  b[12] = V2_VERSION | V2_CMD_LOCAL;
  b[13] = 0x00; // AF_UNSPEC, UNSPEC
  b.writeUInt16BE(0, 14);
  return b;
}

/** The header of `version` for a relayed TCP connection. */
export function proxyHeader(version: ProxyProtocolVersion, c: ProxiedConnection): Buffer {
  return version === 'v1' ? Buffer.from(proxyHeaderV1(c), 'latin1') : proxyHeaderV2(c, 'tcp');
}

/**
 * The header a health check sends: v1 a valid TCP4 or TCP6 line with the probe
 * connection's own addresses (getsockname/getpeername), v2 LOCAL.
 */
export function healthCheckHeader(version: ProxyProtocolVersion, probe: ProxiedConnection): Buffer {
  return version === 'v1' ? Buffer.from(proxyHeaderV1(probe), 'latin1') : proxyHeaderV2Local();
}
