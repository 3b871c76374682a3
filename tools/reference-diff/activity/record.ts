// Why: the recorder's self-check (run.sh runs it before anything else: the harness must give back
// every stock activity fixture exactly, or the fixtures it generates cannot be trusted), and the
// way to turn a hand-written scenario (setup + steps, results absent or ignored) into a fixture,
// e.g. to minimise a divergence the generator found.
//   bun record.ts --check FILE.json...     re-record fixtures, compare with their own expectations
//   bun record.ts --out DIR FILE.json...   record scenarios into DIR/<name>.json
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { fixtureToText, recordFixture } from "./harness.ts";

// FORMAT.md §2.2: key order irrelevant, arrays ordered, numbers by value.
function deepEq(a: any, b: any): boolean {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => deepEq(x, b[i]));
  }
  if (a && b && typeof a === "object" && typeof b === "object") {
    const ka = Object.keys(a), kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && deepEq(a[k], b[k]));
  }
  return a === b;
}

const argv = process.argv.slice(2);
const check = argv[0] === "--check";
const out = argv[0] === "--out" ? argv[1] : undefined;
if (!check && !out) {
  console.error("usage: bun record.ts --check FILE.json... | --out DIR FILE.json...");
  process.exit(2);
}
const files = argv.slice(check ? 1 : 2);
if (out) mkdirSync(out, { recursive: true });
let fixtures = 0, steps = 0, differences = 0;
for (const file of files) {
  const fx = JSON.parse(readFileSync(file, "utf8"));
  if (fx.store !== "activity") continue;
  fixtures++;
  const rec = recordFixture({ ...fx, steps: fx.steps.map(({ expect, expectError, ...s }: any) => s) });
  steps += rec.steps.length;
  if (out) writeFileSync(join(out, `${rec.name}.json`), fixtureToText(rec));
  if (!check) continue;
  fx.steps.forEach((s: any, i: number) => {
    const r = rec.steps[i]!;
    const same = "expectError" in s
      ? r.expectError === s.expectError
      : !("expectError" in r) && deepEq(s.expect, r.expect);
    if (!same) {
      differences++;
      console.log(`${file} step ${i} (${s.op}): fixture ${JSON.stringify(s.expectError ?? s.expect).slice(0, 300)}, reference ${JSON.stringify(r.expectError ?? r.expect).slice(0, 300)}`);
    }
  });
}
console.log(`activity: ${fixtures} fixtures, ${steps} steps recorded${check ? `, ${differences} differences` : ""}`);
if (differences) process.exit(1);
