// A DHCPv6 service's identity: its DUID and IAID, derived from the service's
// MAC (net/ownership/ownership.ts), so a service is one client to the server
// wherever it runs. Pure.
import { parseMac } from '../address';
import { macForService } from '../net/ownership/ownership';
import { duidLl } from './codec6';

/**
 * DHCPv6 client DUID for a service: DUID-LL (RFC 8415 §11.4) of the service
 * MAC, so the same service is the same client to the server after a
 * restart, a reboot or a move to another VM, and gets the same address back.
 * Not DUID-LLT (§11.2): its time field is when the DUID was first made, so
 * each VM (and each lost state directory) would make a different one; not
 * DUID-UUID either, which would be one more identifier to derive when the
 * MAC already is the service's stable identity.
 */
export function duidForService(key: string): Buffer {
  return duidLl(macForService(key));
}

/** The IAID of a service's one IA_NA: the MAC's low 32 bits, as dhclient does with its interface's. */
export function iaidForService(key: string): number {
  return parseMac(macForService(key))!.readUInt32BE(2);
}
