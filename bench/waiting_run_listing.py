"""Cost of listing a run that waits for its root: one OTLP trace of N spans whose root never
came (every span names a parent that is not stored), posted as OTLP/JSON in bodies of 5,000;
then `GET /v1/activity/runs` seven times, each timed in ms. Such a run's entry sums its model
spans' usage, so the page reads every span's id, parent, kind and usage.

    flightlog serve --db waiting.db --addr 127.0.0.1:19734 --grpc-addr off &
    python3 bench/waiting_run_listing.py 19734 50000
"""
import json, sys, time, urllib.request

port = int(sys.argv[1])
count = int(sys.argv[2]) if len(sys.argv) > 2 else 50000
base = f"http://127.0.0.1:{port}"
trace = "ab" * 16
start_ns = 1_700_000_000_000_000_000


def attribute(key, value):
    kind = "intValue" if isinstance(value, int) else "stringValue"
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


for first in range(0, count, 5000):
    spans = [
        {
            "traceId": trace,
            "spanId": f"{n + 1:016x}",
            "parentSpanId": "f" * 16,
            "name": f"chat {n}",
            "startTimeUnixNano": str(start_ns + n * 1_000_000),
            "endTimeUnixNano": str(start_ns + n * 1_000_000 + 500_000),
            "attributes": [
                attribute("gen_ai.operation.name", "chat"),
                attribute("gen_ai.usage.input_tokens", 10),
                attribute("gen_ai.usage.output_tokens", 2),
            ],
        }
        for n in range(first, min(count, first + 5000))
    ]
    body = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": spans}]}]}).encode()
    request = urllib.request.Request(
        f"{base}/v1/traces", data=body, headers={"content-type": "application/json"}
    )
    urllib.request.urlopen(request).read()

times = []
for _ in range(7):
    began = time.perf_counter()
    page = json.loads(urllib.request.urlopen(f"{base}/v1/activity/runs").read())
    times.append(round((time.perf_counter() - began) * 1000, 1))
run = page["runs"][0]
print(f"{count} spans waiting for their root; list ms: {times}; spanCount {run['spanCount']}, "
      f"inputTokens {run['inputTokens']}, awaitingRoot {run['awaitingRoot']}")
