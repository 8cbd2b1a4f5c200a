// Bash completion and lb-agent(8) cover the whole CLI: every command and
// option buildProgram() has (walked here in commander's own objects, not
// through docs.ts), the completion works in a real bash, and the man page is
// well-formed roff (checked without groff).
import t from 'tap';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import type { Command } from 'commander';
import { buildProgram } from '../../agent/cli/main';
import { agentCli } from '../../lab/agent';

/** Every subcommand and its options' flags, straight from commander (help included). */
function walk(program: Command): { name: string; flags: string[]; choices: string[] }[] {
  return program.commands.map((c) => ({
    name: c.name(),
    flags: [...c.options.flatMap((o) => [o.short, o.long]), '-h', '--help'].filter((f): f is string => !!f),
    choices: c.options.flatMap((o) => o.argChoices ?? []),
  }));
}

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-agent-docs-'));
t.teardown(() => fs.rmSync(dir, { recursive: true, force: true }));

t.test('the CLI prints them; an unknown shell is a usage error', async (t) => {
  const c = await agentCli(undefined, undefined, ['completion', 'bash']);
  t.equal(c.code, 0, c.stderr);
  fs.writeFileSync(path.join(dir, 'lb-agent'), c.stdout);
  const m = await agentCli(undefined, undefined, ['man']);
  t.equal(m.code, 0, m.stderr);
  fs.writeFileSync(path.join(dir, 'lb-agent.8'), m.stdout);
  const z = await agentCli(undefined, undefined, ['completion', 'zsh']);
  t.equal(z.code, 2);
  t.match(z.stderr, /Allowed choices are bash/);
});

/** Ask the completion what it offers for a command line (the last word is being completed). */
function complete(words: string[]): string[] {
  const script = `source ${JSON.stringify(path.join(dir, 'lb-agent'))}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(' ')}); COMP_CWORD=${words.length - 1}; _lb_agent; printf '%s\\n' "\${COMPREPLY[@]}"`;
  const r = spawnSync('bash', ['--norc', '-c', script], { encoding: 'utf8', cwd: dir, timeout: 10_000 });
  if (r.status !== 0) throw new Error(`bash: ${r.stderr}`);
  return r.stdout.split('\n').filter(Boolean);
}

t.test('bash completion: registered, and offers every command, option and choice', async (t) => {
  const reg = spawnSync('bash', ['--norc', '-c', `source ${JSON.stringify(path.join(dir, 'lb-agent'))}; complete -p lb-agent`], { encoding: 'utf8', timeout: 10_000 });
  t.equal(reg.stdout.trim(), 'complete -F _lb_agent lb-agent', 'complete -p lb-agent');
  const cmds = walk(buildProgram());
  t.ok(cmds.length >= 9, `${cmds.length} commands`);
  const top = complete(['lb-agent', '']);
  for (const c of cmds) t.ok(top.includes(c.name), `lb-agent <TAB> offers ${c.name}`);
  t.ok(top.includes('help') && top.includes('--version-flag'), 'and help and the global options');
  for (const c of cmds) {
    const offered = complete(['lb-agent', c.name, '-']);
    t.same(c.flags.filter((f) => !offered.includes(f)), [], `lb-agent ${c.name} -<TAB> offers all of ${c.flags.join(' ')}`);
  }
  t.same(complete(['lb-agent', 'status', '--wa']), ['--watch']);
  t.same(complete(['lb-agent', 'run', '--log-level', 'd']), ['debug'], 'an option\'s choices');
  t.same(complete(['lb-agent', 'run', '--on-stop', '']), ['withdraw', 'keep']);
  t.same(complete(['lb-agent', 'completion', 'b']), ['bash'], 'an argument\'s choices');
  t.same(complete(['lb-agent', 'help', 'rel']), ['reload'], 'help completes command names');
  fs.writeFileSync(path.join(dir, 'mine.yaml'), '');
  t.same(complete(['lb-agent', 'reload', '-c', 'mi']), ['mine.yaml'], 'a <path> value completes file names');
  t.same(complete(['lb-agent', 'status', '--interval', '']), [], 'a number is not completed');
});

t.test('lb-agent(8): every command and option, in well-formed roff', async (t) => {
  const man = fs.readFileSync(path.join(dir, 'lb-agent.8'), 'utf8');
  const lines = man.split('\n');
  const macros = lines.filter((l) => l.startsWith('.') && !l.startsWith('.\\"')).map((l) => l.split(/\s/)[0]!);
  t.same([...new Set(macros)].filter((m) => !['.TH', '.SH', '.SS', '.TP', '.B', '.I', '.BR', '.RI', '.br'].includes(m)), [], 'only man(7) macros');
  t.match(lines.find((l) => !l.startsWith('.\\"')), /^\.TH LB-AGENT 8 "[^"]*" "lb-agent \d+\.\d+\.\d+" "System Administration"$/, '.TH first: name, section 8, version');
  const sections = lines.filter((l) => l.startsWith('.SH ')).map((l) => l.slice(4));
  t.same(sections, ['NAME', 'SYNOPSIS', 'DESCRIPTION', 'COMMANDS', 'OPTIONS', 'EXIT STATUS', 'FILES', 'SEE ALSO'], 'the sections man-pages(7) expects, in order');
  t.match(lines[lines.indexOf('.SH NAME') + 1], /^lb-agent \\- \S/, 'NAME is "lb-agent \\- summary" (what whatis/apropos read)');
  t.notOk(lines.some((l) => /^'/.test(l)), 'no text line starts with a control character');
  // The name lb-agent keeps its hyphen; every other one is a minus (options copy-paste as ASCII).
  t.notOk(lines.some((l) => !l.startsWith('.') && /(^|[^\\])-/.test(l.replace(/lb-agent/g, ''))), 'every minus in text is \\-');
  t.notOk(/\\(?![-e&"fF])/.test(man.replace(/\\f[BIR]/g, '')), 'only known escapes');
  const text = man.replace(/\\-/g, '-').replace(/\\f[BIR]/g, '');
  for (const c of walk(buildProgram())) {
    t.ok(lines.includes(`.SS "lb-agent ${c.name} ${c.name === 'help' ? '[command]' : c.name === 'completion' ? '[options] <shell>' : c.name === 'man' ? '[options] [page]' : '[options]'}"`), `a section for ${c.name}`);
    const start = text.indexOf(`.SS "lb-agent ${c.name} `);
    const next = text.indexOf('\n.SS ', start);
    const sect = text.slice(start, next === -1 ? text.indexOf('\n.SH OPTIONS') : next);
    for (const f of c.flags) t.match(sect, new RegExp(`^(.*, )?${f}\\b`, 'm'), `${c.name}: ${f}`);
    for (const ch of c.choices) t.match(sect, ch, `${c.name}: choice ${ch}`);
  }
  for (const code of ['0', '1', '2']) t.ok(lines.includes(`.B ${code}`), `exit status ${code}`);
  t.match(text, /\/etc\/lb-agent\/config\.yaml/);
});
