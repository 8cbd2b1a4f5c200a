// Human output for `lb-agent status`: a table of services and, under each,
// its backends. Pure: a StatusDocument in, text out.
import type { StatusDocument } from '../daemon/daemon';

/** How many of the status document's events the text shows (newest last). */
export const STATUS_EVENTS = 10;

function table(rows: string[][], indent = ''): string {
  const widths: number[] = [];
  for (const r of rows) r.forEach((c, i) => { widths[i] = Math.max(widths[i] ?? 0, c.length); });
  return rows.map((r) => indent + r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join('  ')).join('\n');
}

function ago(ms: number | undefined, now: number): string {
  if (ms === undefined) return '-';
  const s = Math.max(0, Math.round((now - ms) / 1000));
  if (s < 120) return `${s}s`;
  if (s < 7200) return `${Math.round(s / 60)}m`;
  return `${Math.round(s / 3600)}h`;
}

export function formatStatus(doc: StatusDocument, now = Date.now()): string {
  const lines: string[] = [];
  lines.push(`lb-agent ${doc.version} (pid ${doc.pid}) on ${doc.node.name}, parent ${doc.node.interface ?? '-'}${doc.node.address ? ` (${doc.node.address})` : ''}`);
  const placed = doc.dataplane?.placement === 'flow-hash' ? ', new connections placed by flow hash (they outlive a VRRP failover)' : '';
  lines.push(`dataplane: ${doc.dataplane ? `${doc.dataplane.kind} (${doc.dataplane.reason})${placed}${doc.dataplane.dsr ? `, direct server return on ${doc.dataplane.dsr.engine === 'bpf' ? 'the BPF program' : 'the nft table alone'} (${doc.dataplane.dsr.cause}; ${doc.dataplane.dsr.engine === 'bpf' ? 'open connections keep their backend' : 'by hash alone: a change of backends moves some open connections'})` : ''}${doc.dataplane.natEngine ? `, snat flows on ${doc.dataplane.natEngine.engine === 'ebpf' ? 'the eBPF NAT engine' : 'the nft table'} (${doc.dataplane.natEngine.reason})` : ''}` : '-'}; failover: ${doc.failover.mode}; config generation ${doc.config.generation} loaded ${doc.config.loadedAt}`);
  if (doc.dataplane?.statsProblem) lines.push(`dataplane problem: ${doc.dataplane.statsProblem}`);
  if (doc.networks && doc.networks.length > 1) lines.push(`networks: ${doc.networks.map((x) => `${x.name} on ${x.interface}${x.address ? ` (${x.address})` : ''}`).join(', ')}`);
  if (doc.config.lastReload && !doc.config.lastReload.ok) lines.push(`last reload REJECTED: ${doc.config.lastReload.message.split('\n').slice(1).join('; ')}`);
  const n = doc.node;
  if (n.zone !== undefined || n.labelsProblem !== undefined) {
    lines.push(`zone: ${n.zone ?? 'unknown'}${n.region ? `, region ${n.region}` : ''}${n.zoneFrom && n.zoneFrom !== 'unknown' ? ` (from ${n.zoneFrom === 'config' ? 'node.zone' : 'the labels file'})` : ''}${n.labelsProblem ? `; ${n.labelsProblem}` : ''}`);
  }
  if (doc.backend && (doc.backend.vips.length > 0 || doc.backend.problems.length > 0)) {
    const sys = Object.entries(doc.backend.sysctls).map(([k, v]) => `all.${k}=${v ?? '?'}`).join(' ');
    lines.push(`backend of DSR VIPs: ${doc.backend.vips.map((v) => `${v.address} ${v.state === 'on-lo' ? `on ${v.interface}` : 'MISSING'}`).join(', ') || '-'}${sys ? `; ${sys}` : ''}${doc.backend.problems.length ? `; problems: ${doc.backend.problems.join('; ')}` : ''}`);
  }
  lines.push(`overall: ${doc.ready ? 'ready' : 'NOT READY'}`);
  lines.push('');
  const rows: string[][] = [['SERVICE', 'IPAM', 'VIP', 'FAMILY', 'INTERFACE', 'MAC', 'PORTS', 'BACKENDS', 'STATE', 'REASON']];
  for (const s of doc.services) {
    rows.push([
      s.key, s.primaryService ? `share:${s.primaryService}` : s.ipam, s.vip ?? '-', s.family ?? 'IPv4', s.interface ?? '-', s.mac ?? '-',
      s.ports.join(','), `${s.healthyBackends}/${s.backends.length} up`, s.state, s.reason ?? '',
    ]);
  }
  lines.push(table(rows));
  for (const s of doc.services) {
    const extra: string[] = [];
    const src = s.source ?? {};
    if (s.ipam === 'dhcp' && !s.primaryService) {
      for (const k of ['server', 'renewAt', 'rebindAt', 'expiresAt'] as const) if (src[k] !== undefined) extra.push(`${k} ${String(src[k])}`);
    }
    if (s.network !== undefined && s.network !== 'default') extra.push(`network ${s.network}`);
    if (s.sourceIP === 'preserve') extra.push('direct server return (client address kept)');
    for (const note of s.familyNotes ?? []) extra.push(note);
    if (s.topology && s.topology.policy !== 'any') extra.push(`topology ${s.topology.detail}`);
    if (s.failover) {
      // The priority in use, and why, when tracking moved it off the configured one.
      const f = s.failover;
      const reasons = Array.isArray(f.priorityReasons) ? (f.priorityReasons as string[]) : [];
      const prio = f.basePriority !== undefined && f.priority !== f.basePriority ? ` priority ${String(f.priority)} of ${String(f.basePriority)}${reasons.length ? ` (${reasons.join('; ')})` : ''}` : '';
      extra.push(`vrrp ${String(f.state ?? '-')}${f.master ? ` master ${String(f.master)}` : ''}${prio}`);
    }
    if (s.adopted && !s.primaryService) extra.push('VIP adopted from the previous run');
    if (s.lastInterruption) extra.push(`interrupted ${s.interruptions}x, last ${s.lastInterruption.at}: ${s.lastInterruption.reason}`);
    if (s.backends.length === 0 && extra.length === 0) continue;
    lines.push('');
    lines.push(`${s.key}${extra.length ? `: ${extra.join(', ')}` : ''}`);
    if (s.backends.length > 0) {
      const br: string[][] = [['BACKEND', 'STATE', 'SINCE', 'WHY']];
      for (const b of s.backends) {
        // While down, what the probe saw: "tls: certificate has expired (active check)".
        const detail = b.state === 'down' && b.reason && b.lastFailure?.detail ? `${b.reason}: ${b.lastFailure.detail}` : b.reason;
        const why = [detail, b.takenOutBy ? `(${b.takenOutBy} check)` : undefined].filter(Boolean).join(' ');
        br.push([`${b.address}:${b.port}`, b.state, ago(b.since, now), why]);
      }
      lines.push(table(br, '  '));
    }
  }
  const events = (doc.events ?? []).slice(-STATUS_EVENTS);
  if (events.length > 0) {
    lines.push('');
    lines.push(`last ${events.length} event${events.length === 1 ? '' : 's'}:`);
    lines.push(table([['AT', 'EVENT', 'WHAT', 'REASON'], ...events.map((e) => [
      e.at, e.kind, [e.service, e.address].filter(Boolean).join(' ') || '-', e.reason.split('\n').map((l) => l.trim()).filter(Boolean).join('; '),
    ])], '  '));
  }
  return `${lines.join('\n')}\n`;
}
