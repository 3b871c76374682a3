// Why: hand-made journal edge scenarios the random generator rarely or never reaches — odd
// engagement ids, bounds of 2^53-1, a full default journal (10,001 appends), 200 engagements with
// tied recency, compaction changing recency, wide and long values — recorded on the reference.
//   bun edge.ts OUTDIR      writes OUTDIR/journal/edge-*.json
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { recordScenario } from './record.ts';
import { Rng, payload } from './gen.ts';

const A = (engagementId: unknown, at: unknown, type: unknown, data: unknown, extra: Record<string, unknown> = {}) =>
  ({ op: 'append', args: { event: { engagementId, at, type, data, ...extra } } });
const op = (o: string, args: Record<string, unknown> = {}) => ({ op: o, args });
const MAX = Number.MAX_SAFE_INTEGER;

const scenarios: Record<string, { setup?: any; steps: any[]; description: string }> = {};

scenarios['edge-board-filter-values'] = {
  description: 'board filters: null (no filter), empty key, empty kind',
  steps: [
    op('reconstructBoardFromEvents', { records: [{ at: 1, type: 'board_written', data: { key: 'k', kind: 'todo' } }], filter: null }),
    op('reconstructBoardFromEvents', { records: [{ at: 1, type: 'board_written', data: { key: 'k', kind: 'todo' } }], filter: { kind: '' } }),
    op('reconstructBoardFromEvents', { records: [{ at: 1, type: 'board_written', data: { key: 'k', kind: 'todo' } }], filter: { key: '' } }),
  ],
};

// Off by default (README.md): '.' and '..' cannot travel in a URL path (FUZZ_DOT_IDS=1), and the
// HTTP contract takes ids of at most 256 bytes (FUZZ_LONG_IDS=1 adds one of 257).
const ODD_IDS = ['%2e%2e', 'a/../b', ' ', 'a%', '%', '?', '#', 'x'.repeat(256), '\u0000', '\u2026', '/', '\\', 'a\nb', '+',
  ...(process.env.FUZZ_DOT_IDS ? ['.', '..'] : []), ...(process.env.FUZZ_LONG_IDS ? ['y'.repeat(257)] : [])];
for (const [i, id] of ODD_IDS.entries()) {
  scenarios[`edge-id-${String(i).padStart(2, '0')}`] = {
    description: `engagement id ${JSON.stringify(id).slice(0, 40)}`,
    steps: [
      A(id, 1, 'engagement_opened', { entry: 'agent:a' }),
      A('other', 2, 'tool_called', {}),
      op('read', { engagementId: id }),
      op('summarize', { engagementId: id }),
      op('listEngagements'),
      op('compact', { engagementId: id }),
      op('read', { engagementId: 'other' }),
    ],
  };
}

// The reference ignores expectedSeq; over HTTP it is a guard (and a misspelling is refused):
// only with FUZZ_EXPECTED_SEQ=1, like gen.ts.
if (process.env.FUZZ_EXPECTED_SEQ) scenarios['edge-expected-seq-member'] = {
  description: 'append inputs carrying expectedSeq-like members (the reference ignores them)',
  steps: [
    A('e', 1, 't', {}, { expectedSeq: 0 }),
    A('e', 2, 't', {}, { expectedSeq: 5 }),
    A('e', 3, 't', {}, { expectedSeq: null }),
    A('e', 4, 't', {}, { expectedseq: 3 }),
    A('e', 5, 't', {}, { expected_seq: 3 }),
    op('read', { engagementId: 'e' }),
  ],
};

scenarios['edge-retention-negative-age'] = {
  description: 'maxAgeMs negative',
  setup: { retention: { maxEventsPerEngagement: 5, maxAgeMs: -1000 } },
  steps: [A('e', 1, 't', {}), A('f', 5000, 't', {}), op('prune', { now: 0 }), op('listEngagements'), op('prune', { now: -10000 }), op('listEngagements')],
};

scenarios['edge-retention-huge'] = {
  description: 'maxEventsPerEngagement and maxAgeMs at 2^53-1',
  setup: { retention: { maxEventsPerEngagement: MAX, maxAgeMs: MAX } },
  steps: [A('e', -MAX, 't', {}), A('f', MAX, 't', {}), op('prune', { now: MAX }), op('prune', { now: -MAX }), op('listEngagements'), op('prune', { now: 0 }), op('listEngagements')],
};

