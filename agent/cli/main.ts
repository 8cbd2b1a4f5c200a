#!/usr/bin/env node
// The lb-agent command line (commander): parse, dispatch, print, exit.
// Exit codes: 0 success, 1 failure at run time (or a failed check),
// 2 bad usage or an invalid config. No logic beyond parsing and printing.
import { Argument, Command, CommanderError, InvalidArgumentError, Option } from 'commander';
import { DEFAULT_CONFIG_PATH, DEFAULTS } from '../config/defaults';
import { controlSocketOf, type ConfigError } from '../config/load';
import { readConfigText } from '../config/read';
import { LOG_LEVELS, LogLevel } from '../log';
import { controlRequest, controlStream } from '../control/server';
import { formatStatus } from './format';
import type { StatusDocument } from '../daemon/daemon';
import { VERSION } from '../version';
import { LbError, errorMessage, isLbError } from '../errors';

export const EXIT = { OK: 0, FAILURE: 1, USAGE: 2 } as const;
/** For the man page: what each exit code means (the header comment's contract). */
const EXIT_MEANINGS = [
  [EXIT.OK, 'success (a valid config, a passed check, an applied reload; `status --watch` stopped by Ctrl-C)'],
  [EXIT.FAILURE, 'failure at run time: the daemon cannot be reached, a check failed, something could not be removed'],
  [EXIT.USAGE, 'bad usage, or an invalid config (validate, run, a refused reload)'],
] as const;
const RELOAD_TIMEOUT_MS = 60_000;

/** --interval: seconds, 0.1 to 3600. */
function parseInterval(v: string): number {
  const n = Number(v);
  if (!/^\d+(\.\d+)?$/.test(v) || !(n >= 0.1 && n <= 3600)) throw new InvalidArgumentError('seconds between 0.1 and 3600, e.g. 2 or 0.5');
  return n;
}

function out(s: string): void { process.stdout.write(s); }
function err(s: string): void { process.stderr.write(s); }

/**
 * A reader that closed our stdout (`lb-agent status --json | head -1`) has
 * all it wants: the command is done, and exits 0 without a word, as `head`
 * expects of what feeds it. Any other error on stdout is reported on stderr.
 * Returns what takes the handler off (the daemon's stdout is its log's).
 */
export function exitQuietlyOnClosedPipe(stdout: NodeJS.WriteStream = process.stdout): () => void {
  const onError = (e: NodeJS.ErrnoException): void => {
    if (e.code === 'EPIPE') process.exit(EXIT.OK);
    err(`lb-agent: cannot write the output: ${errorMessage(e)}\n`);
    process.exit(EXIT.FAILURE);
  };
  stdout.on('error', onError);
  return () => stdout.off('error', onError);
}

