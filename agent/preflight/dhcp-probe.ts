// Preflight, driver layer: `lb-agent check --dhcp-probe`. Asks the LAN of the
// parent interface whether a DHCP server answers, the way the agent will ask:
// a DISCOVER from a throwaway, locally administered MAC on a temporary
// macvlan (mode bridge), sent and received on an AF_PACKET socket. Only a
// DISCOVER is sent, never a REQUEST, so no lease is taken (RFC 2131 §4.3.1: a
// server commits nothing before a REQUEST). The macvlan is deleted before
// returning, and one left by a killed probe is removed by the next.
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import { realClock, type Clock, type TimerHandle } from '../clock';
import { errorMessage } from '../errors';
import {
  buildClientMessage, decodeReply, encodeDhcp, encodeUdpFrame, BROADCAST_IP, BROADCAST_MAC, DHCP_CLIENT_FILTER,
} from '../dhcp/codec';
import { openPacketSocket, interfaceIndex, ETH_P_IP, type PacketSocket, type FrameInfo } from '../net/packet';
import { formatIPv4, formatMac } from '../ipv4';
import type { DhcpProbeFacts } from './facts';

/** Link name prefix of the probe's temporary macvlan: "lbchk<pid>". */
export const PROBE_LINK_PREFIX = 'lbchk';

export interface DhcpProbeOptions {
  /** How long to wait for an OFFER (default 5 s). */
  timeoutSeconds?: number;
  /** Resend the DISCOVER at these offsets (ms) while waiting (default 1 s and 3 s). */
  retransmitMs?: readonly number[];
  clock?: Clock;
  /** The `ip` binary. */
  ip?: string;
}

function ipCmd(ip: string, args: string[]): Promise<{ ok: boolean; err: string }> {
  return new Promise((resolve) => {
    execFile(ip, args, { timeout: 5000, env: { ...process.env, LC_ALL: 'C' } }, (err, _out, stderr) => {
      resolve({ ok: !err, err: (stderr || (err ? err.message : '')).trim() });
    });
  });
}

/** Remove probe links whose process is gone (a probe killed mid-way). */
async function sweepStale(ip: string): Promise<void> {
  let names: string[] = [];
  try { names = await fs.promises.readdir('/sys/class/net'); } catch { return; }
  for (const n of names) {
    const m = new RegExp(`^${PROBE_LINK_PREFIX}(\\d+)$`).exec(n);
    if (!m) continue;
    const pid = Number(m[1]);
    let alive = true;
    try { process.kill(pid, 0); } catch (e) { alive = (e as NodeJS.ErrnoException).code === 'EPERM'; }
    if (!alive) await ipCmd(ip, ['link', 'del', 'dev', n]);
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
  const ip = opts.ip ?? 'ip';
  const timeoutSeconds = opts.timeoutSeconds ?? 5;
  const retransmit = opts.retransmitMs ?? [1000, 3000];
  const mac = throwawayMac();
  const link = `${PROBE_LINK_PREFIX}${process.pid}`;
  const base = { interface: parent, mac, timeoutSeconds };
  const started = clock.now();
  const elapsed = (): number => Math.round(clock.now() - started);

  await sweepStale(ip);
  const add = await ipCmd(ip, ['link', 'add', 'link', parent, 'name', link, 'address', mac, 'type', 'macvlan', 'mode', 'bridge']);
  if (!add.ok) return { ...base, status: 'error', ms: elapsed(), error: `cannot create a macvlan on ${parent}: ${add.err}` };
  let sock: PacketSocket | undefined;
  try {
    // No IPv6 on the probe link: no DAD, router or MLD chatter from a MAC that exists for a second.
    try { fs.writeFileSync(`/proc/sys/net/ipv6/conf/${link}/disable_ipv6`, '1'); } catch { /* no IPv6 in this kernel */ }
    const up = await ipCmd(ip, ['link', 'set', 'dev', link, 'up']);
    if (!up.ok) return { ...base, status: 'error', ms: elapsed(), error: `cannot bring ${link} up: ${up.err}` };

    const xid = randomBytes(4).readUInt32BE(0);
    const macBuf = Buffer.from(mac.split(':').map((x) => parseInt(x, 16)));
    const dhcp = encodeDhcp(buildClientMessage(
      { kind: 'DISCOVER', xid, secs: 0, ciaddr: 0, requestedIp: undefined, serverId: undefined },
      // RFC 2132 §9.14: client identifier = hardware type 1 + MAC.
      { mac, clientId: Buffer.concat([Buffer.from([1]), macBuf]), hostname: undefined },
    ));
    const frame = encodeUdpFrame({ srcMac: mac, dstMac: BROADCAST_MAC, srcIp: 0, dstIp: BROADCAST_IP, payload: dhcp });

    const s = openPacketSocket({ ifindex: interfaceIndex(link), protocol: ETH_P_IP, filter: DHCP_CLIENT_FILTER });
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
    await ipCmd(ip, ['link', 'del', 'dev', link]);
  }
}
