// metrics/ layer: a metric family whose exposition text is kept per series,
// for the families with a series per service or per backend. Each series
// holds its label part rendered once (`name{service="web",...}`) and its
// whole line as last rendered: a scrape renders again only the lines whose
// value or labels changed, and a family where nothing changed hands back
// the text it built last time. prom-client formats every series of every
// family on every scrape (an object per series, its labels escaped again);
// at a thousand services that was most of a scrape's CPU.
// A series is found without building a key string: by its first label
// value (a service's name), then its other values compared one by one, so
// a collect that puts a thousand unchanged series allocates nothing for
// them; their order on the page is the order the last collect put them in,
// as prom-client's after a reset() (a series that comes back takes its place
// among the others again, not the end).
// Every kept string is built by Array#join, which makes one flat string:
// V8 makes a `+` or template of 13 characters or more a rope (a
// ConsString of its two halves), so a line kept as `${head} ${value}`, a
// head built label by label and a family text built line by line held
// ~220,000 rope nodes (~7 MiB) at a thousand services, and each scrape
// walked the ropes again to copy them out.
// A family registers in a prom-client Registry like any metric (its get()
// answers in prom-client's shape, so registry.metrics() and the tests that
// read it see it as before); exposition() below asks each family for its
// text and formats prom-client's own metrics as prom-client does.
import type { Registry } from 'prom-client';

export type SeriesType = 'gauge' | 'counter';

/** Label values in the family's labelNames order; undefined leaves a label out of that series. */
export type LabelValues = readonly (string | undefined)[];

export interface SeriesFamilyOptions {
  readonly name: string;
  readonly help: string;
  readonly type: SeriesType;
  readonly labelNames: readonly string[];
  readonly registers?: readonly Registry[];
  /**
   * Called before each exposition: the family's series of the moment, put
   * between begin() and end() (a series not put is dropped at end()).
   */
  readonly collect?: (family: SeriesFamily) => void | Promise<void>;
}

interface Series {
  labels: LabelValues;
  /** `name{a="x",b="y"}`, rendered once, when the series came. */
  head: string;
  value: number;
  line: string;
  /** The sync that last put it. */
  mark: number;
  /** What add() summed this sync, settled at end(). */
  pending?: number | undefined;
}

/** Prometheus text format: a label value escapes backslash, double quote and newline. */
function escapeLabel(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n').replace(/"/g, '\\"');
}

/** A help text escapes backslash and newline. */
function escapeHelp(v: string): string {
  return v.replace(/\\/g, '\\\\').replace(/\n/g, '\\n');
}

/** A sample value as the text format (and prom-client) writes it. */
export function valueText(v: number): string {
  if (Number.isNaN(v)) return 'Nan';
  if (!Number.isFinite(v)) return v < 0 ? '-Inf' : '+Inf';
  return `${v}`;
}

/** A series' line, `head value`, as one flat string. */
function lineOf(head: string, value: number): string {
  return [head, valueText(value)].join(' ');
}

/** The bucket of a series: its first label value (a value left out is not an empty one). */
function bucketOf(labels: LabelValues): string {
  const v = labels[0];
  return v === undefined ? '\u0001' : v;
}

/** The same label values, a value left out and an empty one told apart. */
function sameLabels(a: LabelValues, b: LabelValues): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

export class SeriesFamily {
  readonly name: string;
  readonly help: string;
  readonly type: SeriesType;
  readonly labelNames: readonly string[];
  /** prom-client's cluster aggregation, asked of every registered metric. */
  readonly aggregator = 'sum';
  private readonly collector: SeriesFamilyOptions['collect'];
  /** By first label value; a bucket holds the few series of one service. */
  private readonly buckets = new Map<string, Series[]>();
  /** Every series, in the order the last sync put them: the page's order. */
  private series = new Set<Series>();
  /** The series put this sync, in the order put (kept from sync to sync: no allocation while nothing comes). */
  private readonly order: Series[] = [];
  /** A series came this sync: the page's order is made again from `order` at end(). */
  private came = false;
  /**
   * `series` as an array, in the page's order, made again at the next
   * sync after a series came or went (undefined from then, so it never
   * holds a series that went): a sync that puts the series in
   * the order of the last one finds each at `cursor`, the next place, with
   * no lookup by its labels.
   */
  private pageOrder: Series[] | undefined;
  private cursor = 0;
  private readonly header: string;
  /** The family's text as last built; undefined once a series came, went or changed. */
  private text: string | undefined;
  /** The UTF-8 length of `text`, counted when it was built (a page's length is asked at every scrape). */
  private textBytes = 0;
  private sync = 0;
  private syncing = false;
  /** Lines rendered since the family was made (tests read it: a series unchanged is not rendered again). */
  rendered = 0;
  /** Series looked up by their labels since the family was made (tests read it: a sync in the last one's order looks none up). */
  lookups = 0;

