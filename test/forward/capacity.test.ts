// The proxy's capacity rule: descriptors -> maxConnections, one home.
import t from 'tap';
import { parseNofile, readNofile, reservedDescriptors, defaultMaxConnections, effectiveMaxConnections, localExhaustionCode } from '../../agent/forward/capacity';

const LIMITS = `Limit                     Soft Limit           Hard Limit           Units
Max cpu time              unlimited            unlimited            seconds
Max open files            256                  4096                 files
Max locked memory         8388608              8388608              bytes
`;

t.test('the soft descriptor limit from /proc/<pid>/limits', async (t) => {
  t.equal(parseNofile(LIMITS), 256);
  t.equal(parseNofile(LIMITS.replace('256   ', 'unlimited')), undefined);
  t.equal(parseNofile('nothing'), undefined);
  t.ok((readNofile() ?? 0) > 0, 'this process has one');
});

t.test('two descriptors per connection after a reserve of a quarter, 128 to 1024', async (t) => {
  t.equal(reservedDescriptors(256), 128);
  t.equal(defaultMaxConnections(256), 64);
  t.equal(defaultMaxConnections(1024), 384);
  t.equal(defaultMaxConnections(65536), 32256);
  t.equal(defaultMaxConnections(32), 1, 'never below one');
  t.equal(effectiveMaxConnections(500, 256), 500, 'configured wins');
  t.equal(effectiveMaxConnections(undefined, 256), 64);
});

t.test('own exhaustion codes', async (t) => {
  for (const code of ['EMFILE', 'ENFILE', 'ENOBUFS']) t.equal(localExhaustionCode({ code }), code);
  for (const code of ['ECONNREFUSED', 'ETIMEDOUT', undefined]) t.equal(localExhaustionCode({ code }), undefined);
  t.equal(localExhaustionCode(undefined), undefined);
});
