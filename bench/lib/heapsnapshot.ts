// V8 heap snapshots (the .heapsnapshot that `node --heapsnapshot-signal`
// and v8.writeHeapSnapshot write), summarised (pure): the dominator tree
// (Cooper, Harvey and Kennedy's iterative algorithm over the strong edges;
// weak edges retain nothing, as in Chrome's DevTools), each node's retained
// size, and the classes DevTools' Summary view shows (an object by its
// constructor, a closure by its function, strings, compiled code, V8's own
// arrays), each class's retained size counted once (a node of a class under
// another of the same class adds nothing). What a thousand services keep
// shows as classes with a count of about a thousand or a multiple of it.

export interface HeapSnapshotJson {
  readonly snapshot: { readonly meta: { readonly node_fields: readonly string[]; readonly node_types: readonly unknown[]; readonly edge_fields: readonly string[]; readonly edge_types: readonly unknown[] } };
  readonly nodes: ArrayLike<number>;
  readonly edges: ArrayLike<number>;
  readonly strings: readonly string[];
}

export interface HeapClass {
  readonly name: string;
  readonly count: number;
  readonly selfBytes: number;
  readonly retainedBytes: number;
}

export interface HeapDominator {
  readonly name: string;
  readonly retainedBytes: number;
  /** The edge names from the root to it, along the path the depth-first walk took. */
  readonly path: string;
}

/** What the instances of one class hold alone, by the name of the edge to it. */
export interface HeapExpansion {
  readonly name: string;
  readonly count: number;
  readonly retainedBytes: number;
  readonly edges: readonly { readonly edge: string; readonly retainedBytes: number }[];
}

export interface HeapSummary {
  readonly nodes: number;
  /** The dominator tree under the largest instance of each class asked for, indented, down to a share of it. */
  readonly trees: readonly string[];
  /** For each class asked for: the classes of its instances' immediate dominators, with the edge to them, by retained size. */
  readonly owners: readonly string[];
  readonly expansions: readonly HeapExpansion[];
  readonly totalBytes: number;
  /** Classes by retained size, largest first. */
  readonly classes: readonly HeapClass[];
  /** The largest retainers that no other non-root node dominates, largest first. */
  readonly dominators: readonly HeapDominator[];
}

/** The class a node counts under, as DevTools' Summary names it. */
function classOf(type: string, name: string): string {
  switch (type) {
    case 'object': return name;
    case 'closure': return `(closure) ${name || '(anonymous)'}`;
    case 'string': case 'concatenated string': case 'sliced string': return '(string)';
    case 'code': return '(compiled code)';
    case 'array': return `(array) ${name}`;
    case 'hidden': return `(system) ${name}`;
    case 'object shape': return '(object shape)';
    case 'native': return `(native) ${name}`;
    case 'synthetic': return `(synthetic) ${name}`;
    default: return `(${type})`;
  }
}

