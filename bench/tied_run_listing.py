"""Cost of a page of `GET /v1/activity/runs` when many runs share one start (a test suite on
`--manual-clock` records every run at the same instant): N one-span OTLP traces, all started
at the same nanosecond, posted as OTLP/JSON in bodies of 5,000; then the first page (default
limit, and limit 50, and `state=ended`) five times each and three deeper pages, each timed in ms.
The order breaks ties by run id, which no index holds, so a page reads every tied run's id.

    flightlog serve --db tied.db --addr 127.0.0.1:19735 --grpc-addr off &
    python3 bench/tied_run_listing.py 19735 100000
"""
import json, sys, time, urllib.request

port = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 100000
base = f"http://127.0.0.1:{port}"
start_ns = 1_700_000_000_000_000_000

for first in range(0, count, 5000):
    spans = [
        {
            "traceId": f"{n + 1:032x}",
            "spanId": f"{n + 1:016x}",
            "name": f"agent {n}",
            "startTimeUnixNano": str(start_ns),
            "endTimeUnixNano": str(start_ns + 1_000_000),
            "attributes": [
                {"key": "gen_ai.operation.name", "value": {"stringValue": "invoke_agent"}}
            ],
        }
        for n in range(first, min(count, first + 5000))
    ]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    request = urllib.request.Request(
        f"{base}/v1/traces", data=body, headers={"content-type": "application/json"}
    )
    urllib.request.urlopen(request).read()


def page(query):
    began = time.perf_counter()
    body = json.loads(urllib.request.urlopen(f"{base}/v1/activity/runs{query}").read())
    return round((time.perf_counter() - began) * 1000, 1), body


for query in ["", "?limit=50", "?state=ended&limit=50"]:
    print(f"{count} tied runs, page {query or '(default)'} ms: {[page(query)[0] for _ in range(5)]}")
_, body = page("?limit=50")
deeper = []
for _ in range(3):
    took, body = page(f"?limit=50&before={body['next']}")
    deeper.append(took)
print(f"{count} tied runs, pages 2-4 (limit 50) ms: {deeper}")
