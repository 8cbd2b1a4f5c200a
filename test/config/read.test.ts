// Reading the config file with limits: fstat decides before a byte is read.
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawn } from 'node:child_process';
import { readConfigText, readConfigTextAsync, refuseStat, MAX_CONFIG_BYTES } from '../../agent/config/read';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-read-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
const f = (name: string): string => path.join(dir, name);

fs.writeFileSync(f('good.yaml'), 'services: []\n');
fs.symlinkSync(f('good.yaml'), f('link.yaml'));
fs.symlinkSync('/dev/zero', f('zero.yaml'));
fs.writeFileSync(f('big.yaml'), '');
fs.truncateSync(f('big.yaml'), 20_000_000);
fs.writeFileSync(f('limit.yaml'), Buffer.alloc(MAX_CONFIG_BYTES, 0x23));
fs.writeFileSync(f('over.yaml'), Buffer.alloc(MAX_CONFIG_BYTES + 1, 0x23));

for (const [name, read] of [['sync', async (p: string) => readConfigText(p)], ['async', readConfigTextAsync]] as const) {
  t.test(`${name}: what is read and what is refused`, async (t) => {
    t.same(await read(f('good.yaml')), { ok: true, text: 'services: []\n' });
    t.same(await read(f('link.yaml')), { ok: true, text: 'services: []\n' }, 'a symlink to a regular file');
    const cases: [string, string][] = [
      ['zero.yaml', 'not a regular file'],
      ['big.yaml', 'it is 20000000 bytes, more than the 4194304-byte limit (4 MiB)'],
      ['over.yaml', 'more than the 4194304-byte limit'],
      ['.', 'is a directory'],
      ['missing.yaml', 'no such file'],
    ];
    for (const [file, why] of cases) {
      const started = Date.now();
      const r = await read(f(file));
      t.equal(r.ok, false, `${file} refused`);
      if (!r.ok) t.match(r.errors[0]!.message, why);
      t.ok(Date.now() - started < 200, `${file} refused in ${Date.now() - started} ms`);
    }
    const lim = await read(f('limit.yaml'));
    t.ok(lim.ok && lim.text.length === MAX_CONFIG_BYTES, 'exactly 4 MiB is accepted');
  });
}

t.test('a FIFO is refused without waiting for a writer', async (t) => {
  const fifo = f('fifo.yaml');
  const r = await new Promise<{ code: number | null }>((resolve) => {
    const p = spawn('mkfifo', [fifo]);
    p.on('exit', (code: number | null) => resolve({ code }));
    p.on('error', () => resolve({ code: -1 }));
  });
  if (r.code !== 0) { t.comment('mkfifo not available'); return; }
  const sync = readConfigText(fifo);
  t.equal(sync.ok, false);
  if (!sync.ok) t.match(sync.errors[0]!.message, 'not a regular file');
  const as = await readConfigTextAsync(fifo);
  t.equal(as.ok, false);
});

t.test('refuseStat is the one rule', async (t) => {
  const st = (file: boolean, dir: boolean, size: number) => ({ isFile: () => file, isDirectory: () => dir, size });
  t.equal(refuseStat(st(true, false, 10)), undefined);
  t.match(refuseStat(st(false, false, 0))!, 'not a regular file');
  t.match(refuseStat(st(false, true, 0))!, 'directory');
  t.match(refuseStat(st(true, false, 11), 10)!, 'more than the 10-byte limit');
});
