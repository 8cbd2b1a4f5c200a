// ARP codec (pure): Ethernet II + ARP for IPv4 over Ethernet (RFC 826),
// and the RFC 5227 probe/announcement frames built from it. No I/O. Decoding
// never throws: a malformed frame yields a reason that becomes a metric label.
import { formatMac, ipv4FromBytes, ipv4ToBytes, parseMac } from '../../address';
import type { FrameDropReason } from '../metrics';
import { ETHERTYPE_ARP, ETHERTYPE_IPV4 } from '../packet/inet';

export const ARP_HTYPE_ETHERNET = 1;
export const ARP_OP_REQUEST = 1;
export const ARP_OP_REPLY = 2;

export const BROADCAST_MAC = 'ff:ff:ff:ff:ff:ff';
export const ZERO_MAC = '00:00:00:00:00:00';

/** Ethernet header (14) + ARP for IPv4 (28). Shorter than Ethernet's 60-byte minimum: the NIC pads, as for the kernel's own ARP. */
export const ARP_FRAME_LENGTH = 42;

export interface ArpPacket {
  /** Ethernet destination and source, lower-case "aa:bb:cc:dd:ee:ff". */
  readonly ethDst: string;
  readonly ethSrc: string;
  /** ARP_OP_REQUEST (1) or ARP_OP_REPLY (2). */
  readonly op: number;
  readonly senderMac: string;
  /** IPv4 as an unsigned 32-bit number (see agent/address.ts). */
  readonly senderIp: number;
  readonly targetMac: string;
  readonly targetIp: number;
}

export type ArpDecodeFailure = Extract<
  FrameDropReason,
  'short' | 'not-arp' | 'bad-hardware-type' | 'bad-protocol-type' | 'bad-address-length' | 'bad-operation'
>;

export type ArpDecodeResult = { ok: true; packet: ArpPacket } | { ok: false; reason: ArpDecodeFailure };

/** Decode one Ethernet frame. Trailing bytes (Ethernet padding) are ignored. */
export function decodeArp(frame: Uint8Array): ArpDecodeResult {
  if (frame.length < ARP_FRAME_LENGTH) return { ok: false, reason: 'short' };
  const u16 = (o: number): number => (frame[o]! << 8) | frame[o + 1]!;
  if (u16(12) !== ETHERTYPE_ARP) return { ok: false, reason: 'not-arp' };
  if (u16(14) !== ARP_HTYPE_ETHERNET) return { ok: false, reason: 'bad-hardware-type' };
  if (u16(16) !== ETHERTYPE_IPV4) return { ok: false, reason: 'bad-protocol-type' };
  if (frame[18] !== 6 || frame[19] !== 4) return { ok: false, reason: 'bad-address-length' };
  const op = u16(20);
  if (op !== ARP_OP_REQUEST && op !== ARP_OP_REPLY) return { ok: false, reason: 'bad-operation' };
  return {
    ok: true,
    packet: {
      ethDst: formatMac(frame.subarray(0, 6)),
      ethSrc: formatMac(frame.subarray(6, 12)),
      op,
      senderMac: formatMac(frame.subarray(22, 28)),
      senderIp: ipv4FromBytes(frame, 28),
      targetMac: formatMac(frame.subarray(32, 38)),
      targetIp: ipv4FromBytes(frame, 38),
    },
  };
}

function macBytes(mac: string, field: string): Buffer {
  const b = parseMac(mac);
  if (!b) throw new TypeError(`${field} is not a MAC address: ${mac}`);
  return b;
}

function checkIp(ip: number, field: string): number {
  if (!Number.isInteger(ip) || ip < 0 || ip > 0xffffffff) throw new TypeError(`${field} is not an IPv4 number: ${ip}`);
  return ip;
}

/** Encode a 42-byte frame. Throws TypeError on malformed arguments (a programming error, not input from the wire). */
export function encodeArp(p: ArpPacket): Buffer {
  if (p.op !== ARP_OP_REQUEST && p.op !== ARP_OP_REPLY) throw new TypeError(`ARP op must be 1 or 2, got ${p.op}`);
  const b = Buffer.alloc(ARP_FRAME_LENGTH);
  macBytes(p.ethDst, 'ethDst').copy(b, 0);
  macBytes(p.ethSrc, 'ethSrc').copy(b, 6);
  b.writeUInt16BE(ETHERTYPE_ARP, 12);
  b.writeUInt16BE(ARP_HTYPE_ETHERNET, 14);
  b.writeUInt16BE(ETHERTYPE_IPV4, 16);
  b[18] = 6;
  b[19] = 4;
  b.writeUInt16BE(p.op, 20);
  macBytes(p.senderMac, 'senderMac').copy(b, 22);
  ipv4ToBytes(checkIp(p.senderIp, 'senderIp')).copy(b, 28);
  macBytes(p.targetMac, 'targetMac').copy(b, 32);
  ipv4ToBytes(checkIp(p.targetIp, 'targetIp')).copy(b, 38);
  return b;
}

/**
 * RFC 5227 §2.1.1 ARP Probe: a broadcast request with sender IP 0 (so no
 * neighbour's cache is polluted if the address is taken), target IP the
 * candidate, target hardware address all zeroes.
 */
export function arpProbe(mac: string, candidateIp: number): ArpPacket {
  return { ethDst: BROADCAST_MAC, ethSrc: mac, op: ARP_OP_REQUEST, senderMac: mac, senderIp: 0, targetMac: ZERO_MAC, targetIp: candidateIp };
}

/**
 * RFC 5227 §2.3 ARP Announcement (gratuitous ARP): a broadcast request with
 * sender IP = target IP = the address; neighbours that accept gratuitous ARP
 * update (or, with arp_accept, create) their entry for it.
 */
export function arpAnnouncement(mac: string, ip: number): ArpPacket {
  return { ethDst: BROADCAST_MAC, ethSrc: mac, op: ARP_OP_REQUEST, senderMac: mac, senderIp: ip, targetMac: ZERO_MAC, targetIp: ip };
}

/** True for an RFC 5227 probe (sender IP 0, request). */
export function isArpProbe(p: ArpPacket): boolean {
  return p.op === ARP_OP_REQUEST && p.senderIp === 0;
}
