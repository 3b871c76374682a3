// Why: the journal half of the differential check. Seeded random scenarios — appends valid and
// invalid, reads, summaries, compactions, prunes, listings, and the pure functions over loose
// record shapes — recorded on the reference (record.ts) as fixtures.
//   bun gen.ts OUTDIR FIRST_SEED COUNT     writes OUTDIR/journal/fuzz-SEED.json
// Seeds from 10000 on use mode B: many engagements, odd ids in appends, many ties of `at`.
// Stays inside FORMAT.md: ASCII strings (plus the … marker), integers below 2^53, fractional
// numbers only inside data (budget amounts / versions as multiples of 1/8, which add exactly).
// FUZZ_EXPECTED_SEQ=1 adds `expectedSeq` members to some appends: the reference ignores them,
// the HTTP contract treats them as a guard, so it is off by default (README.md).
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { recordScenario } from './record.ts';

export class Rng {
  s: number;
  constructor(seed: number) { this.s = (seed * 2654435761) >>> 0 || 1; }
  next(): number { // mulberry32
    let t = (this.s = (this.s + 0x6d2b79f5) >>> 0);
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  }
  int(lo: number, hi: number): number { return lo + Math.floor(this.next() * (hi - lo + 1)); }
  chance(p: number): boolean { return this.next() < p; }
  pick<T>(xs: readonly T[]): T { return xs[Math.floor(this.next() * xs.length)]; }
  weighted<T>(xs: readonly [number, T][]): T {
    const total = xs.reduce((a, [w]) => a + w, 0);
    let r = this.next() * total;
    for (const [w, v] of xs) { if ((r -= w) < 0) return v; }
    return xs[xs.length - 1][1];
  }
}

const ACTORS = ['agent:lead', 'agent:coder', 'agent:reviewer', 'agent:ops', 'bot:helper', 'human:alice', 'system:guard',
  'human', 'system', '', 'agent:a b', 'Human:bob', 'human:', 'systemx', 'agent:\u0000nul', 'agent:\u2026'] as const;
const MAILS = ['m1', 'm2', 'm3', 'm4', 'm5', 'm6', 'm7', 'm8', '', 'm-none', 'M1', ' m1'] as const;
const KEYS = ['plan', ' plan ', 'plan\t', 'todo-1', 'todo-2', 'spec', '', '   ', 'notes', '\u000bplan', 'art', 'k\u2026',
  '\u001fplan', 'plan\n'] as const;
const WORDS = ['alpha', 'beta', 'gamma', 'delta', 'x', '', 'quoted "q"', 'back\\slash', 'tab\there', 'trunc\u2026', 'ctl\u0001\u007f'];

let WIDE = 0.15;
function mail(r: Rng): string { return r.chance(WIDE) ? `m${r.int(1, 40)}` : r.pick(MAILS); }
function actor(r: Rng): string { return r.chance(WIDE) ? `agent:n${r.int(1, 40)}` : r.pick(ACTORS); }
function bkey(r: Rng): string { return r.chance(WIDE) ? `k${r.int(1, 40)}` : r.pick(KEYS); }

function words(r: Rng): string {
  const n = r.int(0, 4);
  const out: string[] = [];
  for (let i = 0; i < n; i++) out.push(r.pick(WORDS));
  return out.join(' ');
}

function wrong(r: Rng): unknown {
  return r.pick([null, true, false, 0, 42, -7, 2.5, 'str', '', [], [1, 'a'], {}, { x: 1 }, { id: 5 }] as unknown[]);
}

// Budget amounts: integers, multiples of 1/8, zero, negative, or wrong types.
function amount(r: Rng): unknown {
  return r.weighted<unknown>([
    [5, r.int(0, 5000)],
    [4, r.int(-4, 400) / 8],
    [1, 0],
    [1, -r.int(1, 100)],
    [1, String(r.int(1, 9))],
    [1, null],
    [1, true],
    [1, 1e15 + r.int(0, 100)],
  ]);
}

const BUDGET = ['modelCalls', 'tokens', 'wallMs', 'sideEffects'] as const;
function amounts(r: Rng): Record<string, unknown> {
  const o: Record<string, unknown> = {};
  for (const k of BUDGET) if (r.chance(0.6)) o[k] = amount(r);
  if (r.chance(0.15)) o.costUsd = r.int(0, 20) / 4;
  return o;
}

