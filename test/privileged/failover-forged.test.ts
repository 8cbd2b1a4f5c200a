// Privileged: forged VRRP adverts from another namespace - wrong TTL, bad
// checksum, wrong version, wrong type, truncated, wrong length - built with our codec and
// sent through a real packet socket (fixtures/failover-forge.ts), each
// claiming priority 255 for the VRID. Nothing changes on the real routers;
// every frame is counted by reason. A control frame that is valid proves the
// path: it does make the Master yield.
import t from 'tap';
import { requirePrivileged } from '../helpers/privileged';
import { createLab } from '../../lab/netns';
import { encodeAdvertisement, type EncodeOptions } from '../../agent/failover/codec';
import { internetChecksum } from '../../agent/net/packet/inet';
import { parseIPv4 } from '../../agent/address';
import { RouterProc, forge } from './fixtures/failover-client';

if (requirePrivileged(t)) {
  const INTERVAL = 0.2;
  const R1 = '10.99.0.11';
  const R2 = '10.99.0.12';
  const EVIL = '10.99.0.66';

  t.test('forged adverts change nothing and are counted by reason', async (t) => {
    const lab = await createLab(t);
    const n1 = await lab.addHost('r1', { address: `${R1}/24` });
    const n2 = await lab.addHost('r2', { address: `${R2}/24` });
    const evil = await lab.addHost('evil', { address: `${EVIL}/24` });
    // The lab bridge checks IPv4 headers where a plain switch does not:
    // multicast snooping (ip_mc_check_iphdr) drops a datagram shorter than its
    // total length (br_netfilter would too; every lab turns that off). Turn it
    // off on our own bridge so the truncated frame reaches the routers.
    await lab.sh(lab.lan, 'ip link set br0 type bridge mcast_snooping 0');
    const r1 = await RouterProc.start(lab, n1, 'r1', { srcIp: R1, priority: 150, interval: INTERVAL });
    await r1.waitEvent('master', (e) => e.event === 'master');
    const r2 = await RouterProc.start(lab, n2, 'r2', { srcIp: R2, priority: 100, interval: INTERVAL });
    await r2.waitEvent('follows r1', (e) => e.event === 'master-changed' && e.master === R1);

    const base: EncodeOptions = { vrid: 51, priority: 255, maxAdverIntCs: 20, addresses: [parseIPv4('10.99.0.100')!], srcIp: parseIPv4(EVIL)! };
    const badChecksum = encodeAdvertisement(base);
    badChecksum[14 + 20 + 7]! ^= 0x5a;
    const truncated = encodeAdvertisement(base).subarray(0, 14 + 20 + 6); // IP says 32 octets, 26 arrive
    // Count says 2 addresses, 1 present; IP header consistent (re-checksummed).
    const short = encodeAdvertisement({ ...base, addresses: [parseIPv4('10.99.0.100')!, parseIPv4('10.99.0.101')!] });
    const badLength = Buffer.concat([short.subarray(0, short.length - 4)]);
    badLength.writeUInt16BE(badLength.length - 14, 16);
    badLength.writeUInt16BE(0, 24);
    badLength.writeUInt16BE(internetChecksum(badLength, 14, 34), 24);
    const frames: [string, Buffer][] = [
      ['bad-ttl', encodeAdvertisement({ ...base, ttl: 64 })],
      ['bad-checksum', badChecksum],
      ['bad-version', encodeAdvertisement({ ...base, version: 2 })],
      ['bad-type', encodeAdvertisement({ ...base, type: 2 })],
      ['truncated', truncated],
      ['bad-length', badLength],
    ];
    const REPEAT = 10;
    const from1 = r1.events.length;
    const from2 = r2.events.length;
    const sent = await forge(lab, evil, frames.map(([, f]) => f), { repeat: REPEAT, gapMs: 30 });
    t.equal(sent, frames.length * REPEAT);
    // Let a few Master_Down_Intervals pass: a forged 255 that got through would show.
    await new Promise((res) => setTimeout(res, 1500));
    t.equal(r1.state, 'master', 'r1 is still Master');
    t.equal(r2.state, 'backup', 'r2 is still Backup');
    t.equal(r2.master, R1, 'r2 still follows r1');
    for (const r of [r1, r2]) {
      const from = r === r1 ? from1 : from2;
      t.same(r.events.slice(from).filter((e) => e.event !== 'dropped').map((e) => e.event), [], `${r.name}: no transition, no master change`);
      for (const [reason] of frames) {
        t.equal(await r.metric(`lbagent_vrrp_dropped_total{reason="${reason}"}`), REPEAT, `${r.name}: ${REPEAT} x ${reason} counted`);
      }
    }
    t.equal(await r1.metric('lbagent_vrrp_transitions_total{vrid="51",to="backup"}'), 1, 'r1 only ever entered Backup at startup');

    // Control: the same advert, valid, from the same namespace does win.
    await forge(lab, evil, [encodeAdvertisement(base)]);
    await r1.waitEvent('r1 yields to a valid priority 255', (e) => e.event === 'backup' && e.master === EVIL, 3000, from1);
    t.pass('a valid advert through the same path is obeyed: the drops above were the checks, not the path');
    t.equal(await r1.metric('lbagent_vrrp_split_brain_total{vrid="51"}'), 1, 'yielding as Master is counted as split brain');
  });
}
