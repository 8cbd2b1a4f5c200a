// TLS contexts of HTTPS health checks (driver state, no sockets): one
// SecureContext per distinct CA, shared by every target that trusts it, and
// one without a CA for checks that verify nothing. A context is made when
// the first target needs it and dropped with the last one, never per probe:
// building one parses the CA's certificates into an X509 store, which at
// thousands of probes a second would be most of the check's cost. Each
// target also gets its own slot for the TLS session its probes resume.
import type { SecureContext } from 'node:tls';
import type { TlsCheckSpec } from '../config/types';
import type { TlsProbeSettings } from './probe';

/** The cache key of a spec's context: its CA's digest, or '' for none. */
export function contextKey(spec: TlsCheckSpec): string {
  return spec.caSha256 ?? '';
}

interface Entry { readonly context: SecureContext; users: number }

/** node:tls (and node:crypto with it) is required by the first HTTPS target, never by an agent without one. */
const nodeTls = (): typeof import('node:tls') => require('node:tls') as typeof import('node:tls');

function createContext(ca: string | undefined): SecureContext {
  return nodeTls().createSecureContext(ca !== undefined ? { ca } : {});
}

export class TlsContexts {
  private readonly byKey = new Map<string, Entry>();

  constructor(private readonly create: (ca: string | undefined) => SecureContext = createContext) {}

  /** The probe settings of one target; pair with release() when the target goes. */
  acquire(spec: TlsCheckSpec): TlsProbeSettings {
    const key = contextKey(spec);
    let e = this.byKey.get(key);
    if (!e) {
      e = { context: this.create(spec.ca), users: 0 };
      this.byKey.set(key, e);
    }
    e.users++;
    // A session of its own per target: a ticket names one server. connect
    // is looked up here, once per target, not by every probe: a require,
    // even of a cached builtin, goes through the module loader.
    return { servername: spec.sni, context: e.context, verify: spec.ca !== undefined, resume: { session: undefined, fullAt: 0 }, connect: nodeTls().connect };
  }

  release(spec: TlsCheckSpec): void {
    const key = contextKey(spec);
    const e = this.byKey.get(key);
    if (!e) return;
    if (--e.users <= 0) this.byKey.delete(key);
  }

  /** Contexts alive now. */
  get size(): number {
    return this.byKey.size;
  }
}
