// Preflight, presentation layer (pure): the exit code, the one-line verdict,
// the human table and the JSON document of a list of check results.
import type { CheckResult } from './checks';

/** 0: nothing failed (warnings fail only with --strict); 1: something failed; 2: bad usage. */
export const EXIT_OK = 0;
export const EXIT_FAILED = 1;
export const EXIT_USAGE = 2;

export function exitCode(results: readonly CheckResult[], strict: boolean): number {
  if (results.some((r) => r.status === 'fail')) return EXIT_FAILED;
  if (strict && results.some((r) => r.status === 'warn')) return EXIT_FAILED;
  return EXIT_OK;
}

export function verdict(results: readonly CheckResult[], strict: boolean): string {
  const failed = results.filter((r) => r.status === 'fail').map((r) => r.id);
  const warned = results.filter((r) => r.status === 'warn').map((r) => r.id);
  const warnings = warned.length > 0 ? `${warned.length} warning${warned.length > 1 ? 's' : ''} (${warned.join(', ')})` : '';
  if (failed.length > 0) {
    return `FAIL: ${failed.length} check${failed.length > 1 ? 's' : ''} failed (${failed.join(', ')})${warnings ? `, ${warnings}` : ''}; lb-agent cannot run here as configured`;
  }
  if (warned.length > 0 && strict) return `FAIL (--strict): ${warnings}`;
  if (warned.length > 0) return `OK with ${warnings}: lb-agent can run here`;
  return `OK: all ${results.length} checks passed; lb-agent can run here`;
}

const MARK: Record<CheckResult['status'], string> = { pass: 'ok', warn: 'WARN', fail: 'FAIL' };

/** A table: status, id, detail, and an indented "fix:" line under anything not passing. */
export function formatHuman(results: readonly CheckResult[], strict: boolean): string {
  const idWidth = Math.max(...results.map((r) => r.id.length), 5);
  const lines: string[] = [];
  for (const r of results) {
    lines.push(`${MARK[r.status].padEnd(4)}  ${r.id.padEnd(idWidth)}  ${r.detail}`);
    if (r.remedy) lines.push(`${''.padEnd(4)}  ${''.padEnd(idWidth)}  fix: ${r.remedy}`);
  }
  lines.push('', `verdict: ${verdict(results, strict)}`);
  return `${lines.join('\n')}\n`;
}

export interface JsonReport {
  ok: boolean;
  checks: { id: string; status: CheckResult['status']; detail: string; remedy: string | null }[];
}

export function toJson(results: readonly CheckResult[], strict: boolean): JsonReport {
  return {
    ok: exitCode(results, strict) === EXIT_OK,
    checks: results.map((r) => ({ id: r.id, status: r.status, detail: r.detail, remedy: r.remedy ?? null })),
  };
}

export function formatJson(results: readonly CheckResult[], strict: boolean): string {
  return `${JSON.stringify(toJson(results, strict), null, 2)}\n`;
}
