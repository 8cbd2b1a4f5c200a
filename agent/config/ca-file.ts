// The CA file of an HTTPS health check (file I/O and X.509 parsing; no
// network): read with the config file's limits (read.ts: a regular file,
// opened non-blocking, size checked before a byte is read) and checked to
// hold at least one PEM certificate that parses, so a wrong path or a key
// file given by mistake is a config error at load and at reload, not a
// backend that fails every probe. The loader keeps the PEM text and its
// digest in the typed config; the checker builds one TLS context per digest.
// node:crypto is required only when a CA file is there to check: a config
// without one starts without it.
import { errorMessage } from '../errors';
import { readConfigText } from './read';

/** A CA bundle larger than this is refused (the Debian system bundle is about 220 KiB). */
export const MAX_CA_FILE_BYTES = 1024 * 1024;

export type CaFileResult =
  | { readonly ok: true; readonly pem: string; readonly sha256: string; readonly certificates: number }
  | { readonly ok: false; readonly message: string };

/** Reads a CA file: a path in, its PEM text and digest, or why it cannot serve. */
export type CaFileReader = (file: string) => CaFileResult;

const PEM_CERT = /-----BEGIN CERTIFICATE-----[\s\S]*?-----END CERTIFICATE-----/g;

/** Checks PEM text: every CERTIFICATE block must parse, and there must be one. Pure. */
export function checkCaPem(file: string, pem: string): CaFileResult {
  const { createHash, X509Certificate } = require('node:crypto') as typeof import('node:crypto');
  const blocks = pem.match(PEM_CERT) ?? [];
  if (blocks.length === 0) {
    return { ok: false, message: `${file} holds no PEM certificate (-----BEGIN CERTIFICATE-----); point caFile at the CA certificate the backends' certificates are signed by` };
  }
  for (let i = 0; i < blocks.length; i++) {
    try {
      new X509Certificate(blocks[i]!);
    } catch (e) {
      return { ok: false, message: `${file}: certificate ${i + 1} of ${blocks.length} does not parse (${errorMessage(e)})` };
    }
  }
  return { ok: true, pem, sha256: createHash('sha256').update(pem).digest('hex'), certificates: blocks.length };
}

/** The real reader: the file off disk, synchronously (a small regular file; the loader runs in a worker for large configs). */
export const readCaFile: CaFileReader = (file) => {
  const read = readConfigText(file, MAX_CA_FILE_BYTES);
  if (!read.ok) return { ok: false, message: read.errors.map((e) => e.message).join('; ') };
  return checkCaPem(file, read.text);
};
