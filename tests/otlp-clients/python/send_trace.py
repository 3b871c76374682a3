# Why this exists: flightlog's OTLP ingest must work with the real OpenTelemetry Python SDK and
# its stock exporters, not only with hand-built requests. The Rust test
# `crates/flightlog-server/tests/api/otlp_clients.rs` runs this script against a real server and
# reads the run back through the API.
#
# It sends one agent-shaped trace using the OpenTelemetry GenAI semantic conventions:
#
#   invoke_agent travel-agent                      (root, gen_ai.operation.name=invoke_agent)
#   ├── chat gpt-4o-mini                           (model, usage, a custom event)
#   ├── execute_tool get_weather                   (tool, succeeds)
#   ├── execute_tool search_flights                (tool, status ERROR + an exception event)
#   └── chat gpt-4o-mini                           (model, usage)
#
# and prints ONE JSON line on stdout: the trace id and span ids (lower-case hex), and whether
# every export call succeeded. Exit status: 0 when every export succeeded, 3 when an export failed
# (the exporter's own log goes to stderr), 2 for bad arguments.
#
#   python send_trace.py --protocol http --endpoint http://127.0.0.1:4318/v1/traces
#   python send_trace.py --protocol grpc --endpoint http://127.0.0.1:4317 [--token T]
#   python send_trace.py --protocol http --endpoint ... --basic-token T   (Basic, token as password)
#   python send_trace.py ... --root-still-running   (the root is never ended, so never exported:
#       an agent still running, or one whose process died, as flightlog sees it)
#   python send_trace.py ... --callee-service NAME   (get_weather calls a tool server, a second
#       service with its own provider and exporter, which continues the trace from the W3C
#       `traceparent` the call carries, as an instrumented HTTP server does: its spans
#       `invoke_agent weather-service` > `chat`, flagged as continuing a remote parent, are
#       exported as soon as they end, before the agent's, as they are in a real deployment)

import argparse
import base64
import json
import sys
import time

from opentelemetry import propagate, trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import SpanKind, Status, StatusCode

MODEL = "gpt-4o-mini"
ERROR_MESSAGE = "search_flights failed: upstream fare index unavailable"


class RecordingExporter(SpanExporter):
    """Delegates to the real exporter and remembers whether any export call failed (a batch
    processor swallows export results, so this is how the script learns about a refusal)."""

    def __init__(self, inner):
        self.inner = inner
        self.calls = 0
        self.failures = 0

    def export(self, spans):
        self.calls += 1
        try:
            result = self.inner.export(spans)
        except Exception as error:  # pylint: disable=broad-except
            # The HTTP exporter lets some transport errors (connection refused) escape.
            print(f"export raised {type(error).__name__}: {error}", file=sys.stderr)
            result = SpanExportResult.FAILURE
        if result != SpanExportResult.SUCCESS:
            self.failures += 1
        return result

    def shutdown(self):
        self.inner.shutdown()

    def force_flush(self, timeout_millis=30000):
        return self.inner.force_flush(timeout_millis)


def make_exporter(args):
    headers = {}
    if args.token is not None:
        # gRPC metadata keys must be lower case; HTTP header names are case-insensitive.
        headers["authorization"] = f"Bearer {args.token}"
    if args.basic_token is not None:
        credentials = base64.b64encode(f"flightlog-test:{args.basic_token}".encode()).decode()
        headers["authorization"] = f"Basic {credentials}"
    if args.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        compression = {
            "gzip": Compression.Gzip,
            "deflate": Compression.Deflate,
        }.get(args.compression, Compression.NoCompression)
        return OTLPSpanExporter(
            endpoint=args.endpoint,
            headers=headers,
            timeout=args.timeout,
            compression=compression,
        )
    from grpc import Compression as GrpcCompression
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    compression = GrpcCompression.Gzip if args.compression == "gzip" else GrpcCompression.NoCompression
    return OTLPSpanExporter(
        endpoint=args.endpoint,
        insecure=True,
        headers=headers,
        timeout=args.timeout,
        compression=compression,
    )


def hex_ids(span):
    context = span.get_span_context()
    return trace.format_trace_id(context.trace_id), trace.format_span_id(context.span_id)


def chat_attributes(input_tokens, output_tokens, finish_reason=None):
    """A `chat` model call's GenAI attributes, with its usage."""
    attributes = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": MODEL,
        "gen_ai.response.model": MODEL,
        "gen_ai.usage.input_tokens": input_tokens,
        "gen_ai.usage.output_tokens": output_tokens,
    }
    if finish_reason is not None:
        attributes["gen_ai.response.finish_reasons"] = [finish_reason]
    return attributes


