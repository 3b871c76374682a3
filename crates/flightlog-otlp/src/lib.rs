//! OpenTelemetry trace ingest for flightlog: OTLP in, [`ImportedSpan`]s out.
//!
//! An OpenTelemetry exporter (an SDK, a collector, Logfire, OpenLLMetry, OpenInference …) sends
//! `ExportTraceServiceRequest`s over OTLP/HTTP or OTLP/gRPC. This crate turns one into the spans
//! the activity store imports, and nothing else: it knows no HTTP framework and no database.
//!
//! - [`decode_request`]: an OTLP/HTTP body (protobuf or OTLP/JSON, maybe gzip or deflate) into a
//!   request, with the OTLP/JSON traps closed (hex ids; snake_case keys and enum names read as
//!   the Collector reads them, not dropped; bounded inflation).
//! - [`map_request`]: the pure mapping (documented as a table in `docs/otlp.md`): trace → run,
//!   span → span, kinds from the GenAI / OpenInference / OpenLLMetry / Langfuse / Vercel AI SDK
//!   conventions, usage and cost, Logfire's pending spans; a span that cannot be mapped is
//!   rejected alone, with a reason.
//! - [`export_response`], [`encode_response`], [`encode_status`]: the answer an exporter expects.
//! - [`ingest`]: map + `ActivityStore::import_spans` + response, shared by the HTTP handler and
//!   the gRPC service; [`trace_service`]: the tonic `TraceService` around it.
//! - [`count_export`], [`signal_response`], [`signal_services`]: OTLP metrics and logs, which
//!   exporters send to the same endpoint by default: read, counted and answered (with
//!   `partialSuccess` saying they were not kept), never stored.
//!
//! [`ImportedSpan`]: flightlog_core::activity::ImportedSpan

mod attributes;
mod attrs_text;
mod decode;
mod decoded_size;
mod docs;
mod error;
mod facts;
mod ids;
mod json_direct;
mod kind;
mod mapping;
mod prices;
mod response;
mod service;
mod signals;
mod usage;

#[cfg(test)]
mod test_support;

pub use attributes::MAX_ATTRIBUTE_VALUE_BYTES;
pub use decode::{
    check_grpc_messages, decode_request, grpc_frames, inflated_len, ExportSchema, GrpcMessages,
    OtlpEncoding,
};
pub use error::OtlpError;
pub use mapping::{map_request, MappedBatch, MappingOptions, RejectedSpan};
pub use prices::{ModelPrice, PriceTable, PriceTableError};
pub use response::{encode_response, encode_status, export_response, GrpcCode};
pub use service::{
    ingest, trace_service, Authorize, FlightlogTraceService, IngestTally, ObserveIngest,
    TraceServiceServer,
};
pub use signals::{
    count_data_points, count_export, count_log_records, signal_response, signal_services,
    FlightlogSignalService, ObserveDropped, Signal,
};

/// The OTLP trace request and response messages this crate speaks, re-exported so callers need
/// no direct `opentelemetry-proto` dependency.
pub use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTracePartialSuccess, ExportTraceServiceRequest, ExportTraceServiceResponse,
};
