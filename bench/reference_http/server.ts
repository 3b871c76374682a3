// Why: issue 4's single-op target (50,000 writes/s) was set against "the reference store served
// over HTTP by Bun on this machine class" (about 7,300 writes/s). The machine is a shared VM
// whose speed swings by half within minutes, so a flightlog figure alone cannot say whether a
// miss is flightlog's or the phase's. This is that reference server, so the two can be measured
// side by side, in alternating runs of the same load generator: the unmodified reference
// activity store (../../../shared/seeds/activity-store.ts) on a bun:sqlite file in WAL mode with
// synchronous=NORMAL (product.md's setting for the reference figures), behind Bun.serve, with
// the contract's paths, status codes and bodies for what `flightlog-loadgen http --phases
// single` sends (start, event, patch, end, rollup, and the cursor it reads around a phase).
//
// It takes the arguments the load generator gives `flightlog serve` (`serve --db PATH --addr
// HOST:PORT`, others ignored) and prints the same "listening on http://ADDR" line; run it
// through `flightlog-reference` beside this file, which finds Bun.
import { Database } from "bun:sqlite";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { createActivityStore } from "../../../shared/seeds/activity-store.ts";

const SCHEMA = readFileSync(join(import.meta.dir, "../../../shared/conformance/schema.sql"), "utf8");

function flag(name: string, fallback: string): string {
  const at = process.argv.indexOf(name);
  return at >= 0 && at + 1 < process.argv.length ? process.argv[at + 1] : fallback;
}

const dbPath = flag("--db", "flightlog-reference.db");
const [hostname, port] = (() => {
  const addr = flag("--addr", "127.0.0.1:4318");
  const colon = addr.lastIndexOf(":");
  return [addr.slice(0, colon), Number(addr.slice(colon + 1))];
})();
if (hostname !== "127.0.0.1") {
  console.error(`the reference server binds 127.0.0.1 only, not ${hostname}`);
  process.exit(2);
}

const db = new Database(dbPath, { create: true });
db.exec("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; PRAGMA busy_timeout = 5000;");
db.exec(SCHEMA);
const stores = new Map<string, ReturnType<typeof createActivityStore>>();
const defaultStore = createActivityStore(db, {});
function storeFor(request: Request) {
  const writer = request.headers.get("flightlog-writer");
  if (writer === null) return defaultStore;
  let store = stores.get(writer);
  if (!store) {
    store = createActivityStore(db, { writer });
    stores.set(writer, store);
  }
  return store;
}

function json(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), {
    status,
    headers: { "content-type": "application/json" },
  });
}
function error(status: number, code: string, message: string): Response {
  return json(status, { error: { code, message } });
}

const SPAN = /^\/v1\/activity\/spans\/([^/]+)(\/end|\/events)?$/;
const ROLLUP = /^\/v1\/activity\/runs\/([^/]+)\/rollup$/;

async function handle(request: Request): Promise<Response> {
  const path = new URL(request.url).pathname;
  const method = request.method;
  if (method === "GET" && path === "/healthz") return json(200, { status: "ok" });
  if (method === "GET" && path === "/v1/activity/cursor") {
    return json(200, { changeCursor: defaultStore.latestChangeCursor() });
  }
  if (method === "POST" && path === "/v1/activity/spans") {
    return json(201, storeFor(request).startSpan(await request.json()));
  }
  const span = SPAN.exec(path);
  if (span) {
    const spanId = decodeURIComponent(span[1]);
    if (method === "POST" && span[2] === "/end") {
      return json(200, { ended: storeFor(request).endSpan(spanId, await request.json()) });
    }
    if (method === "POST" && span[2] === "/events") {
      const body = await request.json();
      const row = storeFor(request).appendEvent(spanId, body.eventType, body.payload, body.ts);
      return row === null ? error(404, "not_found", `no span with id "${spanId}"`) : json(201, row);
    }
    if (method === "PATCH" && span[2] === undefined) {
      return json(200, { patched: storeFor(request).patchSpan(spanId, await request.json()) });
    }
  }
  const rollup = ROLLUP.exec(path);
  if (rollup && method === "POST") {
    storeFor(request).rollupRun(decodeURIComponent(rollup[1]));
    return new Response(null, { status: 204 });
  }
  return error(404, "not_found", `no route for ${method} ${path}`);
}

const server = Bun.serve({
  hostname,
  port,
  async fetch(request) {
    try {
      return await handle(request);
    } catch (err) {
      const message = String(err);
      return message.includes("constraint")
        ? error(409, "conflict", message)
        : error(400, "invalid_request", message);
    }
  },
});
console.log(`flightlog reference server (Bun ${Bun.version}) listening on http://${hostname}:${server.port}`);
