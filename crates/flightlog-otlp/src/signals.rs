//! OTLP metrics and logs: read, counted and answered, never stored.
//!
//! flightlog records traces. But instrumentations export their other signals to the same
//! endpoint by default: OpenLLMetry's `Traceloop.init()` sends metrics to `/v1/metrics` every
//! minute unless told not to, and an SDK set up with `OTEL_EXPORTER_OTLP_ENDPOINT` sends logs
//! to `/v1/logs`. A 404 there made every such agent print an export error each minute, so
//! "point the exporter at flightlog" did not just work. These exports are now read (so a body
//! that is not OTLP is still a 400) and answered with success, and `partialSuccess` says how
//! many data points or log records were not kept, and why, as OTLP defines for data a receiver
//! does not accept; exporters do not retry such an answer. The server counts them in
//! `/metrics`, so an operator can see that something sends them.
//!
//! What the spans carry is kept: a run's token usage and cost come from its model spans, and
//! span events (the GenAI conventions' prompts and completions, when sent as span events) are
//! stored with their span.

use std::sync::Arc;

use opentelemetry_proto::tonic::collector::logs::v1::logs_service_server::{
    LogsService, LogsServiceServer,
};
use opentelemetry_proto::tonic::collector::logs::v1::{
    ExportLogsPartialSuccess, ExportLogsServiceRequest, ExportLogsServiceResponse,
};
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{
    MetricsService, MetricsServiceServer,
};
use opentelemetry_proto::tonic::collector::metrics::v1::{
    ExportMetricsPartialSuccess, ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::metrics::v1::metric::Data;
use prost::Message;
use serde_json::{json, Map, Value};
use tonic::codec::CompressionEncoding;
use tonic::{Request, Response, Status};

use crate::decode::{read_body, ExportSchema, OtlpEncoding};
use crate::error::OtlpError;
use crate::service::Authorize;

/// An OTLP signal flightlog reads but does not store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Signal {
    /// `/v1/metrics`, `MetricsService/Export`: counted in data points.
    Metrics,
    /// `/v1/logs`, `LogsService/Export`: counted in log records.
    Logs,
}

impl Signal {
    /// Both, in a fixed order.
    pub const ALL: [Signal; 2] = [Signal::Metrics, Signal::Logs];

    /// The signal's name (`metrics`, `logs`), a metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Metrics => "metrics",
            Signal::Logs => "logs",
        }
    }

    /// What `partialSuccess.errorMessage` says about `dropped` items.
    pub fn dropped_message(self, dropped: u64) -> String {
        match self {
            Signal::Metrics => format!(
                "flightlog stores traces, not metrics: {dropped} metric data point(s) were read \
                 and not kept (a run's token usage and cost come from its spans); to stop \
                 sending them, switch the metrics exporter off (OTEL_METRICS_EXPORTER=none, \
                 TRACELOOP_METRICS_ENABLED=false)"
            ),
            Signal::Logs => format!(
                "flightlog stores traces, not logs: {dropped} log record(s) were read and not \
                 kept (span events are kept with their spans); to stop sending them, switch \
                 the logs exporter off (OTEL_LOGS_EXPORTER=none)"
            ),
        }
    }
}

/// Decode an OTLP/HTTP export of `signal` (protobuf or OTLP/JSON, maybe gzip or deflate, within
/// `max_decompressed`) and count what it holds: data points or log records.
pub fn count_export(
    signal: Signal,
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decompressed: usize,
) -> Result<(u64, OtlpEncoding), OtlpError> {
    read_body(
        content_type,
        content_encoding,
        body,
        max_decompressed,
        match signal {
            Signal::Metrics => ExportSchema::Metrics,
            Signal::Logs => ExportSchema::Logs,
        },
        |body, encoding| match (signal, encoding) {
            (Signal::Metrics, OtlpEncoding::Protobuf) => ExportMetricsServiceRequest::decode(body)
                .map(|request| count_data_points(&request))
                .map_err(invalid_protobuf),
            (Signal::Logs, OtlpEncoding::Protobuf) => ExportLogsServiceRequest::decode(body)
                .map(|request| count_log_records(&request))
                .map_err(invalid_protobuf),
            (signal, OtlpEncoding::Json) => count_json(signal, body),
        },
    )
}

fn invalid_protobuf(error: prost::DecodeError) -> OtlpError {
    OtlpError::malformed(format!("invalid protobuf: {error}"))
}

