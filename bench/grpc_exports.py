"""OTLP ingest over gRPC against OTLP/HTTP protobuf, same bodies, same server: is the gRPC
listener (tonic, HTTP/2, the per-message size check) as fast as the HTTP one?

Builds BODIES export requests of 500 agent-shaped spans (traces of 10: an invoke_agent root,
5 chat spans with usage, 4 execute_tool spans, unique ids) with the Python opentelemetry-proto
classes, then sends them over CONNECTIONS gRPC channels (or HTTP keep-alive connections) and
reports spans/s until the last answer and until the last body's last span is queryable, and
the server's CPU per span. Run it with the venv tests/otlp-clients/install.sh makes (it has
grpcio and opentelemetry-proto):

    flightlog serve --db g.db --addr 127.0.0.1:19740 --grpc-addr 127.0.0.1:19741 & echo $! > pid
    target/otlp-clients/venv/bin/python bench/grpc_exports.py 19740 19741 "$(cat pid)" grpc
    (a fresh server again) ... http

Arguments: HTTP_PORT GRPC_PORT SERVER_PID grpc|http [BODIES=400] [CONNECTIONS=4]
"""
import http.client
import os
import sys
import threading
import time
import urllib.request

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.resource.v1 import resource_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

http_port, grpc_port, pid, transport = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
bodies_count = int(sys.argv[5]) if len(sys.argv) > 5 else 400
connections = int(sys.argv[6]) if len(sys.argv) > 6 else 4
SPANS_PER_BODY = 500
TAG = os.urandom(4)


def text(key, value):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(string_value=value))


def integer(key, value):
    return common_pb2.KeyValue(key=key, value=common_pb2.AnyValue(int_value=value))


def body(b):
    spans = []
    base = 1_700_000_000_000_000_000 + b * 10_000_000_000
    for t in range(SPANS_PER_BODY // 10):
        trace_id = TAG + b.to_bytes(4, "big") + t.to_bytes(8, "big")
        root = TAG[:2] + b.to_bytes(2, "big") + t.to_bytes(2, "big") + b"\x00\x00"
        start = base + t * 1_000_000
        for position in range(10):
            span_id = root[:6] + bytes([0xC0, position]) if position else root
            span = trace_pb2.Span(
                trace_id=trace_id,
                span_id=span_id,
                parent_span_id=b"" if position == 0 else root,
                start_time_unix_nano=start + position * 200_000_000,
                end_time_unix_nano=start + position * 200_000_000 + 180_000_000,
            )
            if position == 0:
                span.name = "invoke_agent coder"
                span.attributes.extend([text("gen_ai.operation.name", "invoke_agent"),
                                        text("gen_ai.agent.name", "coder")])
            elif position % 2 == 1:
                span.name = "chat claude-sonnet-4-20250514"
                span.kind = 3
                span.attributes.extend([
                    text("gen_ai.operation.name", "chat"),
                    text("gen_ai.request.model", "claude-sonnet-4-20250514"),
                    integer("gen_ai.usage.input_tokens", 1200 + position),
                    integer("gen_ai.usage.output_tokens", 80 + position),
                ])
            else:
                span.name = "execute_tool bash"
                span.attributes.extend([text("gen_ai.operation.name", "execute_tool"),
                                        text("gen_ai.tool.name", "bash")])
                span.events.append(trace_pb2.Span.Event(
                    time_unix_nano=start + position * 200_000_000 + 150_000_000,
                    name="tool.output",
                    attributes=[text("output", f"test result: ok. 41 passed; trace {t}")]))
            spans.append(span)
    request = trace_service_pb2.ExportTraceServiceRequest(resource_spans=[
        trace_pb2.ResourceSpans(
            resource=resource_pb2.Resource(attributes=[text("service.name", "coder-agent")]),
            scope_spans=[trace_pb2.ScopeSpans(
                scope=common_pb2.InstrumentationScope(name="bench"), spans=spans)])])
    return request.SerializeToString(), spans[-1].span_id.hex()


def cpu_seconds():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


encoded = [body(b) for b in range(bodies_count)]
print(f"{bodies_count} bodies of {SPANS_PER_BODY} spans, {sum(len(e) for e, _ in encoded) // bodies_count // 1024} KiB each, over {transport}, {connections} connections")
next_body = iter(range(bodies_count))
lock = threading.Lock()
errors = []


def take():
    with lock:
        return next(next_body, None)


def grpc_sender():
    channel = grpc.insecure_channel(f"127.0.0.1:{grpc_port}")
    export = channel.unary_unary(
        "/opentelemetry.proto.collector.trace.v1.TraceService/Export",
        request_serializer=lambda raw: raw,
        response_deserializer=trace_service_pb2.ExportTraceServiceResponse.FromString)
    while (index := take()) is not None:
        answer = export(encoded[index][0], timeout=60)
        if answer.HasField("partial_success") and answer.partial_success.rejected_spans:
            errors.append(answer.partial_success.error_message)
    channel.close()


def http_sender():
    connection = http.client.HTTPConnection("127.0.0.1", http_port)
    while (index := take()) is not None:
        connection.request("POST", "/v1/traces", body=encoded[index][0],
                           headers={"Content-Type": "application/x-protobuf"})
        answer = connection.getresponse()
        read = trace_service_pb2.ExportTraceServiceResponse.FromString(answer.read())
        if answer.status != 200:
            errors.append(answer.status)
        elif read.HasField("partial_success") and read.partial_success.rejected_spans:
            errors.append(read.partial_success.error_message)
    connection.close()


cpu_before = cpu_seconds()
started = time.monotonic()
threads = [threading.Thread(target=grpc_sender if transport == "grpc" else http_sender)
           for _ in range(connections)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
accepted = time.monotonic() - started
last = encoded[-1][1]
while True:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/activity/spans/{last}").read()
        break
    except Exception:
        time.sleep(0.005)
queryable = time.monotonic() - started
cpu = cpu_seconds() - cpu_before
spans = bodies_count * SPANS_PER_BODY
missing = 0
for _, span_id in encoded[:: max(1, bodies_count // 40)]:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v1/activity/spans/{span_id}").read()
    except Exception:
        missing += 1
print(f"accepted {spans / accepted:,.0f} spans/s, queryable {spans / queryable:,.0f} spans/s "
      f"({queryable:.2f} s), server CPU {cpu / spans * 1e6:.1f} us a span, "
      f"errors {len(errors)}, sampled bodies missing {missing}")
if errors:
    print("first error:", errors[0])
