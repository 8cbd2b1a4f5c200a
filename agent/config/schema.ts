// The JSON schema of config.yaml (the user contract, docs/configuration.md). Shape and
// ranges only; cross-field rules (pools, Share IP, annotations) live in
// load.ts. `x-what` names what a value must be, for error messages such as
// "services[0].ports[0].port: 70000 is not a port (1-65535)".
import { DEFAULTS, DEFAULT_ARP, DEFAULT_DHCP, DEFAULT_DHCP_GUARD, DEFAULT_KERNEL, DEFAULT_PROXY } from './defaults';

type S = Record<string, unknown>;

const port: S = { type: 'integer', minimum: 1, maximum: 65535, 'x-what': 'a port (1-65535)' };
const ipv4: S = { type: 'string', format: 'lb-ipv4', 'x-what': 'an IPv4 address' };
// RFC 8415 §11.1: a DUID is a 2-octet type and at most 128 octets more; written as dnsmasq and Kea print it.
const duid: S = { type: 'string', pattern: '^[0-9A-Fa-f]{2}(:[0-9A-Fa-f]{2}){2,129}$', 'x-what': 'a DUID in hex octets separated by colons (00:03:00:01:...)' };
const ip: S = { type: 'string', format: 'lb-ip', 'x-what': 'an IPv4 or IPv6 address' };
const family: S = { type: 'string', enum: ['IPv4', 'IPv6'] };
const secondsPos = (min: number, max: number): S => ({ type: 'number', minimum: min, maximum: max, 'x-what': `a number of seconds (${min}-${max})` });
const count = (min: number, max: number): S => ({ type: 'integer', minimum: min, maximum: max, 'x-what': `an integer (${min}-${max})` });
const obj = (properties: S, extra: S = {}): S => ({ type: 'object', additionalProperties: false, properties, ...extra });
// A Kubernetes label value (apimachinery validation.IsValidLabelValue): what
// topology.kubernetes.io/zone and /region hold.
const labelValue: S = { type: 'string', pattern: '^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$', maxLength: 63, minLength: 1, 'x-what': 'a label value (letters, digits, -, _, .; at most 63)' };
const dnsLabel: S = { type: 'string', pattern: '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$', 'x-what': 'a DNS-1123 label (lowercase letters, digits, -; at most 63)' };

const healthCheck = obj({
  enabled: { type: 'boolean', default: DEFAULTS.healthCheck.enabled },
  type: { type: 'string', enum: ['tcp', 'http', 'https'], default: DEFAULTS.healthCheck.type },
  port,
  successThreshold: { ...count(1, 1000), default: DEFAULTS.healthCheck.successThreshold },
  failureThreshold: { ...count(1, 1000), default: DEFAULTS.healthCheck.failureThreshold },
  periodSeconds: { ...secondsPos(0.1, 3600), default: DEFAULTS.healthCheck.periodSeconds },
  timeoutSeconds: { ...secondsPos(0.01, 3600), default: DEFAULTS.healthCheck.timeoutSeconds },
  passiveFailures: { ...count(0, 1000), default: DEFAULTS.healthCheck.passiveFailures },
  // Probes send the service's PROXY protocol header too (a backend that requires it on every connection).
  proxyProtocol: { type: 'boolean', default: DEFAULTS.healthCheck.proxyProtocol },
  http: obj({
    path: { type: 'string', pattern: '^/', default: DEFAULTS.httpCheck.path, 'x-what': 'a path starting with /' },
    expectStatus: {
      type: 'array', items: count(100, 599), minItems: 2, maxItems: 2,
      default: [...DEFAULTS.httpCheck.expectStatus], 'x-what': 'a [low, high] status range',
    },
  }),
  tls: obj({
    // RFC 6066 §3: a host name, not an address; at most 253 characters.
    sni: { type: 'string', pattern: '^(?=.{1,253}$)[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9_]([-A-Za-z0-9_]{0,61}[A-Za-z0-9])?)*$', 'x-what': 'a host name (letters, digits, -, _, dots)' },
    caFile: { type: 'string', pattern: '^/', 'x-what': 'an absolute path' },
  }),
});

