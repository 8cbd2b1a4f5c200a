// The control socket's operations (`lb-agent status`, `reload`, a
// successor's `handover`): which op does what, and the words of a refusal.
// A dispatcher over what the daemon hands it; the socket itself is
// control/server.ts.

/** What the operations reach of the daemon. */
export interface ControlTarget {
  /** The status document (`lb-agent status`). */
  status(): unknown;
  /** A reload, as SIGHUP runs it. */
  reload(): Promise<unknown>;
  /** The first reconcile has run. */
  started(): boolean;
  stopping(): boolean;
  /** Sends the listening sockets to a successor and begins a hand-over stop; absent where nothing is handed over (systemd). */
  readonly onHandover: ((path: string) => unknown) | undefined;
}

/** The ops known, as an unknown op's refusal names them. */
export const CONTROL_OPS = ['status', 'ping', 'reload', 'handover'] as const;

/** Carry out one request; a refusal throws, and the socket answers with its message. */
export function controlOp(target: ControlTarget, op: string, req: Readonly<Record<string, unknown>>): unknown {
  if (op === 'status') return target.status();
  if (op === 'ping') return 'pong';
  if (op === 'reload') return target.reload();
  if (op === 'handover') {
    if (!target.started()) throw new Error('this agent is still starting; try again once `lb-agent status` shows it started');
    if (!target.onHandover) throw new Error('this agent hands nothing over: it runs under systemd, whose fd store keeps the listening sockets across `systemctl restart`');
    if (target.stopping()) throw new Error('this agent is already stopping');
    if (typeof req.path !== 'string' || !req.path.startsWith('/')) throw new Error('handover needs "path", the absolute path of the successor\'s unix datagram socket');
    return target.onHandover(req.path);
  }
  throw new Error(`unknown op ${JSON.stringify(op)} (known: ${CONTROL_OPS.join(', ')})`);
}