export function summariseHeap(snap: HeapSnapshotJson, top = 40, expand: readonly string[] = [], tree: readonly string[] = [], owner: readonly string[] = []): HeapSummary {
  const meta = snap.snapshot.meta;
  const nf = meta.node_fields.length;
  const ef = meta.edge_fields.length;
  const nodeTypes = meta.node_types[0] as string[];
  const edgeTypes = meta.edge_types[0] as string[];
  const tIdx = meta.node_fields.indexOf('type');
  const nIdx = meta.node_fields.indexOf('name');
  const sIdx = meta.node_fields.indexOf('self_size');
  const cIdx = meta.node_fields.indexOf('edge_count');
  const etIdx = meta.edge_fields.indexOf('type');
  const enIdx = meta.edge_fields.indexOf('name_or_index');
  const toIdx = meta.edge_fields.indexOf('to_node');
  const weak = edgeTypes.indexOf('weak');
  const N = snap.nodes.length / nf;
  const firstEdge = new Uint32Array(N + 1);
  for (let i = 0; i < N; i++) firstEdge[i + 1] = firstEdge[i]! + snap.nodes[i * nf + cIdx]!;
  const E = firstEdge[N]!;
  const to = (e: number): number => snap.edges[e * ef + toIdx]! / nf;
  const strong = (e: number): boolean => snap.edges[e * ef + etIdx] !== weak;

  // Predecessors over strong edges (CSR).
  const predCount = new Uint32Array(N + 1);
  for (let e = 0; e < E; e++) if (strong(e)) predCount[to(e) + 1]!++;
  for (let i = 0; i < N; i++) predCount[i + 1]! += predCount[i]!;
  const preds = new Uint32Array(predCount[N]!);
  const fill = predCount.slice(0, N);
  for (let i = 0; i < N; i++) {
    for (let e = firstEdge[i]!; e < firstEdge[i + 1]!; e++) if (strong(e)) preds[fill[to(e)]!++] = i;
  }

  // Post-order from the root (node 0), iterative.
  const UNSEEN = 0xffffffff;
  const post = new Uint32Array(N).fill(UNSEEN);
  const order = new Uint32Array(N);
  const parentEdge = new Uint32Array(N).fill(UNSEEN);
  const parentNode = new Uint32Array(N);
  let n = 0;
  {
    const stack = new Uint32Array(N);
    const cursor = new Uint32Array(N);
    const seen = new Uint8Array(N);
    let sp = 0;
    stack[sp++] = 0; seen[0] = 1; cursor[0] = firstEdge[0]!;
    while (sp > 0) {
      const v = stack[sp - 1]!;
      let pushed = false;
      while (cursor[v]! < firstEdge[v + 1]!) {
        const e = cursor[v]!++;
        if (!strong(e)) continue;
        const w = to(e);
        if (seen[w]) continue;
        seen[w] = 1; parentEdge[w] = e; parentNode[w] = v; cursor[w] = firstEdge[w]!;
        stack[sp++] = w; pushed = true; break;
      }
      if (!pushed) { sp--; post[v] = n; order[n++] = v; }
    }
  }

  // Immediate dominators by post-order number.
  const idom = new Uint32Array(N).fill(UNSEEN);
  const root = 0;
  idom[post[root]!] = post[root]!;
  for (let changed = true; changed;) {
    changed = false;
    for (let k = n - 2; k >= 0; k--) {
      const v = order[k]!;
      let d = UNSEEN;
      for (let p = predCount[v]!; p < predCount[v + 1]!; p++) {
        const u = post[preds[p]!]!;
        if (u === UNSEEN || idom[u] === UNSEEN) continue;
        if (d === UNSEEN) { d = u; continue; }
        let a = u, b = d;
        while (a !== b) {
          while (a < b) a = idom[a]!;
          while (b < a) b = idom[b]!;
        }
        d = a;
      }
      if (d !== UNSEEN && idom[k] !== d) { idom[k] = d; changed = true; }
    }
  }

  // Retained sizes: children before their dominator in post-order.
  const retained = new Float64Array(n);
  let totalBytes = 0;
  for (let k = 0; k < n; k++) { const s = snap.nodes[order[k]! * nf + sIdx]!; retained[k] = s; totalBytes += s; }
  for (let k = 0; k < n - 1; k++) retained[idom[k]!]! += retained[k]!;

  // Classes: a node counts once; its retained size once per class along its dominator chain.
  const classIds = new Map<string, number>();
  const classNames: string[] = [];
  const cls = new Uint32Array(n);
  for (let k = 0; k < n; k++) {
    const i = order[k]! * nf;
    const name = classOf(nodeTypes[snap.nodes[i + tIdx]!]!, snap.strings[snap.nodes[i + nIdx]!]!);
    let id = classIds.get(name);
    if (id === undefined) { id = classNames.length; classIds.set(name, id); classNames.push(name); }
    cls[k] = id;
  }
  const C = classNames.length;
  const count = new Float64Array(C), self = new Float64Array(C), ret = new Float64Array(C);
  // Dominator-tree children (CSR), then a DFS with a per-class depth.
  const kidCount = new Uint32Array(n + 1);
  for (let k = 0; k < n - 1; k++) kidCount[idom[k]! + 1]!++;
  for (let k = 0; k < n; k++) kidCount[k + 1]! += kidCount[k]!;
  const kids = new Uint32Array(kidCount[n]!);
  const kfill = kidCount.slice(0, n);
  for (let k = 0; k < n - 1; k++) kids[kfill[idom[k]!]!++] = k;
  const depth = new Uint32Array(C);
  {
    const stack = new Uint32Array(n);
    const cur = new Uint32Array(n);
    let sp = 0;
    const enter = (k: number): void => {
      const c = cls[k]!;
      count[c]!++; self[c]! += snap.nodes[order[k]! * nf + sIdx]!;
      if (depth[c] === 0) ret[c]! += retained[k]!;
      depth[c]!++;
      stack[sp++] = k; cur[k] = kidCount[k]!;
    };
    enter(n - 1);
    while (sp > 0) {
      const k = stack[sp - 1]!;
      if (cur[k]! < kidCount[k + 1]!) enter(kids[cur[k]!++]!);
      else { sp--; depth[cls[k]!]!--; }
    }
  }
  const classes: HeapClass[] = classNames.map((name, c) => ({ name, count: count[c]!, selfBytes: self[c]!, retainedBytes: ret[c]! }))
    .sort((a, b) => b.retainedBytes - a.retainedBytes).slice(0, top);

  // The largest retainers directly under the root or a synthetic node (GC roots and their groups).
  const synthetic = nodeTypes.indexOf('synthetic');
  const isRootish = (k: number): boolean => k === n - 1 || snap.nodes[order[k]! * nf + tIdx] === synthetic;
  const edgeName = (e: number): string => {
    const t = edgeTypes[snap.edges[e * ef + etIdx]!]!;
    const v = snap.edges[e * ef + enIdx]!;
    return t === 'element' || t === 'hidden' ? `[${v}]` : (snap.strings[v] ?? String(v));
  };
  const pathTo = (v: number): string => {
    const names: string[] = [];
    for (let w = v, guard = 0; w !== 0 && parentEdge[w] !== UNSEEN && guard < 12; guard++) {
      const e = parentEdge[w]!;
      names.push(edgeName(e));
      w = parentNode[w]!;
    }
    return names.reverse().join('.');
  };
  const candidates: number[] = [];
  for (let k = 0; k < n - 1; k++) if (!isRootish(k) && isRootish(idom[k]!)) candidates.push(k);
  candidates.sort((a, b) => retained[b]! - retained[a]!);
  const dominators = candidates.slice(0, top).map((k) => ({ name: classNames[cls[k]!]!, retainedBytes: retained[k]!, path: pathTo(order[k]!) }));
  const expansions = expand.map((name): HeapExpansion => {
    const c = classIds.get(name);
    const by = new Map<string, number>();
    let cnt = 0, total = 0;
    const direct = new Set<number>();
    if (c !== undefined) {
      for (let k = 0; k < n; k++) {
        if (cls[k] !== c) continue;
        cnt++; total += retained[k]!;
        const v = order[k]!;
        for (let e = firstEdge[v]!; e < firstEdge[v + 1]!; e++) {
          if (!strong(e)) continue;
          const w = post[to(e)]!;
          if (w === UNSEEN || idom[w] !== k) continue;
          const label = edgeName(e).replace(/^\[\d+\]$/, '[]');
          by.set(label, (by.get(label) ?? 0) + retained[w]!);
          direct.add(w);
        }
        // What it dominates through more than one of its own edges, by class.
        for (let j = kidCount[k]!; j < kidCount[k + 1]!; j++) {
          const w = kids[j]!;
          if (direct.has(w)) continue;
          const label = `(through several) ${classNames[cls[w]!]!}`;
          by.set(label, (by.get(label) ?? 0) + retained[w]!);
        }
        direct.clear();
      }
    }
    const edges = [...by].map(([edge, retainedBytes]) => ({ edge, retainedBytes })).sort((a, b) => b.retainedBytes - a.retainedBytes).slice(0, 25);
    return { name, count: cnt, retainedBytes: total, edges };
  });
  // An edge that names w from its dominator's own edges (or the first edge to it).
  const nameIn = (k: number, w: number): string => {
    const v = order[k]!, target = order[w]!;
    for (let e = firstEdge[v]!; e < firstEdge[v + 1]!; e++) if (to(e) === target) return edgeName(e);
    return parentEdge[target] === UNSEEN ? '?' : `~${edgeName(parentEdge[target]!)}`;
  };
  const trees = tree.map((name) => {
    const c = classIds.get(name);
    let best = -1;
    for (let k = 0; k < n; k++) if (cls[k] === c && (best < 0 || retained[k]! > retained[best]!)) best = k;
    if (best < 0) return `${name}: none`;
    const lines: string[] = [];
    const walk = (k: number, d: number, label: string, floor: number): void => {
      lines.push(`${'  '.repeat(d)}${label}: ${classNames[cls[k]!]!.slice(0, 60)} ${size(retained[k]!)}`);
      if (d >= 8) return;
      const ks: number[] = [];
      // The small ones by class: a thousand services' entries are each small.
      const groups = new Map<number, { count: number; bytes: number; largest: number; members: number[] }>();
      for (let j = kidCount[k]!; j < kidCount[k + 1]!; j++) {
        const w = kids[j]!;
        if (retained[w]! >= floor) { ks.push(w); continue; }
        const g = groups.get(cls[w]!) ?? { count: 0, bytes: 0, largest: w, members: [] };
        g.count++; g.bytes += retained[w]!; g.members.push(w);
        groups.set(cls[w]!, g);
      }
      ks.sort((a, b) => retained[b]! - retained[a]!);
      for (const w of ks.slice(0, 12)) walk(w, d + 1, nameIn(k, w), floor);
      for (const g of [...groups.values()].filter((x) => x.bytes >= floor && x.count > 1).sort((a, b) => b.bytes - a.bytes).slice(0, 8)) {
        // The example: the median by size, a typical entry (the largest is often an odd one out).
        g.largest = g.members.sort((a, b) => retained[a]! - retained[b]!)[g.members.length >> 1]!;
        lines.push(`${'  '.repeat(d + 1)}${g.count} x ${classNames[cls[g.largest]!]!.slice(0, 60)} ${size(g.bytes)}, e.g.:`);
        walk(g.largest, d + 2, nameIn(k, g.largest), retained[g.largest]! / 20);
      }
    };
    walk(best, 0, name, retained[best]! / 100);
    return lines.join('\n');
  });
  const owners = owner.map((name) => {
    const c = classIds.get(name);
    const by = new Map<string, { count: number; bytes: number }>();
    for (let k = 0; k < n - 1; k++) {
      if (cls[k] !== c) continue;
      const label = `${classNames[cls[idom[k]!]!]!.slice(0, 50)} .${nameIn(idom[k]!, k).replace(/\d+/g, 'N')}`;
      const g = by.get(label) ?? { count: 0, bytes: 0 };
      g.count++; g.bytes += retained[k]!;
      by.set(label, g);
    }
    return [`${name} by immediate dominator:`, ...[...by].sort((a, b) => b[1].bytes - a[1].bytes).slice(0, 20).map(([l, g]) => `  ${l}: ${g.count}, ${size(g.bytes)}`)].join('\n');
  });
  return { nodes: N, totalBytes, classes, dominators, expansions, trees, owners };
}

