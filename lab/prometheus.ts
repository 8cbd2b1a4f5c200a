// lab/prometheus.ts: a real Prometheus server in a lab namespace (Debian's
// prometheus package): write its config, start it, wait until ready, and
// query its HTTP API from inside the namespace. Its data lives in the lab's scratch directory.
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { Lab, waitFor } from './netns';
import { httpGetFrom, httpGetEachFrom } from './services';

export interface PromServer { proc: ChildProcess; base: string; stderr(): string }
export type PromVector = { metric: Record<string, string>; value: [number, string] }[];

/** Start prometheus in ns on listen (host:port), scraping targets every scrapeSeconds. */
export async function startPrometheus(lab: Lab, ns: string, o: { listen: string; targets: string[]; scrapeSeconds?: number; rules?: string }): Promise<PromServer> {
  const dir = lab.file(`prom-${o.listen.replace(/[^0-9]/g, '')}`);
  fs.mkdirSync(dir);
  const cfg = path.join(dir, 'prometheus.yml');
  const every = `${o.scrapeSeconds ?? 1}s`;
  fs.writeFileSync(cfg, [
    'global:',
    `  scrape_interval: ${every}`,
    `  evaluation_interval: ${every}`,
    ...(o.rules ? ['rule_files:', `  - ${o.rules}`] : []),
    'scrape_configs:',
    '  - job_name: lb-agent',
    '    static_configs:',
    `      - targets: [${o.targets.map((x) => `'${x}'`).join(', ')}]`,
    '',
  ].join('\n'));
  const base = `http://${o.listen}`;
  const proc = lab.spawn(ns, 'prometheus', [
    `--config.file=${cfg}`, `--storage.tsdb.path=${path.join(dir, 'data')}`,
    `--web.listen-address=${o.listen}`, '--log.level=warn',
  ]);
  let err = '';
  proc.stderr?.on('data', (d: Buffer) => { err += d.toString(); });
  await waitFor('prometheus to be ready', async () => {
    if (proc.exitCode !== null) throw new Error(`prometheus exited with ${proc.exitCode}: ${err}`);
    return (await httpGetFrom(lab, ns, `${base}/-/ready`, 1000)).ok;
  }, 30_000, 250);
  return { proc, base, stderr: () => err };
}

/** Query a Prometheus server's HTTP API from inside ns; the `result` vector. */
export async function promQuery(lab: Lab, ns: string, base: string, query: string): Promise<PromVector> {
  return queryResult(query, await httpGetFrom(lab, ns, queryUrl(base, query)));
}

/**
 * Several queries from one process inside ns (a process per query cost the
 * Grafana dashboard test ~0.4 s each): each one's `result` vector, or the
 * error that query met, in order.
 */
export async function promQueryEach(lab: Lab, ns: string, base: string, queries: readonly string[]): Promise<(PromVector | Error)[]> {
  const answers = await httpGetEachFrom(lab, ns, queries.map((q) => queryUrl(base, q)));
  return answers.map((r, i) => { try { return queryResult(queries[i]!, r); } catch (e) { return e as Error; } });
}

function queryUrl(base: string, query: string): string {
  return `${base}/api/v1/query?query=${encodeURIComponent(query)}`;
}

function queryResult(query: string, r: { ok: boolean; body: string; error?: string }): PromVector {
  if (!r.ok) throw new Error(`query ${query}: ${r.error}`);
  const doc = JSON.parse(r.body) as { status: string; data: { result: PromVector } };
  if (doc.status !== 'success') throw new Error(`query ${query}: ${r.body}`);
  return doc.data.result;
}