/// The data points of every metric of a request.
pub fn count_data_points(request: &ExportMetricsServiceRequest) -> u64 {
    let points = request
        .resource_metrics
        .iter()
        .flat_map(|resource| &resource.scope_metrics)
        .flat_map(|scope| &scope.metrics)
        .map(|metric| match &metric.data {
            Some(Data::Gauge(gauge)) => gauge.data_points.len(),
            Some(Data::Sum(sum)) => sum.data_points.len(),
            Some(Data::Histogram(histogram)) => histogram.data_points.len(),
            Some(Data::ExponentialHistogram(histogram)) => histogram.data_points.len(),
            Some(Data::Summary(summary)) => summary.data_points.len(),
            None => 0,
        })
        .sum::<usize>();
    points as u64
}

/// The log records of a request.
pub fn count_log_records(request: &ExportLogsServiceRequest) -> u64 {
    let records = request
        .resource_logs
        .iter()
        .flat_map(|resource| &resource.scope_logs)
        .map(|scope| scope.log_records.len())
        .sum::<usize>();
    records as u64
}

/// Count an OTLP/JSON export without decoding what is not counted. Each level may be spelled in
/// lowerCamelCase or snake_case (as the Collector reads them, see `decode`); a level that is
/// not the JSON type OTLP gives it refuses the body, naming its path.
fn count_json(signal: Signal, body: &[u8]) -> Result<u64, OtlpError> {
    let value = crate::decode::parse_json_as_written(body)?;
    let root = as_object(&value, "$")?;
    let (resources, scopes, items) = match signal {
        Signal::Metrics => (
            ["resourceMetrics", "resource_metrics"],
            ["scopeMetrics", "scope_metrics"],
            ["metrics", "metrics"],
        ),
        Signal::Logs => (
            ["resourceLogs", "resource_logs"],
            ["scopeLogs", "scope_logs"],
            ["logRecords", "log_records"],
        ),
    };
    // A non-empty body without the signal's list is another signal's export, or a key in
    // another casing: refused as `/v1/traces` refuses one without `resourceSpans`, rather than
    // answered as an empty export.
    if !root.is_empty() && !resources.iter().any(|key| root.contains_key(*key)) {
        // The client's keys, each cut short: they are echoed in the answer.
        let keys: Vec<String> = root
            .keys()
            .take(5)
            .map(|key| key.chars().take(64).collect())
            .collect();
        let (message, lists) = match signal {
            Signal::Metrics => (
                "ExportMetricsServiceRequest",
                "resourceMetrics, scopeMetrics, metrics",
            ),
            Signal::Logs => (
                "ExportLogsServiceRequest",
                "resourceLogs, scopeLogs, logRecords",
            ),
        };
        return Err(OtlpError::malformed(format!(
            "not an {message}: no `{}` among its keys {keys:?} (OTLP/JSON keys are \
             lowerCamelCase: {lists})",
            resources[0]
        )));
    }
    let mut count = 0u64;
    for (r, resource) in array_member(root, resources, "$")?.iter().enumerate() {
        let path = format!("$.{}[{r}]", resources[0]);
        let resource = as_object(resource, &path)?;
        for (s, scope) in array_member(resource, scopes, &path)?.iter().enumerate() {
            let path = format!("{path}.{}[{s}]", scopes[0]);
            let scope = as_object(scope, &path)?;
            let listed = array_member(scope, items, &path)?;
            match signal {
                Signal::Logs => count += listed.len() as u64,
                Signal::Metrics => {
                    for (m, metric) in listed.iter().enumerate() {
                        let path = format!("{path}.metrics[{m}]");
                        count += json_metric_points(as_object(metric, &path)?, &path)?;
                    }
                }
            }
        }
    }
    Ok(count)
}

/// The data points of one OTLP/JSON metric (whichever of its five kinds it holds).
fn json_metric_points(metric: &Map<String, Value>, path: &str) -> Result<u64, OtlpError> {
    let mut count = 0u64;
    for kind in [
        ["gauge", "gauge"],
        ["sum", "sum"],
        ["histogram", "histogram"],
        ["exponentialHistogram", "exponential_histogram"],
        ["summary", "summary"],
    ] {
        let Some(data) = member(metric, kind, path)? else {
            continue;
        };
        let path = format!("{path}.{}", kind[0]);
        let data = as_object(data, &path)?;
        count += array_member(data, ["dataPoints", "data_points"], &path)?.len() as u64;
    }
    Ok(count)
}

