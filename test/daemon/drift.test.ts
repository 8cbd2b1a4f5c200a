// The drift guard's polled reads (agent/daemon/drift.ts KeptReads): a file
// kept open and read from its start sees each new value, one that goes is
// opened again once it is back, and a value is an integer or nothing.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { KeptReads, parseInteger } from '../../agent/daemon/drift';

t.test('KeptReads: the current value at every read, through one descriptor', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbt-drift-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'arp_ignore');
  fs.writeFileSync(file, '1\n');
  const r = new KeptReads();
  t.teardown(() => r.close());
  const fdsBefore = fs.readdirSync('/proc/self/fd').length;
  t.equal(r.read(file), 1);
  const fdsOpen = fs.readdirSync('/proc/self/fd').length;
  t.equal(fdsOpen, fdsBefore + 1, 'one descriptor kept open');
  // Rewritten in place (a sysctl's file is never replaced): read from offset 0 again.
  const fd = fs.openSync(file, 'r+');
  fs.writeSync(fd, '0\n', 0);
  fs.closeSync(fd);
  t.equal(r.read(file), 0, 'a new value is seen');
  for (let i = 0; i < 100; i++) r.read(file);
  t.equal(fs.readdirSync('/proc/self/fd').length, fdsOpen, 'no descriptor per read');
  t.equal(r.read(path.join(dir, 'absent')), undefined, 'a file that cannot be opened: no value');
  fs.writeFileSync(file, 'x\n');
  t.equal(r.read(file), undefined, 'not an integer: no value');
  fs.rmSync(file);
  fs.writeFileSync(file, '2\n');
  t.equal(r.read(file), 2, 'a file gone and back: opened again');
  r.close();
  t.equal(fs.readdirSync('/proc/self/fd').length, fdsBefore, 'close() lets every descriptor go');
});

t.test('KeptReads: a real sysctl, as the guard polls it', async (t) => {
  const file = '/proc/sys/net/ipv4/conf/lo/arp_ignore';
  const r = new KeptReads();
  t.teardown(() => r.close());
  const want = Number(fs.readFileSync(file, 'utf8').trim());
  t.equal(r.read(file), want);
  t.equal(r.read(file), want, 'read again through the kept descriptor');
});

t.test('parseInteger: digits and a line end, or nothing', async (t) => {
  const p = (s: string): number | undefined => { const b = Buffer.from(s); return parseInteger(b, b.length); };
  t.equal(p('1\n'), 1);
  t.equal(p('0'), 0);
  t.equal(p('255\n'), 255);
  t.equal(p('2\t\n'), 2);
  t.equal(p(''), undefined, 'empty');
  t.equal(p('\n'), undefined, 'no digit');
  t.equal(p('-1\n'), undefined, 'negative');
  t.equal(p('1 2\n'), undefined, 'two values');
  t.equal(p('1x\n'), undefined, 'trailing garbage');
  t.equal(p('1234567890123456\n'), undefined, 'too many digits');
  const b = Buffer.from('7\nrest');
  t.equal(parseInteger(b, 2), 7, 'only the bytes read count');
});
