// Preflight, driver layer: `lb-agent check --dhcp-probe`. Asks the LAN of the
// parent interface whether a DHCP server answers, the way the agent will ask:
// a DISCOVER from a throwaway, locally administered MAC on a temporary
// macvlan (mode bridge), sent and received on an AF_PACKET socket. Only a
// DISCOVER is sent, never a REQUEST, so no lease is taken (RFC 2131 §4.3.1: a
// server commits nothing before a REQUEST). The macvlan is deleted before
// returning, and one left by a killed probe is removed by the next. Links
// and sysctls go through net/ (rtnetlink, net/sysctl.ts), as the daemon's do.
import { randomBytes } from 'node:crypto';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { errorMessage } from '../errors';
import {
  buildClientMessage, decodeReply, encodeDhcp, encodeUdpFrame, BROADCAST_IP, BROADCAST_MAC, DHCP_CLIENT_FILTER,
} from '../dhcp/codec';
import { openPacketSocket, ETH_P_IP, type PacketSocket, type FrameInfo } from '../net/packet/packet';
import { openNetlink, type NetlinkClient } from '../net/netlink/netlink';
import { disableIpv6, type SysctlOptions } from '../net/sysctl/sysctl';
import { formatIPv4, formatMac } from '../address';
import type { DhcpProbeFacts } from './facts';

/** Link name prefix of the probe's temporary macvlan: "lbchk<pid>". */
export const PROBE_LINK_PREFIX = 'lbchk';

export interface DhcpProbeOptions {
  /** How long to wait for an OFFER (default 5 s). */
  timeoutSeconds?: number;
  /** Resend the DISCOVER at these offsets (ms) while waiting (default 1 s and 3 s). */
  retransmitMs?: readonly number[];
  clock?: Clock;
  /** The rtnetlink client (tests); by default one is opened and closed around the probe. */
  netlink?: NetlinkClient;
  /** Where the sysctl tree is (tests). */
  sysctl?: SysctlOptions;
}

/** Whether a process is gone (a probe killed mid-way left its link behind). */
function processGone(pid: number): boolean {
  try { process.kill(pid, 0); return false; } catch (e) { return (e as NodeJS.ErrnoException).code !== 'EPERM'; }
}

/** Remove probe links whose process is gone. */
async function sweepStale(nl: NetlinkClient): Promise<void> {
  const pattern = new RegExp(`^${PROBE_LINK_PREFIX}(\\d+)$`);
  for (const l of await nl.listLinks()) {
    const m = pattern.exec(l.name);
    if (m && processGone(Number(m[1]))) await nl.deleteLink(l.index).catch(() => false);
  }
}

/** A random unicast, locally administered MAC (02:...). */
function throwawayMac(): string {
  const b = randomBytes(6);
  b[0] = 0x02;
  return formatMac(b);
}

/** Send a DISCOVER on a temporary macvlan of `parent` and wait for an OFFER. */
export async function probeDhcp(parent: string, opts: DhcpProbeOptions = {}): Promise<DhcpProbeFacts> {
  const clock = opts.clock ?? realClock;
  const timeoutSeconds = opts.timeoutSeconds ?? 5;
  const retransmit = opts.retransmitMs ?? [1000, 3000];
  const mac = throwawayMac();
  const link = `${PROBE_LINK_PREFIX}${process.pid}`;
  const base = { interface: parent, mac, timeoutSeconds };
  const started = clock.now();
  const elapsed = (): number => Math.round(clock.now() - started);

  let nl: NetlinkClient;
  try {
    nl = opts.netlink ?? openNetlink();
  } catch (e) {
    return { ...base, status: 'error', ms: elapsed(), error: `cannot open rtnetlink: ${errorMessage(e)}` };
  }
  let index: number | undefined;
  let sock: PacketSocket | undefined;
  try {
    await sweepStale(nl).catch(() => undefined);
    try {
      index = (await nl.createMacvlan({ name: link, parent, mac, mode: 'bridge' })).index;
    } catch (e) {
      return { ...base, status: 'error', ms: elapsed(), error: `cannot create a macvlan on ${parent}: ${errorMessage(e)}` };
    }
    // No IPv6 on the probe link: no DAD, router or MLD chatter from a MAC that exists for a second.
    await disableIpv6(link, opts.sysctl).catch(() => false);
    try {
      await nl.setLinkUp(index, true);
    } catch (e) {
      return { ...base, status: 'error', ms: elapsed(), error: `cannot bring ${link} up: ${errorMessage(e)}` };
    }

    const xid = randomBytes(4).readUInt32BE(0);
    const macBuf = Buffer.from(mac.split(':').map((x) => parseInt(x, 16)));
    const dhcp = encodeDhcp(buildClientMessage(
      { kind: 'DISCOVER', xid, secs: 0, ciaddr: 0, requestedIp: undefined, serverId: undefined },
      // RFC 2132 §9.14: client identifier = hardware type 1 + MAC.
      { mac, clientId: Buffer.concat([Buffer.from([1]), macBuf]), hostname: undefined },
    ));
    const frame = encodeUdpFrame({ srcMac: mac, dstMac: BROADCAST_MAC, srcIp: 0, dstIp: BROADCAST_IP, payload: dhcp });

    const s = openPacketSocket({ ifindex: index, protocol: ETH_P_IP, filter: DHCP_CLIENT_FILTER });
    sock = s;
    return await new Promise<DhcpProbeFacts>((resolve) => {
      const timers: TimerHandle[] = [];
      const finish = (r: DhcpProbeFacts): void => {
        for (const t of timers) clock.clearTimeout(t);
        s.removeAllListeners('frame');
        resolve(r);
      };
      s.on('frame', (buf: Buffer, info: FrameInfo) => {
        // Anything else on the wire (other clients' replies, malformed frames) is simply not our OFFER.
        const r = decodeReply(buf, info, { xid, mac });
        if (!r.ok || r.value.packet.fields.kind !== 'OFFER') return;
        const f = r.value.packet.fields;
        finish({
          ...base, status: 'offer', ms: elapsed(),
          offeredIp: formatIPv4(r.value.packet.message.yiaddr),
          ...(f.serverId !== undefined ? { serverId: formatIPv4(f.serverId) } : {}),
        });
      });
      s.on('error', (e: Error) => finish({ ...base, status: 'error', ms: elapsed(), error: e.message }));
      const send = (): void => {
        try { s.send(frame); } catch (e) { finish({ ...base, status: 'error', ms: elapsed(), error: errorMessage(e) }); }
      };
      send();
      for (const at of retransmit) if (at < timeoutSeconds * 1000) timers.push(clock.setTimeout(send, at));
      timers.push(clock.setTimeout(() => finish({ ...base, status: 'no-offer', ms: elapsed() }), timeoutSeconds * 1000));
    });
  } catch (e) {
    return { ...base, status: 'error', ms: elapsed(), error: errorMessage(e) };
  } finally {
    sock?.close();
    if (index !== undefined) await nl.deleteLink(index).catch(() => false);
    if (!opts.netlink) nl.close();
  }
}