/// `object`'s member under either spelling (`None` when absent or null); both at once is
/// ambiguous and refused, as the trace decoder refuses it.
fn member<'a>(
    object: &'a Map<String, Value>,
    names: [&str; 2],
    path: &str,
) -> Result<Option<&'a Value>, OtlpError> {
    let camel = object.get(names[0]).filter(|value| !value.is_null());
    let snake = if names[1] == names[0] {
        None
    } else {
        object.get(names[1]).filter(|value| !value.is_null())
    };
    match (camel, snake) {
        (Some(_), Some(_)) => Err(OtlpError::malformed(format!(
            "{path} has both `{}` and `{}`: give one",
            names[0], names[1]
        ))),
        (value, None) | (None, value) => Ok(value),
    }
}

/// The array member under either spelling (empty when absent).
fn array_member<'a>(
    object: &'a Map<String, Value>,
    names: [&str; 2],
    path: &str,
) -> Result<&'a [Value], OtlpError> {
    match member(object, names, path)? {
        None => Ok(&[]),
        Some(Value::Array(items)) => Ok(items),
        Some(_) => Err(OtlpError::malformed(format!(
            "{path}.{} must be an array",
            names[0]
        ))),
    }
}

fn as_object<'a>(value: &'a Value, path: &str) -> Result<&'a Map<String, Value>, OtlpError> {
    value
        .as_object()
        .ok_or_else(|| OtlpError::malformed(format!("{path} must be a JSON object")))
}

/// The success answer to an export of `signal` in `encoding`, with `partialSuccess` when
/// `dropped` items were not kept.
pub fn signal_response(
    signal: Signal,
    dropped: u64,
    encoding: OtlpEncoding,
) -> (&'static str, Vec<u8>) {
    let body = match encoding {
        OtlpEncoding::Protobuf => match signal {
            Signal::Metrics => metrics_response(dropped).encode_to_vec(),
            Signal::Logs => logs_response(dropped).encode_to_vec(),
        },
        OtlpEncoding::Json => {
            let value = match partial(signal, dropped) {
                None => json!({}),
                Some((dropped, message)) => {
                    let count_key = match signal {
                        Signal::Metrics => "rejectedDataPoints",
                        Signal::Logs => "rejectedLogRecords",
                    };
                    json!({"partialSuccess": {count_key: dropped, "errorMessage": message}})
                }
            };
            value.to_string().into_bytes()
        }
    };
    (encoding.content_type(), body)
}

/// What `partialSuccess` says about `dropped` items of `signal` (none when there were none):
/// their count, as the message's `int64`, and why they were not kept.
fn partial(signal: Signal, dropped: u64) -> Option<(i64, String)> {
    (dropped > 0).then(|| {
        (
            i64::try_from(dropped).unwrap_or(i64::MAX),
            signal.dropped_message(dropped),
        )
    })
}

fn metrics_response(dropped: u64) -> ExportMetricsServiceResponse {
    ExportMetricsServiceResponse {
        partial_success: partial(Signal::Metrics, dropped).map(
            |(rejected_data_points, error_message)| ExportMetricsPartialSuccess {
                rejected_data_points,
                error_message,
            },
        ),
    }
}

fn logs_response(dropped: u64) -> ExportLogsServiceResponse {
    ExportLogsServiceResponse {
        partial_success: partial(Signal::Logs, dropped).map(
            |(rejected_log_records, error_message)| ExportLogsPartialSuccess {
                rejected_log_records,
                error_message,
            },
        ),
    }
}

/// Told of every export of a signal that is not stored, with how many items it held.
pub type ObserveDropped = dyn Fn(Signal, u64) + Send + Sync;

/// The gRPC `MetricsService` and `LogsService`: the same answers as over HTTP.
#[derive(Clone)]
pub struct FlightlogSignalService {
    authorize: Arc<Authorize>,
    observe: Arc<ObserveDropped>,
}

impl std::fmt::Debug for FlightlogSignalService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlightlogSignalService")
            .finish_non_exhaustive()
    }
}

