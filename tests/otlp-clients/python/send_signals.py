# Why this exists: an agent set up with the OpenTelemetry SDK's defaults (or OpenLLMetry) exports
# its metrics and logs to the same endpoint as its traces. flightlog keeps traces only, but it
# must answer those exports so the SDK reports no failure: the Rust test
# `crates/flightlog-server/tests/api/otlp_clients.rs` runs this script against a real server.
#
# It records a counter, a histogram and two log records with the stock SDK (MeterProvider with a
# PeriodicExportingMetricReader, LoggerProvider with a BatchLogRecordProcessor) and the stock
# OTLP exporters, flushes both, and prints ONE JSON line on stdout: how many export calls each
# exporter made, how many failed, and every warning or error the SDK logged. Exit status: 0 when
# every export succeeded and the SDK logged no warning, 3 otherwise, 2 for bad arguments.
#
#   python send_signals.py --protocol http --endpoint http://127.0.0.1:4318
#   python send_signals.py --protocol grpc --endpoint http://127.0.0.1:4317

import argparse
import json
import logging
import sys


class Captured(logging.Handler):
    """Every WARNING or worse the SDK and its exporters log."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.lines = []

    def emit(self, record):
        self.lines.append(f"{record.name}: {record.getMessage()}")


def recording(exporter, results):
    """Make `exporter` note the result of each export call in `results`."""
    inner = exporter.export

    def export(*args, **kwargs):
        try:
            result = inner(*args, **kwargs)
        except Exception as error:  # pylint: disable=broad-except
            results.append(f"raised {type(error).__name__}: {error}")
            raise
        results.append(result.name)
        return result

    exporter.export = export
    return exporter


def exporters(args):
    if args.protocol == "http":
        from opentelemetry.exporter.otlp.proto.http import Compression
        from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

        base = args.endpoint.rstrip("/")
        return (
            OTLPMetricExporter(endpoint=f"{base}/v1/metrics", compression=Compression.Gzip),
            OTLPLogExporter(endpoint=f"{base}/v1/logs", compression=Compression.Gzip),
        )
    from opentelemetry.exporter.otlp.proto.grpc._log_exporter import OTLPLogExporter
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    return (
        OTLPMetricExporter(endpoint=args.endpoint, insecure=True),
        OTLPLogExporter(endpoint=args.endpoint, insecure=True),
    )


def main():
    parser = argparse.ArgumentParser(description="Export OTLP metrics and logs once.")
    parser.add_argument("--protocol", choices=["http", "grpc"], required=True)
    parser.add_argument("--endpoint", required=True)
    args = parser.parse_args()

    captured = Captured()
    logging.getLogger("opentelemetry").addHandler(captured)

    from opentelemetry.sdk._logs import LoggerProvider, LoggingHandler
    from opentelemetry.sdk._logs.export import BatchLogRecordProcessor
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.resources import Resource

    resource = Resource.create({"service.name": "flightlog-signals-test"})
    metric_results, log_results = [], []
    metric_exporter, log_exporter = exporters(args)
    recording(metric_exporter, metric_results)
    recording(log_exporter, log_results)

    reader = PeriodicExportingMetricReader(metric_exporter, export_interval_millis=60_000)
    meters = MeterProvider(resource=resource, metric_readers=[reader])
    meter = meters.get_meter("agent")
    tokens = meter.create_histogram("gen_ai.client.token.usage", unit="{token}")
    calls = meter.create_counter("agent.tool.calls")
    tokens.record(1200, {"gen_ai.token.type": "input"})
    tokens.record(80, {"gen_ai.token.type": "output"})
    calls.add(2, {"gen_ai.tool.name": "get_weather"})

    loggers = LoggerProvider(resource=resource)
    loggers.add_log_record_processor(BatchLogRecordProcessor(log_exporter))
    agent_log = logging.getLogger("agent")
    agent_log.propagate = False
    agent_log.setLevel(logging.INFO)
    agent_log.addHandler(LoggingHandler(level=logging.INFO, logger_provider=loggers))
    agent_log.info("planning the trip")
    agent_log.warning("the fare index is slow")

    flushed = meters.force_flush(10_000) and loggers.force_flush(10_000)
    meters.shutdown()
    loggers.shutdown()

    failures = [r for r in metric_results + log_results if r != "SUCCESS"]
    ok = bool(flushed) and bool(metric_results) and bool(log_results) and not failures
    ok = ok and not captured.lines
    print(
        json.dumps(
            {
                "ok": ok,
                "metricExports": metric_results,
                "logExports": log_results,
                "warnings": captured.lines,
            }
        )
    )
    return 0 if ok else 3


if __name__ == "__main__":
    sys.exit(main())
