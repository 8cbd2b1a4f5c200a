// V8 CPU profiles (the .cpuprofile that `node --cpu-prof` and the
// inspector's Profiler.stop write), summarised (pure): where a process's
// busy time went, by self time, in buckets a reader can act on: our code,
// Node's tls and net/streams JavaScript, native work a JavaScript function
// called (a binding: SSL_new, the handshake's first flight, connect(2)),
// native work with no JavaScript on the stack (libuv's callbacks into
// Node's C++: the TLS records read and written, OpenSSL's handshake steps
// on data arriving), and the garbage collector.

export interface CpuProfileNode {
  readonly id: number;
  readonly callFrame: { readonly functionName: string; readonly url: string; readonly lineNumber: number };
  readonly children?: readonly number[];
}

export interface CpuProfile {
  readonly nodes: readonly CpuProfileNode[];
  readonly startTime: number;
  readonly endTime: number;
  /** The node sampled, one per sample. */
  readonly samples: readonly number[];
  /** µs before each sample. */
  readonly timeDeltas: readonly number[];
}

export const PROFILE_BUCKETS = [
  'lb-agent', 'node tls (JS)', 'node net and streams (JS)', 'other JS', 'native, called from JS', 'native, no JS on the stack', 'garbage collector',
] as const;
export type ProfileBucket = (typeof PROFILE_BUCKETS)[number];

/** The bucket of a frame's self time; undefined for idle (the event loop waiting). */
export function bucketOf(frame: CpuProfileNode['callFrame']): ProfileBucket | undefined {
  const { functionName: fn, url } = frame;
  if (fn === '(idle)') return undefined;
  if (fn === '(garbage collector)') return 'garbage collector';
  if (fn === '(program)' || fn === '(root)') return 'native, no JS on the stack';
  // A binding's C++ (TLSWrap's setSession, start; TCPWrap's connect) shows as a frame without a script.
  if (url === '') return 'native, called from JS';
  if (/\/(agent|bench)\//.test(url)) return 'lb-agent';
  if (/^node:(_tls_|tls$|internal\/tls\/)/.test(url)) return 'node tls (JS)';
  if (/^node:(net$|stream$|_stream_|internal\/(streams\/|stream_base_commons|net$|dns))/.test(url)) return 'node net and streams (JS)';
  return 'other JS';
}

export interface ProfileSummary {
  /** ms the profiled thread was busy (everything but idle). */
  readonly busyMs: number;
  readonly profiledMs: number;
  /** Self time per bucket, in PROFILE_BUCKETS order; share of busyMs. */
  readonly buckets: readonly { readonly bucket: ProfileBucket; readonly ms: number; readonly share: number }[];
  /** The frames with the most self time, merged by name and script. */
  readonly top: readonly { readonly name: string; readonly where: string; readonly bucket: ProfileBucket; readonly ms: number; readonly share: number }[];
}

const r1 = (x: number): number => Math.round(x * 10) / 10;
const r3 = (x: number): number => Math.round(x * 1000) / 1000;

/** Self time by bucket and the `top` busiest frames. */
export function summariseProfile(p: CpuProfile, top = 15): ProfileSummary {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const selfUs = new Map<number, number>();
  for (let i = 0; i < p.samples.length; i++) {
    // A sample's delta is the time since the one before: it belongs to the sample it precedes.
    const id = p.samples[i]!;
    selfUs.set(id, (selfUs.get(id) ?? 0) + (p.timeDeltas[i] ?? 0));
  }
  const bucketUs = new Map<ProfileBucket, number>();
  const frameUs = new Map<string, { name: string; where: string; bucket: ProfileBucket; us: number }>();
  let busy = 0;
  for (const [id, us] of selfUs) {
    const n = byId.get(id);
    if (!n) continue;
    const b = bucketOf(n.callFrame);
    if (b === undefined) continue;
    busy += us;
    bucketUs.set(b, (bucketUs.get(b) ?? 0) + us);
    const where = n.callFrame.url === '' ? '' : `${n.callFrame.url.replace(/^file:\/\/.*?\/dist\//, '')}:${n.callFrame.lineNumber + 1}`;
    const name = n.callFrame.functionName || '(anonymous)';
    const key = `${name}\0${where}`;
    const f = frameUs.get(key) ?? { name, where, bucket: b, us: 0 };
    f.us += us;
    frameUs.set(key, f);
  }
  const share = (us: number): number => (busy > 0 ? r3(us / busy) : 0);
  return {
    busyMs: r1(busy / 1000),
    profiledMs: r1((p.endTime - p.startTime) / 1000),
    buckets: PROFILE_BUCKETS.map((bucket) => ({ bucket, ms: r1((bucketUs.get(bucket) ?? 0) / 1000), share: share(bucketUs.get(bucket) ?? 0) })),
    top: [...frameUs.values()].sort((a, b) => b.us - a.us).slice(0, top).map((f) => ({ name: f.name, where: f.where, bucket: f.bucket, ms: r1(f.us / 1000), share: share(f.us) })),
  };
}
