// Why: the command line both recorders share (activity/record.ts, journal/record.ts): the
// self-check that re-records the stock fixtures from their own steps and compares, and the way
// to turn hand-written scenarios (expectations absent or ignored) into fixtures.
//   bun <store>/record.ts --check FILE.json...     re-record fixtures, compare with their own expectations
//   bun <store>/record.ts --out DIR FILE.json...   record scenarios into DIR/<name>.json
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";

// FORMAT.md §2.2: key order irrelevant, arrays ordered, numbers by value.
function deepEqual(a: any, b: any): boolean {
  if (Array.isArray(a) || Array.isArray(b)) {
    return Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => deepEqual(x, b[i]));
  }
  if (a && b && typeof a === "object" && typeof b === "object") {
    const ka = Object.keys(a), kb = Object.keys(b);
    return ka.length === kb.length && ka.every((k) => Object.prototype.hasOwnProperty.call(b, k) && deepEqual(a[k], b[k]));
  }
  return a === b;
}

// `record` gets each scenario of `store` with its steps' expectations removed and returns the
// fixture the reference gives; `toText` writes one out. Exits 1 when the check found differences.
export async function recorderCli(
  store: string,
  record: (scenario: any) => any | Promise<any>,
  toText: (fixture: any) => string,
): Promise<void> {
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
    if (fx.store !== store) continue;
    fixtures++;
    const rec = await record({ ...fx, steps: fx.steps.map(({ expect, expectError, ...s }: any) => s) });
    steps += rec.steps.length;
    if (out) writeFileSync(join(out, `${rec.name}.json`), toText(rec));
    if (!check) continue;
    fx.steps.forEach((s: any, i: number) => {
      const r = rec.steps[i]!;
      const same = s.expectError !== undefined
        ? r.expectError === s.expectError
        : r.expectError === undefined && deepEqual(s.expect, r.expect);
      if (!same) {
        differences++;
        console.log(`${file} step ${i} (${s.op}): fixture ${JSON.stringify(s.expectError ?? s.expect).slice(0, 300)}, reference ${JSON.stringify(r.expectError ?? r.expect).slice(0, 300)}`);
      }
    });
  }
  console.log(`${store}: ${fixtures} fixtures, ${steps} steps recorded${check ? `, ${differences} differences` : ""}`);
  if (differences) process.exit(1);
}
