// The pool source's pure helpers for IPv6 VIPs (the source itself runs on
// the real kernel in test/privileged/ipam-pool*.test.ts): the parent's
// link-local address whatever order its addresses are listed in, the host
// prefix of each family, and the NDP timings taken from the arp: section.
import t from 'tap';
import { linkLocalOf, ndpTimings, poolVipPrefix } from '../../agent/ipam/pool-source';
import { parseAddress } from '../../agent/address';
import { DEFAULT_ARP } from '../../agent/config/defaults';

t.test('the link-local address wherever the parent lists it; none without one', async (t) => {
  const ll = parseAddress('fe80::5054:ff:fe12:3456')!.value;
  t.equal(linkLocalOf([{ address: 'fe80::5054:ff:fe12:3456' }, { address: 'fd00:99::2' }]), ll, 'listed first');
  t.equal(linkLocalOf([{ address: 'fd00:99::2' }, { address: 'fd00:99::200' }, { address: 'fe80::5054:ff:fe12:3456' }]), ll, 'listed after global ones and a VIP');
  t.equal(linkLocalOf([{ address: 'fd00:99::2' }, { address: 'fec0::1' }]), undefined, 'site-local (fec0::/10) is not link-local');
  t.equal(linkLocalOf([{ address: 'febf:ffff::1' }]), parseAddress('febf:ffff::1')!.value, 'febf:: is still in fe80::/10');
  t.equal(linkLocalOf([]), undefined);
});

t.test('a host prefix per family; NDP timings from arp:, DAD off when probing is', async (t) => {
  t.equal(poolVipPrefix('IPv4'), 32);
  t.equal(poolVipPrefix('IPv6'), 128);
  t.same(ndpTimings(DEFAULT_ARP, true), {
    dadTransmits: 1, retransTimerMs: 1000, announceNum: DEFAULT_ARP.announceNum, announceIntervalMs: DEFAULT_ARP.announceInterval * 1000,
    refreshMs: DEFAULT_ARP.refreshInterval * 1000, defendIntervalMs: 10_000,
  });
  t.equal(ndpTimings({ ...DEFAULT_ARP, probeNum: 0 }, true).dadTransmits, 0, 'arp.probeNum 0: no DAD either');
  t.equal(ndpTimings(DEFAULT_ARP, false).dadTransmits, 0, 'no probe (VRRP, or DAD already run): straight to the burst');
});