/** closedPipeHandler: what takes exitQuietlyOnClosedPipe's handler off; `run` calls it. */
export function buildProgram(closedPipeHandler?: () => void): Command {
  const program = new Command();
  program
    .name('lb-agent')
    .description('Load-balancer data plane for VMs on an L2 network')
    .version(VERSION, '-V, --version-flag', 'print the version')
    .showHelpAfterError('(run lb-agent --help for usage)')
    .exitOverride()
    .configureOutput({ writeOut: out, writeErr: err });

  const configOpt = (): Option => new Option('-c, --config <path>', 'configuration file').default(DEFAULT_CONFIG_PATH);
  const logOpt = (): Option => new Option('--log-level <level>', 'log level').choices([...LOG_LEVELS]).default('info');

  program.command('run')
    .description('run the daemon (systemd starts this)')
    .addOption(configOpt()).addOption(logOpt())
    .addOption(new Option('--on-stop <what>', 'on SIGTERM: withdraw VIPs, links and forwarding, or keep them serving for the next process (a restart; `lb-agent withdraw` takes them off)').choices(['withdraw', 'keep']).default('withdraw'))
    .option('--replace', 'take over from the agent running with this config, outside systemd: its listening sockets are handed over on the control socket and it stops leaving the data path serving (no request fails); without one running, start as usual')
    .action(async (opts: { config: string; logLevel: LogLevel; onStop: 'withdraw' | 'keep'; replace?: boolean }) => {
      closedPipeHandler?.();
      const { runDaemon } = await import('../daemon/main');
      process.exitCode = await runDaemon({ configPath: opts.config, logLevel: opts.logLevel, onStop: opts.onStop, replace: opts.replace === true });
    });

  program.command('withdraw')
    .description('take every VIP, service link and forwarding rule the agent left off the LAN (no daemon may run); leases and claims are kept')
    .addOption(configOpt()).addOption(logOpt())
    .option('--unless-restarting', 'do nothing unless systemd is stopping the unit (ExecStopPost: a restart or a crash recovery keeps serving)')
    .option('--json', 'print the result as JSON')
    .action(async (opts: { config: string; logLevel: LogLevel; unlessRestarting?: boolean; json?: boolean }) => {
      const { withdrawAll } = await import('../daemon/withdraw');
      const { createLogger } = await import('../log');
      const r = await withdrawAll({ configPath: opts.config, unlessRestarting: !!opts.unlessRestarting, log: createLogger(opts.json ? 'error' : opts.logLevel, process.stderr) });
      if (opts.json) out(`${JSON.stringify(r)}\n`);
      else if (r.kept) out(`kept: ${r.kept}\n`);
      else out(`withdrew ${r.removed.length} item(s)${r.removed.length ? `: ${r.removed.join(', ')}` : ''}\n${r.problems.map((p) => `problem: ${p}\n`).join('')}`);
      process.exitCode = r.problems.length > 0 ? EXIT.FAILURE : EXIT.OK;
    });

  program.command('validate')
    .description('check a configuration file and print every error in it')
    .addOption(configOpt()).addOption(logOpt())
    .option('--json', 'print the result as JSON')
    .action(async (opts: { config: string; json?: boolean }) => {
      // Read (fstat-checked) before the parser and schema are even loaded: a
      // device, FIFO or oversized file is refused in the time node takes to start.
      const read = readConfigText(opts.config);
      const { parseConfigText, formatConfigErrors } = await import('../config/load');
      const res = read.ok ? parseConfigText(read.text) : read;
      if (opts.json) {
        out(`${JSON.stringify(res.ok ? { ok: true, services: res.config.services.length } : { ok: false, errors: res.errors }, null, 2)}\n`);
      } else if (res.ok) {
        out(`${opts.config}: valid (${res.config.services.length} service${res.config.services.length === 1 ? '' : 's'})\n`);
      } else {
        err(`${formatConfigErrors(res.errors, opts.config)}\n${opts.config}: ${res.errors.length} error${res.errors.length === 1 ? '' : 's'}\n`);
      }
      process.exitCode = res.ok ? EXIT.OK : EXIT.USAGE;
    });

  program.command('check')
    .description('preflight: can lb-agent run on this machine with this config? (cloud-init runs this)')
    .addOption(configOpt()).addOption(logOpt())
    .option('--json', 'print the result as JSON')
    .option('--strict', 'warnings fail too')
    .option('--dhcp-probe', 'also send a DHCP DISCOVER from a throwaway MAC and wait for an OFFER (no lease is taken)')
    .action(async (opts: { config: string; json?: boolean; strict?: boolean; dhcpProbe?: boolean }) => {
      const { runCheck } = await import('../preflight/index');
      process.exitCode = await runCheck({ configPath: opts.config, json: !!opts.json, strict: !!opts.strict, dhcpProbe: !!opts.dhcpProbe, stdout: out });
    });

  program.command('status')
    .description('show the running daemon\'s services, VIPs and backends')
    .addOption(configOpt())
    .option('-s, --socket <path>', 'control socket (default: control.socket of the config, else /run/lb-agent/agent.sock)')
    .option('--json', 'print the status as JSON, the daemon\'s document as it sends it (one line)')
    .option('-w, --watch', 'redraw the status in place at an interval until Ctrl-C; an unreachable daemon is shown and asked again')
    .addOption(new Option('-i, --interval <seconds>', 'with --watch: seconds between redraws').default(2).argParser(parseInterval))
    .action(async (opts: { config: string; socket?: string; json?: boolean; watch?: boolean; interval: number }) => {
      const socket = opts.socket ?? controlSocketOf(opts.config);
      if (opts.watch) {
        if (opts.json) throw new LbError('LB_ERR_CLI_USAGE', '--watch and --json do not go together: --watch redraws a terminal; for a feed, run `lb-agent status --json` in a loop');
        const { watchStatus } = await import('./watch');
        const intervalMs = opts.interval * 1000;
        // Each request is bounded by the interval (at least 1 s), so a hung daemon is shown as such.
        await watchStatus({ socket, intervalMs, write: out, fetch: async () => (await controlRequest(socket, 'status', Math.max(1000, intervalMs))) as StatusDocument });
        process.exitCode = EXIT.OK;
        return;
      }
      if (opts.json) {
        // The daemon's document as it sends it (built once per change), never parsed here.
        await controlStream(socket, 'status', (chunk) => { process.stdout.write(chunk); });
        out('\n');
        process.exitCode = EXIT.OK;
        return;
      }
      const doc = (await controlRequest(socket, 'status')) as StatusDocument;
      out(formatStatus(doc));
      process.exitCode = EXIT.OK;
    });

  // The reload systemd's ExecReload= runs. Unlike SIGHUP it waits
  // for the verdict, so `systemctl reload` fails when the file is refused.
  program.command('reload')
    .description('make the running daemon reload its config file; exit 0 applied, 2 refused (the running config is kept), 1 no daemon')
    .addOption(configOpt())
    .option('-s, --socket <path>', 'control socket (default: control.socket of the config, else /run/lb-agent/agent.sock)')
    .option('--json', 'print the verdict as JSON')
    .action(async (opts: { config: string; socket?: string; json?: boolean }) => {
      const socket = opts.socket ?? controlSocketOf(opts.config);
      // Bounded: a reload applies a whole config (RFC 5227 probes, leases).
      const r = (await controlRequest(socket, 'reload', RELOAD_TIMEOUT_MS)) as { ok: boolean; message: string; errors?: ConfigError[] };
      const code = r.ok ? EXIT.OK : r.errors?.length ? EXIT.USAGE : EXIT.FAILURE;
      if (opts.json) {
        const { config } = (await controlRequest(socket, 'status')) as StatusDocument;
        out(`${JSON.stringify({ ok: r.ok, file: config.path, message: r.message.split('\n')[0], errors: r.errors ?? [] }, null, 2)}\n`);
      } else if (r.ok) {
        out(`lb-agent ${r.message}\n`);
      } else {
        err(`lb-agent: ${r.message}\n${r.errors?.length ? `${r.errors.length} error${r.errors.length === 1 ? '' : 's'}\n` : ''}`);
      }
      process.exitCode = code;
    });

  // Generated from this very definition, so they cannot drift from it.
  program.command('completion')
    .description('print the bash completion script (systemd/install.sh installs it)')
    .addArgument(new Argument('<shell>', 'the shell').choices(['bash']))
    .action(async () => {
      const { bashCompletion } = await import('./docs');
      out(bashCompletion(program));
    });

  program.command('man')
    .description('print a man page as roff: lb-agent(8), or with "config" lb-agent.yaml(5) (systemd/install.sh installs both)')
    .addArgument(new Argument('[page]', 'the page: lb-agent (section 8, the default) or config (lb-agent.yaml, section 5)').choices(['lb-agent', 'config']).default('lb-agent'))
    .action(async (page: string) => {
      if (page === 'config') {
        const { configManPage } = await import('./pages');
        out(configManPage(VERSION));
        return;
      }
      const { manPage } = await import('./docs');
      out(manPage(program, {
        version: VERSION,
        exit: EXIT_MEANINGS,
        files: [
          [DEFAULT_CONFIG_PATH, 'the configuration (-c to use another)'],
          [DEFAULTS.control.socket, 'the control socket `status` and `reload` use (control.socket in the config)'],
          [DEFAULTS.stateDir, 'leases, claims and health verdicts kept across restarts (stateDir in the config)'],
        ],
      }));
    });

  program.command('version')
    .description('print the version')
    .option('--json', 'print as JSON')
    .action((opts: { json?: boolean }) => {
      out(opts.json ? `${JSON.stringify({ version: VERSION, node: process.version })}\n` : `lb-agent ${VERSION} (node ${process.version})\n`);
    });

  return program;
}

export async function main(argv: string[], closedPipeHandler?: () => void): Promise<number> {
  const program = buildProgram(closedPipeHandler);
  try {
    await program.parseAsync(argv);
    return typeof process.exitCode === 'number' ? process.exitCode : EXIT.OK;
  } catch (e) {
    if (e instanceof CommanderError) {
      // --help and --version exit 0; everything else commander rejects is usage.
      if (e.code === 'commander.helpDisplayed' || e.code === 'commander.version' || e.code === 'commander.help') return EXIT.OK;
      return EXIT.USAGE;
    }
    if (isLbError(e)) {
      err(`lb-agent: ${e.message} [${e.code}]\n`);
      return e.code === 'LB_ERR_CONFIG_INVALID' || e.code === 'LB_ERR_CLI_USAGE' ? EXIT.USAGE : EXIT.FAILURE;
    }
    err(`lb-agent: ${errorMessage(e)}\n`);
    return EXIT.FAILURE;
  }
}

if (require.main === module) {
  main(process.argv, exitQuietlyOnClosedPipe()).then((code) => { process.exitCode = code; }, (e: unknown) => {
    process.stderr.write(`lb-agent: ${errorMessage(e)}\n`);
    process.exitCode = EXIT.FAILURE;
  });
}