const MiB = (b: number): string => (b / 1048576).toFixed(2);
/** Bytes as MiB, or KiB below a tenth of a MiB (one service's share). */
const size = (b: number): string => b >= 104858 ? `${MiB(b)} MiB` : `${(b / 1024).toFixed(2)} KiB`;

/** The summary as Markdown tables, in MiB. */
export function renderHeapSummary(s: HeapSummary): string {
  const out = [`${s.nodes} nodes, ${MiB(s.totalBytes)} MiB`, '', '| class | count | self MiB | retained MiB |', '| --- | --- | --- | --- |'];
  for (const c of s.classes) out.push(`| ${c.name.replace(/\|/g, '\\|').slice(0, 80)} | ${c.count} | ${MiB(c.selfBytes)} | ${MiB(c.retainedBytes)} |`);
  out.push('', '| dominator | retained MiB | path |', '| --- | --- | --- |');
  for (const d of s.dominators) out.push(`| ${d.name.replace(/\|/g, '\\|').slice(0, 60)} | ${MiB(d.retainedBytes)} | ${d.path.replace(/\|/g, '\\|').slice(0, 120)} |`);
  for (const t of [...s.trees, ...s.owners]) out.push('', '```', t, '```');
  for (const x of s.expansions) {
    out.push('', `${x.name}: ${x.count}, ${MiB(x.retainedBytes)} MiB retained`, '', '| edge | retained MiB |', '| --- | --- |');
    for (const e of x.edges) out.push(`| ${e.edge.replace(/\|/g, '\\|').slice(0, 80)} | ${MiB(e.retainedBytes)} |`);
  }
  return out.join('\n');
}
