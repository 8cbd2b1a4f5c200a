// The schema's own string formats (`format: lb-ipv4`, `lb-ip` in schema.ts): one home
// for the build-time compiler (validator-build.ts) and for the validator it
// generates, which requires this file at run time.
import { parseAddress, parseIPv4 } from '../address';

export const formats: Readonly<Record<string, (value: string) => boolean>> = {
  'lb-ipv4': (v) => parseIPv4(v) !== undefined,
  'lb-ip': (v) => parseAddress(v) !== undefined,
};
