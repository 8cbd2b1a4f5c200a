// lab/agent.ts owns the handle on the real agent binary - the production
// bundle, dist/bundle/lb-agent.js (agent/bundle-build.ts) - inside a lab namespace: write its config, start it, read its JSON logs, ask its control
// socket, signal it. The control socket and state dir live in the lab's
// scratch directory, so they vanish with the lab.
import * as fs from 'node:fs';
import * as path from 'node:path';
import { ChildProcess } from 'node:child_process';
import { stringify } from './yaml';
import { Lab, waitFor, run } from './netns';
import { distPath } from './services';
import { controlRequest } from '../agent/control/server';
import type { StatusDocument } from '../agent/daemon/daemon';
import { onJsonLines } from './jsonlines';

export const AGENT_BIN = distPath('bundle', 'lb-agent.js');
/**
 * The same CLI from tsc's module tree, for a test that observes which of
 * the agent's modules load (the bundle is one file to require()).
 */
export const AGENT_MODULE_TREE_BIN = distPath('agent', 'cli', 'main.js');

const UNIT = path.resolve(__dirname, '..', '..', 'systemd', 'lb-agent.service');

/**
 * The environment the unit runs the agent with (its `Environment=` lines:
 * V8's flags in NODE_OPTIONS and glibc's malloc tunables), so that
 * every lab, test and bench agent runs as the installed one does.
 */
export function unitEnvironment(unit = UNIT): Record<string, string> {
  const env: Record<string, string> = {};
  for (const m of fs.readFileSync(unit, 'utf8').matchAll(/^Environment="?([A-Z_]+)=([^"\n]*)"?$/gm)) env[m[1]!] = m[2]!.trim();
  return env;
}

export interface AgentHandle {
  proc: ChildProcess;
  ns: string;
  configPath: string;
  socket: string;
  stateDir: string;
  logs: Record<string, unknown>[];
  stderr(): string;
  status(): Promise<StatusDocument>;
  writeConfig(cfg: Record<string, unknown>): void;
  signal(sig: NodeJS.Signals): void;
  /** Resolves with the exit code (or the signal) when the process ends. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  /** Wait until a log line matches. */
  waitLog(what: string, pred: (l: Record<string, unknown>) => boolean, timeoutMs?: number): Promise<Record<string, unknown>>;
}

/**
 * LB_AGENT_TEST_ENGINE=nft|ebpf|auto: a whole test file's agents run with
 * that `kernel.engine` (a hand run of a suite against one engine), except
 * where the test's config names one itself. Unset: the config as written.
 */
export function withTestEngine<T extends Record<string, unknown>>(cfg: T, env: NodeJS.ProcessEnv = process.env): T {
  const engine = env['LB_AGENT_TEST_ENGINE'];
  if (engine === undefined || engine === '') return cfg;
  if (!['nft', 'ebpf', 'auto'].includes(engine)) throw new Error(`LB_AGENT_TEST_ENGINE=${JSON.stringify(engine)}: expected nft, ebpf or auto`);
  const kernel = (cfg['kernel'] ?? {}) as Record<string, unknown>;
  if (kernel['engine'] !== undefined) return cfg;
  return { ...cfg, kernel: { ...kernel, engine } };
}

/** withTestEngine for a config's text: a top-level `kernel:` appended where it has none (its lines keep their numbers). */
export function withTestEngineText(text: string, env: NodeJS.ProcessEnv = process.env): string {
  const engine = env['LB_AGENT_TEST_ENGINE'];
  if (engine === undefined || engine === '' || /^kernel:/m.test(text)) return text;
  withTestEngine({}, env);
  return `${text}${text.endsWith('\n') ? '' : '\n'}kernel:\n  engine: ${engine}\n`;
}

let counter = 0;

