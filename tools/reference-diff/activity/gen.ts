// Why: the activity half of the differential check. Seeded random operation sequences on the
// reference store (harness.ts), recorded as fixtures; it runs the reference while generating so
// that it can keep every step free of the ties FORMAT.md §3.5 rules out (a step whose result
// would depend on one is dropped or its time nudged).
//   bun gen.ts OUTDIR FIRST_SEED COUNT     writes OUTDIR/activity/fuzz-SEED.json
// Environment (README.md): FUZZ_PROFILE picks one profile for every seed (else one per seed);
// the others, set to 1, go outside FORMAT.md or the HTTP contract and are off by default.
import { mkdirSync, writeFileSync } from "node:fs";
import { RefHarness, fixtureToText, type Step } from "./harness.ts";

const PROFILES = ["default", "manyRuns", "deep", "extreme", "bulk", "edgy", "heavy", "huge"] as const;
const env = (name: string) => Boolean(process.env[name]);
const KNOB = {
  profile: process.env.FUZZ_PROFILE || undefined,
  runIds: env("FUZZ_RUNIDS"), // run ids not in creation order (FORMAT.md §3.5)
  ties: env("FUZZ_TIES"), // no tie avoidance (FORMAT.md §3.5)
  beyond: env("FUZZ_BEYOND"), // attrs/payload keys that look like array indexes (FORMAT.md §3.4)
  negUsage: env("FUZZ_NEG_USAGE"), // negative / huge usage values (edgy profile; HTTP contract)
  bigBatch: env("FUZZ_BIG_BATCH"), // prune batch 2^53-1 (edgy profile; HTTP contract)
  emptyIds: env("FUZZ_EMPTY_IDS"), // runId "" (HTTP contract)
  dotIds: env("FUZZ_DOT_IDS"), // span ids "." and ".." (cannot travel in a URL path)
};
if (KNOB.profile !== undefined && !(PROFILES as readonly string[]).includes(KNOB.profile)) {
  throw new Error(`FUZZ_PROFILE must be one of ${PROFILES.join(", ")}`);
}

