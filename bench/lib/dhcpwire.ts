// DHCP exchanges as seen on the wire, for comparing clients on equal terms:
// tcpdump in the DHCP server's namespace stamps every DISCOVER and ACK, and
// the time from a client's first DISCOVER to its first ACK (per
// Client-Ethernet-Address) excludes process start-up and whatever a client
// does after the ACK (lb-agent's RFC 5227 probe, say). The parser is pure;
// the capture runs in a lab namespace and stops with the run.
//
// The capture writes the packets as they are (a pcap file; each packet
// taken and written as it arrives, --immediate-mode -U: a stopped capture
// otherwise loses what still sits in the ring's open block or its buffer) and
// they are decoded after the run: the bench only watches. Decoding while
// capturing (`-vv -l`, ~25 lines a DHCP packet, one write each, read by the
// bench process) ran on the same two cores as the clients it timed, and
// cost more with 50 clients than with one.
import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import type { Lab } from '../../lab/netns';
import { run, waitFor } from '../../lab/netns';

export interface WirePacket { at: number; chaddr: string; type: string }

/** Packets from `tcpdump -n -tt -vv` text (here, of `-r` a capture file): one per timestamped header, with its chaddr and DHCP message type. */
export function parseTcpdumpDhcp(text: string): WirePacket[] {
  const out: WirePacket[] = [];
  let cur: { at: number; chaddr?: string; type?: string } | undefined;
  const flush = (): void => {
    if (cur?.chaddr && cur.type) out.push({ at: cur.at, chaddr: cur.chaddr, type: cur.type });
  };
  for (const line of text.split('\n')) {
    const ts = /^(\d+\.\d+) IP /.exec(line);
    if (ts) { flush(); cur = { at: Number(ts[1]) * 1000 }; continue; }
    if (!cur) continue;
    const mac = /Client-Ethernet-Address ([0-9a-f:]{17})/.exec(line);
    if (mac) cur.chaddr = mac[1];
    const type = /DHCP-Message \(53\), length 1: (\w+)/.exec(line);
    if (type) cur.type = type[1];
  }
  flush();
  return out;
}

/** First DISCOVER to first ACK, ms, per client MAC that got both. */
export function exchangeTimes(packets: readonly WirePacket[]): Map<string, number> {
  const discover = new Map<string, number>();
  const res = new Map<string, number>();
  for (const p of packets) {
    if (p.type === 'Discover' && !discover.has(p.chaddr)) discover.set(p.chaddr, p.at);
    if (p.type === 'ACK' && discover.has(p.chaddr) && !res.has(p.chaddr)) res.set(p.chaddr, p.at - discover.get(p.chaddr)!);
  }
  return res;
}

export interface WireCapture { stop(): Promise<Map<string, number>> }

/**
 * Capture DHCP (UDP 67/68) on `ifname` in `ns` into `file` until stop(),
 * which decodes the file (`tcpdump -r -n -tt -vv`) and returns each
 * client's first DISCOVER -> first ACK, ms. The file is removed after.
 */
export async function startWireCapture(lab: Lab, ns: string, file: string, ifname = 'eth0'): Promise<WireCapture> {
  const proc: ChildProcess = lab.spawn(ns, 'tcpdump', ['-i', ifname, '-n', '-s', '1500', '-U', '--immediate-mode', '-w', file, 'udp and (port 67 or port 68)']);
  let err = '';
  proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
  await waitFor('tcpdump to listen', () => {
    if (proc.exitCode !== null) throw new Error(`tcpdump exited: ${err}`);
    return err.includes('listening on');
  }, 10_000, 20);
  return {
    stop: async () => {
      // Let the last ACK reach the capture socket before tcpdump goes (SIGINT: it writes out what it holds).
      await new Promise((r) => setTimeout(r, 200));
      await new Promise<void>((resolve) => {
        if (proc.exitCode !== null) return resolve();
        const timer = setTimeout(() => { proc.kill('SIGKILL'); resolve(); }, 3000);
        proc.once('exit', () => { clearTimeout(timer); resolve(); });
        proc.kill('SIGINT');
      });
      try {
        const { stdout } = await run('tcpdump', ['-r', file, '-n', '-tt', '-vv'], { timeoutMs: 30_000 });
        return exchangeTimes(parseTcpdumpDhcp(stdout));
      } finally {
        fs.rmSync(file, { force: true });
      }
    },
  };
}
