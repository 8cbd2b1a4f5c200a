// lab/tls.ts: a throwaway certificate authority for HTTPS health-check tests
// and benches, made with the `openssl` CLI in a directory of its own: a CA,
// and leaf certificates it signs for chosen names and validity dates (an
// expired one too). OpenSSL 3.0's `x509 -req` has no -not_before/-not_after,
// so leaves are signed with `openssl ca`, whose -startdate/-enddate take any
// dates. EC P-256 keys: generated in milliseconds. Also the lab's HTTPS
// backend (lab/bin/tls-backend.ts), started inside a namespace.
import type { ChildProcess } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { run, waitFor, type Lab } from './netns';
import { distPath } from './services';

export interface Leaf {
  readonly cert: string;
  readonly key: string;
}

export interface LeafOptions {
  /** DNS names of the subjectAltName (the first is also the CN). */
  readonly dns: readonly string[];
  /** IP addresses of the subjectAltName. */
  readonly ips?: readonly string[];
  /** Validity, as Date; default: from an hour ago for 30 days. */
  readonly notBefore?: Date;
  readonly notAfter?: Date;
}

export interface TestCa {
  readonly dir: string;
  /** The CA certificate (PEM): what caFile points at. */
  readonly caFile: string;
  issue(name: string, opts: LeafOptions): Promise<Leaf>;
  /** A self-signed certificate no CA of the lab signed. */
  selfSigned(name: string, dns: string): Promise<Leaf>;
  remove(): void;
}

/** YYYYMMDDHHMMSSZ, as `openssl ca -startdate/-enddate` take it. */
export function opensslTime(d: Date): string {
  return `${d.toISOString().replace(/[-:T]/g, '').slice(0, 14)}Z`;
}

const EC = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];

/** Makes a CA in a new temporary directory (under `parent`, default the OS's). */
export async function createTestCa(parent = os.tmpdir()): Promise<TestCa> {
  const dir = fs.mkdtempSync(path.join(parent, 'lb-tls-'));
  const p = (f: string): string => path.join(dir, f);
  fs.writeFileSync(p('index.txt'), '');
  fs.writeFileSync(p('serial'), '1000\n');
  fs.mkdirSync(p('issued'));
  fs.writeFileSync(p('ca.cnf'), [
    '[ca]', 'default_ca = lab',
    '[lab]', `dir = ${dir}`, 'database = $dir/index.txt', 'serial = $dir/serial', 'new_certs_dir = $dir/issued',
    'certificate = $dir/ca.pem', 'private_key = $dir/ca.key', 'default_md = sha256', 'policy = any', 'unique_subject = no',
    'copy_extensions = none', 'default_days = 30',
    '[any]', 'commonName = supplied',
    '',
  ].join('\n'));
  await run('openssl', ['req', '-x509', ...EC, '-keyout', p('ca.key'), '-out', p('ca.pem'), '-days', '30', '-subj', '/CN=lb-agent lab CA',
    '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  const issue = async (name: string, o: LeafOptions): Promise<Leaf> => {
    const key = p(`${name}.key`);
    const csr = p(`${name}.csr`);
    const cert = p(`${name}.pem`);
    const ext = p(`${name}.ext`);
    const san = [...o.dns.map((d) => `DNS:${d}`), ...(o.ips ?? []).map((i) => `IP:${i}`)].join(',');
    fs.writeFileSync(ext, `basicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=${san}\n`);
    await run('openssl', ['req', '-new', ...EC, '-keyout', key, '-out', csr, '-subj', `/CN=${o.dns[0] ?? name}`]);
    const from = o.notBefore ?? new Date(Date.now() - 3600_000);
    const to = o.notAfter ?? new Date(Date.now() + 30 * 86400_000);
    await run('openssl', ['ca', '-batch', '-notext', '-config', p('ca.cnf'), '-in', csr, '-out', cert, '-extfile', ext,
      '-startdate', opensslTime(from), '-enddate', opensslTime(to)]);
    return { cert, key };
  };
  const selfSigned = async (name: string, dns: string): Promise<Leaf> => {
    const key = p(`${name}.key`);
    const cert = p(`${name}.pem`);
    await run('openssl', ['req', '-x509', ...EC, '-keyout', key, '-out', cert, '-days', '30', '-subj', `/CN=${dns}`, '-addext', `subjectAltName=DNS:${dns}`]);
    return { cert, key };
  };
  return { dir, caFile: p('ca.pem'), issue, selfSigned, remove: () => fs.rmSync(dir, { recursive: true, force: true }) };
}

/** A request a TLS backend saw: the server name the client sent (false: none), its Host header, and whether its TLS session was resumed. */
export interface TlsRequest { readonly servername: string | false; readonly host: string | undefined; readonly url: string; readonly reused: boolean }

export interface TlsBackend {
  readonly proc: ChildProcess;
  /** Requests answered so far. */
  requests(): TlsRequest[];
  stop(): Promise<void>;
}

/**
 * Starts lab/bin/tls-backend.js in `ns`: an HTTPS server with `leaf`
 * answering `status`, or (stall) a port that accepts and never handshakes.
 */
export async function startTlsBackend(lab: Lab, ns: string, o: { port: number; leaf?: Leaf; status?: number; stall?: boolean }): Promise<TlsBackend> {
  const args = [distPath('lab', 'bin', 'tls-backend.js'), '--port', String(o.port)];
  if (o.stall) args.push('--stall');
  else {
    if (!o.leaf) throw new Error('startTlsBackend: a leaf certificate, or stall');
    args.push('--cert', o.leaf.cert, '--key', o.leaf.key, '--status', String(o.status ?? 200));
  }
  const proc = lab.spawn(ns, process.execPath, args);
  let out = '';
  proc.stdout?.on('data', (d: Buffer) => { out += d.toString(); });
  await waitFor(`TLS backend on ${ns}:${o.port} to listen`, () => out.includes('"listening"'), 10_000);
  return {
    proc,
    requests: () => out.split('\n').filter((l) => l.startsWith('{"servername"')).map((l) => JSON.parse(l) as TlsRequest),
    stop: () => new Promise<void>((resolve) => {
      if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
      proc.once('exit', () => resolve());
      proc.kill('SIGKILL');
    }),
  };
}
