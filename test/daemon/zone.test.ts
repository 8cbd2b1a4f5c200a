// This node's zone (agent/daemon/zone.ts): read for a config, the one it
// replaced returned, the labels file polled so a rewrite reaches the owner,
// nothing polled after stop().
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import t from 'tap';
import { NodeZone, placeOf } from '../../agent/daemon/zone';
import type { NodeTopology } from '../../agent/config/labels';
import type { Desired } from '../../agent/config/types';
import { silentLogger } from '../../agent/log';

const config = { node: { name: 'n' }, services: [] } as unknown as Desired;

t.test('read returns the zone it replaced; a rewrite of the labels file reaches the owner until stop', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbagent-zone-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const file = path.join(dir, 'labels');
  fs.writeFileSync(file, 'a');
  let zone = 'zone-a';
  let rewrites = 0;
  const z = new NodeZone({
    log: silentLogger(),
    read: () => Promise.resolve({ zone, region: 'r1', zoneFrom: 'labels-file', regionFrom: 'labels-file', labelsFile: file, problem: undefined } satisfies NodeTopology),
    onRewrite: () => { rewrites++; },
  });
  t.equal(z.current.zone, undefined, 'unknown before the first read');
  const before = await z.read(config);
  t.equal(before.zone, undefined);
  t.equal(z.current.zone, 'zone-a');
  t.equal(placeOf(z.current), 'zone-a (region r1)');
  zone = 'zone-b';
  await new Promise((r) => setTimeout(r, 50));
  fs.writeFileSync(file, 'bb');
  const deadline = Date.now() + 6000;
  while (rewrites === 0 && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
  t.ok(rewrites >= 1, 'the rewrite was seen');
  t.equal((await z.read(config)).zone, 'zone-a', 'the owner re-reads; the old zone comes back as the one replaced');
  z.stop();
  const seen = rewrites;
  fs.writeFileSync(file, 'ccc');
  await new Promise((r) => setTimeout(r, 2500));
  t.equal(rewrites, seen, 'nothing after stop');
  t.equal(placeOf({ ...z.current, zone: undefined, region: undefined }), 'unknown');
});