// failover.track: what lowers this node's VRRP priority (failover/tracking.ts).
// Weights as keepalived's, 1-254 (an effective priority never leaves 1-254).
const trackWeight: S = count(1, 254);
const track = obj({
  interfaces: {
    type: 'array', maxItems: 64, default: [], 'x-what': 'a list of { name, weight, failAfter, recoverAfter }',
    items: obj({
      name: { type: 'string', pattern: '^[^/\\s]{1,15}$', 'x-what': 'an interface name (at most 15 characters)' },
      weight: trackWeight,
      failAfter: { ...secondsPos(0, 3600), default: DEFAULTS.track.interface.failAfter },
      recoverAfter: { ...secondsPos(0, 3600), default: DEFAULTS.track.interface.recoverAfter },
    }, { required: ['name'] }),
  },
  services: {
    type: 'array', maxItems: 256, default: [], 'x-what': 'a list of { service, minHealthy, weight, failAfter, recoverAfter }',
    items: obj({
      service: { type: 'string', pattern: '^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$', 'x-what': '"namespace/name" or "name" of a service of this file' },
      minHealthy: { ...count(1, 4096), default: DEFAULTS.track.service.minHealthy },
      weight: trackWeight,
      failAfter: { ...secondsPos(0, 3600), default: DEFAULTS.track.service.failAfter },
      recoverAfter: { ...secondsPos(0, 3600), default: DEFAULTS.track.service.recoverAfter },
    }, { required: ['service'] }),
  },
});

const service = obj({
  name: dnsLabel,
  namespace: { ...dnsLabel, default: DEFAULTS.namespace },
  ipam: { type: 'string', enum: ['dhcp', 'pool'] },
  primaryService: { type: 'string', pattern: '^([a-z0-9]([-a-z0-9]*[a-z0-9])?/)?[a-z0-9]([-a-z0-9]*[a-z0-9])?$|^$', 'x-what': '"namespace/name" or "name" of another service' },
  loadBalancerIP: { anyOf: [ip, { type: 'string', maxLength: 0 }], 'x-what': 'an IPv4 or IPv6 address' },
  // Kubernetes' words: one address per family; spec.ipFamilies, spec.ipFamilyPolicy.
  loadBalancerIPs: { type: 'array', items: ip, minItems: 1, maxItems: 2, uniqueItems: true, 'x-what': 'a list of one address per family' },
  ipFamilies: { type: 'array', items: family, minItems: 1, maxItems: 2, uniqueItems: true, 'x-what': 'a list of IPv4, IPv6 (each at most once)' },
  ipFamilyPolicy: { type: 'string', enum: ['SingleStack', 'PreferDualStack', 'RequireDualStack'] },
  vrid: count(1, 255),
  priority: count(1, 254),
  annotations: { type: 'object', additionalProperties: { type: ['string', 'number', 'boolean'] }, 'x-what': 'a map of strings' },
  ports: {
    type: 'array', minItems: 1, maxItems: 256, 'x-what': 'a non-empty list of ports',
    items: obj({
      name: { type: 'string', maxLength: 63 },
      port,
      protocol: { type: 'string', enum: ['TCP', 'UDP'], default: DEFAULTS.protocol },
      targetPort: port,
    }, { required: ['port'] }),
  },
  backends: {
    type: 'array', maxItems: 4096,
    items: {
      anyOf: [ip, obj({ address: ip, weight: count(1, 256), zone: labelValue }, { required: ['address'] })],
      'x-what': 'an IPv4 or IPv6 address or { address, weight, zone }',
    },
    default: [],
  },
  healthCheck: { ...healthCheck, default: {} },
  sourceIP: { type: 'string', enum: ['snat', 'preserve'], default: DEFAULTS.sourceIP },
  topology: { type: 'string', enum: ['any', 'prefer-zone', 'zone-only'], default: DEFAULTS.topology },
  // Off unless set; the proxy data path sends the header (load.ts refuses it on the kernel path).
  proxyProtocol: { type: 'string', enum: ['v1', 'v2'] },
  // A key of networks:, or "default" (node.interface, top-level pools and failover).
  network: { ...dnsLabel, 'x-what': 'a network name (a key of networks:, or default)' },
}, { required: ['name', 'ports'] });

