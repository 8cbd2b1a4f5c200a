// `lb-agent status --json` on the bin's own path (start.ts), before the CLI
// bundle is compiled: a control socket client that streams the daemon's
// JSON text to stdout, and nothing else. The command is what monitoring
// runs in a loop; compiling and starting the whole CLI (commander, the
// config loader, the formatters: a 1.7 MB bundle) for it cost more than
// Node's own start. Only the plain forms are taken here (--json with
// --socket and --config); every other form, and a config file that names a
// socket of its own (its YAML must be parsed), goes to the full CLI, whose
// answer is the same.
import { DEFAULT_CONFIG_PATH, DEFAULTS } from '../config/defaults';
import { readConfigText } from '../config/read';
import { controlStream } from '../control/server';
import { errorMessage, isLbError } from '../errors';

/** What the arguments after `status` ask, when this path can answer them; undefined sends them to the full CLI. */
export interface StatusJsonArgs {
  readonly socket: string | undefined;
  readonly config: string;
}

/**
 * `status --json [-s|--socket PATH] [-c|--config PATH]` (either option
 * given at most once, `--opt=value` too), from the arguments after the
 * node binary and the script. Anything else (help, --watch, an unknown
 * option, a value that looks like an option) is the full CLI's. Pure.
 */
export function statusJsonArgs(args: readonly string[]): StatusJsonArgs | undefined {
  if (args[0] !== 'status') return undefined;
  let json = false;
  let socket: string | undefined;
  let config: string | undefined;
  for (let i = 1; i < args.length; i++) {
    const a = args[i]!;
    if (a === '--json') {
      if (json) return undefined;
      json = true;
      continue;
    }
    const eq = a.indexOf('=');
    const name = a.startsWith('--') && eq > 0 ? a.slice(0, eq) : a;
    let value: string | undefined;
    if (eq > 0 && a.startsWith('--')) value = a.slice(eq + 1);
    else value = args[++i];
    if (value === undefined || value === '' || value.startsWith('-')) return undefined;
    if (name === '-s' || name === '--socket') {
      if (socket !== undefined) return undefined;
      socket = value;
    } else if (name === '-c' || name === '--config') {
      if (config !== undefined) return undefined;
      config = value;
    } else {
      return undefined;
    }
  }
  return json ? { socket, config: config ?? DEFAULT_CONFIG_PATH } : undefined;
}

/**
 * The socket a config file names when no YAML must be read to know it:
 * the default for a file that cannot be read or never says "control" (as
 * config/load.ts controlSocketOf decides), undefined when it does.
 */
function socketWithoutYaml(file: string): string | undefined {
  const read = readConfigText(file);
  return !read.ok || !read.text.includes('control') ? DEFAULTS.control.socket : undefined;
}

/**
 * Answer `status --json` here when the arguments allow it: the daemon's
 * answer streamed to stdout, exit 0; the CLI's message and exit 1 when
 * the daemon cannot be reached; exit 0 without a word when the reader
 * closed stdout (main.ts exitQuietlyOnClosedPipe). Returns false, having
 * done nothing, for the full CLI to answer.
 */
export function statusJsonFast(args: readonly string[]): boolean {
  const parsed = statusJsonArgs(args);
  if (parsed === undefined) return false;
  const socket = parsed.socket ?? socketWithoutYaml(parsed.config);
  if (socket === undefined) return false;
  const stdout = process.stdout;
  stdout.on('error', (e: NodeJS.ErrnoException) => {
    if (e.code === 'EPIPE') process.exit(0);
    process.stderr.write(`lb-agent: cannot write the output: ${errorMessage(e)}\n`);
    process.exit(1);
  });
  controlStream(socket, 'status', (chunk) => { stdout.write(chunk); }).then(() => {
    stdout.write('\n');
    process.exitCode = 0;
  }, (e: unknown) => {
    process.stderr.write(isLbError(e) ? `lb-agent: ${e.message} [${e.code}]\n` : `lb-agent: ${errorMessage(e)}\n`);
    process.exitCode = 1;
  });
  return true;
}