#[tonic::async_trait]
impl MetricsService for FlightlogSignalService {
    async fn export(
        &self,
        request: Request<ExportMetricsServiceRequest>,
    ) -> Result<Response<ExportMetricsServiceResponse>, Status> {
        (self.authorize)(request.metadata())?;
        let dropped = count_data_points(request.get_ref());
        (self.observe)(Signal::Metrics, dropped);
        Ok(Response::new(metrics_response(dropped)))
    }
}

#[tonic::async_trait]
impl LogsService for FlightlogSignalService {
    async fn export(
        &self,
        request: Request<ExportLogsServiceRequest>,
    ) -> Result<Response<ExportLogsServiceResponse>, Status> {
        (self.authorize)(request.metadata())?;
        let dropped = count_log_records(request.get_ref());
        (self.observe)(Signal::Logs, dropped);
        Ok(Response::new(logs_response(dropped)))
    }
}

/// The tonic servers of the metrics and logs services (gzip accepted, as for traces).
pub fn signal_services(
    authorize: Arc<Authorize>,
    observe: Arc<ObserveDropped>,
) -> (
    MetricsServiceServer<FlightlogSignalService>,
    LogsServiceServer<FlightlogSignalService>,
) {
    let service = FlightlogSignalService { authorize, observe };
    (
        MetricsServiceServer::new(service.clone())
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate),
        LogsServiceServer::new(service)
            .accept_compressed(CompressionEncoding::Gzip)
            .accept_compressed(CompressionEncoding::Deflate),
    )
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs};
    use opentelemetry_proto::tonic::metrics::v1::{
        Gauge, Histogram, HistogramDataPoint, Metric, NumberDataPoint, ResourceMetrics,
        ScopeMetrics,
    };

    use super::*;

    fn metrics_request() -> ExportMetricsServiceRequest {
        let gauge = Metric {
            name: "gen_ai.client.token.usage".into(),
            data: Some(Data::Gauge(Gauge {
                data_points: vec![NumberDataPoint::default(); 2],
            })),
            ..Metric::default()
        };
        let histogram = Metric {
            name: "gen_ai.client.operation.duration".into(),
            data: Some(Data::Histogram(Histogram {
                data_points: vec![HistogramDataPoint::default(); 3],
                aggregation_temporality: 1,
            })),
            ..Metric::default()
        };
        ExportMetricsServiceRequest {
            resource_metrics: vec![ResourceMetrics {
                scope_metrics: vec![ScopeMetrics {
                    metrics: vec![gauge, histogram, Metric::default()],
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            }],
        }
    }

    #[test]
    fn protobuf_and_json_exports_are_counted_alike() {
        let request = metrics_request();
        let protobuf = request.encode_to_vec();
        let counted = count_export(
            Signal::Metrics,
            Some("application/x-protobuf"),
            None,
            &protobuf,
            1 << 20,
        );
        assert_eq!(counted.ok(), Some((5, OtlpEncoding::Protobuf)));

        let json = br#"{"resourceMetrics": [{"scopeMetrics": [{"metrics": [
            {"name": "a", "gauge": {"dataPoints": [{}, {}]}},
            {"name": "b", "histogram": {"data_points": [{}, {}, {}]}},
            {"name": "c", "exponential_histogram": {"dataPoints": [{}]}},
            {"name": "d", "unknownMember": 1}]}]}]}"#;
        let counted = count_export(
            Signal::Metrics,
            Some("application/json"),
            None,
            json,
            1 << 20,
        );
        assert_eq!(counted.ok(), Some((6, OtlpEncoding::Json)));

        let logs = ExportLogsServiceRequest {
            resource_logs: vec![ResourceLogs {
                scope_logs: vec![
                    ScopeLogs {
                        log_records: vec![LogRecord::default(); 4],
                        ..ScopeLogs::default()
                    },
                    ScopeLogs::default(),
                ],
                ..ResourceLogs::default()
            }],
        };
        let counted = count_export(
            Signal::Logs,
            Some("application/x-protobuf"),
            None,
            &logs.encode_to_vec(),
            1 << 20,
        );
        assert_eq!(counted.ok(), Some((4, OtlpEncoding::Protobuf)));
        let json = br#"{"resource_logs": [{"scopeLogs": [{"logRecords": [{}, {"body": {"stringValue": "x"}}]}]}]}"#;
        let counted = count_export(Signal::Logs, Some("application/json"), None, json, 1 << 20);
        assert_eq!(counted.ok(), Some((2, OtlpEncoding::Json)));
        // An empty export is valid, and a null list is an empty one (proto3 JSON's default).
        for body in [
            &b"{}"[..],
            b"{\"resourceLogs\": null}",
            b"{\"resource_logs\": []}",
        ] {
            let counted = count_export(Signal::Logs, Some("application/json"), None, body, 1 << 20);
            assert_eq!(counted.ok(), Some((0, OtlpEncoding::Json)));
        }
    }

    #[test]
    fn an_export_hidden_in_serde_jsons_raw_value_token_is_not_read() {
        // serde_json's `Value` read the token's string as the object (and counted 3 records).
        let body = br#"{"$serde_json::private::RawValue": "{\"resourceLogs\": [{\"scopeLogs\": [{\"logRecords\": [{}, {}, {}]}]}]}"}"#;
        let error = count_export(Signal::Logs, Some("application/json"), None, body, 1 << 20)
            .expect_err("refused");
        assert!(error.to_string().contains("resourceLogs"), "{error}");
    }

    #[test]
    fn bodies_that_are_not_otlp_are_refused_with_their_path() {
        for (signal, body, expected) in [
            (Signal::Metrics, &b"[]"[..], "$ must be a JSON object"),
            (Signal::Metrics, b"{\"resourceMetrics\": {}}", "$.resourceMetrics must be an array"),
            (
                Signal::Metrics,
                b"{\"resourceMetrics\": [{\"scopeMetrics\": [{\"metrics\": [{\"sum\": {\"dataPoints\": 3}}]}]}]}",
                "$.resourceMetrics[0].scopeMetrics[0].metrics[0].sum.dataPoints must be an array",
            ),
            (
                Signal::Logs,
                b"{\"resourceLogs\": [{\"scopeLogs\": [7]}]}",
                "$.resourceLogs[0].scopeLogs[0] must be a JSON object",
            ),
            (
                Signal::Logs,
                b"{\"resourceLogs\": [], \"resource_logs\": []}",
                "has both `resourceLogs` and `resource_logs`",
            ),
            (Signal::Logs, b"{not json", "invalid JSON"),
            (
                Signal::Metrics,
                b"{\"resourceSpans\": []}",
                "not an ExportMetricsServiceRequest: no `resourceMetrics` among its keys",
            ),
            (Signal::Logs, b"{\"ResourceLogs\": []}", "no `resourceLogs` among its keys"),
        ] {
            let error = count_export(signal, Some("application/json"), None, body, 1 << 20)
                .expect_err("refused");
            assert!(matches!(error, OtlpError::Malformed { .. }), "{error}");
            assert!(error.to_string().contains(expected), "{error}");
        }
        let error = count_export(
            Signal::Metrics,
            Some("application/x-protobuf"),
            None,
            b"\xff\xff\xff",
            1 << 20,
        )
        .expect_err("refused");
        assert!(error.to_string().contains("invalid protobuf"), "{error}");
        let error = count_export(Signal::Logs, Some("text/plain"), None, b"{}", 1 << 20)
            .expect_err("refused");
        assert!(
            matches!(error, OtlpError::UnsupportedContentType { .. }),
            "{error}"
        );
    }

    #[test]
    fn the_answer_says_how_many_were_not_kept_and_why() {
        let (content_type, body) = signal_response(Signal::Metrics, 5, OtlpEncoding::Protobuf);
        assert_eq!(content_type, "application/x-protobuf");
        let decoded = ExportMetricsServiceResponse::decode(body.as_slice()).expect("a response");
        let partial = decoded.partial_success.expect("partial success");
        assert_eq!(partial.rejected_data_points, 5);
        assert!(partial.error_message.contains("stores traces, not metrics"));

        let (_, body) = signal_response(Signal::Logs, 2, OtlpEncoding::Json);
        let value: Value = serde_json::from_slice(&body).expect("JSON");
        assert_eq!(value["partialSuccess"]["rejectedLogRecords"], 2);
        assert!(value["partialSuccess"]["errorMessage"]
            .as_str()
            .is_some_and(|m| m.contains("OTEL_LOGS_EXPORTER=none")));

        let (_, body) = signal_response(Signal::Logs, 0, OtlpEncoding::Json);
        assert_eq!(body, b"{}");
        let (_, body) = signal_response(Signal::Metrics, 0, OtlpEncoding::Protobuf);
        assert!(body.is_empty(), "an empty response message");
    }
}
