// bench/lib/cpuprofile.ts: a V8 CPU profile's self time by bucket and by
// frame, idle left out of the busy time.
import t from 'tap';
import { bucketOf, summariseProfile, type CpuProfile } from '../../../bench/lib/cpuprofile';

const frame = (functionName: string, url = '', lineNumber = 0): CpuProfile['nodes'][number]['callFrame'] => ({ functionName, url, lineNumber });

t.test('buckets: our code, Node\'s tls and net JavaScript, native work with and without JavaScript on the stack, GC', async (t) => {
  t.equal(bucketOf(frame('(idle)')), undefined, 'idle is not busy time');
  t.equal(bucketOf(frame('(garbage collector)')), 'garbage collector');
  t.equal(bucketOf(frame('(program)')), 'native, no JS on the stack');
  t.equal(bucketOf(frame('setSession')), 'native, called from JS', 'a binding without a script');
  t.equal(bucketOf(frame('httpsProbe', 'file:///w/dist/agent/health/probe.js')), 'lb-agent');
  t.equal(bucketOf(frame('TLSSocket._init', 'node:_tls_wrap')), 'node tls (JS)');
  t.equal(bucketOf(frame('connect', 'node:tls')), 'node tls (JS)');
  t.equal(bucketOf(frame('Socket', 'node:net')), 'node net and streams (JS)');
  t.equal(bucketOf(frame('onStreamRead', 'node:internal/stream_base_commons')), 'node net and streams (JS)');
  t.equal(bucketOf(frame('Readable.push', 'node:internal/streams/readable')), 'node net and streams (JS)');
  t.equal(bucketOf(frame('emit', 'node:events')), 'other JS');
  t.equal(bucketOf(frame('observe', 'file:///w/node_modules/prom-client/lib/histogram.js')), 'other JS');
});

t.test('self time from samples and their deltas, merged by frame, shares of the busy time', async (t) => {
  const p: CpuProfile = {
    nodes: [
      { id: 1, callFrame: frame('(root)'), children: [2, 3, 4, 5] },
      { id: 2, callFrame: frame('(idle)') },
      { id: 3, callFrame: frame('(program)') },
      { id: 4, callFrame: frame('httpsProbe', 'file:///w/dist/agent/health/probe.js', 281), children: [6] },
      { id: 5, callFrame: frame('(garbage collector)') },
      { id: 6, callFrame: frame('setSession') },
      // The same function reached by another path: one line in the top list.
      { id: 7, callFrame: frame('httpsProbe', 'file:///w/dist/agent/health/probe.js', 281) },
    ],
    startTime: 0,
    endTime: 10_000,
    samples: [2, 3, 3, 4, 6, 6, 6, 5, 7, 2],
    timeDeltas: [1000, 1000, 1000, 500, 1000, 1000, 1000, 500, 500, 2500],
  };
  const s = summariseProfile(p, 3);
  t.equal(s.busyMs, 6.5, 'idle (3.5 ms) left out');
  t.equal(s.profiledMs, 10);
  const b = Object.fromEntries(s.buckets.map((x) => [x.bucket, x.ms]));
  t.same(b, { 'lb-agent': 1, 'node tls (JS)': 0, 'node net and streams (JS)': 0, 'other JS': 0, 'native, called from JS': 3, 'native, no JS on the stack': 2, 'garbage collector': 0.5 });
  t.equal(s.buckets.find((x) => x.bucket === 'native, called from JS')!.share, 0.462);
  t.same(s.top.map((x) => [x.name, x.where, x.ms]), [['setSession', '', 3], ['(program)', '', 2], ['httpsProbe', 'agent/health/probe.js:282', 1]]);
});