function maybe(r: Rng, o: Record<string, unknown>, key: string, good: () => unknown, pGood = 0.75, pWrong = 0.12) {
  const x = r.next();
  if (x < pGood) o[key] = good();
  else if (x < pGood + pWrong) o[key] = wrong(r);
  // else absent
}

function venue(r: Rng): unknown {
  return r.weighted<unknown>([
    [6, { kind: r.pick(['chat', 'thread', 'email']), id: `v-${r.int(1, 5)}` }],
    [1, { kind: 'chat' }],
    [1, { kind: 3, id: 'v' }],
    [1, { kind: 'chat', id: 'v-9', extra: true }],
    [1, 'chat:v-1'],
    [1, null],
  ]);
}

const TYPES = ['engagement_opened', 'mail_sent', 'mail_admitted', 'mail_delivered', 'turn_started', 'turn_finished',
  'mail_completed', 'mail_cancelled', 'tool_called', 'board_written', 'guard_blocked', 'mail_denied', 'escalated',
  'venue_projected', 'budget_charged', 'budget_granted', 'engagement_closed', 'custom_note'] as const;

function mailIds(r: Rng): unknown[] {
  const n = r.int(0, 4);
  const out: unknown[] = [];
  for (let i = 0; i < n; i++) out.push(r.chance(0.85) ? mail(r) : wrong(r));
  return out;
}