const ifname: S = { type: 'string', pattern: '^[^/\\s]{1,15}$', 'x-what': 'an interface name (at most 15 characters)' };

// The kube-vip pool keys; the top-level pools: and each network's.
const pools: S = {
  type: 'object', default: {},
  propertyNames: { pattern: '^(cidr|range)-[a-z0-9]([-a-z0-9]*[a-z0-9])?$' },
  additionalProperties: { type: 'string', 'x-what': 'a comma-separated list' },
  'x-what': 'a kube-vip pool key (cidr-<namespace|global> or range-<namespace|global>)',
};

// One network the VM is on: its NIC, its pools, where its virtual routers run.
const network = obj({
  interface: ifname,
  pools,
  failover: {
    ...obj({
      interface: { ...ifname, 'x-what': 'an interface name' },
      vrid: count(1, 255),
      peers: { type: 'array', items: ip, maxItems: 64, uniqueItems: true, 'x-what': 'a list of the other agents\' addresses (IPv4; IPv6 link-local or global for the IPv6 instance)' },
      track: { ...track, default: {} },
    }),
    default: {},
  },
}, { required: ['interface'] });

export const configSchema: S = obj({
  node: {
    ...obj({
      name: { type: 'string', minLength: 1, maxLength: 253 },
      interface: { type: 'string', pattern: '^[^/\\s]{1,15}$', 'x-what': 'an interface name (at most 15 characters)' },
      priority: { ...count(1, 254), default: DEFAULTS.node.priority },
      zone: labelValue,
      region: labelValue,
      labelsFile: { type: 'string', pattern: '^/', default: DEFAULTS.node.labelsFile, 'x-what': 'an absolute path' },
    }),
    default: {},
  },
  failover: {
    ...obj({
      mode: { type: 'string', enum: ['none', 'vrrp'], default: DEFAULTS.failover.mode },
      vrid: { ...count(1, 255), default: DEFAULTS.failover.vrid },
      // RFC 5798 §5.1: IPv6 VIPs ride their own instance; its VRIDs start here (default: vrid).
      vrid6: count(1, 255),
      // RFC 5798 §5.2.7: 12-bit centiseconds, so 0.01 .. 40.95 s.
      advertInterval: { ...secondsPos(0.01, 40.95), default: DEFAULTS.failover.advertInterval },
      preempt: { type: 'boolean', default: DEFAULTS.failover.preempt },
      preemptDelay: { ...secondsPos(0, 3600), default: DEFAULTS.failover.preemptDelay },
      interface: { type: 'string', pattern: '^[^/\\s]{1,15}$', 'x-what': 'an interface name' },
      peers: { type: 'array', items: ip, maxItems: 64, uniqueItems: true, default: [...DEFAULTS.failover.peers], 'x-what': 'a list of the other agents\' addresses (IPv4; IPv6 link-local or global for the IPv6 instance)' },
      track: { ...track, default: {} },
    }),
    default: {},
  },
  stateDir: { type: 'string', pattern: '^/', default: DEFAULTS.stateDir, 'x-what': 'an absolute path' },
  metrics: {
    ...obj({ listen: { type: 'string', default: DEFAULTS.metrics.listen, 'x-what': 'host:port or ""' } }),
    default: {},
  },
  control: {
    ...obj({ socket: { type: 'string', pattern: '^/', default: DEFAULTS.control.socket, 'x-what': 'an absolute path' } }),
    default: {},
  },
  reconcile: {
    ...obj({ resyncInterval: { ...secondsPos(1, 3600), default: DEFAULTS.reconcile.resyncInterval } }),
    default: {},
  },
  dataplane: { type: 'string', enum: ['auto', 'kernel', 'proxy'], default: DEFAULTS.dataplane },
  pools,
  networks: {
    type: 'object', default: {}, maxProperties: 64,
    propertyNames: { pattern: '^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$' },
    additionalProperties: network,
    'x-what': 'a network name (a DNS-1123 label)',
  },
  arp: {
    ...obj({
      probeWait: { ...secondsPos(0, 60), default: DEFAULT_ARP.probeWait },
      probeNum: { ...count(0, 20), default: DEFAULT_ARP.probeNum },
      probeMin: { ...secondsPos(0.001, 60), default: DEFAULT_ARP.probeMin },
      probeMax: { ...secondsPos(0.001, 60), default: DEFAULT_ARP.probeMax },
      announceWait: { ...secondsPos(0, 60), default: DEFAULT_ARP.announceWait },
      announceNum: { ...count(0, 20), default: DEFAULT_ARP.announceNum },
      announceInterval: { ...secondsPos(0.001, 60), default: DEFAULT_ARP.announceInterval },
      // 0 = off; load.ts refuses 0 < x < 0.1, so a typo cannot flood the LAN.
      refreshInterval: { ...secondsPos(0, 3600), default: DEFAULT_ARP.refreshInterval },
    }),
    default: {},
  },
  dhcp: {
    ...obj({
      retransmitInitial: { ...secondsPos(0.01, 64), default: DEFAULT_DHCP.retransmitInitial },
      retransmitMax: { ...secondsPos(0.01, 600), default: DEFAULT_DHCP.retransmitMax },
      retransmitJitter: { ...secondsPos(0, 10), default: DEFAULT_DHCP.retransmitJitter },
      declineWait: { ...secondsPos(0, 600), default: DEFAULT_DHCP.declineWait },
      maxConcurrentStarts: { ...count(1, 1024), default: DEFAULT_DHCP.maxConcurrentStarts },
      probeOffer: { type: 'boolean', default: DEFAULT_DHCP.probeOffer },
      allowOtherSubnets: { type: 'boolean', default: DEFAULT_DHCP_GUARD.allowOtherSubnets },
      servers: { type: 'array', items: ipv4, maxItems: 64, uniqueItems: true, default: [...DEFAULT_DHCP_GUARD.servers], 'x-what': 'a list of DHCP server identifiers (IPv4)' },
      servers6: { type: 'array', items: duid, maxItems: 64, uniqueItems: true, default: [...DEFAULT_DHCP_GUARD.servers6], 'x-what': 'a list of DHCPv6 server DUIDs' },
    }),
    default: {},
  },
  proxy: {
    ...obj({
      algorithm: { type: 'string', enum: ['round-robin', 'least-connections'], default: DEFAULT_PROXY.algorithm },
      idleTimeout: { ...secondsPos(1, 86400), default: DEFAULT_PROXY.idleTimeout },
      connectTimeout: { ...secondsPos(0.01, 60), default: DEFAULT_PROXY.connectTimeout },
      // No default here: unset means "from the descriptor limit", known only at run time.
      maxConnections: count(1, 10_000_000),
      // No default here either: unset means one per CPU (forward/proxy.ts defaultWorkers), known only at run time.
      workers: count(1, 256),
    }),
    default: {},
  },
  kernel: {
    ...obj({
      engine: { type: 'string', enum: ['nft', 'ebpf', 'auto'], default: DEFAULT_KERNEL.engine },
      flowEntries: { ...count(1024, 16_777_216), default: DEFAULT_KERNEL.flowEntries },
      natPorts: { type: 'array', items: port, minItems: 2, maxItems: 2, default: [...DEFAULT_KERNEL.natPorts], 'x-what': 'a [low, high] port range' },
    }),
    default: {},
  },
  backend: {
    ...obj({
      vips: { type: 'array', items: ip, maxItems: 1024, uniqueItems: true, default: [], 'x-what': 'a list of the VIPs (IPv4 or IPv6) of the DSR services this VM is a backend of' },
    }),
    default: {},
  },
  services: { type: 'array', items: service, default: [], maxItems: 10000 },
});