scenarios['edge-at-bounds'] = {
  description: 'at and now at +-(2^53-1)',
  steps: [
    A('e', MAX, 't', {}), A('f', -MAX, 't', {}), A('g', 0, 't', {}),
    op('listEngagements'), op('prune', { now: MAX }), op('listEngagements'), op('prune', { now: -MAX }), op('listEngagements'),
    A('f', -MAX, 'engagement_opened', {}), op('summarize', { engagementId: 'f' }),
  ],
};

{
  const steps: any[] = [];
  for (let i = 0; i < 10001; i++) steps.push(A('big', 1000 + i, i % 3 ? 'budget_charged' : 'mail_sent', i % 3 ? { tokens: 0.25, modelCalls: 1 } : { mailId: `m${i}`, from: `agent:${i % 50}`, to: 'agent:x' }));
  steps.push(op('summarize', { engagementId: 'big' }));
  steps.push(A('big', 99999, 'engagement_closed', {}));
  steps.push(op('compact', { engagementId: 'big' }));
  steps.push(op('summarize', { engagementId: 'big' }));
  steps.push(A('big', 100000, 'engagement_closed', {}));
  steps.push(op('read', { engagementId: 'big' }));
  scenarios['edge-default-full'] = { description: '10,001 appends under the default retention; compaction frees room', steps };
}

{
  const r = new Rng(7);
  const steps: any[] = [];
  const ids = Array.from({ length: 200 }, (_, i) => `e${i}`);
  let at = 1000;
  for (let round = 0; round < 6; round++) {
    for (let i = 0; i < 150; i++) {
      const id = r.pick(ids);
      if (r.chance(0.6)) at += r.int(0, 2);
      steps.push(A(id, at - r.int(0, 3), 'tool_called', {}));
    }
    steps.push(op('listEngagements'));
    steps.push(op('listEngagements', { limit: r.int(0, 30) }));
    steps.push(op('prune', { now: at - r.int(0, 20) + 2592000000 }));
    steps.push(op('listEngagements'));
  }
  scenarios['edge-many-engagements'] = { description: '200 engagements, many ties of last at, prunes and re-creation', steps };
}

{
  // Compaction changing recency and interplay with full / re-append.
  const steps: any[] = [];
  for (let i = 0; i < 25; i++) steps.push(A('c', 100 + i, i % 2 ? 'budget_charged' : 'tool_called', i % 2 ? { usage: { tokens: 1.5 } } : { actor: 'agent:a' }));
  steps.push(A('c', 200, 'engagement_closed', { budget: { spent: { tokens: 1 } }, consumed: { wallMs: 3 } }));
  steps.push(A('c', 300, 'budget_charged', { tokens: 2 }));
  steps.push(A('d', 250, 'tool_called', {}));
  steps.push(op('listEngagements'));
  steps.push(op('compact', { engagementId: 'c' }));
  steps.push(op('listEngagements'));
  steps.push(op('read', { engagementId: 'c' }));
  steps.push(op('summarize', { engagementId: 'c' }));
  steps.push(op('compact', { engagementId: 'c' }));
  steps.push(A('c', 250, 'x', {}));
  steps.push(op('listEngagements'));
  steps.push(op('prune', { now: 250 + 30 }));
  steps.push(op('listEngagements'));
  scenarios['edge-compaction-recency'] = { setup: { retention: { maxEventsPerEngagement: 27, maxAgeMs: 30 } }, description: 'compaction drops the trailing events: recency and fullness change', steps };
}

{
  const deep = (n: number): any => (n <= 1 ? {} : { k: deep(n - 1) });
  scenarios['edge-data-depth'] = {
    description: 'data nesting 64 levels, the most flightlog stores (65 is a documented refusal)',
    steps: [A('e', 1, 't', deep(64)), op('read', { engagementId: 'e' }), op('summarize', { engagementId: 'e' })],
  };
}

scenarios['edge-proto-key'] = {
  description: 'a __proto__ key in record data: an own key like any other, not a prototype',
  steps: [op('summarizeEngagementEvents', { engagementId: 'e', records: JSON.parse('[{"at":1,"type":"board_written","data":{"__proto__":{"key":"k"}}}]') })],
};

