// scripts/setup.sh installs every program the agent, the demo, the tests and
// the bench run (issue 16: the bench's forward area failed on a fresh VM
// because conntrack was missing). The programs are found in the sources -
// the first argument of spawn/execFile/run and of a lab's spawn/exec, the
// commands of the shell scripts a lab runs in a namespace (lab.sh), and the
// bench's per-area tool lists - and each must be in setup.sh's package map,
// be a program of a package there, or belong to Debian's essential set.
import * as fs from 'node:fs';
import * as path from 'node:path';
import t from 'tap';

const ROOT = path.resolve(__dirname, '..', '..', '..');

/** Essential on every Debian/Ubuntu (coreutils, util-linux, bash, libc-bin, dash). */
const ESSENTIAL = new Set(['sh', 'bash', 'env', 'cat', 'timeout', 'nproc', 'mkfifo', 'mount', 'umount', 'unshare', 'nsenter', 'setpriv', 'prlimit', 'getent', 'kill', 'sleep', 'true', 'false',
  'ls', 'wc', 'sed', 'grep', 'awk', 'head', 'tail', 'echo', 'printf', 'test', 'rm', 'mkdir', 'date', 'seq']);
/** Shell words that are not programs. */
const SHELL = new Set(['ulimit', 'for', 'do', 'done', 'if', 'then', 'else', 'fi', 'while', 'in', 'export', 'cd', 'set', 'trap', 'wait', 'read', 'exec', 'times']);
/** Programs that come with a package named in setup.sh under another file. */
const ALSO = new Map([['promtool', 'prometheus'], ['node', 'nodejs (checked by setup.sh itself)'], ['ss', 'iproute2'], ['bridge', 'iproute2'], ['nstat', 'iproute2']]);

/** The commands of a shell script: the first word of each pipeline stage, list element and $(...). */
function shellCommands(script: string): string[] {
  return script.split(/&&|\|\||;|\||\$\(|\n|\bthen\b|\bdo\b|\belse\b/)
    // A variable assignment (`s=$(date +%s%N)`) is not a command; what it runs follows its `$(`.
    .map((part) => /^\s*\(?\s*(?:exec\s+)?([a-z][a-z0-9_.-]*)(?!\S*=)/.exec(part)?.[1])
    .filter((w): w is string => w !== undefined && !SHELL.has(w));
}
/** Run only inside the systemd test container, whose root has them. */
const IN_CONTAINER = new Set(['systemctl', 'journalctl', 'systemd-sysusers']);

function sources(dir: string): string[] {
  const out: string[] = [];
  if (!fs.existsSync(dir)) return out;
  for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) out.push(...sources(p));
    else if (e.name.endsWith('.ts')) out.push(p);
  }
  return out;
}

function programsRun(): Map<string, string> {
  const found = new Map<string, string>();
  const patterns = [
    /\b(?:spawn|spawnSync|execFile|execFileSync|execProgram)\(\s*'([a-z0-9_.-]+)'/g,
    /\brun\(\s*'([a-z0-9_.-]+)',\s*\[/g,
    /\blab\.(?:spawn|exec)\([^,()]+(?:\([^)]*\))?,\s*'([a-z0-9_.-]+)'/g,
    /\bexec\(\s*'([a-z0-9_.-]+)',\s*\[/g,
  ];
  for (const dir of ['agent', 'bench', 'test', 'lab']) {
    for (const f of sources(path.join(ROOT, dir))) {
      const text = fs.readFileSync(f, 'utf8');
      for (const re of patterns) for (const m of text.matchAll(re)) if (!found.has(m[1]!)) found.set(m[1]!, path.relative(ROOT, f));
      // lab.sh(ns, 'ip link set ... && nft ...'): the script's commands.
      for (const m of text.matchAll(/\.sh\([^,()]+(?:\([^)]*\))?,\s*(['`])([\s\S]*?)\1/g)) {
        for (const cmd of shellCommands(m[2]!.replace(/\$\{[^}]*\}/g, 'X'))) if (!found.has(cmd)) found.set(cmd, path.relative(ROOT, f));
      }
      // bench/run.ts: the tools each area checks for before it runs.
      if (path.relative(ROOT, f) !== path.join('bench', 'run.ts')) continue;
      for (const m of text.matchAll(/^\s+[a-z]+: \[((?:'[a-z0-9_.-]+',? ?)*)\],$/gm)) {
        for (const q of m[1]!.matchAll(/'([a-z0-9_.-]+)'/g)) if (!found.has(q[1]!)) found.set(q[1]!, path.relative(ROOT, f));
      }
    }
  }
  return found;
}

function installed(): Set<string> {
  const text = fs.readFileSync(path.join(ROOT, 'scripts', 'setup.sh'), 'utf8');
  return new Set([...text.matchAll(/^\s+\[[a-z0-9.+-]+\]=(\S+)$/gm)].map((m) => path.basename(m[1]!)));
}

t.test('the commands of a lab shell script', async (t) => {
  t.same(shellCommands('ip link set lo up && ip link add br0 type bridge; sysctl -qw a=1'), ['ip', 'ip', 'sysctl']);
  t.same(shellCommands('for l in $(ip -o link show | sed -n p); do ip link del "$l"; done'), ['ip', 'sed', 'ip']);
  t.same(shellCommands('ulimit -n 64 && exec tcpdump -i eth0'), ['tcpdump']);
  t.same(shellCommands('s=$(date +%s%N); for i in $(seq 3); do nft -f a; done; times'), ['date', 'seq', 'nft'], 'an assignment is not a command; times is the shell\'s');
});

t.test('every program the code runs is installed by scripts/setup.sh', async (t) => {
  const have = installed();
  t.ok(have.has('conntrack'), 'conntrack (the bench forward area flushes flows with it)');
  const run = programsRun();
  t.ok(run.size > 20, `programs found in the sources (${run.size}): the scan works`);
  for (const must of ['nft', 'dnsmasq', 'haproxy', 'conntrack', 'systemd-nspawn', 'sysctl', 'ss']) t.ok(run.has(must), `the scan sees ${must}`);
  const missing = [...run].filter(([p]) => !have.has(p) && !ESSENTIAL.has(p) && !ALSO.has(p) && !IN_CONTAINER.has(p));
  t.same(missing.map(([p, f]) => `${p} (run in ${f})`), [], 'nothing the code runs is left for a fresh VM to lack');
});
