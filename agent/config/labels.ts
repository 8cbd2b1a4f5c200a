// config/ layer: the node labels file and the node's zone and region.
// There is no Kubernetes API inside the VM, so the labels that
// Harvester syncs to the guest node (topology.kubernetes.io/zone and
// /region, harvester-node-driver.md "Topology spread constraints") reach the
// agent as a file: one `key=value` per line, as the Kubernetes downward API
// writes `metadata.labels` (value in double quotes, Go-escaped), or unquoted.
// parseLabels and resolveNodeTopology are pure; readNodeTopology is the one
// read of the file.
import { promises as fsp } from 'node:fs';
import { errorMessage } from '../errors';
import type { NodeConfig } from './types';

export const ZONE_LABEL = 'topology.kubernetes.io/zone';
export const REGION_LABEL = 'topology.kubernetes.io/region';
// The labels before Kubernetes 1.17 (still written by old node drivers);
// read only when the topology.kubernetes.io ones are absent.
const LEGACY = { zone: 'failure-domain.beta.kubernetes.io/zone', region: 'failure-domain.beta.kubernetes.io/region' } as const;

/** A labels file is a handful of lines; anything larger is not one. */
export const MAX_LABELS_BYTES = 64 * 1024;

/** apimachinery's IsValidLabelValue (the schema's labelValue). */
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
/** A qualified label key: optional DNS-subdomain prefix and a name. */
const LABEL_KEY = /^([a-z0-9]([-a-z0-9.]*[a-z0-9])?\/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$/;

export interface LabelsProblem { readonly line: number; readonly message: string }

export interface ParsedLabels {
  readonly labels: ReadonlyMap<string, string>;
  /** Lines that were not `key=value` with a valid key and value: skipped, reported. */
  readonly problems: readonly LabelsProblem[];
}

/** Undo Go's strconv.Quote for the escapes a label value can need. */
function unquote(v: string): string | undefined {
  if (!v.startsWith('"')) return v;
  if (v.length < 2 || !v.endsWith('"')) return undefined;
  let out = '';
  for (let i = 1; i < v.length - 1; i++) {
    const c = v[i]!;
    if (c !== '\\') { if (c === '"') return undefined; out += c; continue; }
    const n = v[++i];
    if (n === '\\' || n === '"') out += n;
    else return undefined;
  }
  return out;
}

/**
 * Parse a labels file: `key=value` or `key="value"` per line; blank lines and
 * lines starting with `#` are skipped. Pure; never throws.
 */
export function parseLabels(text: string): ParsedLabels {
  const labels = new Map<string, string>();
  const problems: LabelsProblem[] = [];
  text.split('\n').forEach((raw, i) => {
    const line = raw.trim();
    if (line === '' || line.startsWith('#')) return;
    const eq = line.indexOf('=');
    if (eq <= 0) { problems.push({ line: i + 1, message: `not key=value: ${JSON.stringify(line.slice(0, 80))}` }); return; }
    const key = line.slice(0, eq).trim();
    const value = unquote(line.slice(eq + 1).trim());
    if (!LABEL_KEY.test(key) || key.length > 316) { problems.push({ line: i + 1, message: `${JSON.stringify(key.slice(0, 80))} is not a label key` }); return; }
    if (value === undefined || value.length > 63 || !LABEL_VALUE.test(value)) {
      problems.push({ line: i + 1, message: `the value of ${key} is not a label value (letters, digits, -, _, .; at most 63)` });
      return;
    }
    labels.set(key, value);
  });
  return { labels, problems };
}

export type TopologySource = 'config' | 'labels-file' | 'unknown';

/** Where this node sits, and where each part came from. */
export interface NodeTopology {
  readonly zone: string | undefined;
  readonly region: string | undefined;
  readonly zoneFrom: TopologySource;
  readonly regionFrom: TopologySource;
  /** The labels file that was consulted (only when the config leaves zone or region unset). */
  readonly labelsFile: string | undefined;
  /** Why the file did not give what was looked for, for status, logs and `lb-agent check`. */
  readonly problem: string | undefined;
}

/** What reading the labels file gave: its text, or why there is none. */
export type LabelsRead = { readonly text: string } | { readonly missing: true } | { readonly error: string };

/**
 * The node's zone and region: the config's when set, else the labels file's.
 * Pure: `read` is what readLabelsFile found (undefined when it was not needed).
 */
export function resolveNodeTopology(node: Pick<NodeConfig, 'zone' | 'region' | 'labelsFile'>, read: LabelsRead | undefined): NodeTopology {
  const needFile = node.zone === undefined || node.region === undefined;
  let labels: ReadonlyMap<string, string> = new Map();
  let problem: string | undefined;
  if (needFile) {
    if (read === undefined || 'missing' in read) problem = `${node.labelsFile} does not exist`;
    else if ('error' in read) problem = `${node.labelsFile}: ${read.error}`;
    else {
      const parsed = parseLabels(read.text);
      labels = parsed.labels;
      if (parsed.problems.length > 0) problem = `${node.labelsFile}: ${parsed.problems.map((p) => `line ${p.line}: ${p.message}`).join('; ')}`;
    }
  }
  const fromFile = (key: string, legacy: string): string | undefined => labels.get(key) ?? labels.get(legacy);
  const zone = node.zone ?? fromFile(ZONE_LABEL, LEGACY.zone);
  const region = node.region ?? fromFile(REGION_LABEL, LEGACY.region);
  if (needFile && problem === undefined && zone === undefined) problem = `${node.labelsFile} has no ${ZONE_LABEL} label`;
  // A missing file matters only while the zone is unknown (the region is shown, never used to choose).
  if (zone !== undefined && read !== undefined && !('text' in read)) problem = undefined;
  return {
    zone, region,
    zoneFrom: node.zone !== undefined ? 'config' : zone !== undefined ? 'labels-file' : 'unknown',
    regionFrom: node.region !== undefined ? 'config' : region !== undefined ? 'labels-file' : 'unknown',
    labelsFile: needFile ? node.labelsFile : undefined,
    problem,
  };
}

/** Read the labels file (bounded); never throws. */
export async function readLabelsFile(file: string): Promise<LabelsRead> {
  let fh: fsp.FileHandle | undefined;
  try {
    fh = await fsp.open(file, 'r');
    const st = await fh.stat();
    if (!st.isFile()) return { error: 'not a regular file' };
    if (st.size > MAX_LABELS_BYTES) return { error: `larger than ${MAX_LABELS_BYTES} bytes: not a labels file` };
    return { text: (await fh.readFile('utf8')) };
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'ENOENT') return { missing: true };
    return { error: errorMessage(e) };
  } finally {
    await fh?.close().catch(() => undefined);
  }
}

/** The node's topology from the config and, when needed, the labels file. */
export async function readNodeTopology(node: Pick<NodeConfig, 'zone' | 'region' | 'labelsFile'>): Promise<NodeTopology> {
  const needFile = node.zone === undefined || node.region === undefined;
  return resolveNodeTopology(node, needFile ? await readLabelsFile(node.labelsFile) : undefined);
}
