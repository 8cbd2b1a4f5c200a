// Config loading: YAML text -> schema validation (ajv, defaults from
// defaults.ts, unknown keys rejected) -> cross-field rules (pools, Harvester
// annotations, Share IP) -> a deeply frozen Desired. Every error names the
// field path and the offending value; all errors of a file come at once;
// nothing is returned from a file that does not validate.
import * as os from 'node:os';
import { isIP } from 'node:net';
import type { ErrorObject } from 'ajv';
import { splitServiceEntries } from './split';
import { parseYaml } from './yaml';
import { ANNOTATIONS, ANNOTATION_PREFIX, DEFAULTS } from './defaults';
import { parsePools } from './pools';
import { familyServiceKey, planFamilies, tiedToIpv4, type FamilyPlan } from './families';
import { DEFAULT_NETWORK, poolsOfNetwork } from './networks';
import { familyOf, formatAddress, parseAddress, parseIPv4, type Family } from '../address';
import { errorMessage } from '../errors';
import { readConfigText } from './read';
import { readCaFile, type CaFileReader } from './ca-file';
import type {
  CheckType, Desired, NetworkSpec, ServiceSpec, PortSpec, BackendSpec, HealthCheckSpec, IpamMode, IpFamilyPolicy, Pool, SourceIpMode, TlsCheckSpec, TopologyPolicy, TrackConfig,
} from './types';

export interface ConfigError {
  /** Field path, e.g. services[0].ports[0].port; '' for the whole file. */
  readonly path: string;
  readonly message: string;
  /** 1-based line in the file, when known. */
  readonly line?: number;
}

export type LoadResult =
  | { readonly ok: true; readonly config: Desired; readonly reuse?: ConfigReuse }
  | { readonly ok: false; readonly errors: readonly ConfigError[] };

/** What one service's entry of a file built into (buildServices), kept to be taken again for the same text. */
interface BuiltService {
  /** The entry as validated (schema defaults filled in). */
  readonly raw: RawService;
  readonly ipam: IpamMode | undefined;
  readonly ipamGiven: boolean;
  readonly hc: HealthCheckSpec;
  readonly ports: PortSpec[];
  readonly backends: BackendSpec[];
  readonly plan: FamilyPlan;
  /** Its family services, the objects of the accepted config. */
  readonly specs: readonly ServiceSpec[];
}

/**
 * What a file's services were built into, by the text of each entry, for
 * the next parse (a reload): an entry whose text (its source lines when
 * the file is cut at its entries, split.ts, and then not parsed again;
 * else JSON of the parsed YAML) is the same, in a file whose other
 * sections are the same, is not
 * validated or built again, and keeps its ServiceSpec objects, so the
 * reload's diff finds it unchanged by identity. The checks across services
 * (names, IPs, ports of a shared IP, VRIDs, tracks) run over every service
 * each time. Entries are taken again only when nothing else in the file
 * decides what they build: not a secondary (it takes its primary's IPAM,
 * families and network) and not an HTTPS check (its CA file is read at
 * every reload).
 */
export class ConfigReuse {
  /** @internal */
  constructor(readonly globals: string, readonly byText: ReadonlyMap<string, BuiltService>) {}

  /** How many entries the parse that made this took from the one before (tests read it). */
  taken = 0;
  /** How many entries it handed to the schema's validator (tests read it). */
  validated = 0;
  /** How many entries it parsed as YAML on their own, undefined when it parsed the file whole (tests read it). */
  parsed: number | undefined;
}

type Seg = string | number;

function pathText(segs: readonly Seg[]): string {
  let s = '';
  for (const seg of segs) {
    if (typeof seg === 'number') s += `[${seg}]`;
    else if (/^[A-Za-z_][A-Za-z0-9_]*$/.test(seg)) s += s ? `.${seg}` : seg;
    else s += `[${JSON.stringify(seg)}]`;
  }
  return s;
}

function show(v: unknown): string {
  if (v === undefined) return 'nothing';
  if (v === null) return 'null';
  if (typeof v === 'string') return JSON.stringify(v);
  if (typeof v === 'object') return Array.isArray(v) ? 'a list' : 'a mapping';
  return String(v);
}

/** The schema's validator, generated at build time beside this file (validator-build.ts). */
export const VALIDATOR_FILE = 'schema-validator.js';

type Validate = ((data: unknown) => boolean) & { errors?: ErrorObject[] | null };
let validateFn: Validate | undefined;
/**
 * The schema's validator, compiled at build time (validator-build.ts writes
 * schema-validator.js beside this file): no ajv compile at start or in a
 * reload's worker. Loaded on first use, so `lb-agent validate`
 * refuses an unreadable file without paying for it.
 */
function validator(): Validate {
  if (!validateFn) {
    try {
      // A literal path: the production bundle (agent/bundle-build.ts) takes
      // the generated file in; VALIDATOR_FILE names the same file.
      validateFn = require('./schema-validator') as Validate;
    } catch (e) {
      throw new Error(`the compiled config schema (${VALIDATOR_FILE}) is missing or broken: run \`npm run build\` (${errorMessage(e)})`);
    }
  }
  return validateFn;
}

function instanceSegs(instancePath: string): Seg[] {
  if (!instancePath) return [];
  return instancePath.slice(1).split('/').map((p) => {
    const s = p.replace(/~1/g, '/').replace(/~0/g, '~');
    return /^\d+$/.test(s) ? Number(s) : s;
  });
}

/** Turn ajv's errors into one clear message per problem. */
function schemaErrors(errors: ErrorObject[]): { segs: Seg[]; message: string }[] {
  const out: { segs: Seg[]; message: string }[] = [];
  // anyOf: keep the errors of the branch that matches the value's type, or one summary.
  const anyOfs = errors.filter((e) => e.keyword === 'anyOf');
  const suppressed = new Set<ErrorObject>();
  for (const a of anyOfs) {
    const branchErrs = errors.filter((e) => e !== a && e.schemaPath.startsWith(`${a.schemaPath}/`)
      && (e.instancePath === a.instancePath || e.instancePath.startsWith(`${a.instancePath}/`)));
    const byBranch = new Map<string, ErrorObject[]>();
    for (const e of branchErrs) {
      const idx = e.schemaPath.slice(a.schemaPath.length + 1).split('/')[0]!;
      byBranch.set(idx, [...(byBranch.get(idx) ?? []), e]);
      suppressed.add(e);
    }
    const typed = [...byBranch.values()].find((errs) => !errs.some((e) => e.keyword === 'type' && e.instancePath === a.instancePath));
    if (typed) { for (const e of typed) suppressed.delete(e); suppressed.add(a); }
  }
  for (const e of errors) {
    if (suppressed.has(e)) continue;
    const segs = instanceSegs(e.instancePath);
    const what = e.parentSchema?.['x-what'] as string | undefined;
    switch (e.keyword) {
      case 'additionalProperties': {
        const key = (e.params as { additionalProperty: string }).additionalProperty;
        const allowed = Object.keys(((e.parentSchema as { properties?: object }).properties) ?? {});
        out.push({ segs: [...segs, key], message: `unknown key ${JSON.stringify(key)}${allowed.length ? ` (allowed here: ${allowed.join(', ')})` : ''}` });
        break;
      }
      case 'required':
        out.push({ segs: [...segs, (e.params as { missingProperty: string }).missingProperty], message: 'is required' });
        break;
      case 'enum':
        out.push({ segs, message: `${show(e.data)} is not one of ${(e.params as { allowedValues: unknown[] }).allowedValues.join(', ')}` });
        break;
      case 'propertyNames':
        out.push({ segs: [...segs, (e.params as { propertyName: string }).propertyName], message: `${JSON.stringify((e.params as { propertyName: string }).propertyName)} is not ${what ?? 'an allowed key'}` });
        break;
      case 'format':
      case 'pattern':
        if (e.schemaPath.includes('/propertyNames/')) break; // reported by propertyNames
        out.push({ segs, message: `${show(e.data)} is not ${what ?? (e.keyword === 'format' ? 'well formed' : `a string matching ${(e.params as { pattern: string }).pattern}`)}` });
        break;
      default:
        if (what) out.push({ segs, message: `${show(e.data)} is not ${what}` });
        else out.push({ segs, message: `${show(e.data)} ${e.message ?? 'is invalid'}` });
    }
  }
  // One message per path and text.
  const seen = new Set<string>();
  return out.filter((x) => {
    const k = `${pathText(x.segs)}\0${x.message}`;
    if (seen.has(k)) return false;
    seen.add(k);
    return true;
  });
}

