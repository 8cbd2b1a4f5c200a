// metrics/ layer: a metric family whose exposition text is kept per series,
// for the families with a series per service or per backend. Each series
// holds its label part rendered once (`name{service="web",...}`) and its
// whole line as last rendered: a scrape renders again only the lines whose
// value or labels changed, and a family where nothing changed hands back
// the text it built last time. prom-client formats every series of every
// family on every scrape (an object per series, its labels escaped again);
// at a thousand services that was most of a scrape's CPU.
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

/** A series' key: its label values (a value left out is not an empty one); flat, as it is kept in the map. */
function seriesId(labels: LabelValues): string {
  const parts: string[] = [];
  for (const v of labels) parts.push(v === undefined ? '\u0001' : v);
  return parts.join('\u0000');
}

export class SeriesFamily {
  readonly name: string;
  readonly help: string;
  readonly type: SeriesType;
  readonly labelNames: readonly string[];
  /** prom-client's cluster aggregation, asked of every registered metric. */
  readonly aggregator = 'sum';
  private readonly collector: SeriesFamilyOptions['collect'];
  private readonly series = new Map<string, Series>();
  private readonly header: string;
  /** The family's text as last built; undefined once a series came, went or changed. */
  private text: string | undefined;
  private sync = 0;
  private syncing = false;
  /** Lines rendered since the family was made (tests read it: a series unchanged is not rendered again). */
  rendered = 0;

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

  /** The series of these label values has this value (one series per distinct set of label values, as prom-client keeps them). */
  set(labels: LabelValues, value: number): void {
    const id = seriesId(labels);
    const s = this.series.get(id);
    if (s === undefined) {
      const head = this.head(labels);
      this.rendered++;
      this.series.set(id, { labels, head, value, line: lineOf(head, value), mark: this.sync });
      this.text = undefined;
      return;
    }
    s.mark = this.sync;
    if (Object.is(s.value, value)) return;
    s.value = value;
    s.line = lineOf(s.head, value);
    this.rendered++;
    this.text = undefined;
  }

  /** The value of the series of these label values, if it is held. */
  value(labels: LabelValues): number | undefined {
    return this.series.get(seriesId(labels))?.value;
  }

  remove(labels: LabelValues): void {
    if (this.series.delete(seriesId(labels))) this.text = undefined;
  }

  /** Every series gone. */
  reset(): void {
    if (this.series.size > 0) this.text = undefined;
    this.series.clear();
  }

  /** A sync begins: the series put from here to end() are the family's, the others go at end(). */
  begin(): void {
    this.sync++;
    this.syncing = true;
  }

  end(): void {
    if (!this.syncing) return;
    this.syncing = false;
    for (const [id, s] of this.series) {
      if (s.mark !== this.sync) { this.series.delete(id); this.text = undefined; }
    }
  }

  /** The family's text in the Prometheus text format (HELP, TYPE, a line a series), its collect run first. */
  async exposition(): Promise<string> {
    await this.collect();
    if (this.text === undefined) {
      const lines = [this.header];
      for (const s of this.series.values()) lines.push(s.line);
      this.text = lines.join('\n');
    }
    return this.text;
  }

  /** prom-client's shape of a metric's values (registry.metrics(), getMetricsAsJSON()). */
  async get(): Promise<{ name: string; help: string; type: SeriesType; aggregator: string; values: { labels: Record<string, string>; value: number }[] }> {
    await this.collect();
    const values = [...this.series.values()].map((s) => {
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
 * The registry's text as registry.metrics() writes it (Prometheus text
 * format): a SeriesFamily gives its kept text, prom-client's own metrics
 * are formatted by prom-client.
 */
export async function exposition(registry: Registry): Promise<string> {
  const r = registry as Registry & { getMetricsAsString(m: unknown): Promise<string> };
  const parts = await Promise.all((r.getMetricsAsArray() as unknown[]).map((m) => (m instanceof SeriesFamily ? m.exposition() : r.getMetricsAsString(m))));
  // One flat string: a template around the join would make the page a rope.
  const out: string[] = [];
  for (const p of parts) { if (out.length > 0) out.push('\n\n'); out.push(p); }
  out.push('\n');
  return out.join('');
}