  constructor(o: SeriesFamilyOptions) {
    this.name = o.name;
    this.help = o.help;
    this.type = o.type;
    this.labelNames = o.labelNames;
    this.collector = o.collect;
    this.header = `# HELP ${o.name} ${escapeHelp(o.help)}\n# TYPE ${o.name} ${o.type}`;
    for (const r of o.registers ?? []) r.registerMetric(this as never);
  }

  /** Series now held. */
  get size(): number { return this.series.size; }

  /**
   * The series of these label values has this value (one series per
   * distinct set of label values, as prom-client keeps them). The values
   * are copied when a series comes, so a caller may pass one array it
   * fills again for every series.
   */
  set(labels: LabelValues, value: number): void {
    const s = this.next(labels) ?? this.find(labels);
    if (s === undefined) {
      const head = this.head(labels);
      this.rendered++;
      const n: Series = { labels: labels.slice(), head, value, line: lineOf(head, value), mark: this.sync };
      const key = bucketOf(labels);
      const bucket = this.buckets.get(key);
      if (bucket === undefined) this.buckets.set(key, [n]);
      else bucket.push(n);
      this.series.add(n);
      this.pageOrder = undefined;
      this.text = undefined;
      if (this.syncing) { this.order.push(n); this.came = true; }
      return;
    }
    if (this.syncing && s.mark !== this.sync) this.order.push(s);
    s.mark = this.sync;
    s.pending = undefined;
    this.change(s, value);
  }

  /**
   * Within a sync, the series of these label values adds this value to what
   * this sync put (prom-client's inc() after a reset(): two sources of one
   * series sum). The sum is settled at end(), and the line rendered again
   * only when it differs from the value last rendered.
   */
  add(labels: LabelValues, value: number): void {
    const s = this.next(labels) ?? this.find(labels);
    if (s === undefined || !this.syncing) { this.set(labels, value); return; }
    if (s.mark !== this.sync) {
      this.order.push(s);
      s.mark = this.sync;
      s.pending = value;
    } else {
      s.pending = (s.pending ?? s.value) + value;
    }
  }

  /** The value of the series of these label values, if it is held. */
  value(labels: LabelValues): number | undefined {
    return this.find(labels)?.value;
  }

  remove(labels: LabelValues): void {
    const s = this.find(labels);
    if (s !== undefined) this.drop(s);
  }

  /** Every series gone. */
  reset(): void {
    if (this.series.size > 0) this.text = undefined;
    this.series.clear();
    this.buckets.clear();
    this.pageOrder = undefined;
  }

  /** A sync begins: the series put from here to end() are the family's, the others go at end(). */
  begin(): void {
    this.sync++;
    this.syncing = true;
    this.order.length = 0;
    this.came = false;
    this.cursor = 0;
    if (this.pageOrder === undefined) this.pageOrder = [...this.series];
  }

  end(): void {
    if (!this.syncing) return;
    this.syncing = false;
    for (const s of this.series) {
      if (s.mark !== this.sync) this.drop(s);
      else if (s.pending !== undefined) {
        // What add() summed this sync.
        const v = s.pending;
        s.pending = undefined;
        this.change(s, v);
      }
    }
    if (this.came) {
      // A series came: the page takes the order of this sync's puts.
      this.came = false;
      const next = new Set<Series>();
      for (const s of this.order) if (this.series.has(s)) next.add(s);
      this.series = next;
      this.pageOrder = undefined;
      this.text = undefined;
    }
    this.order.length = 0;
  }

  /** A series' value is this number: its line rendered again only when the number differs. */
  private change(s: Series, v: number): void {
    if (Object.is(s.value, v)) return;
    s.value = v;
    s.line = lineOf(s.head, v);
    this.rendered++;
    this.text = undefined;
  }

  /**
   * Within a sync, the series at the cursor when it has these labels and
   * this sync has not put it yet (the cursor moves past it); else undefined
   * and the cursor stays, for find() to look it up.
   */
  private next(labels: LabelValues): Series | undefined {
    if (!this.syncing) return undefined;
    const s = this.pageOrder?.[this.cursor];
    if (s === undefined || s.mark === this.sync || !sameLabels(s.labels, labels)) return undefined;
    this.cursor++;
    return s;
  }

  private find(labels: LabelValues): Series | undefined {
    this.lookups++;
    const bucket = this.buckets.get(bucketOf(labels));
    if (bucket === undefined) return undefined;
    for (const s of bucket) if (sameLabels(s.labels, labels)) return s;
    return undefined;
  }

  private drop(s: Series): void {
    this.series.delete(s);
    this.pageOrder = undefined;
    const key = bucketOf(s.labels);
    const bucket = this.buckets.get(key);
    if (bucket !== undefined) {
      const i = bucket.indexOf(s);
      if (i >= 0) bucket.splice(i, 1);
      if (bucket.length === 0) this.buckets.delete(key);
    }
    this.text = undefined;
  }