// ---------- PRNG ----------
function mulberry32(a: number) {
  return function () {
    a |= 0; a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}
let R = mulberry32(1);
let PROFILE = "default";
const rnd = () => R();
const ri = (lo: number, hi: number) => lo + Math.floor(rnd() * (hi - lo + 1)); // inclusive
const chance = (p: number) => rnd() < p;
function pick<T>(a: readonly T[]): T { return a[Math.floor(rnd() * a.length)]!; }
function wpick<T>(items: Array<[number, T]>): T {
  const tot = items.reduce((s, [w]) => s + w, 0);
  let x = rnd() * tot;
  for (const [w, v] of items) { if ((x -= w) < 0) return v; }
  return items[items.length - 1]![1];
}

const KINDS = ["turn", "tool", "subagent", "cron"] as const;
const OUTCOMES = ["success", "error", "timeout", "cancelled", "denied", "interrupted"] as const;
const LETTERS = "abcdefghijklmnopqrstuvwxyz";
function word(n = ri(1, 8)) { let s = ""; for (let i = 0; i < n; i++) s += LETTERS[ri(0, 25)]; return s; }
function asciiStr(maxLen = 20): string {
  const mode = ri(0, 9);
  if (mode === 0) return "";
  if (mode <= 6) { const w = []; const n = ri(1, 4); for (let i = 0; i < n; i++) w.push(word()); return w.join(" "); }
  // arbitrary ASCII incl. control chars, quotes, backslashes, DEL
  let s = ""; const n = ri(1, maxLen);
  for (let i = 0; i < n; i++) {
    const c = wpick<number>([[5, ri(32, 126)], [1, ri(0, 31)], [1, 127], [1, 34], [1, 92]]);
    s += String.fromCharCode(c);
  }
  return s;
}
function key(): string {
  return wpick<string>([[20, word(ri(1, 7))], [2, pick(["model", "tool", "prompt", "exitCode", "retry", "step"])],
    [1, asciiStr(6) || "k"], [PROFILE === "edgy" ? 3 : 0.3, "__proto__"], [0.3, "constructor"], [0.3, "toString"],
    [KNOB.beyond ? 2 : 0, String(ri(0, 20))]]);
}
function num(allowFloat: boolean): number {
  return wpick<() => number>([
    [4, () => ri(0, 100000)], [1, () => -ri(0, 1000)], [1, () => 0],
    [allowFloat ? 3 : 0, () => ri(-100000, 100000) / 100], [allowFloat ? 1 : 0, () => ri(0, 64) / 4],
    [0.5, () => pick([9007199254740991, -9007199254740991, 2 ** 52, 1e15])],
    [allowFloat ? 0.3 : 0, () => pick([1e-7, 1.5e300, 123456.789, 0.1, 1e21, 2e-300])],
  ])();
}
function jsonVal(depth: number, allowFloat: boolean): any {
  const t = wpick<string>([[3, "str"], [3, "num"], [1, "bool"], [1, "null"], [depth > 0 ? 1.5 : 0, "obj"], [depth > 0 ? 1 : 0, "arr"]]);
  switch (t) {
    case "str": return asciiStr();
    case "num": return num(allowFloat);
    case "bool": return chance(0.5);
    case "null": return null;
    case "obj": return jsonObj(depth - 1, allowFloat);
    default: { const a = []; const n = ri(0, 4); for (let i = 0; i < n; i++) a.push(jsonVal(depth - 1, allowFloat)); return a; }
  }
}
function jsonObj(depth: number, allowFloat = true): Record<string, unknown> {
  const o: Record<string, unknown> = {}; const n = ri(0, 4);
  for (let i = 0; i < n; i++) o[key()] = jsonVal(depth, allowFloat);
  return o;
}

// payloads, including sizes around the 16384 cap
const CAP = 16384;
function bigString(len: number): string {
  // mostly letters; sometimes characters that JSON-escape (grow the JSON form)
  const esc = chance(0.5);
  let s = "";
  while (s.length < len) {
    if (esc && chance(0.05)) s += pick(['"', "\\", "\n", "\u0001", "\t", "\u007f"]);
    else s += LETTERS[ri(0, 25)];
  }
  return s.slice(0, len);
}
function repetitive(): any {
  // medium-size, repetitive JSON like tool calls (compresses well with a trained dictionary)
  const o: any = { tool: pick(["Bash", "Read", "Edit", "Grep"]), path: "/home/user/project/src/" + pick(["main.rs", "lib.rs", "mod.rs"]),
    exitCode: ri(0, 3), ok: chance(0.8) };
  const lines = []; const n = ri(20, 300);
  for (let i = 0; i < n; i++) lines.push(pick(["fn main() {", "    let x = 1;", "}", "use std::io;", "// comment " + word(4), "    println!(\"{}\", x);"]));
  o.output = lines.join("\n");
  if (chance(0.3)) o.nested = { a: [1, 2, 3, word(5)], b: { c: ri(0, 99), d: "same same same" } };
  return o;
}
function payload(): { has: boolean; v?: any } {
  if (PROFILE === "heavy" && chance(0.7)) return { has: true, v: repetitive() };
  return wpick<() => { has: boolean; v?: any }>([
    [2, () => ({ has: false })],
    [1, () => ({ has: true, v: null })],
    [6, () => ({ has: true, v: jsonVal(3, true) })],
    [4, () => ({ has: true, v: jsonObj(2, true) })],
    [0.6, () => ({ has: true, v: bigString(CAP + ri(-30, 30)) })],
    [0.3, () => ({ has: true, v: bigString(CAP - ri(0, 200)) })],
    [0.3, () => ({ has: true, v: bigString(ri(CAP + 1, CAP + 3000)) })],
    [0.6, () => { // object near the cap: ints, bools, ascii strings only
      const target = CAP + ri(-40, 40);
      const o: any = { n: ri(0, 1000), ok: chance(0.5) };
      const head = JSON.stringify({ ...o, text: "" }).length;
      o.text = bigString(Math.max(0, target - head));
      if (chance(0.3)) o.tail = [1, true, "x\"y", -5];
      return { has: true, v: o };
    }],
    [0.3, () => { // array near the cap
      const a: any[] = []; let len = 2;
      const target = CAP + ri(-20, 20);
      while (len < target) { const x = chance(0.5) ? ri(0, 99999) : word(ri(1, 30)); a.push(x); len += JSON.stringify(x).length + 1; }
      return { has: true, v: a };
    }],
  ])();
}

// ---------- scenario state ----------
type Ctx = {
  h: RefHarness;
  steps: Step[];
  clock: number;
  runs: string[]; // created in order
  runCounter: number;
  spanIds: string[]; // every span id ever tried
  writers: string[];
  defWriter: string;
  skipped: Record<string, number>;
};

function dbAll(c: Ctx, sql: string, ...p: any[]): any[] { return c.h.db.query(sql).all(...p) as any[]; }
function dbGet(c: Ctx, sql: string, ...p: any[]): any { return c.h.db.query(sql).get(...p); }

function nextClock(c: Ctx): number | undefined {
  const m = wpick<string>([[60, "adv"], [10, "same"], [8, "none"], [7, "jump"], [3, "back"], [2, "bigjump"]]);
  switch (m) {
    case "adv": return c.clock + ri(1, 3000);
    case "same": return c.clock;
    case "none": return undefined;
    case "jump": return c.clock + ri(60_000, 7_200_000);
    case "back": return c.clock - ri(1, 5000);
    default: return c.clock + ri(86_400_000, 40 * 86_400_000);
  }
}

function pickWriter(c: Ctx): string | undefined {
  return wpick<() => string | undefined>([[6, () => undefined], [2, () => pick(c.writers)], [0.3, () => c.defWriter]])();
}

function existingSpans(c: Ctx, where = "1=1"): any[] {
  return dbAll(c, `SELECT span_id, run_id, parent_span_id, outcome, started_at FROM activity_spans WHERE ${where}`);
}

function spanTarget(c: Ctx): string {
  if (PROFILE === "huge") {
    return wpick<() => string>([
      [c.spanIds.length ? 8 : 0, () => c.spanIds[Math.max(0, c.spanIds.length - ri(1, 30))]!],
      [c.spanIds.length ? 2 : 0, () => pick(c.spanIds)],
      [0.3, () => "s-missing-" + ri(1, 3)],
    ])();
  }
  const open = existingSpans(c, "outcome IS NULL");
  const ended = existingSpans(c, "outcome IS NOT NULL");
  return wpick<() => string>([
    [open.length ? 6 : 0, () => pick(open).span_id],
    [ended.length ? 2 : 0, () => pick(ended).span_id],
    [c.spanIds.length ? 1 : 0, () => pick(c.spanIds)],
    [0.6, () => "s-missing-" + ri(1, 3)],
  ])();
}
function runTarget(c: Ctx): string {
  if (PROFILE === "huge" && c.runs.length && chance(0.8)) return c.runs[Math.max(0, c.runs.length - ri(1, 20))]!;
  return wpick<() => string>([
    [c.runs.length ? 8 : 0, () => pick(c.runs)],
    [0.5, () => "r-missing"],
    [KNOB.emptyIds ? 0.2 : 0, () => ""],
  ])();
}

function usage(): any {
  const u: any = {};
  if (chance(0.5)) u.inputTokens = wpick([[5, ri(1, 50000)], [1, 0], [0.2, 9007199254740991]]);
  if (chance(0.5)) u.outputTokens = wpick([[5, ri(1, 50000)], [1, 0]]);
  if (chance(0.4)) u.cacheReadTokens = wpick([[5, ri(1, 90000)], [1, 0]]);
  if (chance(0.4)) u.cacheCreationTokens = wpick([[5, ri(1, 90000)], [1, 0]]);
  if (chance(0.4)) u.costUsd = wpick<number>([[3, ri(0, 400000) / 10000], [1, 0], [1, ri(0, 40) / 4], [1, ri(1, 5)], [0.3, 0.1]]);
  if (KNOB.negUsage && PROFILE === "edgy" && chance(0.3)) {
    const k = pick(["inputTokens", "outputTokens", "cacheReadTokens", "cacheCreationTokens", "costUsd"]);
    u[k] = k === "costUsd" ? pick([-0.5, -1, -BIG, 1e300, 5e-324, 0.30000000000000004, 123456789.125]) : pick([-1, -12345, -BIG, BIG]);
  }
  if (chance(0.4)) u.model = wpick([[5, pick(["claude-opus", "claude-haiku", "claude-sonnet"])], [1, ""], [1, asciiStr(10)]]);
  return u;
}

const BIG = 9007199254740991;
function edge(v: number): number {
  return PROFILE === "edgy" && chance(0.25) ? pick([BIG, -BIG, 2 ** 52, -(2 ** 52), 1, -1]) : v;
}
// positive batches above 10000 are beyond the HTTP contract (the HTTP replayer only translates negative ones)
function edgeBatch(v: number): number {
  return PROFILE === "edgy" && chance(0.25) ? pick([-BIG, -(2 ** 52), 1, -1, 10000, KNOB.bigBatch ? BIG : 9999]) : v;
}
function timeNear(c: Ctx): number {
  if (KNOB.ties && chance(0.5)) return c.clock - (c.clock % 1000);
  return wpick<() => number>([
    [5, () => c.clock - ri(0, 2000)],
    [2, () => c.clock + ri(1, 5000)],
    [1, () => c.clock - ri(100_000, 100_000_000)],
    [0.3, () => 0],
    [0.3, () => -ri(1, 100000)],
    [0.5, () => c.clock],
  ])();
}

// ---------- op generators: return a step (without result) or null if not applicable ----------
function genStartSpan(c: Ctx, s: Step): Step | null {
  const newRun = c.runs.length === 0 || chance(PROFILE === "manyRuns" ? 0.7 : PROFILE === "bulk" ? 0.8 : PROFILE === "huge" ? 0.5 : PROFILE === "deep" ? 0.05 : 0.35);
  let runId: string;
  if (newRun) {
    c.runCounter++;
    runId = KNOB.runIds ? word(ri(1, 3)) + String(c.runCounter) : "r" + String(c.runCounter).padStart(4, "0");
  }
  else runId = chance(0.03) ? "r-missing" : pick(c.runs);
  const inRun = dbAll(c, "SELECT span_id, run_id FROM activity_spans WHERE run_id = ?", runId);
  let spanId: string;
  const taken = PROFILE === "huge" ? (c.spanIds.length ? [{ span_id: pick(c.spanIds), run_id: "?" }] : []) : existingSpans(c);
  spanId = wpick<() => string>([
    [20, () => `${runId}.${inRun.length + (chance(0.85) ? 0 : ri(1, 3))}`],
    [taken.length ? 1 : 0, () => pick(taken).span_id],
    [c.spanIds.length ? 0.5 : 0, () => pick(c.spanIds)],
    [0.3, () => asciiStr(8) || "x"],
  ])();
  if (!KNOB.dotIds && (spanId === "." || spanId === "..")) spanId = "x" + spanId;
  const input: any = { spanId, runId };
  const others = taken.filter((t) => t.run_id !== runId);
  const parent = wpick<() => string | undefined>([
    [inRun.length ? 12 : 0, () => pick(inRun).span_id],
    [inRun.length ? 1.2 : 8, () => undefined],
    [0.6, () => ""],
    [0.6, () => "s-nope-" + ri(1, 3)],
    [others.length ? 0.6 : 0, () => pick(others).span_id],
    [0.4, () => spanId],
    [0.4, () => `${runId}.${inRun.length + 1}`],
  ])();
  if (parent !== undefined) input.parentSpanId = parent;
  input.name = wpick([[8, `${pick(["turn", "Bash", "Read", "task", "cron"])} ${word(3)}`], [1, ""], [1, asciiStr(12)]]);
  input.kind = pick(KINDS);
  input.origin = wpick([[3, "session"], [2, "cron"]]);
  if (chance(0.4)) input.sessionId = wpick([[5, "sess-" + ri(1, 5)], [1, ""]]);
  if (chance(0.3)) input.jobName = wpick([[5, "job-" + word(4)], [1, ""]]);
  if (chance(0.5)) input.attrs = chance(0.15) ? {} : jsonObj(2);
  if (PROFILE === "heavy" && chance(0.6)) input.attrs = { ...(input.attrs ?? {}), ...repetitive() };
  if (chance(0.6)) input.startedAt = timeNear(c);
  // tie avoidance: started_at unique within the run and among open roots
  const isRoot = parent === undefined;
  const dup = dbGet(c, "SELECT 1 AS x FROM activity_spans WHERE span_id = ?", spanId);
  if (!dup && !KNOB.ties) {
    for (let tries = 0; ; tries++) {
      const at = input.startedAt ?? (s.clock ?? c.clock);
      const clash = dbGet(c, "SELECT 1 AS x FROM activity_spans WHERE run_id = ? AND started_at = ?", runId, at) ||
        (isRoot && dbGet(c, "SELECT 1 AS x FROM activity_spans WHERE outcome IS NULL AND parent_span_id IS NULL AND started_at = ?", at));
      if (!clash) break;
      if (input.startedAt !== undefined) input.startedAt += input.startedAt >= BIG - 1000 ? -1 : 1;
      else s.clock = (s.clock ?? c.clock) + 1;
      if (tries > 1000) return null;
    }
  }
  if (newRun) c.runs.push(runId);
  c.spanIds.push(spanId);
  s.op = "startSpan"; s.args = { input };
  return s;
}

function genEnd(c: Ctx, s: Step): Step {
  const input: any = { outcome: pick(OUTCOMES) };
  if (chance(0.6)) input.reason = wpick([[6, pick(["budget exhausted", "parent cancelled", "tool failed", "ok"])], [1, ""], [1, asciiStr(10)]]);
  if (chance(0.6)) input.endedAt = timeNear(c);
  if (chance(0.5)) input.usage = usage();
  if (chance(0.4)) input.attrs = jsonObj(2);
  if (PROFILE === "heavy" && chance(0.4)) input.attrs = { ...(input.attrs ?? {}), ...repetitive() };
  s.op = "endSpan"; s.args = { spanId: spanTarget(c), input };
  return s;
}
function genPatch(c: Ctx, s: Step): Step {
  const patch: any = {};
  if (chance(0.5)) patch.attrs = jsonObj(2);
  if (PROFILE === "heavy" && chance(0.4)) patch.attrs = { ...(patch.attrs ?? {}), ...repetitive() };
  if (chance(0.5)) patch.usage = usage();
  if (chance(0.3)) patch.waitUntil = edge(wpick([[5, c.clock + ri(0, 100000)], [1, 0], [1, -5]]));
  s.op = "patchSpan"; s.args = { spanId: spanTarget(c), patch };
  return s;
}
function genAppend(c: Ctx, s: Step): Step | null {
  const spanId = spanTarget(c);
  const args: any = { spanId, eventType: wpick([[8, pick(["tool_result", "status", "text", "thinking", "tool_use"])], [1, ""], [1, asciiStr(8)]]) };
  const p = payload();
  if (p.has) args.payload = p.v;
  if (chance(0.6)) args.ts = edge(timeNear(c));
  const span = dbGet(c, "SELECT run_id FROM activity_spans WHERE span_id = ?", spanId);
  if (span && !KNOB.ties) {
    const idx = (dbGet(c, "SELECT COALESCE(MAX(event_index), -1) + 1 AS idx FROM activity_events WHERE span_id = ?", spanId) as any).idx;
    for (let tries = 0; ; tries++) {
      const ts = args.ts ?? (s.clock ?? c.clock);
      const clash = dbGet(c, `SELECT 1 AS x FROM activity_events e JOIN activity_spans sp ON sp.span_id = e.span_id
                              WHERE sp.run_id = ? AND e.ts = ? AND e.event_index = ?`, span.run_id, ts, idx);
      if (!clash) break;
      if (args.ts !== undefined) args.ts += args.ts >= BIG - 1000 ? -1 : 1; else s.clock = (s.clock ?? c.clock) + 1;
      if (tries > 1000) return null;
    }
  }
  s.op = "appendEvent"; s.args = args;
  return s;
}
function genHeartbeat(c: Ctx, s: Step): Step {
  const args: any = { spanId: spanTarget(c) };
  if (chance(0.6)) args.at = edge(timeNear(c));
  s.op = "heartbeat"; s.args = args;
  return s;
}
function genCascade(c: Ctx, s: Step): Step {
  s.op = "cascadeClose";
  s.args = { runId: runTarget(c), outcome: pick(OUTCOMES), reason: wpick([[5, pick(["parent cancelled", "budget exhausted", "user abort"])], [1, ""]]) };
  return s;
}
function orderedOk(rows: any[], keyf: (r: any) => any): boolean {
  for (let i = 1; i < rows.length; i++) if (!(keyf(rows[i - 1]) < keyf(rows[i]))) return false;
  return true;
}
function genSweepOwn(c: Ctx, s: Step): Step | null {
  const open = dbAll(c, "SELECT DISTINCT run_id FROM activity_spans WHERE outcome IS NULL AND origin = 'session'");
  if (!orderedOk(open, (r) => r.run_id)) { c.skipped.sweepOwnOrder = (c.skipped.sweepOwnOrder ?? 0) + 1; return null; }
  s.op = "sweepOwnOrphans"; s.args = {};
  return s;
}
function genSweepStale(c: Ctx, s: Step): Step | null {
  const args: any = { staleAfterMs: edge(wpick([[3, pick([30000, 300000, 3600000])], [2, ri(0, 20000)], [1, 0], [0.5, -ri(1, 100000)], [0.5, ri(1, 100) * 86_400_000]])) };
  if (chance(0.4)) args.now = edge(timeNear(c));
  const writer = s.writer ?? c.defWriter;
  const now = args.now ?? (s.clock ?? c.clock);
  const roots = dbAll(c, `SELECT span_id, run_id, started_at FROM activity_spans
           WHERE outcome IS NULL AND parent_span_id IS NULL
             AND writer != ? AND COALESCE(last_heartbeat_at, started_at) < ?`, writer, now - args.staleAfterMs);
  if (!orderedOk(roots, (r) => r.started_at)) { c.skipped.sweepStaleOrder = (c.skipped.sweepStaleOrder ?? 0) + 1; return null; }
  s.op = "sweepStale"; s.args = args;
  return s;
}
function genFindStuck(c: Ctx, s: Step): Step | null {
  const args: any = { thresholdMs: wpick([[3, pick([0, 60000, 3600000])], [2, ri(0, 100000)], [0.5, -ri(1, 10000)]]) };
  if (chance(0.5)) args.now = timeNear(c);
  const now = args.now ?? (s.clock ?? c.clock);
  const rows = dbAll(c, "SELECT started_at FROM activity_spans WHERE outcome IS NULL AND parent_span_id IS NULL AND started_at < ?", now - args.thresholdMs);
  if (!orderedOk(rows, (r) => r.started_at)) { c.skipped.findStuckOrder = (c.skipped.findStuckOrder ?? 0) + 1; return null; }
  s.op = "findStuck"; s.args = args;
  return s;
}
function cursorArg(c: Ctx): number {
  const hi = (dbGet(c, "SELECT COALESCE(MAX(change_id),0) AS hi FROM activity_changes") as any).hi;
  const seqHi = (dbGet(c, "SELECT seq FROM sqlite_sequence WHERE name = 'activity_changes'") as any)?.seq ?? 0;
  return wpick<() => number>([[3, () => 0], [5, () => ri(0, Math.max(hi, seqHi))], [1, () => hi], [1, () => seqHi + ri(0, 3)], [0.5, () => -ri(1, 5)], [0.3, () => 9007199254740991]])();
}
function limitArg(): number | undefined {
  return wpick<() => number | undefined>([[3, () => undefined], [4, () => ri(1, 12)], [1, () => 0], [1, () => -ri(1, 5)], [0.5, () => 10000], [0.3, () => ri(10001, 20000)]])();
}
function genChanges(c: Ctx, s: Step, op: string): Step {
  const args: any = { changeCursor: edge(cursorArg(c)) };
  let l = limitArg(); if (l !== undefined) l = edge(l); if (l !== undefined) args.limit = l;
  if (PROFILE === "huge") { args.limit = ri(0, 5); if (chance(0.7)) args.changeCursor = Math.max(0, (dbGet(c, "SELECT COALESCE(MAX(change_id),0) AS hi FROM activity_changes") as any).hi - ri(0, 20)); }
  s.op = op; s.args = args;
  return s;
}
function genPrune(c: Ctx, s: Step): Step | null {
  const options: any = {
    digestFloorAt: wpick<() => number>([[3, () => c.clock - ri(0, 3_600_000)], [2, () => c.clock + ri(0, 86_400_000)], [1, () => 0], [1, () => -ri(1, 1e6)], [1, () => c.clock - ri(1, 30) * 86_400_000]])(),
    hardCeilingMs: wpick<() => number>([[3, () => pick([600000, 86_400_000, 7 * 86_400_000])], [2, () => ri(0, 3_600_000)], [1, () => 1e12], [0.5, () => -ri(1, 1e6)], [0.5, () => 0]])(),
  };
  if (chance(0.5)) options.now = edge(timeNear(c) + (chance(0.3) ? ri(0, 30) * 86_400_000 : 0));
  if (chance(0.6)) options.batch = edgeBatch(wpick<number>([[4, ri(1, 4)], [1, 0], [1, -1], [1, 50], [0.5, -ri(2, 10)]]));
  options.digestFloorAt = edge(options.digestFloorAt); options.hardCeilingMs = edge(options.hardCeilingMs);
  const now = options.now ?? (s.clock ?? c.clock);
  const floor = Math.max(options.digestFloorAt, 0); const ceiling = now - options.hardCeilingMs;
  const cands = dbAll(c, `SELECT run_id, ended_at AS ended FROM activity_run_rollups r
             WHERE detail_pruned = 0 AND ended_at IS NOT NULL
               AND (ended_at < ? OR ended_at < ?)
               AND NOT EXISTS (SELECT 1 FROM activity_spans s WHERE s.run_id = r.run_id AND s.outcome IS NULL)`, floor, ceiling);
  for (let i = 1; i < cands.length; i++) if (cands[i - 1].ended > cands[i].ended) { c.skipped.pruneOrder = (c.skipped.pruneOrder ?? 0) + 1; return null; }
  const b = options.batch ?? 50;
  if (b > 0 && b < cands.length && cands[b - 1].ended === cands[b].ended) { c.skipped.pruneTie = (c.skipped.pruneTie ?? 0) + 1; return null; }
  s.op = "prune"; s.args = { options };
  return s;
}

function genStep(c: Ctx): Step | null {
  const s: Step = {} as Step;
  const clk = nextClock(c);
  if (clk !== undefined) s.clock = clk;
  const w = pickWriter(c);
  if (w !== undefined) s.writer = w;
  const op = PROFILE === "huge" ? wpick<string>([
    [10, "startSpan"], [9, "endSpan"], [4, "rollupRun"], [c.steps.length > 20000 ? 0.05 : 0, "prune"], [0.02, "sweepStale"],
    [0.1, "changesSince"], [0.02, "terminalRootChangesSince"], [0.1, "readRollup"], [0.1, "latestChangeCursor"], [1, "appendEvent"],
    [0.5, "getSpan"], [0.3, "runHighWaterSeq"], [0.3, "patchSpan"], [0.3, "heartbeat"], [0.05, "cascadeClose"],
  ]) : PROFILE === "bulk" ? wpick<string>([
    [10, "startSpan"], [10, "endSpan"], [8, "rollupRun"], [c.steps.length > 500 ? 0.4 : 0, "prune"], [0.3, "sweepStale"],
    [0.3, "changesSince"], [0.3, "terminalRootChangesSince"], [0.3, "readRollup"], [0.3, "latestChangeCursor"], [0.5, "appendEvent"],
  ]) : PROFILE === "manyRuns" ? wpick<string>([
    [20, "startSpan"], [14, "endSpan"], [2, "appendEvent"], [8, "rollupRun"], [3, "cascadeClose"], [1, "sweepOwnOrphans"],
    [2, "sweepStale"], [3, "prune"], [1, "readRollup"], [1, "changesSince"], [1, "terminalRootChangesSince"], [1, "latestChangeCursor"],
    [0.5, "findStuck"], [0.5, "openRootSpans"], [0.5, "snapshotRun"], [0.5, "runHighWaterSeq"], [1, "heartbeat"],
  ]) : wpick<string>([
    [16, "startSpan"], [10, "endSpan"], [5, "patchSpan"], [12, "appendEvent"], [4, "heartbeat"],
    [2, "cascadeClose"], [1.2, "sweepOwnOrphans"], [2.5, "sweepStale"], [1.5, "findStuck"],
    [4, "changesSince"], [2.5, "terminalRootChangesSince"], [1, "latestChangeCursor"], [2, "snapshotRun"],
    [1.5, "runHighWaterSeq"], [2, "getSpan"], [1.5, "openRootSpans"], [3, "rollupRun"], [2, "prune"], [3, "readRollup"],
  ]);
  // the clock for tie checks: generators read s.clock ?? c.clock
  const cc = c.clock; if (s.clock !== undefined) c.clock = s.clock;
  let r: Step | null;
  switch (op) {
    case "startSpan": r = genStartSpan(c, s); break;
    case "endSpan": r = genEnd(c, s); break;
    case "patchSpan": r = genPatch(c, s); break;
    case "appendEvent": r = genAppend(c, s); break;
    case "heartbeat": r = genHeartbeat(c, s); break;
    case "cascadeClose": r = genCascade(c, s); break;
    case "sweepOwnOrphans": r = genSweepOwn(c, s); break;
    case "sweepStale": r = genSweepStale(c, s); break;
    case "findStuck": r = genFindStuck(c, s); break;
    case "changesSince": case "terminalRootChangesSince": r = genChanges(c, s, op); break;
    case "latestChangeCursor": case "openRootSpans": s.op = op; s.args = {}; r = s; break;
    case "snapshotRun": case "runHighWaterSeq": case "rollupRun": case "readRollup":
      s.op = op; s.args = { runId: runTarget(c) }; r = s; break;
    case "getSpan": s.op = op; s.args = { spanId: spanTarget(c) }; r = s; break;
    case "prune": r = genPrune(c, s); break;
    default: throw new Error(op);
  }
  c.clock = cc;
  if (!r) return null;
  // put keys in fixture order
  const o: Step = {} as Step;
  if (r.clock !== undefined) o.clock = r.clock;
  if (r.writer !== undefined) o.writer = r.writer;
  o.op = r.op; o.args = r.args;
  return o;
}

function generate(seed: number) {
  R = mulberry32(seed * 7919 + 17);
  PROFILE = KNOB.profile ?? pick(["default", "default", "manyRuns", "deep", "extreme", "bulk", "edgy", "edgy", "heavy", "heavy"]);
  const defWriter = pick(["w1", "srv", "pid:1:2"]);
  const clock0 = PROFILE === "extreme"
    ? wpick<number>([[2, 2 ** 53 - 1 - 1e12 + ri(0, 1e8)], [2, -1e15 + ri(0, 1e8)], [1, -ri(0, 100000)], [1, 0]])
    : wpick<number>([[8, 1_700_000_000_000 + ri(0, 1e8)], [1, 0], [1, ri(1000, 100000)]]);
  const setup: any = { writer: defWriter, clock: clock0 };
  const h = new RefHarness(setup);
  const c: Ctx = { h, steps: [], clock: clock0, runs: [], runCounter: 0, spanIds: [], writers: ["w2", "w3", "cronw"], defWriter, skipped: {} };
  const n = PROFILE === "huge" ? ri(45000, 60000) : PROFILE === "heavy" ? ri(300, 600) : PROFILE === "bulk" ? ri(600, 900) : PROFILE === "manyRuns" ? ri(300, 700) : PROFILE === "deep" ? ri(100, 400) : ri(20, 160);
  let guard = 0;
  while (c.steps.length < n && guard++ < n * 10) {
    const st = genStep(c);
    if (!st) continue;
    const rec = h.perform(st);
    if (rec.clock !== undefined) c.clock = rec.clock;
    if (rec.expectError && rec.expectError !== "constraint") throw new Error(`seed ${seed}: unexpected error ${rec.expectError} in ${JSON.stringify(st)}`);
    c.steps.push(rec);
  }
  const name = `fuzz-${String(seed).padStart(5, "0")}`;
  return { fx: { name, store: "activity", description: `differential fuzz scenario (seed ${seed}, profile ${PROFILE}), tools/reference-diff/activity/gen.ts`, setup, steps: c.steps }, skipped: c.skipped };
}

if (import.meta.main) {
  const [out, first, count] = [process.argv[2]!, Number(process.argv[3]), Number(process.argv[4])];
  if (!out || !Number.isSafeInteger(first) || !Number.isSafeInteger(count)) {
    console.error("usage: bun gen.ts OUTDIR FIRST_SEED COUNT");
    process.exit(2);
  }
  mkdirSync(`${out}/activity`, { recursive: true });
  const t0 = performance.now();
  let steps = 0; const ops: Record<string, number> = {}; const skipped: Record<string, number> = {};
  for (let seed = first; seed < first + count; seed++) {
    const { fx, skipped: sk } = generate(seed);
    for (const s of fx.steps) { ops[s.op] = (ops[s.op] ?? 0) + 1; steps++; }
    for (const [k, v] of Object.entries(sk)) skipped[k] = (skipped[k] ?? 0) + v;
    writeFileSync(`${out}/activity/${fx.name}.json`, fixtureToText(fx));
  }
  console.log(`activity: ${count} scenarios, ${steps} steps recorded in ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  console.log(JSON.stringify({ ops, skippedForTies: skipped }));
}