interface RawService {
  name: string; namespace: string; ipam?: string; primaryService?: string; loadBalancerIP?: string;
  loadBalancerIPs?: string[]; ipFamilies?: Family[]; ipFamilyPolicy?: IpFamilyPolicy;
  vrid?: number; priority?: number; annotations?: Record<string, string | number | boolean>;
  ports: { name?: string; port: number; protocol: 'TCP' | 'UDP'; targetPort?: number }[];
  backends: (string | { address: string; weight?: number; zone?: string })[];
  sourceIP: SourceIpMode; topology: TopologyPolicy;
  healthCheck: {
    enabled: boolean; type: CheckType; port?: number; successThreshold: number; failureThreshold: number;
    periodSeconds: number; timeoutSeconds: number; passiveFailures: number; proxyProtocol: boolean; http?: { path: string; expectStatus: [number, number] };
    tls?: { sni?: string; caFile?: string };
  };
  proxyProtocol?: 'v1' | 'v2';
  network?: string;
}

interface RawTrack {
  interfaces: { name: string; weight?: number; failAfter: number; recoverAfter: number }[];
  services: { service: string; minHealthy: number; weight?: number; failAfter: number; recoverAfter: number }[];
}

interface RawNetwork {
  interface: string; pools: Record<string, string>;
  failover: { interface?: string; vrid?: number; peers?: string[]; track: RawTrack };
}

interface RawConfig {
  node: { name?: string; interface?: string; priority: number; zone?: string; region?: string; labelsFile: string };
  failover: {
    mode: 'none' | 'vrrp'; vrid: number; vrid6?: number; advertInterval: number; preempt: boolean; preemptDelay: number; interface?: string; peers: string[];
    track: RawTrack;
  };
  stateDir: string; metrics: { listen: string }; control: { socket: string }; reconcile: { resyncInterval: number };
  dataplane: 'auto' | 'kernel' | 'proxy'; pools: Record<string, string>; networks: Record<string, RawNetwork>;
  arp: Desired['arp']; dhcp: Omit<Desired['dhcp'], 'servers'> & { servers: string[] }; proxy: Desired['proxy'];
  kernel: { engine: Desired['kernel']['engine']; flowEntries: number; natPorts: [number, number] };
  backend: { vips: string[] };
  services: RawService[];
}