  /** The family's text in the Prometheus text format (HELP, TYPE, a line a series), its collect run first. */
  async exposition(): Promise<string> {
    await this.collect();
    if (this.text === undefined) {
      const lines = [this.header];
      for (const s of this.series) lines.push(s.line);
      this.text = lines.join('\n');
      this.textBytes = Buffer.byteLength(this.text, 'utf8');
    }
    return this.text;
  }

  /** The UTF-8 length of the text exposition() last returned. */
  get expositionBytes(): number {
    return this.textBytes;
  }

  /** prom-client's shape of a metric's values (registry.metrics(), getMetricsAsJSON()). */
  async get(): Promise<{ name: string; help: string; type: SeriesType; aggregator: string; values: { labels: Record<string, string>; value: number }[] }> {
    await this.collect();
    const values = [...this.series].map((s) => {
      const labels: Record<string, string> = {};
      s.labels.forEach((v, i) => { if (v !== undefined) labels[this.labelNames[i]!] = v; });
      return { labels, value: s.value };
    });
    return { name: this.name, help: this.help, type: this.type, aggregator: this.aggregator, values };
  }

  private async collect(): Promise<void> {
    if (!this.collector) return;
    try {
      await this.collector(this);
    } catch (e) {
      // A collect that failed drops nothing: the series stay as they were.
      this.syncing = false;
      throw e;
    }
    this.end();
  }

  private head(labels: LabelValues): string {
    if (labels.length !== this.labelNames.length) {
      throw new Error(`${this.name}: ${labels.length} label values for the ${this.labelNames.length} labels ${this.labelNames.join(', ')}`);
    }
    const parts: string[] = [];
    for (let i = 0; i < labels.length; i++) {
      const v = labels[i];
      if (v === undefined) continue;
      parts.push(parts.length === 0 ? '' : ',', this.labelNames[i]!, '="', escapeLabel(v), '"');
    }
    return parts.length === 0 ? this.name : [this.name, '{', ...parts, '}'].join('');
  }
}

/**
 * The registry's page as its parts: each SeriesFamily's kept text as it is,
 * prom-client's own metrics formatted by prom-client, the separators
 * between them, and the page's length in UTF-8 bytes. Their concatenation
 * is registry.metrics()' text; the server encodes them into one Buffer
 * (pageBuffer). The page is never made one string: at a thousand services
 * that string is half a MiB on the JavaScript heap, kept for the
 * endpoint's reuse interval, so each scrape's copy outlived the young
 * generation and stayed resident until a full collection (~0.5 MiB of RSS
 * a scrape); the parts are the families' own kept texts and a few small
 * strings that die young, and the Buffer's bytes lie outside the heap.
 */
export interface ExpositionPage {
  readonly parts: readonly string[];
  readonly bytes: number;
}

export async function expositionParts(registry: Registry): Promise<ExpositionPage> {
  const r = registry as Registry & { getMetricsAsString(m: unknown): Promise<string> };
  const metrics = r.getMetricsAsArray() as unknown[];
  const texts = await Promise.all(metrics.map((m) => (m instanceof SeriesFamily ? m.exposition() : r.getMetricsAsString(m))));
  const parts: string[] = [];
  let bytes = 0;
  for (let i = 0; i < texts.length; i++) {
    const p = texts[i]!;
    const m = metrics[i];
    if (parts.length > 0) { parts.push('\n\n'); bytes += 2; }
    parts.push(p);
    // A kept family's length was counted when its text was built.
    bytes += m instanceof SeriesFamily ? m.expositionBytes : Buffer.byteLength(p, 'utf8');
  }
  parts.push('\n');
  return { parts, bytes: bytes + 1 };
}

/**
 * The page's bytes in one Buffer (UTF-8, the parts in order): what the
 * server writes, one write per scrape, and every scrape served from the
 * same gather writes the same Buffer. Written part by part into a Buffer
 * of the page's counted length (no page-long string is made); a count
 * that does not match what was written is an error, never a short or
 * padded body.
 */
export function pageBuffer(page: ExpositionPage): Buffer {
  // Room for one more character (UTF-8: 4 bytes at most) past the count:
  // a page longer than counted writes past it and is caught below, where
  // write() would otherwise stop at the end of the Buffer unseen.
  const buf = Buffer.allocUnsafeSlow(page.bytes + 4);
  let at = 0;
  for (const p of page.parts) at += buf.write(p, at, 'utf8');
  if (at !== page.bytes) throw new Error(`metrics page: ${at > page.bytes ? 'more than' : at} bytes written of the ${page.bytes} counted`);
  return buf.subarray(0, at);
}

/**
 * The registry's text as registry.metrics() writes it (Prometheus text
 * format), as one flat string (Array#join: a template around it would make
 * the page a rope): expositionParts() joined.
 */
export async function exposition(registry: Registry): Promise<string> {
  return (await expositionParts(registry)).parts.join('');
}