{
  const big: Record<string, unknown> = {};
  for (let i = 0; i < 20; i++) big[`x${i}`] = i;
  scenarios['edge-wide-objects'] = {
    description: 'objects with more than 8 keys (hash lookups)',
    steps: [
      A('e', 1, 'engagement_opened', { ...big, initiator: { ...big, id: 'u' }, venue: { ...big, kind: 'chat', id: 'v' }, entry: 'agent:a' }),
      A('e', 2, 'guard_blocked', { ...big, reason: { ...big, code: 'c', detail: 'd' }, from: 'agent:b' }),
      A('e', 3, 'engagement_closed', { ...big, budget: { ...big, spent: { ...big, tokens: 5 } } }),
      op('summarize', { engagementId: 'e' }),
      op('summarizeEngagementEvents', { engagementId: 'e', records: [{ ...big, at: 1, type: 'board_written', data: { ...big, key: 'k' } }, { ...big, at: 2, type: '', event: { ...big, type: 'tool_called' } }] }),
    ],
  };
}

scenarios['edge-long-strings'] = {
  description: 'long strings and many events per summary',
  steps: [
    A('e', 1, 'board_written', { key: 'k'.repeat(5000), content: 'c'.repeat(100000) }),
    op('summarize', { engagementId: 'e' }),
    A('e', 2, 't'.repeat(3000), { s: '\u2026'.repeat(1000) }),
    op('read', { engagementId: 'e' }),
  ],
};

scenarios['edge-types'] = {
  description: 'types with control characters and the marker',
  steps: [
    A('e', 1, '\u0000', {}), A('e', 2, ' ', {}), A('e', 3, 'engagement_closed\u2026', {}), A('e', 4, '\t', {}),
    op('read', { engagementId: 'e' }), op('summarize', { engagementId: 'e' }),
  ],
};

scenarios['edge-close-status-variants'] = {
  description: 'compaction decision by the last close status: absent, null, completed, other',
  steps: (() => {
    const steps: any[] = [];
    const variants: [string, Record<string, unknown>][] = [['s1', {}], ['s2', { status: null }], ['s3', { status: 'completed' }], ['s4', { status: 'Completed' }], ['s5', { status: ['completed'] }]];
    for (const [id, close] of variants) {
      for (let i = 0; i < 21; i++) steps.push(A(id, i, i % 2 ? 'turn_started' : 'mail_sent', i % 2 ? { mailId: `m${i - 1}` } : { mailId: `m${i}`, from: 'agent:a', to: 'agent:b' }));
      steps.push(A(id, 30, 'engagement_closed', close));
      steps.push(op('compact', { engagementId: id }));
      steps.push(op('read', { engagementId: id }));
      steps.push(op('summarize', { engagementId: id }));
    }
    return steps;
  })(),
};

// Random records with extra keys at the record level, fed to the pure functions.
{
  const r = new Rng(11);
  const steps: any[] = [];
  for (let n = 0; n < 200; n++) {
    const recs: any[] = [];
    for (let i = 0; i < r.int(1, 30); i++) {
      const type = r.pick(['board_written', 'mail_sent', 'engagement_opened', 'engagement_closed', 'guard_blocked', 'escalated', 'venue_projected', 'budget_charged', 'turn_finished']);
      const rec: any = { at: r.int(-5, 50), type, data: payload(r, type) };
      if (r.chance(0.3)) rec.event = { type: r.pick(['x', type]), ...payload(r, type) };
      if (r.chance(0.3)) for (let k = 0; k < 10; k++) rec[`z${k}`] = k;
      recs.push(rec);
    }
    steps.push(op('summarizeEngagementEvents', { engagementId: `e${n}`, records: recs }));
    steps.push(op('reconstructBoardFromEvents', { records: recs, ...(r.chance(0.5) ? { filter: { kind: r.pick(['todo', 'note', 'artifact']) } } : {}) }));
  }
  scenarios['edge-records-extra-keys'] = { description: 'pure functions on records with extra keys', steps };
}

const out = process.argv[2];
if (!out) {
  console.error('usage: bun edge.ts OUTDIR');
  process.exit(2);
}
mkdirSync(join(out, 'journal'), { recursive: true });
let steps = 0;
for (const [name, sc] of Object.entries(scenarios)) {
  const fx = await recordScenario({ name, store: 'journal', description: sc.description, setup: sc.setup ?? {}, steps: sc.steps });
  steps += fx.steps.length;
  writeFileSync(join(out, 'journal', `${name}.json`), JSON.stringify(fx));
}
console.log(`journal: ${Object.keys(scenarios).length} edge scenarios, ${steps} steps recorded`);