export function serviceKey(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

/** Parse "host:port" (IPv4 or "[v6]") or "" for the metrics listener. */
export function parseListen(s: string): { host: string; port: number } | undefined {
  const m = /^(\[[0-9a-fA-F:]+\]|[^:\s]*):(\d{1,5})$/.exec(s);
  if (!m) return undefined;
  const port = Number(m[2]);
  if (port > 65535) return undefined;
  const host = m[1]!.startsWith('[') ? m[1]!.slice(1, -1) : (m[1] || '0.0.0.0');
  if (!m[1]!.startsWith('[') && m[1] !== '' && m[1] !== 'localhost' && parseIPv4(host) === undefined) return undefined;
  return { host, port };
}

/**
 * A backend's path in the file. A kept entry's are made again from its
 * validated form when it is taken (every backend of an accepted entry has
 * one), not kept: three arrays a backend, a third of what an entry kept.
 */
function backendPath(at: (...segs: Seg[]) => Seg[], b: RawService['backends'][number], bi: number): Seg[] {
  return typeof b === 'string' ? at('backends', bi) : at('backends', bi, 'address');
}

/** Build typed services and check the cross-field rules. */
function buildServices(raw: RawConfig, pools: readonly Pool[], err: (segs: Seg[], msg: string) => void, readCa: CaFileReader, taken: readonly (BuiltService | undefined)[] = [], texts: readonly string[] = []): { specs: ServiceSpec[]; built: Map<string, BuiltService> } {
  const keys = new Map<string, number>();
  const prelim: {
    idx: number; key: string; raw: RawService; ipam: IpamMode | undefined; ipamGiven: boolean;
    primary: string | undefined; hc: HealthCheckSpec; ports: PortSpec[]; backends: BackendSpec[]; backendSegs: Seg[][]; taken?: BuiltService;
  }[] = [];

  raw.services.forEach((s, idx) => {
    const at = (...segs: Seg[]): Seg[] => ['services', idx, ...segs];
    const key = serviceKey(s.namespace, s.name);
    if (keys.has(key)) err(at('name'), `${JSON.stringify(key)} is defined twice (also services[${keys.get(key)}])`);
    else keys.set(key, idx);
    const was = taken[idx];
    // A taken entry is a primary whose families are planned (its paths to
    // its backends are read only by the family checks, which it skips).
    if (was !== undefined) {
      prelim.push({ idx, key, raw: s, ipam: was.ipam, ipamGiven: was.ipamGiven, primary: undefined, hc: was.hc, ports: was.ports, backends: was.backends, backendSegs: [], taken: was });
      return;
    }

    // Harvester annotations: mapped onto typed fields; both spellings must agree.
    const ann = s.annotations ?? {};
    const annStr = (k: string): string | undefined => (ann[k] === undefined ? undefined : String(ann[k]));
    for (const k of Object.keys(ann)) {
      if (k.startsWith(ANNOTATION_PREFIX) && !(Object.values(ANNOTATIONS) as string[]).includes(k)) {
        err(at('annotations', k), `unknown Harvester annotation (known: ${Object.values(ANNOTATIONS).join(', ')})`);
      }
    }
    const agree = <T>(field: Seg[], typed: T | undefined, annKey: string, parsed: T | undefined, shown: string | undefined): T | undefined => {
      if (shown === undefined) return typed;
      if (parsed === undefined) return typed;
      if (typed !== undefined && typed !== parsed) {
        err(at('annotations', annKey), `${JSON.stringify(shown)} conflicts with ${pathText(at(...field))}: ${show(typed)}`);
      }
      return parsed;
    };
    const annInt = (annKey: string, min: number, max: number, float = false): number | undefined => {
      const v = annStr(annKey);
      if (v === undefined) return undefined;
      const n = Number(v);
      if (v.trim() === '' || !Number.isFinite(n) || (!float && !Number.isInteger(n)) || n < min || n > max) {
        err(at('annotations', annKey), `${JSON.stringify(v)} is not ${float ? 'a number' : 'an integer'} (${min}-${max})`);
        return undefined;
      }
      return n;
    };

    let ipamAnn: IpamMode | undefined;
    const ipamAnnRaw = annStr(ANNOTATIONS.ipam);
    if (ipamAnnRaw !== undefined) {
      if (ipamAnnRaw === 'dhcp' || ipamAnnRaw === 'pool') ipamAnn = ipamAnnRaw;
      else err(at('annotations', ANNOTATIONS.ipam), `${JSON.stringify(ipamAnnRaw)} is not one of dhcp, pool`);
    }
    const ipamTyped = s.ipam as IpamMode | undefined;
    const ipam = agree(['ipam'], ipamTyped, ANNOTATIONS.ipam, ipamAnn, ipamAnnRaw);

    const primAnnRaw = annStr(ANNOTATIONS.primaryService);
    const normPrimary = (p: string | undefined): string | undefined => {
      if (p === undefined || p === '') return undefined;
      return p.includes('/') ? p : serviceKey(s.namespace, p);
    };
    if (primAnnRaw !== undefined && primAnnRaw !== '' && !/^([a-z0-9]([-a-z0-9]*[a-z0-9])?\/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$/.test(primAnnRaw)) {
      err(at('annotations', ANNOTATIONS.primaryService), `${JSON.stringify(primAnnRaw)} is not "namespace/name" or "name" of another service`);
    }
    const primary = agree(['primaryService'], normPrimary(s.primaryService), ANNOTATIONS.primaryService, normPrimary(primAnnRaw), primAnnRaw);

    // Ports: targetPort defaults to port; one protocol+port once per service.
    const ports: PortSpec[] = [];
    const seenPorts = new Map<string, number>();
    s.ports.forEach((p, pi) => {
      const id = `${p.protocol}/${p.port}`;
      if (seenPorts.has(id)) err(at('ports', pi, 'port'), `${p.protocol} ${p.port} is listed twice (also ports[${seenPorts.get(id)}])`);
      seenPorts.set(id, pi);
      ports.push({ name: p.name ?? `${p.protocol.toLowerCase()}-${p.port}`, port: p.port, protocol: p.protocol, targetPort: p.targetPort ?? p.port });
    });

    // Backends.
    const backends: BackendSpec[] = [];
    const backendSegs: Seg[][] = [];
    const seenB = new Map<string, number>();
    s.backends.forEach((b, bi) => {
      const address = typeof b === 'string' ? b : b.address;
      const weight = typeof b === 'string' ? DEFAULTS.weight : (b.weight ?? DEFAULTS.weight);
      const zone = typeof b === 'string' ? undefined : b.zone;
      const a = parseAddress(address);
      const segs = backendPath(at, b, bi);
      if (a === undefined) { err(segs, `${JSON.stringify(address)} is not an IPv4 or IPv6 address`); return; }
      if (seenB.has(address)) { err(segs, `${JSON.stringify(address)} is listed twice (also backends[${seenB.get(address)}])`); return; }
      seenB.set(address, bi);
      const n = a.family === 'IPv4' ? Number(a.value) : 0;
      const fam = a.family === 'IPv4' ? {} : { family: a.family };
      backends.push(zone === undefined ? { address, addressNum: n, weight, ...fam } : { address, addressNum: n, weight, zone, ...fam });
      backendSegs.push(segs);
    });

    // Direct server return: the agent only swaps the frame's
    // destination MAC, so the backend receives the packet exactly as the
    // client sent it, to VIP:port. It cannot be told to listen elsewhere.
    if (s.sourceIP === 'preserve') {
      s.ports.forEach((p, pi) => {
        if (p.targetPort !== undefined && p.targetPort !== p.port) {
          err(at('ports', pi, 'targetPort'), `${p.targetPort} differs from port ${p.port}: with sourceIP: preserve (direct server return) the backend receives the client's packet unchanged, to the VIP and port ${p.port}, so targetPort must equal port (remove it, or use sourceIP: snat)`);
        }
      });
      if (raw.dataplane === 'proxy') {
        err(at('sourceIP'), 'preserve needs the kernel data path (direct server return forwards frames, the userspace proxy opens its own connections): set dataplane: kernel or auto, or sourceIP: snat');
      }
    }

    // Health check: typed fields, then annotations (must agree), then defaults.
    const h = s.healthCheck;
    const hcPort = agree(['healthCheck', 'port'], h.port, ANNOTATIONS.healthcheckPort, annInt(ANNOTATIONS.healthcheckPort, 1, 65535), annStr(ANNOTATIONS.healthcheckPort));
    const succ = agree(['healthCheck', 'successThreshold'], rawHc(s, 'successThreshold'), ANNOTATIONS.successThreshold, annInt(ANNOTATIONS.successThreshold, 1, 1000), annStr(ANNOTATIONS.successThreshold));
    const fail = agree(['healthCheck', 'failureThreshold'], rawHc(s, 'failureThreshold'), ANNOTATIONS.failureThreshold, annInt(ANNOTATIONS.failureThreshold, 1, 1000), annStr(ANNOTATIONS.failureThreshold));
    const period = agree(['healthCheck', 'periodSeconds'], rawHc(s, 'periodSeconds'), ANNOTATIONS.periodSeconds, annInt(ANNOTATIONS.periodSeconds, 0.1, 3600, true), annStr(ANNOTATIONS.periodSeconds));
    const timeout = agree(['healthCheck', 'timeoutSeconds'], rawHc(s, 'timeoutSeconds'), ANNOTATIONS.timeoutSeconds, annInt(ANNOTATIONS.timeoutSeconds, 0.01, 3600, true), annStr(ANNOTATIONS.timeoutSeconds));
    const hc: HealthCheckSpec = {
      enabled: h.enabled,
      type: h.type,
      port: hcPort ?? ports[0]?.targetPort ?? 0,
      successThreshold: succ ?? DEFAULTS.healthCheck.successThreshold,
      failureThreshold: fail ?? DEFAULTS.healthCheck.failureThreshold,
      periodSeconds: period ?? DEFAULTS.healthCheck.periodSeconds,
      timeoutSeconds: timeout ?? DEFAULTS.healthCheck.timeoutSeconds,
      http: h.type !== 'tcp' ? { path: h.http?.path ?? DEFAULTS.httpCheck.path, expectStatus: h.http?.expectStatus ?? DEFAULTS.httpCheck.expectStatus } : undefined,
      ...(h.type === 'https' ? { tls: tlsCheck(h.tls ?? {}, (segs, msg) => err(at('healthCheck', 'tls', ...segs), msg), readCa) } : {}),
      passiveFailures: h.passiveFailures,
      ...(h.proxyProtocol && s.proxyProtocol !== undefined ? { proxyProtocol: s.proxyProtocol } : {}),
    };
    if (h.http && h.type === 'tcp') err(at('healthCheck', 'http'), 'is only valid with healthCheck.type: http or https');
    if (h.tls && h.type !== 'https') err(at('healthCheck', 'tls'), `is only valid with healthCheck.type: https (type is ${h.type})`);
    if (hc.http && hc.http.expectStatus[0] > hc.http.expectStatus[1]) {
      err(at('healthCheck', 'http', 'expectStatus'), `[${hc.http.expectStatus.join(', ')}] is reversed`);
    }
    // The PROXY protocol header, on the proxy data path only.
    const pp = s.proxyProtocol;
    if (pp !== undefined && raw.dataplane === 'kernel') {
      err(at('proxyProtocol'), `${pp}: the PROXY protocol header is sent by the userspace proxy only, and dataplane is kernel (nftables forwards packets, it never writes into a connection); set dataplane: proxy or auto (auto then runs the proxy), or remove proxyProtocol`);
    }
    if (pp === 'v1') {
      ports.forEach((p, pi) => {
        if (p.protocol === 'UDP') err(at('ports', pi, 'protocol'), `UDP port ${p.port} with proxyProtocol v1: PROXY protocol v1 has no UDP (only TCP4/TCP6 lines); use proxyProtocol: v2, which carries UDP, or move the port to a service without it`);
      });
    }
    if (h.proxyProtocol && pp === undefined) {
      err(at('healthCheck', 'proxyProtocol'), 'true, but the service has no proxyProtocol: set proxyProtocol: v1 or v2 on the service (the probe sends the same version), or remove healthCheck.proxyProtocol');
    }

    // The network: a key of networks:, or the default one.
    if (s.network !== undefined && s.network !== DEFAULT_NETWORK && !Object.prototype.hasOwnProperty.call(raw.networks, s.network)) {
      const defined = Object.keys(raw.networks);
      err(at('network'), `${JSON.stringify(s.network)} is not a network of this file: define it under networks${defined.length > 0 ? ` (defined: ${defined.join(', ')})` : ''}, or leave network out for the default network (node.interface)`);
    }

    prelim.push({ idx, key, raw: s, ipam, ipamGiven: ipamTyped !== undefined || ipamAnn !== undefined, primary, hc, ports, backends, backendSegs });
  });

  // One agent runs one data path. Direct server return needs the
  // kernel path and the PROXY protocol the proxy; under dataplane: auto a
  // config asking for both would pick one at start and fail the other
  // there, so it is refused here, naming both.
  if (raw.dataplane !== 'kernel' && raw.dataplane !== 'proxy') {
    const dsr = prelim.find((p) => p.raw.sourceIP === 'preserve');
    const pp = prelim.find((p) => p.raw.proxyProtocol !== undefined);
    if (dsr && pp) {
      const other = dsr === pp ? 'its own sourceIP: preserve' : `services[${dsr.idx}] (${dsr.key}) asks for sourceIP: preserve`;
      err(['services', pp.idx, 'proxyProtocol'], `${pp.raw.proxyProtocol ?? ''} needs the userspace proxy, but ${other}, which needs the kernel path, and one agent runs one data path; drop one of them (sourceIP: snat, or no proxyProtocol)`);
    }
  }

  // Share IP rules (Harvester's, made stricter).
  const byKey = new Map(prelim.map((p) => [p.key, p]));
  const lbIps = new Map<string, string>();
  for (const p of prelim) {
    const at = (...segs: Seg[]): Seg[] => ['services', p.idx, ...segs];
    if (p.primary !== undefined) {
      const prim = byKey.get(p.primary);
      const field = p.raw.primaryService !== undefined ? at('primaryService') : at('annotations', ANNOTATIONS.primaryService);
      if (p.primary === p.key) err(field, `${JSON.stringify(p.primary)}: a service cannot share its own IP`);
      else if (!prim) err(field, `${JSON.stringify(p.primary)}: no such service in this file (service ${p.key})`);
      else if (prim.primary !== undefined) {
        err(field, `${JSON.stringify(p.primary)} is itself a secondary of ${prim.primary}; ${p.key} must name ${prim.primary} (no chains)`);
      }
      if (p.ipamGiven) err(p.raw.ipam !== undefined ? at('ipam') : at('annotations', ANNOTATIONS.ipam), `service ${p.key} shares the IP of ${p.primary}; a secondary takes the primary's IPAM mode and may not set one`);
      if (p.raw.loadBalancerIP) err(at('loadBalancerIP'), `service ${p.key} shares the IP of ${p.primary}; a secondary may not ask for its own IP`);
      if (p.raw.loadBalancerIPs !== undefined) err(at('loadBalancerIPs'), `service ${p.key} shares the IPs of ${p.primary}; a secondary may not ask for its own IPs`);
      for (const k of ['ipFamilies', 'ipFamilyPolicy'] as const) {
        if (p.raw[k] !== undefined) err(at(k), `service ${p.key} shares the IPs of ${p.primary}; a secondary has the primary's families and may not set ${k}`);
      }
      if (p.raw.vrid !== undefined) err(at('vrid'), `service ${p.key} shares the IP of ${p.primary}; its VIP rides the primary's virtual router`);
      if (prim && p.raw.network !== undefined && (p.raw.network) !== (prim.raw.network ?? DEFAULT_NETWORK)) {
        err(at('network'), `service ${p.key} shares the IP of ${p.primary}, which is on network ${prim.raw.network ?? DEFAULT_NETWORK}; a secondary is on its primary's network (leave network out)`);
      }
    } else {
      const asked = p.raw.loadBalancerIPs?.map((a, i) => ({ a, segs: at('loadBalancerIPs', i) })) ?? (p.raw.loadBalancerIP ? [{ a: p.raw.loadBalancerIP, segs: at('loadBalancerIP') }] : []);
      for (const { a, segs } of asked) {
        const other = lbIps.get(a);
        if (other) err(segs, `${a} is also asked for by ${other}; use primaryService to share an IP`);
        lbIps.set(a, p.key);
      }
    }
  }
  // No two services on one VIP with the same protocol and port.
  const groups = new Map<string, typeof prelim>();
  for (const p of prelim) {
    const root = p.primary !== undefined && byKey.has(p.primary) ? p.primary : p.key;
    groups.set(root, [...(groups.get(root) ?? []), p]);
  }
  for (const [root, members] of groups) {
    if (members.length < 2) continue;
    const used = new Map<string, string>();
    for (const m of members) {
      m.ports.forEach((port, pi) => {
        const id = `${port.protocol}/${port.port}`;
        const other = used.get(id);
        if (other !== undefined && other !== m.key) {
          err(['services', m.idx, 'ports', pi, 'port'], `${port.protocol} ${port.port} of ${m.key} clashes with ${other}: services sharing the IP of ${root} may not use the same protocol and port`);
        }
        used.set(id, m.key);
      });
    }
  }

  // Under VRRP a router is named by its VRID (status, the lbagent_vrrp_*
  // metrics): routers of two networks may not share one.
  if (raw.failover.mode === 'vrrp') {
    const vridNet = new Map<number, { network: string; segs: Seg[] }>();
    const reported = new Set<string>();
    for (const p of prelim) {
      if (p.primary !== undefined) continue;
      const net = p.raw.network ?? DEFAULT_NETWORK;
      const netVrid = net === DEFAULT_NETWORK ? raw.failover.vrid : (raw.networks[net]?.failover.vrid ?? raw.failover.vrid);
      const vrid = p.raw.vrid ?? netVrid;
      const segs: Seg[] = p.raw.vrid !== undefined ? ['services', p.idx, 'vrid'] : net === DEFAULT_NETWORK ? ['failover', 'vrid'] : ['networks', net, 'failover', 'vrid'];
      const seen = vridNet.get(vrid);
      if (seen && seen.network !== net) {
        if (reported.has(pathText(segs))) continue;
        reported.add(pathText(segs));
        err(segs, `VRID ${vrid} of network ${net} (service ${p.key}) is also a virtual router of network ${seen.network} (${pathText(seen.segs)}); give each network its own VRIDs (set networks.<name>.failover.vrid)`);
      } else if (!seen) vridNet.set(vrid, { network: net, segs });
    }
  }

  // The families each service is served in (config/families.ts): the
  // primaries first, since a secondary takes its primary's.
  const plans = new Map<string, FamilyPlan>();
  for (const p of prelim) {
    if (p.primary !== undefined) continue;
    if (p.taken !== undefined) { plans.set(p.key, p.taken.plan); continue; }
    const at = (...segs: Seg[]): Seg[] => ['services', p.idx, ...segs];
    const { plan, problems } = planFamilies({
      namespace: p.raw.namespace, ipam: p.ipam ?? DEFAULTS.ipam,
      ipFamilies: p.raw.ipFamilies, ipFamilyPolicy: p.raw.ipFamilyPolicy,
      loadBalancerIP: p.raw.loadBalancerIP || undefined, loadBalancerIPs: p.raw.loadBalancerIPs,
      backends: p.backends.map((b, i) => ({ family: b.family ?? 'IPv4', address: b.address, segs: p.backendSegs[i]! })),
    }, { pools: poolsOfNetwork(pools, p.raw.network) });
    for (const pr of problems) err(at(...pr.segs), `service ${p.key}: ${pr.message}`);
    plans.set(p.key, plan);
  }

  // One ServiceSpec per served family ("family services", types.ts).
  const out: ServiceSpec[] = [];
  const built = new Map<string, BuiltService>();
  for (const p of prelim) {
    if (p.taken !== undefined) {
      out.push(...p.taken.specs);
      built.set(texts[p.idx]!, p.taken);
      continue;
    }
    const first = out.length;
    const prim = p.primary !== undefined ? byKey.get(p.primary) : undefined;
    const ipam: IpamMode = (prim ? prim.ipam : p.ipam) ?? DEFAULTS.ipam;
    const plan = plans.get(prim ? prim.key : p.key);
    if (!plan) continue; // a secondary of a missing primary: reported above
    if (prim) {
      p.backends.forEach((b, i) => {
        const f = b.family ?? 'IPv4';
        if (!plan.requested.includes(f)) err(p.backendSegs[i]!, `service ${p.key}: ${JSON.stringify(b.address)} is ${f}, but ${prim.key}, whose IPs it shares, is ${plan.requested.join(' and ')} only; each VIP forwards to backends of its own family`);
      });
    }
    for (const family of plan.served) {
      out.push({
        key: familyServiceKey(p.key, family), family, ipFamilies: plan.served, ipFamilyPolicy: plan.policy,
        ...(plan.notes.length > 0 ? { familyNotes: plan.notes } : {}),
        name: p.raw.name, namespace: p.raw.namespace, ipam,
        primaryService: p.primary === undefined ? undefined : familyServiceKey(p.primary, family),
        loadBalancerIP: prim ? undefined : plan.addresses.get(family),
        vrid: p.raw.vrid, priority: p.raw.priority, ports: p.ports,
        backends: p.backends.filter((b) => (b.family ?? 'IPv4') === family), healthCheck: p.hc,
        sourceIP: p.raw.sourceIP, topology: p.raw.topology,
        ...(p.raw.proxyProtocol !== undefined ? { proxyProtocol: p.raw.proxyProtocol } : {}),
        ...networkField((prim ?? p).raw.network),
      });
    }
    // Kept for the next parse when nothing but its own text decides what it builds.
    if (p.primary === undefined && p.hc.type !== 'https' && texts[p.idx] !== undefined) {
      built.set(texts[p.idx]!, {
        raw: p.raw, ipam: p.ipam, ipamGiven: p.ipamGiven, hc: p.hc, ports: p.ports, backends: p.backends,
        plan, specs: out.slice(first),
      });
    }
  }
  return { specs: out, built };
}

/** A service's network field: absent for the default network, so a config without networks: builds what it always did. */
function networkField(network: string | undefined): { network?: string } {
  return network === undefined || network === DEFAULT_NETWORK ? {} : { network };
}

/**
 * The named networks: each one's pools (tagged with its name), interface
 * and virtual-router settings (unset ones from the top-level failover).
 * A pool belongs to one network: an address range in two networks' pools
 * is refused, as is a NIC two networks name.
 */
function buildNetworks(raw: RawConfig, defaultPools: readonly Pool[], err: (segs: Seg[], msg: string) => void): NetworkSpec[] {
  const out: NetworkSpec[] = [];
  const owners: { segs: Seg[]; pool: Pool }[] = defaultPools.map((pool) => ({ segs: ['pools', pool.key], pool }));
  const nics = new Map<string, string>();
  if (raw.node.interface !== undefined) nics.set(raw.node.interface, 'node.interface (the default network)');
  for (const [name, n] of Object.entries(raw.networks)) {
    if (name === DEFAULT_NETWORK) {
      err(['networks', name], `"${DEFAULT_NETWORK}" is the node's own network (node.interface with the top-level pools and failover settings); give this network another name, or configure the default one there`);
      continue;
    }
    const other = nics.get(n.interface);
    if (other !== undefined) err(['networks', name, 'interface'], `${JSON.stringify(n.interface)} is also the interface of ${other}; each network is a NIC of its own (put these pools and services on one network)`);
    else nics.set(n.interface, `networks.${name}`);
    const parsed = parsePools(n.pools);
    for (const pe of parsed.errors) err(['networks', name, 'pools', pe.key], pe.message);
    const pools = parsed.pools.map((p) => ({ ...p, network: name }));
    for (const pool of pools) owners.push({ segs: ['networks', name, 'pools', pool.key], pool });
    // Unset peers are the top-level ones, of both families; the track is
    // this network's own (built with the services, buildConfig).
    const peers = splitPeers(n.failover.peers ?? raw.failover.peers);
    out.push({
      name, interface: n.interface, pools,
      failover: { interface: n.failover.interface ?? n.interface, vrid: n.failover.vrid ?? raw.failover.vrid, ...peers, track: NO_TRACK },
    });
  }
  // A pool belongs to one network only: its addresses go on that network's NIC.
  const ranges = owners.flatMap((o) => o.pool.ranges.map((r) => ({ ...o, r })));
  ranges.sort((x, y) => (x.r.family !== y.r.family ? (x.r.family < y.r.family ? -1 : 1) : x.r.start < y.r.start ? -1 : x.r.start > y.r.start ? 1 : 0));
  let reach: (typeof ranges)[number] | undefined;
  for (const cur of ranges) {
    if (reach && reach.r.family === cur.r.family && cur.r.start <= reach.r.end && (reach.pool.network ?? DEFAULT_NETWORK) !== (cur.pool.network ?? DEFAULT_NETWORK)) {
      err(cur.segs, `${JSON.stringify(cur.r.text)} overlaps ${JSON.stringify(reach.r.text)} of ${pathText(reach.segs)}: a pool belongs to one network only (its addresses go on that network's interface)`);
    }
    if (!reach || reach.r.family !== cur.r.family || cur.r.end > reach.r.end) reach = cur;
  }
  return out;
}

/** failover.peers (or a network's) split by family: IPv4 as numbers, IPv6 as RFC 5952 text. */
function splitPeers(peers: readonly string[]): { peers: number[]; peers6: string[] } {
  return {
    peers: peers.filter((a) => familyOf(a) === 'IPv4').map((a) => parseIPv4(a)!),
    peers6: peers.map((a) => parseAddress(a)).filter((a) => a?.family === 'IPv6').map((a) => formatAddress(a!)),
  };
}

const NO_TRACK: TrackConfig = { interfaces: [], services: [] };

/**
 * A track section (failover.track for the default network's routers,
 * networks.<name>.failover.track for that network's), checked against the
 * services of the file: a tracked service must exist, be on that network
 * (its track lowers that network's routers, which carry its VIP), run
 * health checks (without them every backend counts as healthy and the
 * track could never fire) and have at least minHealthy backends (or it
 * would fail from the start, for good). An interface is not looked up here
 * (the file is validated off the VM too): `lb-agent check` warns about one
 * the VM does not have.
 */
function buildTrack(t: RawTrack, where: Seg[], network: string, raw: RawConfig, built: readonly ServiceSpec[], err: (segs: Seg[], msg: string) => void): TrackConfig {
  const name = pathText(where);
  const seenIf = new Map<string, number>();
  const interfaces = t.interfaces.map((x, i) => {
    const other = seenIf.get(x.name);
    if (other !== undefined) err([...where, 'interfaces', i, 'name'], `${JSON.stringify(x.name)} is tracked twice (also ${name}.interfaces[${other}])`);
    seenIf.set(x.name, i);
    return { name: x.name, weight: x.weight, failAfter: x.failAfter, recoverAfter: x.recoverAfter };
  });
  const seenSvc = new Map<string, number>();
  const services = t.services.map((x, i) => {
    const at = (...segs: Seg[]): Seg[] => [...where, 'services', i, ...segs];
    const key = x.service.includes('/') ? x.service : serviceKey(DEFAULTS.namespace, x.service);
    const other = seenSvc.get(key);
    if (other !== undefined) err(at('service'), `${JSON.stringify(key)} is tracked twice (also ${name}.services[${other}])`);
    seenSvc.set(key, i);
    const svc = raw.services.find((s) => serviceKey(s.namespace, s.name) === key);
    // Its network as built (a secondary's is its primary's); unknown when the service was refused.
    const spec = built.find((s) => familyServiceKey(key, s.family ?? 'IPv4') === s.key);
    const on = spec ? spec.network ?? DEFAULT_NETWORK : undefined;
    if (!svc) {
      const known = raw.services.map((s) => serviceKey(s.namespace, s.name));
      err(at('service'), `${JSON.stringify(x.service)}: no service ${key} in this file${known.length > 0 ? ` (services: ${known.slice(0, 10).join(', ')}${known.length > 10 ? ', ...' : ''})` : ''}`);
    } else if (on !== undefined && on !== network) {
      err(at('service'), `service ${key} is on network ${on}, and ${name} lowers the priority of network ${network}'s virtual routers only, which do not carry its VIP: track it under ${on === DEFAULT_NETWORK ? 'failover.track' : `networks.${on}.failover.track`}`);
    } else if (!svc.healthCheck.enabled) {
      err(at('service'), `service ${key} has healthCheck.enabled: false, so every backend counts as healthy and this track could never lower the priority: turn its health check on, or remove the track`);
    } else if (x.minHealthy > svc.backends.length) {
      err(at('minHealthy'), `${x.minHealthy} is more than the ${svc.backends.length} backend${svc.backends.length === 1 ? '' : 's'} of service ${key}: the track would fail from the start and never recover`);
    }
    return { service: key, minHealthy: x.minHealthy, weight: x.weight, failAfter: x.failAfter, recoverAfter: x.recoverAfter };
  });
  return { interfaces, services };
}

/**
 * The TLS settings of an HTTPS check. The CA file is read here, at load and
 * at every reload, so a missing, unreadable or non-PEM file is refused with
 * the field's path, and a reload sees a CA file that changed on disk.
 */
function tlsCheck(t: { sni?: string; caFile?: string }, err: (segs: Seg[], msg: string) => void, readCa: CaFileReader): TlsCheckSpec {
  // RFC 6066 §3: "Literal IPv4 and IPv6 addresses are not permitted in HostName."
  if (t.sni !== undefined && isIP(t.sni) !== 0) err(['sni'], `${JSON.stringify(t.sni)} is an IP address; SNI carries a host name only (RFC 6066 §3): name the host the certificate is for, or leave sni out to send none`);
  let ca: { pem: string; sha256: string } | undefined;
  if (t.caFile !== undefined) {
    const r = readCa(t.caFile);
    if (r.ok) ca = r;
    else err(['caFile'], r.message);
  }
  return { sni: t.sni, caFile: t.caFile, ca: ca?.pem, caSha256: ca?.sha256 };
}

// The typed healthCheck fields as the user wrote them (before schema defaults),
// so that an annotation only conflicts with a value the user actually set.
const explicitHc = new WeakMap<object, Set<string>>();
function rawHc<K extends 'successThreshold' | 'failureThreshold' | 'periodSeconds' | 'timeoutSeconds'>(s: RawService, k: K): number | undefined {
  const set = explicitHc.get(s.healthCheck);
  return set && set.has(k) ? s.healthCheck[k] : undefined;
}

export function deepFreeze<T>(o: T): T {
  if (o && typeof o === 'object' && !Object.isFrozen(o)) {
    Object.freeze(o);
    for (const v of Object.values(o as object)) deepFreeze(v);
  }
  return o;
}

/**
 * A network's peers under VRRP (failover.peers for the default network,
 * networks.<name>.failover.peers, or the top-level ones it inherits): each
 * an address another agent can send adverts from, and peers for every
 * family that has VIPs on that network. Each family is its own instance
 * (RFC 5798 §5.1): peers of one family only would leave the other instance
 * listening to any host on the LAN, which is what listing peers means to
 * rule out. `own`: the list is written at `segs` (an inherited one is
 * checked address by address where it is written).
 */
function failoverPeerProblems(peers: readonly string[], segs: Seg[], own: boolean, network: string, services: readonly ServiceSpec[], err: (segs: Seg[], message: string) => void): void {
  const listed = new Set<Family>();
  peers.forEach((text, i) => {
    const a = parseAddress(text);
    if (!a) return; // the schema reported it
    listed.add(a.family);
    if (a.family !== 'IPv6' || !own) return;
    const v = a.value;
    if (v === 0n || v === 1n || v >> 120n === 0xffn || v >> 32n === 0xffffn) {
      err([...segs, i], `${text} is not an address another agent sends VRRP adverts from (unspecified, loopback, multicast or IPv4-mapped); list its link-local (fe80::/10) or global IPv6 address`);
    }
  });
  if (listed.size === 0) return;
  const where = network === DEFAULT_NETWORK ? '' : ` on network ${network}`;
  for (const f of ['IPv4', 'IPv6'] as const) {
    // A dual-stack DHCP service's IPv6 VIP rides its IPv4 router (families.ts tiedToIpv4): no IPv6 instance.
    const svc = services.find((s) => (s.family ?? 'IPv4') === f && s.primaryService === undefined && (s.network ?? DEFAULT_NETWORK) === network && tiedToIpv4(s) === undefined);
    if (svc && !listed.has(f)) {
      err(segs, `lists no ${f} address, but service ${svc.key}${where} has an ${f} VIP: its ${f} VRRP instance would hear adverts from any host; add the other agents' ${f} addresses${f === 'IPv6' ? ' (link-local or global)' : ''}${own || network === DEFAULT_NETWORK ? '' : `, or set networks.${network}.failover.peers`}`);
    }
  }
}

/**
 * The tracks of every network, and the top-level one's meaning: it lowers
 * the default network's routers only. Under VRRP, a top-level track in a
 * file whose services all live on named networks would lower nothing: it is
 * refused with where it belongs.
 */
function buildTracks(raw: RawConfig, networks: readonly NetworkSpec[], built: readonly ServiceSpec[], err: (segs: Seg[], msg: string) => void): { track: TrackConfig; networks: NetworkSpec[] } {
  const track = buildTrack(raw.failover.track, ['failover', 'track'], DEFAULT_NETWORK, raw, built, err);
  const primaries = built.filter((s) => s.primaryService === undefined);
  const tracked = track.interfaces.length + track.services.length > 0;
  if (raw.failover.mode === 'vrrp' && tracked && primaries.length > 0 && primaries.every((s) => s.network !== undefined)) {
    const nets = [...new Set(primaries.map((s) => s.network!))];
    err(['failover', 'track'], `lowers the default network's virtual routers only, and no service is on the default network (every one is on ${nets.join(', ')}): move it under ${nets.map((n) => `networks.${n}.failover.track`).join(' and ')}`);
  }
  return {
    track,
    networks: networks.map((n) => ({ ...n, failover: { ...n.failover, track: buildTrack(raw.networks[n.name]!.failover.track, ['networks', n.name, 'failover', 'track'], n.name, raw, built, err) } })),
  };
}

/**
 * Validate already-parsed data (e.g. from YAML) into a frozen Desired.
 * `readCa` reads the CA files HTTPS checks name (the configuration
 * reference passes one that reads nothing).
 */
export function buildConfig(data: unknown, locate: (segs: Seg[]) => number | undefined = () => undefined, hostname = os.hostname(), readCa: CaFileReader = readCaFile, reuse?: ConfigReuse, keys?: readonly string[]): LoadResult {
  const errors: ConfigError[] = [];
  const err = (segs: Seg[], message: string): void => {
    const line = locate(segs);
    errors.push(line === undefined ? { path: pathText(segs), message } : { path: pathText(segs), message, line });
  };
  // A config tool that truncates the file before writing it must not
  // make a reload remove every service; "no services" has to be said outright.
  if (data === null || data === undefined) {
    err([], 'the file is empty; write `services: []` to run with no services on purpose');
    return { ok: false, errors };
  }
  if (typeof data !== 'object' || Array.isArray(data)) {
    err([], `the file must be a YAML mapping of settings, not ${show(data)}`);
    return { ok: false, errors };
  }
  if (!Object.prototype.hasOwnProperty.call(data, 'services')) {
    err(['services'], 'is required: list the services, or write `services: []` to run with none on purpose');
  }
  // Each entry's text, and the file's other sections': the keys of what a reload takes again (ConfigReuse).
  const given: unknown = (data as { services?: unknown }).services;
  const entries: readonly unknown[] = Array.isArray(given) ? given : [];
  const texts = keys ?? entries.map((s) => JSON.stringify(s) ?? '');
  const globals = JSON.stringify({ ...data, services: undefined });
  const taken = reuse !== undefined && reuse.globals === globals ? texts.map((t) => reuse.byText.get(t)) : [];
  // Only the entries not taken again are copied and validated; an error's index is the file's.
  const fresh = entries.flatMap((s, i) => (taken[i] === undefined ? [{ s, i }] : []));
  const work = structuredClone(Array.isArray(given) ? { ...data, services: fresh.map((f) => f.s) } : data) as Record<string, unknown>;
  // Remember which healthCheck fields were written, before defaults fill them.
  const services = Array.isArray(work.services) ? work.services : [];
  for (const s of services) {
    if (s && typeof s === 'object' && (s as RawService).healthCheck && typeof (s as RawService).healthCheck === 'object') {
      explicitHc.set((s as RawService).healthCheck, new Set(Object.keys((s as RawService).healthCheck)));
    }
  }
  const validate = validator();
  if (!validate(work)) {
    for (const e of schemaErrors(validate.errors ?? [])) {
      const segs = e.segs[0] === 'services' && typeof e.segs[1] === 'number' && fresh[e.segs[1]] !== undefined ? ['services', fresh[e.segs[1]]!.i, ...e.segs.slice(2)] : e.segs;
      err(segs, e.message);
    }
    return { ok: false, errors };
  }
  if (Array.isArray(given)) {
    const validated = work.services as RawService[];
    const all: RawService[] = new Array<RawService>(given.length);
    fresh.forEach((f, j) => { all[f.i] = validated[j]!; });
    taken.forEach((b, i) => { if (b !== undefined) all[i] = b.raw; });
    work.services = all;
  }
  const raw = work as unknown as RawConfig;

  const listen = raw.metrics.listen;
  if (listen !== '' && !parseListen(listen)) err(['metrics', 'listen'], `${JSON.stringify(listen)} is not host:port (e.g. 0.0.0.0:9477) or "" to turn metrics off`);
  if (raw.arp.refreshInterval > 0 && raw.arp.refreshInterval < 0.1) err(['arp', 'refreshInterval'], `${raw.arp.refreshInterval} is below 0.1 s: use 0 to turn the refresh off, or 0.1 or more`);
  if (raw.arp.probeMin > raw.arp.probeMax) err(['arp', 'probeMin'], `${raw.arp.probeMin} is larger than arp.probeMax (${raw.arp.probeMax})`);
  if (raw.dhcp.retransmitInitial > raw.dhcp.retransmitMax) err(['dhcp', 'retransmitInitial'], `${raw.dhcp.retransmitInitial} is larger than dhcp.retransmitMax (${raw.dhcp.retransmitMax})`);

  const { pools, errors: poolErrors } = parsePools(raw.pools);
  for (const pe of poolErrors) err(['pools', pe.key], pe.message);

  const untracked = buildNetworks(raw, pools, err);
  const { specs: built, built: byText } = buildServices(raw, [...pools, ...untracked.flatMap((n) => n.pools)], err, readCa, taken, texts);
  const { track, networks } = buildTracks(raw, untracked, built, err);
  // A VM that is a backend of a VIP cannot also be the load balancer that
  // holds it: the VIP on lo would take the clients' packets for itself.
  if (raw.kernel.natPorts[0] > raw.kernel.natPorts[1]) err(['kernel', 'natPorts'], `[${raw.kernel.natPorts.join(', ')}] is reversed`);
  raw.backend.vips.forEach((vip, i) => {
    const svc = raw.services.find((s) => s.loadBalancerIP === vip);
    if (svc) err(['backend', 'vips', i], `${vip} is also the loadBalancerIP of service ${serviceKey(svc.namespace, svc.name)} on this node: a VM is either the load balancer holding a VIP or a backend with it on lo, not both`);
  });
  if (raw.failover.mode === 'vrrp') {
    failoverPeerProblems(raw.failover.peers, ['failover', 'peers'], true, DEFAULT_NETWORK, built, err);
    for (const [name, n] of Object.entries(raw.networks)) {
      const own = n.failover.peers !== undefined;
      failoverPeerProblems(n.failover.peers ?? raw.failover.peers, own ? ['networks', name, 'failover', 'peers'] : ['failover', 'peers'], own, name, built, err);
    }
  }
  if (errors.length > 0) return { ok: false, errors };

  const config: Desired = {
    node: {
      name: raw.node.name ?? hostname, interface: raw.node.interface, priority: raw.node.priority,
      zone: raw.node.zone, region: raw.node.region, labelsFile: raw.node.labelsFile,
    },
    failover: {
      mode: raw.failover.mode, vrid: raw.failover.vrid,
      // RFC 5798 §5.2.7: the interval travels in centiseconds.
      advertInterval: Math.round(raw.failover.advertInterval * 100) / 100,
      preempt: raw.failover.preempt, preemptDelay: raw.failover.preemptDelay, interface: raw.failover.interface,
      ...splitPeers(raw.failover.peers),
      vrid6: raw.failover.vrid6,
      track,
    },
    stateDir: raw.stateDir,
    metrics: { listen: raw.metrics.listen },
    control: { socket: raw.control.socket },
    reconcile: { resyncInterval: raw.reconcile.resyncInterval },
    dataplane: raw.dataplane,
    pools,
    ...(networks.length > 0 ? { networks } : {}),
    arp: raw.arp,
    dhcp: { ...raw.dhcp, servers: raw.dhcp.servers.map((a) => parseIPv4(a)!), servers6: raw.dhcp.servers6.map((d) => d.toLowerCase()) },
    proxy: raw.proxy,
    kernel: { engine: raw.kernel.engine, flowEntries: raw.kernel.flowEntries, natPorts: [raw.kernel.natPorts[0], raw.kernel.natPorts[1]] },
    // Canonical text (RFC 5952 for IPv6): lo's addresses are listed so.
    backend: { vips: raw.backend.vips.map((v) => formatAddress(parseAddress(v)!)) },
    services: built,
  };
  const next = new ConfigReuse(globals, byText);
  next.taken = taken.filter((b) => b !== undefined).length;
  next.validated = fresh.length;
  return { ok: true, config: deepFreeze(config), reuse: next };
}

/** Parse YAML text and validate it. `source` names the file in messages. */
export function parseConfigText(text: string, hostname?: string, reuse?: ConfigReuse): LoadResult {
  return parseByEntries(text, hostname, reuse) ?? parseWhole(text, hostname, reuse);
}

/** The whole file parsed as one document: what every parse's result, its errors and their lines included, is. */
export function parseWhole(text: string, hostname?: string, reuse?: ConfigReuse): LoadResult {
  const y = parseYaml(text);
  if (!y.ok) {
    // An alias bomb is refused before anything expands it: an ordinary error, at the first alias.
    const message = y.kind === 'aliases' ? y.message
      : y.column !== undefined ? `YAML syntax error at column ${y.column}: ${y.message}` : `YAML syntax error: ${y.message}`;
    return { ok: false, errors: [y.line !== undefined ? { path: '', message, line: y.line } : { path: '', message }] };
  }
  return buildConfig(y.data, (segs) => y.locate(segs), hostname, undefined, reuse);
}

/**
 * The file parsed by its service entries (split.ts): the other sections as
 * one document, and only the entries whose text `reuse` has not built
 * before, each alone. Undefined, for the whole parse, when the file is not
 * cut or anything in it fails to parse or validate: an error is always the
 * whole parse's, with its line. An entry's key is its text as it is: it
 * begins with spaces or `- ` (split.ts), which no key of the whole parse
 * (JSON text: `{`, `[`, `"`, a digit, `-` and a digit, or a literal) does, so the
 * two kinds of key never meet, and no copy of a thousand texts is made to
 * tell them apart.
 */
function parseByEntries(text: string, hostname?: string, reuse?: ConfigReuse): LoadResult | undefined {
  const cut = splitServiceEntries(text);
  if (cut === undefined) return undefined;
  const head = parseYaml(cut.head);
  if (!head.ok || head.data === null || typeof head.data !== 'object' || Array.isArray(head.data)) return undefined;
  const top = head.data as Record<string, unknown>;
  if (!Array.isArray(top.services) || top.services.length !== 0) return undefined;
  const keys = cut.entries;
  const globals = JSON.stringify({ ...top, services: undefined });
  const known = reuse !== undefined && reuse.globals === globals ? reuse.byText : undefined;
  const services: unknown[] = new Array<unknown>(keys.length);
  let parsed = 0;
  for (let i = 0; i < keys.length; i++) {
    // A taken entry's data is not read (buildConfig takes its validated form).
    if (known?.has(keys[i]!)) { services[i] = null; continue; }
    const y = parseYaml(cut.entries[i]!);
    parsed++;
    if (!y.ok || !Array.isArray(y.data) || y.data.length !== 1) return undefined;
    services[i] = y.data[0];
  }
  const r = buildConfig({ ...top, services }, () => undefined, hostname, undefined, reuse, keys);
  if (r.ok && r.reuse) r.reuse.parsed = parsed;
  return r.ok ? r : undefined;
}

export { MAX_ALIAS_COUNT } from './yaml';

/** Read (regular file, at most 4 MiB) and validate a config file, synchronously: the CLI. */
export function loadConfigFile(file: string, hostname?: string): LoadResult {
  const read = readConfigText(file);
  if (!read.ok) return read;
  return parseConfigText(read.text, hostname);
}

/** One line per error: "file:line: path: message". */
export function formatConfigErrors(errors: readonly ConfigError[], file?: string): string {
  return errors.map((e) => {
    const where = [file, e.line !== undefined ? String(e.line) : undefined].filter(Boolean).join(':');
    const head = where ? `${where}: ` : '';
    return `${head}${e.path ? `${e.path}: ` : ''}${e.message}`;
  }).join('\n');
}

/**
 * The control socket a config file names, for the commands that talk to the
 * running daemon (`status`, `reload`). Read even from a file that does not
 * validate - a reload of a broken file must still reach the daemon to be
 * refused - and the default when the file or the key is missing.
 */
export function controlSocketOf(file: string): string {
  // Only control.socket is read: the file is not validated (a thousand
  // services would cost `lb-agent status` tens of milliseconds), and a file
  // that never says "control" names no socket of its own.
  const read = readConfigText(file);
  if (!read.ok || !read.text.includes('control')) return DEFAULTS.control.socket;
  // Not YAML, or an alias bomb: the default.
  const y = parseYaml(read.text);
  const s = y.ok ? (y.data as { control?: { socket?: unknown } } | null)?.control?.socket : undefined;
  return typeof s === 'string' && s !== '' ? s : DEFAULTS.control.socket;
}