export function payload(r: Rng, type: string): Record<string, unknown> {
  const d: Record<string, unknown> = {};
  switch (type) {
    case 'engagement_opened': {
      const v = r.int(0, 5);
      if (v === 0) d.initiator = { kind: r.pick(['human', 'agent', 'service']), id: r.pick(['alice', 'bob', 'u1']), ...(r.chance(0.5) ? { trust: r.pick(['owner', 'group_member']) } : {}), ...(r.chance(0.2) ? { extra: { n: 1 } } : {}) };
      else if (v === 1) d.principal = r.pick(['alice', '', 'human:bob']);
      else if (v === 2) d.principal = { kind: 'service', id: `p-${r.int(1, 5)}` };
      else if (v === 3) d.initiator = r.pick([{ kind: 'human' }, { id: 7 }, 'alice', null, []]);
      else if (v === 4) { d.initiator = { id: 'x' }; d.principal = 'shadowed'; }
      if (r.chance(0.3)) d.principal ??= r.pick(['carol', { id: 'p-x', kind: 'human' }, 5]);
      if (r.chance(0.7)) d.venue = venue(r);
      maybe(r, d, 'entry', () => actor(r));
      break;
    }
    case 'mail_sent':
    case 'mail_admitted': {
      maybe(r, d, 'mailId', () => mail(r), 0.85, 0.08);
      maybe(r, d, 'kind', () => r.pick(['ask', 'result', 'notify', 'delegate', 'result', '']), 0.8, 0.05);
      maybe(r, d, 'from', () => actor(r), 0.85, 0.05);
      maybe(r, d, 'to', () => actor(r), 0.85, 0.05);
      if (r.chance(0.5)) maybe(r, d, 'causationId', () => mail(r), 0.85, 0.1);
      if (r.chance(0.3)) maybe(r, d, 'status', () => r.pick(['cancelled', 'completed', 'done']), 0.8, 0.1);
      break;
    }
    case 'mail_delivered':
    case 'turn_started':
    case 'turn_finished':
    case 'mail_completed': {
      maybe(r, d, 'actor', () => actor(r), 0.7, 0.1);
      maybe(r, d, 'mailId', () => mail(r), 0.6, 0.1);
      if (r.chance(0.35)) d.mails = r.chance(0.85) ? mailIds(r) : wrong(r);
      if (r.chance(0.3)) maybe(r, d, 'status', () => r.pick(['cancelled', 'completed', 'failed']), 0.85, 0.1);
      break;
    }
    case 'mail_cancelled':
      maybe(r, d, 'mailId', () => mail(r), 0.85, 0.1);
      if (r.chance(0.3)) d.actor = actor(r);
      break;
    case 'tool_called':
      maybe(r, d, 'actor', () => actor(r), 0.7, 0.1);
      d.tool = r.pick(['read', 'write', 'search']);
      break;
    case 'board_written': {
      maybe(r, d, 'key', () => bkey(r), 0.9, 0.05);
      maybe(r, d, 'kind', () => r.pick(['artifact', 'todo', 'note', 'todo', 'Note', 'other']), 0.6, 0.08);
      maybe(r, d, 'content', () => words(r), 0.7, 0.1);
      const who = r.int(0, 5);
      if (who === 0) d.actor = actor(r);
      else if (who === 1) d.author = actor(r);
      else if (who === 2) { d.actor = wrong(r); d.author = actor(r); }
      else if (who === 3) { d.actor = null; d.author = actor(r); }
      else if (who === 4) { d.actor = actor(r); d.author = actor(r); }
      if (r.chance(0.3)) maybe(r, d, 'version', () => r.weighted<unknown>([[3, r.int(0, 30)], [2, r.int(-8, 80) / 8], [1, -3], [1, '4']]), 0.8, 0.15);
      if (r.chance(0.4)) maybe(r, d, 'status', () => r.pick(['pending', 'in_progress', 'done', 'Done', 'blocked']), 0.85, 0.1);
      break;
    }
    case 'guard_blocked':
    case 'mail_denied': {
      if (r.chance(0.7)) d.from = r.chance(0.85) ? actor(r) : wrong(r);
      if (r.chance(0.4)) d.actor = r.chance(0.85) ? actor(r) : wrong(r);
      if (r.chance(0.6)) d.to = r.chance(0.85) ? actor(r) : wrong(r);
      const v = r.int(0, 5);
      if (v === 0) d.reason = { code: r.pick(['loop', 'budget', 'policy']), ...(r.chance(0.5) ? { detail: r.chance(0.8) ? words(r) : 5 } : {}) };
      else if (v === 1) d.reason = words(r);
      else if (v === 2) { d.reason = { code: 7, detail: 'x' }; d.code = r.pick(['hop', 9]); }
      else if (v === 3) { d.code = r.pick(['loop', 'rate', 3]); if (r.chance(0.5)) d.reason = words(r); }
      else if (v === 4) d.reason = wrong(r);
      if (r.chance(0.2)) d.mailId = mail(r);
      break;
    }
    case 'escalated':
      if (r.chance(0.5)) d.by = r.chance(0.85) ? actor(r) : wrong(r);
      if (r.chance(0.4)) d.from = r.chance(0.85) ? actor(r) : wrong(r);
      if (r.chance(0.4)) d.actor = r.chance(0.85) ? actor(r) : wrong(r);
      maybe(r, d, 'reason', () => words(r), 0.75, 0.1);
      break;
    case 'venue_projected':
      maybe(r, d, 'actor', () => actor(r), 0.8, 0.1);
      if (r.chance(0.85)) d.venue = venue(r);
      maybe(r, d, 'mailId', () => mail(r), 0.7, 0.1);
      maybe(r, d, 'mode', () => r.pick(['visible', 'summary', 'hidden']), 0.6, 0.1);
      break;
    case 'budget_charged':
    case 'budget_granted': {
      const v = r.int(0, 6);
      if (v === 0) d.usage = amounts(r);
      else if (v === 1) d.amount = amounts(r);
      else if (v === 2) d.consumed = amounts(r);
      else if (v === 3) Object.assign(d, amounts(r));
      else if (v === 4) { d.usage = wrong(r); d.amount = amounts(r); Object.assign(d, amounts(r)); }
      else if (v === 5) { d.usage = [1, 2]; Object.assign(d, amounts(r)); }
      else { d.amount = amounts(r); d.consumed = amounts(r); }
      if (r.chance(0.2)) d.actor = actor(r);
      break;
    }
    case 'engagement_closed': {
      if (r.chance(0.75)) d.status = r.weighted<unknown>([[6, 'completed'], [1, 'escalated'], [1, 'cancelled'], [1, 'blocked'], [1, 'open'], [1, null], [1, 5]]);
      maybe(r, d, 'reason', () => words(r), 0.5, 0.1);
      const v = r.int(0, 4);
      if (v === 0) d.budget = { spent: amounts(r), ...(r.chance(0.3) ? { granted: amounts(r) } : {}) };
      else if (v === 1) d.consumed = amounts(r);
      else if (v === 2) { d.budget = r.pick([{ spent: 3 }, { granted: amounts(r) }, 'x', null]); if (r.chance(0.6)) d.consumed = amounts(r); }
      break;
    }
    default: {
      // custom / unknown types carrying look-alike fields
      if (r.chance(0.5)) d.value = r.chance(0.5) ? r.int(-1000, 100000) : words(r);
      if (r.chance(0.3)) Object.assign(d, payload(r, r.pick(TYPES.slice(0, -1))));
      break;
    }
  }
  if (r.chance(0.1)) d[r.pick(['extra', 'note', 'nested', 'seq', 'type'])] = r.pick([{ deep: [1, { a: null }] }, 'x', 3, [], null, 0.5]);
  return d;
}

