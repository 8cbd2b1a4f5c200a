// The per-family wire face of VRRP and the keys the state machine compares:
// both families round-trip through one interface, an IPv6 address gets a key
// on the right side of ours (the §6.4.3 tie-break), keys are stable, and the
// table a flood of forged senders fills stays bounded without losing the
// current Master.
import t from 'tap';
import { MachineKeys, vrrpWire } from '../../agent/failover/wire';
import { parseAddress } from '../../agent/address';

t.test('each family: its EtherType, group, virtual MAC and codec; addresses as canonical text', async (t) => {
  const v4 = vrrpWire('IPv4');
  const v6 = vrrpWire('IPv6');
  t.same([v4.ethertype, v4.group, v4.multicastMac.toString('hex'), v4.virtualMac(51).toString('hex')], [0x0800, '224.0.0.18', '01005e000012', '00005e000133']);
  t.same([v6.ethertype, v6.group, v6.multicastMac.toString('hex'), v6.virtualMac(51).toString('hex')], [0x86dd, 'ff02::12', '333300000012', '00005e000233']);
  t.equal(v6.parse('FE80:0:0::0001'), 'fe80::1');
  t.equal(v6.parse('10.0.0.1'), undefined, 'an IPv4 address is not an IPv6 instance\'s');
  t.equal(v4.parse('fe80::1'), undefined);
  for (const [w, src, addrs] of [[v4, '10.99.0.2', ['10.99.0.100']], [v6, 'fe80::2', ['fd00:99::200', '2001:db8::1']]] as const) {
    const frame = w.encode({ vrid: 9, priority: 77, maxAdverIntCs: 25, addresses: addrs, src, srcMac: w.virtualMac(9) });
    const d = w.decode(frame);
    t.same(d, { ok: true, advert: { vrid: 9, priority: 77, maxAdverIntCs: 25, src, addresses: addrs } }, `${w.family} round trip`);
    t.same(vrrpWire(w.family === 'IPv4' ? 'IPv6' : 'IPv4').decode(frame), { ok: false, reason: 'not-vrrp' }, `${w.family} is not the other family's`);
  }
});

t.test('MachineKeys: IPv4 keys are the address; IPv6 keys order every sender against us as the addresses do', async (t) => {
  const k4 = new MachineKeys('IPv4', '10.0.0.5');
  t.equal(k4.key('10.0.0.6'), 0x0a000006);
  t.equal(k4.address(0x0a000006), '10.0.0.6');
  const k = new MachineKeys('IPv6', 'fe80::5');
  const own = k.key('fe80::5');
  const senders = ['fe80::4', 'fe80::6', 'fe80::1:0', 'fe80::', 'fd00::ffff', 'fe80::5:0:0:0', 'fe80::4'];
  for (const s of senders) {
    const key = k.key(s);
    t.ok(Number.isInteger(key) && key >= 0 && key <= 0xffffffff, `${s}: a u32`);
    t.equal(key > own, cmp(s, 'fe80::5') > 0, `${s} is ${cmp(s, 'fe80::5') > 0 ? 'greater' : 'smaller'} than ours, and so is its key`);
    t.equal(k.address(key), s, 'and back');
  }
  t.equal(k.key('fe80::4'), k.key('fe80::4'), 'stable');
  t.equal(k.size, 7, 'ours and six others');
  const moved = k.setOwn('fe80::7');
  t.ok(k.key('fe80::6') < moved && k.key('fe80::8') > moved, 'a new own address orders afresh');
});

t.test('MachineKeys: a flood of senders is bounded and keeps the current Master', async (t) => {
  const k = new MachineKeys('IPv6', 'fe80::8000', 16);
  const master = k.key('fe80::9000');
  let clashes = 0;
  let largest = 0;
  for (let i = 0; i < 1000; i++) {
    if (k.key(`fe80::${(i + 1).toString(16)}:1`, master) === master) clashes++;
    largest = Math.max(largest, k.size);
  }
  t.equal(clashes, 0, 'no sender gets the kept key');
  t.ok(largest <= 16, `the table never outgrew its limit (${largest})`);
  t.equal(k.address(master), 'fe80::9000', 'the kept Master keeps its key');
  t.ok(k.size <= 16, `at most the limit (${k.size})`);
});

/** Compare two IPv6 addresses by value (agent/address.ts parses them). */
function cmp(a: string, b: string): number {
  const x = parseAddress(a)!.value;
  const y = parseAddress(b)!.value;
  return x > y ? 1 : x < y ? -1 : 0;
}
