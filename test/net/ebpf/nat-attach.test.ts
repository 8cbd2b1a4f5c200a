// nat-attach.ts: what can be told without the kernel (the engine's load,
// attach and counters run in test/privileged/forward-ebpf-nat.test.ts).
import t from 'tap';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as os from 'node:os';
import { isLbError } from '../../../agent/errors';
import { NatEngine, mountBpffs, natCounterKey, natPinDir, possibleCpus, probeNatHere } from '../../../agent/net/ebpf/nat-attach';

t.test('possible CPUs from the kernel\'s list', async (t) => {
  t.equal(possibleCpus('0-1\n'), 2);
  t.equal(possibleCpus('0'), 1);
  t.equal(possibleCpus('0,2-5'), 6);
  t.ok(possibleCpus() >= 1, 'this machine\'s');
});

t.test('an addon without libbpf loading is refused with the engine\'s code and the reason', async (t) => {
  try {
    new NatEngine({ device: 'eth0', pinDir: '/tmp/x', bpf: 'libbpf is not installed (libbpf.so.1: cannot open shared object file)' as never });
    t.fail('constructed');
  } catch (err) {
    t.ok(isLbError(err) && err.code === 'LB_ERR_FORWARD_NAT_BPF');
    t.match((err as Error).message, /libbpf is not installed/);
  }
});

t.test('the probe names a missing object file and how to build it', async (t) => {
  const missing = path.join(os.tmpdir(), 'no-such-dir', 'nat.bpf.o');
  const why = probeNatHere({ pinDir: '/tmp/unused', objectPath: missing });
  t.match(why, new RegExp(`${missing.replace(/[.]/g, '\\.')} is not built .*clang and libbpf-dev`));
});

t.test('names', async (t) => {
  t.equal(natPinDir('eth0'), '/sys/fs/bpf/lb-agent/nat-eth0');
  t.equal(natCounterKey('default/web', 'TCP/80', '10.0.0.11'), 'default/web\u0000TCP/80\u000010.0.0.11');
});

t.test('a BPF file system: there already, mounted, or why not', async (t) => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lbnat-unit-'));
  t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));
  const asked: string[] = [];
  const refused = mountBpffs(dir, (d) => { asked.push(d); throw new Error('mount: permission denied\nmore'); });
  t.same(asked, [dir], 'a directory on another file system: a mount is tried there');
  t.equal(refused, `no BPF file system at ${dir}, and mounting one failed (mount: permission denied); mount -t bpf bpf ${dir}`, 'a refused mount: why, and the command');
  t.equal(mountBpffs(dir, () => undefined), `no BPF file system at ${dir} after mounting one`, 'a mount that left no bpffs is not taken for one');
  t.match(mountBpffs(path.join(dir, 'absent'), () => undefined), /absent: .*ENOENT/, 'no such directory: said');
});