// A type name for an event: mostly the known ones, sometimes other/odd names.
function pickType(r: Rng, weights?: [number, string][]): string {
  if (weights) return r.weighted(weights);
  if (r.chance(0.05)) return r.pick(['custom_note', 'Board_written', 'board_written ', 'x', 'engagement_closed\u0000', 'note']);
  return r.pick(TYPES);
}

type Step = { op: string; args: any };

const BASE = 1_700_000_000_000;
const MAX_SAFE = Number.MAX_SAFE_INTEGER;

function generate(seed: number): any {
  const r = new Rng(seed);
  WIDE = r.pick([0, 0.1, 0.4]);
  const retention = r.weighted<any>([
    [3, undefined],
    [3, { maxEventsPerEngagement: r.int(21, 60), maxAgeMs: r.pick([600000, 3600000, 86400000]) }],
    [1, { maxEventsPerEngagement: r.int(0, 6), maxAgeMs: r.pick([0, 1000, 60000]) }],
    [1, { maxEventsPerEngagement: r.int(22, 40), maxAgeMs: r.pick([1, 1000]) }],
    [1, { maxEventsPerEngagement: 10000, maxAgeMs: r.pick([0, 5, 2592000000, MAX_SAFE]) }],
  ]);
  const maxAge = retention?.maxAgeMs ?? 2592000000;
  // Mode B (seeds >= 10000): many engagements, odd ids in appends, heavy ties of at.
  const modeB = seed >= 10000;
  const nEng = modeB ? r.int(8, 120) : r.int(1, 6);
  const odd = ['a b', 'a/b', 'x%2Fy', 'q?x=1', 'h#f', 'p+q', 'e.1', 'UPPER', 'u\u0001ctl', 'nul\u0000id', 'dots..', '~tilde', 'semi;colon', 'x'.repeat(200), 'tab\tid', 'k\u2026'];
  const engs: string[] = [];
  const oddB = [...odd, 'Eng-001', 'eng-001 ', 'eng-00', 'eng-001\u0000', ' eng-001', 'ENG-001', 'eng_001', 'eng-1'];
  for (let i = 0; i < nEng; i++) engs.push(r.chance(modeB ? 0.3 : 0.15) ? r.pick(modeB ? oddB : odd) : `eng-${String(i + 1).padStart(3, '0')}`);
  const uniq = [...new Set(engs)];
  // Per-engagement steering: compaction-minded engagements avoid blocking events and close late.
  const profile = new Map<string, { compactable: boolean; count: number; closed: boolean }>();
  for (const e of uniq) profile.set(e, { compactable: r.chance(0.55), count: 0, closed: false });

  let clock = r.chance(0.1) ? r.pick([0, -5_000_000, MAX_SAFE - 10_000_000, -(MAX_SAFE - 10_000_000)]) : BASE;
  const tick = (): number => {
    const v = r.weighted<number>([
      [10, r.int(1, 5000)],
      [modeB ? 15 : 3, 0], // ties
      [2, -r.int(1, 5000)], // backwards
      [1, r.int(100_000, 10_000_000)],
      [1, Math.round(maxAge * (0.5 + r.next()))],
    ]);
    clock = Math.max(-MAX_SAFE, Math.min(MAX_SAFE, clock + v));
    return clock;
  };
  const steps: Step[] = [];
  const nSteps = r.weighted<number>([[3, r.int(20, 80)], [4, r.int(80, 250)], [2, r.int(250, 600)]]);
  const lastAts: number[] = [];

  const records = (): unknown[] => {
    const n = r.weighted<number>([[1, 0], [6, r.int(1, 15)], [4, r.int(15, 60)]]);
    const out: unknown[] = [];
    let at = r.chance(0.8) ? BASE : r.int(-1000, 1000);
    for (let i = 0; i < n; i++) {
      at += r.weighted<number>([[6, r.int(1, 3000)], [2, 0], [1, -r.int(1, 1000)]]);
      const type = pickType(r);
      const data = payload(r, type);
      const shape = r.weighted<string>([[4, 'stored'], [4, 'loose'], [3, 'event'], [2, 'both'], [1, 'fallback'], [1, 'bad-data']]);
      let rec: Record<string, unknown>;
      if (shape === 'stored') rec = { engagementId: 'e', seq: i, at, type, data };
      else if (shape === 'loose') rec = { at, type, data };
      else if (shape === 'event') rec = { at, event: { type, ...data } };
      else if (shape === 'both') {
        const other = payload(r, r.chance(0.5) ? type : pickType(r));
        rec = { at, type, data, event: { type: r.chance(0.5) ? type : pickType(r), ...other } };
      } else if (shape === 'fallback') {
        rec = { at, type: r.pick(['', 7, null, false]), event: { type: r.chance(0.85) ? type : r.pick([3, null]), ...data }, ...(r.chance(0.5) ? { data: payload(r, type) } : {}) };
      } else {
        rec = { at, type, data: r.pick([[1, 2], 'str', null, 5, true]), ...(r.chance(0.6) ? { event: data } : {}) };
      }
      out.push(rec);
    }
    return out;
  };

  const invalidAppend = (): any => {
    const e = r.pick(uniq);
    const base: any = { engagementId: e, at: tick(), type: pickType(r), data: payload(r, 'custom_note') };
    const v = r.int(0, 13);
    if (v === 0) base.engagementId = r.pick(['', 42, null, [], { id: e }, true]);
    else if (v === 1) delete base.engagementId;
    else if (v === 2) base.at = r.pick(['1000', null, true, [], {}, '']);
    else if (v === 3) delete base.at;
    else if (v === 4) base.data = r.pick([[], [1], 'str', 5, true, null, '']);
    else if (v === 5) delete base.data;
    else if (v === 6) base.type = r.pick(['', 7, null, true, [], { t: 1 }]);
    else if (v === 7) delete base.type;
    else if (v === 8) { base.engagementId = ''; base.data = null; base.type = 3; }
    else if (v === 9) { base.at = null; base.type = ''; }
    else if (v === 10) { base.data = [1]; delete base.type; }
    else if (v === 11) return r.pick([null, [], 'event', 5]);
    else if (v === 12) { base.seq = r.int(0, 99); base.extra = 'dropped'; base.type = ''; }
    else { base.at = r.pick(['NaN', 'Infinity', '-1']); }
    return base;
  };

  for (let i = 0; i < nSteps; i++) {
    const op = r.weighted<string>([
      [62, 'append'], [5, 'invalid'], [5, 'read'], [7, 'summarize'], [5, 'compact'], [4, 'listEngagements'],
      [3, 'prune'], [3, 'summarizeEngagementEvents'], [3, 'reconstructBoardFromEvents'],
    ]);
    const e = r.chance(0.93) ? r.pick(uniq) : r.pick(['missing-1', 'Eng-001', 'eng-001 ', 'eng-00']);
    switch (op) {
      case 'append': {
        const p = profile.get(e);
        if (!p) { steps.push({ op: 'read', args: { engagementId: e } }); break; }
        let type: string;
        if (p.compactable) {
          type = pickType(r, [
            [2, 'engagement_opened'], [6, 'mail_sent'], [2, 'mail_admitted'], [6, 'mail_delivered'], [6, 'turn_started'], [4, 'turn_finished'],
            [3, 'mail_completed'], [1, 'mail_cancelled'], [3, 'tool_called'], [4, 'board_written'], [3, 'venue_projected'],
            [8, 'budget_charged'], [3, 'budget_granted'], [p.count > 18 ? 8 : 1, 'engagement_closed'], [1, 'custom_note'],
            [r.chance(0.1) ? 1 : 0, 'guard_blocked'], [r.chance(0.05) ? 1 : 0, 'escalated'],
          ]);
        } else type = pickType(r);
        const ev: any = { engagementId: e, at: tick(), type, data: payload(r, type) };
        if (r.chance(0.04)) ev.seq = r.int(0, 50);
        if (r.chance(0.03)) ev.extra = { anything: [1, 2] };
        if (r.chance(0.02) && process.env.FUZZ_EXPECTED_SEQ) ev.expectedSeq = p.count;
        steps.push({ op: 'append', args: { event: ev } });
        p.count++;
        if (type === 'engagement_closed') p.closed = true;
        lastAts.push(ev.at);
        if (p.compactable && p.closed && r.chance(0.5)) steps.push({ op: 'compact', args: { engagementId: e } });
        break;
      }
      case 'invalid':
        steps.push({ op: 'append', args: { event: invalidAppend() } });
        break;
      case 'read':
      case 'summarize':
      case 'compact':
        steps.push({ op, args: { engagementId: e } });
        break;
      case 'listEngagements': {
        const v = r.int(0, 5);
        if (v <= 1) steps.push({ op, args: {} });
        else if (v === 2) steps.push({ op, args: { limit: r.int(0, 3) } });
        else if (v === 3) steps.push({ op, args: { limit: r.int(-3, -1) } });
        else if (v === 4) steps.push({ op, args: { limit: r.int(4, 20) } });
        else steps.push({ op, args: { limit: r.pick([10000, 10001, 0]) } });
        break;
      }
      case 'prune': {
        const ref = lastAts.length ? r.pick(lastAts) : clock;
        const now = Math.max(-MAX_SAFE, Math.min(MAX_SAFE, ref + maxAge + r.pick([-1, 0, 1, r.int(-5000, 5000), r.int(0, 10_000_000)])));
        steps.push({ op, args: { now } });
        break;
      }
      case 'summarizeEngagementEvents':
        if (modeB && r.chance(0.5)) {
          const evs = steps.filter((s) => s.op === 'append' && s.args.event?.engagementId === e && typeof s.args.event.type === 'string' && s.args.event.type
            && typeof s.args.event.at === 'number' && s.args.event.data && typeof s.args.event.data === 'object' && !Array.isArray(s.args.event.data))
            .map((s, i) => ({ engagementId: e, seq: i, at: s.args.event.at, type: s.args.event.type, data: s.args.event.data }));
          steps.push({ op, args: { engagementId: e, records: evs } });
          break;
        }
        steps.push({ op, args: { engagementId: r.chance(0.9) ? e : r.pick(['', 'zz']), records: records() } });
        break;
      case 'reconstructBoardFromEvents': {
        const v = r.int(0, 6);
        const args: any = { records: records() };
        if (v === 1) args.filter = {};
        else if (v === 2) args.filter = { key: bkey(r) };
        else if (v === 3) args.filter = { kind: r.pick(['todo', 'note', 'artifact', 'bogus']) };
        else if (v === 4) args.filter = { key: bkey(r), kind: r.pick(['todo', 'note', 'artifact']) };
        steps.push({ op, args });
        break;
      }
    }
  }
  // End with a full look at every engagement.
  for (const e of uniq) {
    steps.push({ op: 'read', args: { engagementId: e } });
    steps.push({ op: 'summarize', args: { engagementId: e } });
  }
  steps.push({ op: 'listEngagements', args: {} });
  return {
    name: `fuzz-${String(seed).padStart(5, '0')}`,
    store: 'journal',
    description: `differential fuzz scenario, seed ${seed} (tools/reference-diff/journal/gen.ts)`,
    setup: retention ? { retention } : {},
    steps,
  };
}

if (import.meta.main) {
  const [out, first, count] = [process.argv[2]!, Number(process.argv[3]), Number(process.argv[4])];
  if (!out || !Number.isSafeInteger(first) || !Number.isSafeInteger(count)) {
    console.error('usage: bun gen.ts OUTDIR FIRST_SEED COUNT');
    process.exit(2);
  }
  mkdirSync(join(out, 'journal'), { recursive: true });
  const t0 = performance.now();
  let steps = 0;
  const outcomes: Record<string, number> = {};
  for (let seed = first; seed < first + count; seed++) {
    const fx = await recordScenario(generate(seed));
    steps += fx.steps.length;
    for (const st of fx.steps) {
      const k = st.expectError ? `${st.op}:${st.expectError}` : `${st.op}:ok`;
      outcomes[k] = (outcomes[k] ?? 0) + 1;
    }
    writeFileSync(join(out, 'journal', `${fx.name}.json`), JSON.stringify(fx));
  }
  console.log(`journal: ${count} scenarios, ${steps} steps recorded in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  console.log(JSON.stringify({ outcomes }));
}
