// The peers the bench runs next to lb-agent, inside lab namespaces: nginx as
// a fast HTTP backend, HAProxy (mode tcp) and nginx stream as the balancers
// lb-agent is compared with, and iperf3 servers for bulk throughput. Each
// start waits until the listener is up and returns a handle whose process is
// killed with the lab. Configs are plain text written to the lab's scratch dir.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { listening, waitListening, type Lab } from '../../lab/netns';
import { processTree, startTimeOf } from './procfs';

export interface Peer {
  name: string;
  proc: ChildProcess;
  /** Lines the process printed (stdout and stderr), each with the wall-clock ms it arrived. */
  lines: { at: number; text: string }[];
  stop(): Promise<void>;
}

/** A peer about to start must not find its port taken: the leftover would be measured in its place. */
async function mustBeFree(lab: Lab, ns: string, port: number, what: string): Promise<void> {
  if (await listening(lab, ns, port)) throw new Error(`${what}: something already listens on port ${port} in ${ns}`);
}


function track(name: string, proc: ChildProcess): Peer {
  const lines: { at: number; text: string }[] = [];
  const feed = (stream: NodeJS.ReadableStream | null): void => {
    let partial = '';
    stream?.on('data', (d: Buffer) => {
      partial += d.toString();
      let nl: number;
      while ((nl = partial.indexOf('\n')) >= 0) {
        if (lines.length < 10_000) lines.push({ at: Date.now(), text: partial.slice(0, nl) });
        partial = partial.slice(nl + 1);
      }
    });
  };
  feed(proc.stdout);
  feed(proc.stderr);
  return {
    name, proc, lines,
    stop: async () => {
      // nginx workers outlive a SIGKILLed master and keep the listener: the
      // next slot's nginx would then fail to bind while the orphan answered
      // in its place. SIGTERM lets a master take its workers down; whatever
      // of the tree is left after 3 s is killed.
      const tree = processTree(proc.pid).map((pid) => ({ pid, start: startTimeOf(pid) }));
      if (proc.exitCode === null && proc.signalCode === null) {
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, 3000);
          proc.once('exit', () => { clearTimeout(timer); resolve(); });
          proc.kill('SIGTERM');
        });
      }
      for (const { pid, start } of tree) {
        // Only the very process seen before (same pid and start time), never a reused pid.
        if (start === undefined || startTimeOf(pid) !== start) continue;
        try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
      }
    },
  };
}

/** The main context every nginx of the bench starts with: in the foreground under the lab, its pid and log files in `dir`. */
function nginxMain(dir: string, workers: number | 'auto' = 1, connections = 8192): string {
  return `user root;
worker_processes ${workers};
daemon off;
pid ${dir}/nginx.pid;
error_log ${dir}/error.log warn;
events { worker_connections ${connections}; multi_accept on; }
`;
}

/** nginx answering every HTTP request with a short body: a backend fast enough that the balancer is what is measured. */
/**
 * nginx answering its id on `port`, and on `proxyProtocolPort` (when given)
 * after a required PROXY protocol header (v1 or v2); with `ipv6`, `port`
 * also on the host's IPv6 addresses.
 */
export async function startNginxBackend(lab: Lab, ns: string, id: string, port = 8080, proxyProtocolPort?: number, ipv6 = false): Promise<Peer> {
  const dir = lab.file(`nginx-${id}`);
  fs.mkdirSync(dir, { recursive: true });
  const conf = path.join(dir, 'nginx.conf');
  fs.writeFileSync(conf, `${nginxMain(dir)}http {
  access_log off;
  keepalive_requests 100000000;
  keepalive_timeout 60s;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  server {
    listen ${port} backlog=4096;
${ipv6 ? `    listen [::]:${port} ipv6only=on backlog=4096;\n` : ''}${proxyProtocolPort !== undefined ? `    listen ${proxyProtocolPort} proxy_protocol backlog=4096;\n` : ''}    location / { default_type text/plain; return 200 "${id}\\n"; }
  }
}
`);
  const proc = lab.spawn(ns, 'nginx', ['-p', dir, '-e', `${dir}/error.log`, '-c', conf]);
  await waitListening(lab, ns, port, `nginx backend ${id}`, { proc });
  return track(`nginx-${id}`, proc);
}

/**
 * nginx as `count` TLS backends: one server on `address`, ports first ..
 * first + count - 1, every request answered 200. Each answered request
 * appends one line to `accessLog`: "r" when its TLS session was resumed, "."
 * when it was a full handshake (two bytes a check, so a size is a count).
 */
export async function startNginxTlsBackends(lab: Lab, ns: string, o: { address: string; firstPort: number; count: number; cert: string; key: string; accessLog: string }): Promise<Peer> {
  const dir = lab.file('nginx-tls');
  fs.mkdirSync(dir, { recursive: true });
  const conf = path.join(dir, 'nginx.conf');
  const listens = Array.from({ length: o.count }, (_, i) => `    listen ${o.address}:${o.firstPort + i} ssl backlog=1024;`).join('\n');
  fs.writeFileSync(conf, `${nginxMain(dir, 1, 16384)}worker_rlimit_nofile 40000;
http {
  log_format resumed '$ssl_session_reused';
  access_log ${o.accessLog} resumed;
  keepalive_timeout 0;
  client_body_temp_path ${dir}/body;
  proxy_temp_path ${dir}/proxy;
  ssl_certificate ${o.cert};
  ssl_certificate_key ${o.key};
  ssl_session_cache shared:tls:10m;
  server {
${listens}
    location / { default_type text/plain; return 200 "ok\\n"; }
  }
}
`);
  const proc = lab.spawn(ns, 'nginx', ['-p', dir, '-e', `${dir}/error.log`, '-c', conf]);
  await waitListening(lab, ns, o.firstPort + o.count - 1, 'nginx TLS backends', { proc, timeoutMs: 30_000 });
  return track('nginx-tls', proc);
}

