// Why this exists: flightlog's OTLP ingest must work with the real OpenTelemetry JavaScript SDK
// and its stock OTLP/HTTP exporter (which sends OTLP/JSON), not only with hand-built requests.
// The Rust test `crates/flightlog-server/tests/api/otlp_clients.rs` runs this script against a
// real server and reads the run back through the API.
//
// It sends the same agent-shaped trace as ../python/send_trace.py (GenAI semantic conventions):
//
//   invoke_agent travel-agent                      (root, gen_ai.operation.name=invoke_agent)
//   ├── chat gpt-4o-mini                           (model, usage, a custom event)
//   ├── execute_tool get_weather                   (tool, succeeds)
//   ├── execute_tool search_flights                (tool, status ERROR + an exception event)
//   └── chat gpt-4o-mini                           (model, usage)
//
// and prints ONE JSON line on stdout: the trace id and span ids (lower-case hex), and whether
// every export call succeeded. Exit status: 0 when every export succeeded, 3 when one failed,
// 2 for bad arguments.
//
//   node send_trace.mjs --endpoint http://127.0.0.1:4318/v1/traces [--token T]

import { parseArgs } from 'node:util';

import { context, trace, SpanKind, SpanStatusCode } from '@opentelemetry/api';
import { ExportResultCode } from '@opentelemetry/core';
import { OTLPTraceExporter } from '@opentelemetry/exporter-trace-otlp-http';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { BatchSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { NodeTracerProvider } from '@opentelemetry/sdk-trace-node';

const MODEL = 'gpt-4o-mini';
const ERROR_MESSAGE = 'search_flights failed: upstream fare index unavailable';

function parseArguments() {
  try {
    const { values } = parseArgs({
      options: {
        endpoint: { type: 'string' },
        token: { type: 'string' },
        'service-name': { type: 'string', default: 'flightlog-js-client' },
        'timeout-ms': { type: 'string', default: '5000' },
      },
      strict: true,
    });
    if (!values.endpoint) {
      throw new Error('--endpoint URL is required');
    }
    return values;
  } catch (error) {
    process.stderr.write(`send_trace.mjs: ${error.message}\n`);
    process.exit(2);
  }
}

/** Delegates to the real exporter and counts failed export calls (a batch processor swallows
 * export results, so this is how the script learns about a refusal). */
class RecordingExporter {
  constructor(inner) {
    this.inner = inner;
    this.calls = 0;
    this.failures = 0;
  }

  export(spans, resultCallback) {
    this.calls += 1;
    this.inner.export(spans, (result) => {
      if (result.code !== ExportResultCode.SUCCESS) {
        this.failures += 1;
        process.stderr.write(`export failed: ${result.error ?? 'unknown error'}\n`);
      }
      resultCallback(result);
    });
  }

  shutdown() {
    return this.inner.shutdown();
  }

  forceFlush() {
    return this.inner.forceFlush ? this.inner.forceFlush() : Promise.resolve();
  }
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

async function send(tracer) {
  const spans = {};
  const agent = tracer.startSpan('invoke_agent travel-agent', {
    kind: SpanKind.INTERNAL,
    attributes: {
      'gen_ai.operation.name': 'invoke_agent',
      'gen_ai.agent.name': 'travel-agent',
      'gen_ai.agent.id': 'agent-001',
      'gen_ai.provider.name': 'openai',
      'gen_ai.conversation.id': 'conv-js-1',
    },
  });
  spans.agent = agent.spanContext().spanId;
  const inAgent = trace.setSpan(context.active(), agent);

  const chat1 = tracer.startSpan(
    `chat ${MODEL}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'gen_ai.operation.name': 'chat',
        'gen_ai.provider.name': 'openai',
        'gen_ai.request.model': MODEL,
        'gen_ai.response.model': MODEL,
        'gen_ai.usage.input_tokens': 1200,
        'gen_ai.usage.output_tokens': 80,
        'gen_ai.response.finish_reasons': ['tool_calls'],
      },
    },
    inAgent,
  );
  chat1.addEvent('flightlog.test.checkpoint', {
    step: 1,
    note: 'planning the trip',
    cached: false,
  });
  spans.chat1 = chat1.spanContext().spanId;
  await sleep(2);
  chat1.end();

  const toolOk = tracer.startSpan(
    'execute_tool get_weather',
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': 'get_weather',
        'gen_ai.tool.call.id': 'call-1',
      },
    },
    inAgent,
  );
  spans.toolOk = toolOk.spanContext().spanId;
  await sleep(2);
  toolOk.end();

  const failing = tracer.startSpan(
    'execute_tool search_flights',
    {
      kind: SpanKind.INTERNAL,
      attributes: {
        'gen_ai.operation.name': 'execute_tool',
        'gen_ai.tool.name': 'search_flights',
        'gen_ai.tool.call.id': 'call-2',
      },
    },
    inAgent,
  );
  spans.toolError = failing.spanContext().spanId;
  try {
    const error = new Error('upstream fare index unavailable');
    error.name = 'ConnectionError';
    throw error;
  } catch (error) {
    failing.recordException(error);
    failing.setStatus({ code: SpanStatusCode.ERROR, message: ERROR_MESSAGE });
  }
  failing.end();

  const chat2 = tracer.startSpan(
    `chat ${MODEL}`,
    {
      kind: SpanKind.CLIENT,
      attributes: {
        'gen_ai.operation.name': 'chat',
        'gen_ai.provider.name': 'openai',
        'gen_ai.request.model': MODEL,
        'gen_ai.response.model': MODEL,
        'gen_ai.usage.input_tokens': 1500,
        'gen_ai.usage.output_tokens': 120,
        'gen_ai.response.finish_reasons': ['stop'],
      },
    },
    inAgent,
  );
  spans.chat2 = chat2.spanContext().spanId;
  await sleep(2);
  chat2.end();

  agent.end();
  return { traceId: agent.spanContext().traceId, spans };
}

async function main() {
  const args = parseArguments();
  const timeoutMillis = Number.parseInt(args['timeout-ms'], 10);
  const headers = {};
  if (args.token !== undefined) {
    headers.Authorization = `Bearer ${args.token}`;
  }
  const exporter = new RecordingExporter(
    new OTLPTraceExporter({ url: args.endpoint, headers, timeoutMillis }),
  );
  const provider = new NodeTracerProvider({
    resource: resourceFromAttributes({ 'service.name': args['service-name'] }),
    spanProcessors: [new BatchSpanProcessor(exporter)],
  });
  const tracer = provider.getTracer('flightlog-otlp-client-test', '0.1.0');

  const { traceId, spans } = await send(tracer);
  let flushed = true;
  try {
    await provider.forceFlush();
    await provider.shutdown();
  } catch (error) {
    flushed = false;
    process.stderr.write(`flush failed: ${error}\n`);
  }

  const ok = flushed && exporter.calls > 0 && exporter.failures === 0;
  process.stdout.write(
    `${JSON.stringify({
      client: 'js-http-json',
      traceId,
      spans,
      exportCalls: exporter.calls,
      exportFailures: exporter.failures,
      ok,
    })}\n`,
  );
  process.exitCode = ok ? 0 : 3;
}

await main();
