// Ownership marks: the link names, MAC addresses and DHCP client
// identifiers the agent derives from a service key ("namespace/name"), and
// how it recognises its own links and addresses after a restart. Deterministic, so a
// service keeps its MAC (and so its DHCP lease) across restarts, reboots and
// moves to another VM. The hash is SHA-256 by the node binary's own OpenSSL
// through the addon, node:crypto only with an addon built before
// it: the same bytes either way, so names and MACs never change.
import { parseMac } from '../../address';
import { sha256Fn } from '../../native/native';

/** Every agent-created link is named LINK_PREFIX + 12 hex digits. */
export const LINK_PREFIX = 'lbv';
/** Locally administered (bit 1), unicast (bit 0 clear) first octet: IEEE 802 §8.2. */
export const MAC_PREFIX = '02:';
/**
 * IFA_PROTO of every address the agent adds (Linux 6.3+; `ip addr` shows it
 * as "proto 76" with iproute2 6.3+). The kernel keeps it with the address,
 * so a restart, `lb-agent withdraw` or a crash-only start finds every VIP
 * the agent left, claim or not. Values 0-3 are the kernel's own.
 */
export const OWNED_ADDRESS_PROTO = 76;

/** IFNAMSIZ is 16 including the NUL. */
export const MAX_IFNAME_LENGTH = 15;

const OWNED_NAME = /^lbv[0-9a-f]{12}$/;

/** Names and MACs by service key: the daemon asks for a DHCP service's MAC on every forwarding-state build. */
const derived = new Map<string, { name: string; mac: string }>();
/** Bound on the memo: more keys than any config holds; past it, start over. */
const MAX_DERIVED = 4096;

/**
 * SHA-256 of `data`. Loading node:crypto for it costs a DHCP service ~0.55
 * MiB of RSS; the addon's sha256 hashes with the same OpenSSL.
 */
function sha256(data: Buffer): Buffer {
  const native = sha256Fn();
  if (native !== undefined) return native(data);
  const { createHash } = require('node:crypto') as typeof import('node:crypto');
  return createHash('sha256').update(data).digest();
}

function derive(key: string): { name: string; mac: string } {
  const known = derived.get(key);
  if (known !== undefined) return known;
  const d = sha256(Buffer.from(key, 'utf8'));
  const made = {
    name: LINK_PREFIX + d.subarray(0, 6).toString('hex'),
    mac: MAC_PREFIX + Array.from(d.subarray(0, 5), (b) => b.toString(16).padStart(2, '0')).join(':'),
  };
  if (derived.size >= MAX_DERIVED) derived.clear();
  derived.set(key, made);
  return made;
}

/**
 * 'lbv' + the first 6 bytes of SHA-256(key) in hex: 15 characters, the most
 * IFNAMSIZ allows. 48 bits make an accidental collision between services of
 * one agent negligible.
 */
export function linkNameForService(key: string): string {
  return derive(key).name;
}

/**
 * '02:' + the first 5 bytes of SHA-256(key): locally administered, so it
 * never collides with a vendor (OUI) address.
 */
export function macForService(key: string): string {
  return derive(key).mac;
}

/**
 * DHCP client identifier (option 61) for a service: type 1 (Ethernet)
 * followed by the service MAC, RFC 2132 §9.14 - the form dhclient and most
 * clients send by default. Chosen over RFC 4361's type 255 (IAID + DUID)
 * because it is already stable (the MAC is derived from the key, not from
 * the VM), every DHCP server and its operators recognise it, and lease
 * tables then show the same address in both columns.
 */
export function clientIdForService(key: string): Buffer {
  const mac = parseMac(macForService(key))!;
  return Buffer.concat([Buffer.from([1]), mac]);
}

/** What ownership needs to know about a link. */
export interface LinkMarks {
  readonly name: string;
  readonly mac: string;
}

/**
 * An agent link: the name is LINK_PREFIX + 12 hex digits AND the MAC is
 * locally administered with the '02:' prefix. Both, so an operator's own
 * interface that merely starts with 'lbv' is never touched.
 */
export function isOwnedLink(link: LinkMarks): boolean {
  return OWNED_NAME.test(link.name) && link.mac.toLowerCase().startsWith(MAC_PREFIX);
}

/** Whether a link name carries the agent prefix (whatever its MAC). */
export function hasOwnedName(name: string): boolean {
  return OWNED_NAME.test(name);
}
