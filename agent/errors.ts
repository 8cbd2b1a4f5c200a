// Error codes: every error a user or a caller can see carries one of these
// stable codes, so callers match on `code`, never on wording (the undici /
// fastify pattern). Add new codes here, grouped by area, and nowhere else.

export const ERROR_CODES = [
  // config/
  'LB_ERR_CONFIG_INVALID',
  // cli/
  'LB_ERR_CLI_USAGE',
  // daemon/
  'LB_ERR_DAEMON_LOCKED',
  'LB_ERR_DAEMON_START',
  // control/
  'LB_ERR_CONTROL_UNREACHABLE',
  'LB_ERR_CONTROL_PROTOCOL',
  // state/
  'LB_ERR_STATE_WRITE',
  'LB_ERR_STATE_READ',
  'LB_ERR_STATE_CORRUPT',
  // net/
  'LB_ERR_NET_NO_INTERFACE',
  'LB_ERR_NET_NO_CAPABILITY',
  'LB_ERR_NET_NETLINK',
  'LB_ERR_NET_MACVLAN_UNSUPPORTED',
  'LB_ERR_NET_SOCKET',
  'LB_ERR_NET_SYSCTL',
  'LB_ERR_NET_NATIVE_MISSING',
  'LB_ERR_NET_CONNTRACK',
  // forward/
  'LB_ERR_FORWARD_NFT',
  'LB_ERR_FORWARD_NFT_MISSING',
  'LB_ERR_FORWARD_LISTEN',
  'LB_ERR_FORWARD_DSR_UNSUPPORTED',
  'LB_ERR_FORWARD_DSR_BPF',
  // failover/
  'LB_ERR_VRRP_SOCKET',
  'LB_ERR_VRRP_INVALID',
  // metrics/
  'LB_ERR_METRICS_LISTEN',
] as const;

export type ErrorCode = (typeof ERROR_CODES)[number];

/** An error with a stable code and, optionally, where it happened. */
export class LbError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, details?: Record<string, unknown>, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'LbError';
    this.code = code;
    this.details = details;
  }
}

export function isLbError(err: unknown, code?: ErrorCode): err is LbError {
  return err instanceof LbError && (code === undefined || err.code === code);
}

/** The message of anything thrown, for logs and status lines. */
export function errorMessage(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

/** errnos that say this process (or host) ran out of descriptors or socket buffers: never a peer's fault. */
export const LOCAL_EXHAUSTION_CODES = ['EMFILE', 'ENFILE', 'ENOBUFS'] as const;
export type LocalExhaustionCode = (typeof LOCAL_EXHAUSTION_CODES)[number];

/** The err's code when it is one of LOCAL_EXHAUSTION_CODES, else undefined. */
export function localExhaustionCode(err: unknown): LocalExhaustionCode | undefined {
  const code = (err as { code?: unknown } | undefined)?.code;
  return (LOCAL_EXHAUSTION_CODES as readonly unknown[]).includes(code) ? code as LocalExhaustionCode : undefined;
}