def tool_server(provider, headers, ids):
    """The tool server's side of a call: continue the trace its request's headers carry, do its
    work (an agent with one model call), and export at once (the caller's spans are still
    running)."""
    tracer = provider.get_tracer("flightlog-otlp-client-test-tool-server", "0.1.0")
    with tracer.start_as_current_span(
        "invoke_agent weather-service",
        context=propagate.extract(headers),
        kind=SpanKind.SERVER,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "weather-service",
        },
    ) as entry:
        ids["callee"] = hex_ids(entry)[1]
        with tracer.start_as_current_span(
            f"chat {MODEL}",
            kind=SpanKind.CLIENT,
            attributes=chat_attributes(300, 30),
        ) as chat:
            ids["calleeChat"] = hex_ids(chat)[1]
            time.sleep(0.002)
    return provider.force_flush(10000)


def send(tracer, end_root=True, callee_provider=None):
    """Record the agent-shaped trace; returns the ids to print. Without `end_root` the root span
    is left running (an SDK exports a span only when it ends). With `callee_provider`,
    get_weather is a call to a tool server exporting through it."""
    ids = {}
    root = tracer.start_span(
        "invoke_agent travel-agent",
        kind=SpanKind.INTERNAL,
        attributes={
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "travel-agent",
            "gen_ai.agent.id": "agent-001",
            "gen_ai.provider.name": "openai",
            "gen_ai.conversation.id": "conv-python-1",
        },
    )
    with trace.use_span(root, end_on_exit=end_root) as agent:
        trace_id, ids["agent"] = hex_ids(agent)

        with tracer.start_as_current_span(
            f"chat {MODEL}",
            kind=SpanKind.CLIENT,
            attributes=chat_attributes(1200, 80, "tool_calls"),
        ) as chat:
            chat.add_event(
                "flightlog.test.checkpoint",
                attributes={"step": 1, "note": "planning the trip", "cached": False},
            )
            ids["chat1"] = hex_ids(chat)[1]
            time.sleep(0.002)

        with tracer.start_as_current_span(
            "execute_tool get_weather",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "get_weather",
                "gen_ai.tool.call.id": "call-1",
            },
        ) as tool:
            ids["toolOk"] = hex_ids(tool)[1]
            if callee_provider is not None:
                headers = {}
                propagate.inject(headers)
                ids["calleeFlushed"] = tool_server(callee_provider, headers, ids)
            time.sleep(0.002)

        with tracer.start_as_current_span(
            "execute_tool search_flights",
            kind=SpanKind.INTERNAL,
            attributes={
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": "search_flights",
                "gen_ai.tool.call.id": "call-2",
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as failing:
            ids["toolError"] = hex_ids(failing)[1]
            try:
                raise ConnectionError("upstream fare index unavailable")
            except ConnectionError as error:
                failing.record_exception(error)
                failing.set_status(Status(StatusCode.ERROR, ERROR_MESSAGE))

        with tracer.start_as_current_span(
            f"chat {MODEL}",
            kind=SpanKind.CLIENT,
            attributes=chat_attributes(1500, 120, "stop"),
        ) as chat:
            ids["chat2"] = hex_ids(chat)[1]
            time.sleep(0.002)
    return trace_id, ids


def main():
    parser = argparse.ArgumentParser(description="Send one agent-shaped OTLP trace.")
    parser.add_argument("--protocol", choices=["http", "grpc"], required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--token", help="sent as `authorization: Bearer <token>`")
    parser.add_argument("--basic-token", help="sent as the password of `authorization: Basic`")
    # deflate: OTLP/HTTP only (gRPC has gzip).
    parser.add_argument("--compression", choices=["none", "gzip", "deflate"], default="none")
    parser.add_argument("--service-name", default="flightlog-python-client")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per export call")
    parser.add_argument(
        "--callee-service",
        help="get_weather calls a tool server of this service name, which continues the trace",
    )
    parser.add_argument(
        "--root-still-running",
        action="store_true",
        help="never end the root span, so only its children are exported",
    )
    args = parser.parse_args()

    exporter = RecordingExporter(make_exporter(args))
    provider = TracerProvider(resource=Resource.create({"service.name": args.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    tracer = provider.get_tracer("flightlog-otlp-client-test", "0.1.0")
    callee_exporter, callee_provider = None, None
    if args.callee_service is not None:
        callee_exporter = RecordingExporter(make_exporter(args))
        callee_provider = TracerProvider(
            resource=Resource.create({"service.name": args.callee_service})
        )
        callee_provider.add_span_processor(BatchSpanProcessor(callee_exporter))

    trace_id, ids = send(
        tracer, end_root=not args.root_still_running, callee_provider=callee_provider
    )
    flushed = provider.force_flush(int(args.timeout * 1000) + 5000)
    provider.shutdown()

    ok = flushed and exporter.calls > 0 and exporter.failures == 0
    if callee_provider is not None:
        callee_provider.shutdown()
        ok = ok and ids.pop("calleeFlushed", False) and callee_exporter.failures == 0
    print(
        json.dumps(
            {
                "client": f"python-{args.protocol}",
                "traceId": trace_id,
                "spans": ids,
                "exportCalls": exporter.calls,
                "exportFailures": exporter.failures,
                "ok": ok,
            }
        ),
        flush=True,
    )
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
