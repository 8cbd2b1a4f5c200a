// Preflight, driver layer: the DHCPv6 half of `lb-agent check --dhcp-probe`,
// for a config with IPv6 DHCP services. Asks the LAN of the parent interface
// whether a DHCPv6 server answers, the way the agent will ask (dhcp/driver6.ts):
// a SOLICIT for one IA_NA from the link-local address of a temporary macvlan
// with a throwaway, locally administered MAC (its DUID-LL), to
// All_DHCP_Relay_Agents_and_Servers. Only a SOLICIT is sent, without Rapid
// Commit, never a REQUEST, so no lease is taken (RFC 8415 §18.3.1: a server
// answers a SOLICIT with an ADVERTISE and commits nothing). The macvlan is
// the IPv4 probe's name (dhcp-probe.ts, which sweeps one a killed probe
// left) and is deleted before returning.
import * as dgram from 'node:dgram';
import { randomBytes } from 'node:crypto';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { errorMessage } from '../errors';
import { formatMac } from '../address';
import {
  DHCP6_CLIENT_PORT, DHCP6_SERVER_PORT, buildClient6Message, decodeReplyPayload6, describeDuid, duidLl, encodeDhcp6, formatIPv6,
} from '../dhcp/codec6';
import { usableAddress } from '../dhcp/lease6';
import { openNetlink, type NetlinkClient } from '../net/netlink/netlink';
import { prepareIpv6Link, type SysctlOptions } from '../net/sysctl/sysctl';
import { linkLocalOf } from '../ipam/pool-source';
import { PROBE_LINK_PREFIX } from './dhcp-probe';
import type { DhcpProbeFacts } from './facts';

export interface Dhcp6ProbeOptions {
  /** How long to wait for an ADVERTISE (default 5 s). */
  timeoutSeconds?: number;
  /** Resend the SOLICIT at these offsets (ms) while waiting (default 1 s and 3 s: RFC 8415 §7.6's IRT, doubled). */
  retransmitMs?: readonly number[];
  clock?: Clock;
  netlink?: NetlinkClient;
  sysctl?: SysctlOptions;
}

/** How long the macvlan's link-local address may take to appear (the kernel runs a new link within a second). */
const LINK_LOCAL_WAIT_MS = 3_000;

/** Send a SOLICIT from a temporary macvlan of `parent` and wait for an ADVERTISE with an address. */
export async function probeDhcp6(parent: string, opts: Dhcp6ProbeOptions = {}): Promise<DhcpProbeFacts> {
  const clock = opts.clock ?? realClock;
  const timeoutSeconds = opts.timeoutSeconds ?? 5;
  const retransmit = opts.retransmitMs ?? [1000, 3000];
  const macBuf = randomBytes(6);
  macBuf[0] = 0x02;
  const mac = formatMac(macBuf);
  const link = `${PROBE_LINK_PREFIX}${process.pid}`;
  const base = { interface: parent, mac, timeoutSeconds };
  const started = clock.now();
  const elapsed = (): number => Math.round(clock.now() - started);
  const error = (e: string): DhcpProbeFacts => ({ ...base, status: 'error', ms: elapsed(), error: e });

  let nl: NetlinkClient;
  try {
    nl = opts.netlink ?? openNetlink();
  } catch (e) {
    return error(`cannot open rtnetlink: ${errorMessage(e)}`);
  }
  let index: number | undefined;
  let sock: dgram.Socket | undefined;
  try {
    try {
      index = (await nl.createMacvlan({ name: link, parent, mac, mode: 'bridge' })).index;
    } catch (e) {
      return error(`cannot create a macvlan on ${parent}: ${errorMessage(e)}`);
    }
    // As the agent's DHCPv6 macvlan: no router solicitations or SLAAC, a link-local address usable at once.
    if (!(await prepareIpv6Link(link, opts.sysctl))) return error(`IPv6 is not available on ${parent} (no net.ipv6.conf.${link})`);
    await nl.setLinkUp(index, true);
    const until = clock.now() + LINK_LOCAL_WAIT_MS;
    let ll: bigint | undefined;
    while ((ll = linkLocalOf(await nl.listAddresses(index, 'IPv6'))) === undefined) {
      if (clock.now() > until) return error(`${link} got no IPv6 link-local address within ${LINK_LOCAL_WAIT_MS / 1000} s (is IPv6 disabled on ${parent}?)`);
      await new Promise<void>((r) => clock.setTimeout(r, 50));
    }
    const s = dgram.createSocket({ type: 'udp6', reuseAddr: true });
    sock = s;
    await new Promise<void>((resolve, reject) => {
      s.once('error', reject);
      s.bind({ address: `${formatIPv6(ll)}%${link}`, port: DHCP6_CLIENT_PORT, exclusive: true }, () => { s.off('error', reject); resolve(); });
    });
    const duid = duidLl(mac);
    const iaid = randomBytes(4).readUInt32BE(0);
    const xid = randomBytes(3).readUIntBE(0, 3);
    const solicit = (elapsedMs: number): Buffer => encodeDhcp6(buildClient6Message(
      { kind: 'SOLICIT', xid, elapsedMs, serverId: undefined, addresses: [] }, { duid, iaid },
    ));
    return await new Promise<DhcpProbeFacts>((resolve) => {
      const timers: TimerHandle[] = [];
      const finish = (r: DhcpProbeFacts): void => {
        for (const t of timers) clock.clearTimeout(t);
        s.removeAllListeners('message');
        resolve(r);
      };
      s.on('message', (msg: Buffer) => {
        // Anything else (another client's reply, a malformed one, an ADVERTISE without an address for us) is not our answer.
        const r = decodeReplyPayload6(msg, { xid, duid });
        if (!r.ok || r.value.fields.kind !== 'ADVERTISE') return;
        const u = usableAddress(r.value.fields, iaid, undefined);
        if (!u.ok) return;
        finish({
          ...base, status: 'offer', ms: elapsed(), offeredIp: formatIPv6(u.address.address),
          ...(r.value.fields.serverId !== undefined ? { serverId: describeDuid(r.value.fields.serverId) } : {}),
        });
      });
      s.on('error', (e: Error) => finish(error(e.message)));
      const send = (): void => {
        s.send(solicit(elapsed()), DHCP6_SERVER_PORT, `ff02::1:2%${link}`, (e) => { if (e) finish(error(e.message)); });
      };
      send();
      for (const at of retransmit) if (at < timeoutSeconds * 1000) timers.push(clock.setTimeout(send, at));
      timers.push(clock.setTimeout(() => finish({ ...base, status: 'no-offer', ms: elapsed() }), timeoutSeconds * 1000));
    });
  } catch (e) {
    return error(errorMessage(e));
  } finally {
    try { sock?.close(); } catch { /* closed already */ }
    if (index !== undefined) await nl.deleteLink(index).catch(() => false);
    if (!opts.netlink) nl.close();
  }
}