export async function startIperfServer(lab: Lab, ns: string, port = 5201): Promise<Peer> {
  const proc = lab.spawn(ns, 'iperf3', ['-s', '-p', String(port)]);
  await waitListening(lab, ns, port, 'iperf3 server', { proc });
  return track('iperf3', proc);
}

export interface HaproxyOptions {
  /** undefined: HAProxy's default (one thread per CPU it may run on). */
  threads?: number;
  bind: string; // address:port
  servers: { name: string; address: string }[];
  /** `check inter .. fall .. rise ..` on every server, and the check timeout. */
  check?: { interMs: number; fall: number; rise: number; timeoutMs: number };
  /** A PROXY protocol header to the main frontend's servers (`send-proxy` / `send-proxy-v2`). */
  sendProxy?: 'v1' | 'v2';
  /** Extra frontends: [bind, servers]. */
  extra?: { name: string; bind: string; servers: { name: string; address: string }[] }[];
  statsSocket?: string;
  /** `expose-fd listeners` on the stats socket: a new process may take the listening sockets over it (`-x`). */
  exposeListeners?: boolean;
  /** Master-worker mode (`-W -S <masterSocket>`): SIGUSR2 to the master reloads, the new worker takes the old one's listeners. */
  masterSocket?: string;
}

export function haproxyConfig(o: HaproxyOptions): string {
  const server = (s: { name: string; address: string }, pp: string): string => {
    const c = o.check;
    return `  server ${s.name} ${s.address}${c ? ` check inter ${c.interMs} fall ${c.fall} rise ${c.rise}` : ''}${pp}`;
  };
  const listen = (name: string, bind: string, servers: { name: string; address: string }[], pp = ''): string =>
    `listen ${name}\n  bind ${bind}\n  balance roundrobin\n${servers.map((s) => server(s, pp)).join('\n')}\n`;
  return `global
${o.threads !== undefined ? `  nbthread ${o.threads}\n` : ''}  maxconn 9000
${o.statsSocket ? `  stats socket ${o.statsSocket} mode 600 level admin${o.exposeListeners ? ' expose-fd listeners' : ''}\n` : ''}defaults
  mode tcp
  timeout connect 2s
  timeout client 60s
  timeout server 60s
${o.check ? `  timeout check ${o.check.timeoutMs}ms\n` : ''}
${listen('vip', o.bind, o.servers, o.sendProxy === 'v2' ? ' send-proxy-v2' : o.sendProxy === 'v1' ? ' send-proxy' : '')}${(o.extra ?? []).map((e) => listen(e.name, e.bind, e.servers)).join('')}`;
}

/** HAProxy in the foreground (-db; with masterSocket the master stays in the foreground): its warnings, server state changes included, arrive on stderr. */
export async function startHaproxy(lab: Lab, ns: string, name: string, o: HaproxyOptions): Promise<Peer> {
  const conf = lab.file(`${name}.cfg`);
  fs.writeFileSync(conf, haproxyConfig(o));
  const port = Number(o.bind.split(':').pop());
  await mustBeFree(lab, ns, port, name);
  const proc = lab.spawn(ns, 'haproxy', [...(o.masterSocket ? ['-W', '-S', o.masterSocket] : []), '-db', '-f', conf]);
  const peer = track(name, proc);
  try {
    await waitListening(lab, ns, port, name, { proc });
  } catch (e) {
    throw new Error(`${(e as Error).message}\n${peer.lines.map((l) => l.text).join('\n')}`);
  }
  return peer;
}

export interface NginxStreamOptions {
  workers: number | 'auto';
  frontends: { listen: string; servers: string[] }[];
}

export async function startNginxStream(lab: Lab, ns: string, name: string, o: NginxStreamOptions): Promise<Peer> {
  const dir = lab.file(name);
  fs.mkdirSync(dir, { recursive: true });
  const conf = path.join(dir, 'nginx.conf');
  fs.writeFileSync(conf, `load_module /usr/lib/nginx/modules/ngx_stream_module.so;
${nginxMain(dir, o.workers, 20_000)}stream {
${o.frontends.map((f, i) => `  upstream u${i} {
${f.servers.map((s) => `    server ${s};`).join('\n')}
  }
  server {
    listen ${f.listen} backlog=4096;
    proxy_pass u${i};
    proxy_connect_timeout 2s;
  }`).join('\n')}
}
`);
  const port = Number(o.frontends[0]!.listen.split(':').pop());
  await mustBeFree(lab, ns, port, name);
  const proc = lab.spawn(ns, 'nginx', ['-p', dir, '-e', `${dir}/error.log`, '-c', conf]);
  await waitListening(lab, ns, port, name, { proc });
  return track(name, proc);
}