/** Start `lb-agent run` in ns. cfg is the config as an object; control.socket and stateDir are filled in if absent. */
export async function startAgent(lab: Lab, ns: string, cfg: Record<string, unknown>, opts: { name?: string; waitReady?: boolean; env?: Record<string, string>; logLevel?: string; stateDir?: string; args?: string[]; nofile?: number; command?: string[]; bin?: string } = {}): Promise<AgentHandle> {
  const name = opts.name ?? `agent${counter++}`;
  const stateDir = opts.stateDir ?? (cfg.stateDir as string | undefined) ?? lab.file(`${name}-state`);
  const socket = (cfg.control as { socket?: string } | undefined)?.socket ?? lab.file(`${name}.sock`);
  const configPath = lab.file(`${name}.yaml`);
  // A config must say `services:`; a test that starts an agent without any means none.
  const full = withTestEngine({ services: [], ...cfg, stateDir, control: { socket } });
  fs.writeFileSync(configPath, stringify(full));
  const argv = [opts.bin ?? AGENT_BIN, 'run', '--config', configPath, '--log-level', opts.logLevel ?? 'debug', ...(opts.args ?? [])];
  // nofile: the agent runs under that descriptor limit (soft and hard), as under a unit's LimitNOFILE=.
  // bin: the CLI file to run (AGENT_BIN, the bundle, unless a test observes the module tree).
  // command: run the agent through this command (e.g. `env NODE_OPTIONS=...`).
  // The agent runs with the unit's environment, as installed (opts.env may say otherwise).
  const env = { ...process.env, ...unitEnvironment(), ...(opts.env ?? {}) };
  const proc = opts.command !== undefined
    ? lab.spawn(ns, opts.command[0]!, [...opts.command.slice(1), process.execPath, ...argv], { env })
    : opts.nofile === undefined
      ? lab.spawn(ns, process.execPath, argv, { env })
      : lab.spawn(ns, 'prlimit', [`--nofile=${opts.nofile}:${opts.nofile}`, process.execPath, ...argv], { env });
  const logs: Record<string, unknown>[] = [];
  let err = '';
  onJsonLines(proc.stdout!, (o) => logs.push(o), (line) => logs.push({ raw: line }));
  proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => {
    proc.once('exit', (code, signal) => resolve({ code, signal }));
  });
  const handle: AgentHandle = {
    proc, ns, configPath, socket, stateDir, logs,
    stderr: () => err,
    status: async () => (await controlRequest(socket, 'status', 3000)) as StatusDocument,
    writeConfig: (c) => fs.writeFileSync(configPath, stringify(withTestEngine({ services: [], ...c, stateDir, control: { socket } }))),
    signal: (sig) => { proc.kill(sig); },
    exited,
    waitLog: (what, pred, timeoutMs = 15_000) => waitFor(`agent log: ${what}`, () => logs.find(pred), timeoutMs),
  };
  if (opts.waitReady !== false) {
    await waitFor(`agent ${name} to start`, async () => {
      if (proc.exitCode !== null) throw new Error(`agent exited with ${proc.exitCode}: ${err}\n${logs.map((l) => JSON.stringify(l)).join('\n')}`);
      return logs.some((l) => l.msg === 'lb-agent started');
    }, 30_000);
  }
  return handle;
}

/** Run an lb-agent CLI command inside ns (or on the host when ns is undefined). */
export async function agentCli(lab: Lab | undefined, ns: string | undefined, args: string[], timeoutMs = 20_000): Promise<{ code: number; stdout: string; stderr: string }> {
  if (lab && ns) return lab.exec(ns, process.execPath, [AGENT_BIN, ...args], { allowFail: true, timeoutMs });
  return run(process.execPath, [AGENT_BIN, ...args], { allowFail: true, timeoutMs });
}

/** Wait until the agent's status satisfies pred. */
export async function waitStatus(agent: AgentHandle, what: string, pred: (s: StatusDocument) => boolean, timeoutMs = 20_000): Promise<StatusDocument> {
  let last: StatusDocument | undefined;
  try {
    return await waitFor(what, async () => {
      last = await agent.status();
      return pred(last) ? last : undefined;
    }, timeoutMs, 100);
  } catch (e) {
    throw new Error(`${(e as Error).message}\nlast status: ${JSON.stringify(last?.services, null, 1)}`);
  }
}
