//! Ingest: map a request, import its spans, answer; and the OTLP/gRPC `TraceService` on top.
//!
//! [`ingest`] is the one path from a decoded request to the store, shared by the OTLP/HTTP
//! handler (in the server crate) and the gRPC service here, so both answer identically. Spans
//! the mapping rejected and spans the store refused are reported together in `partialSuccess`.

use std::sync::Arc;

use flightlog_core::activity::{ActivityStore, StoreError};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::codec::CompressionEncoding;
use tonic::metadata::MetadataMap;
use tonic::{Request, Response, Status};

use crate::mapping::{map_request, MappingOptions, RejectedSpan};
use crate::response::export_response;

pub use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;

/// Decides whether a gRPC call may export, from its metadata (e.g. `authorization`): `Err` is
/// returned to the caller as is (typically `Status::unauthenticated` or `permission_denied`).
pub type Authorize = dyn Fn(&MetadataMap) -> Result<(), Status> + Send + Sync;

/// What one export did with its spans: the numbers the server's `/metrics` counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IngestTally {
    /// Spans written whole (their id was new).
    pub created: u64,
    /// Spans that were stored open (started natively, or announced pending) and were completed.
    pub completed: u64,
    /// Spans that were stored open and stay open (an announcement delivered again).
    pub refreshed: u64,
    /// Spans already stored terminal: a repeated delivery, nothing written.
    pub unchanged: u64,
    /// Spans refused, by the mapping or by the store (`partialSuccess.rejectedSpans`).
    pub rejected: u64,
    /// Span events written.
    pub events_added: u64,
}

/// Told of every export's [`IngestTally`] (the server counts them in its metrics).
pub type ObserveIngest = dyn Fn(&IngestTally) + Send + Sync;

/// Map `request`, import its spans into `store`, and build the response: `partialSuccess`
/// counts the spans the mapping rejected plus those the store refused. A request with no
/// importable span does not call the store. The request is consumed by the mapping, so none of
/// it is held while the store writes.
pub async fn ingest(
    store: &dyn ActivityStore,
    request: ExportTraceServiceRequest,
    options: &MappingOptions,
) -> Result<(ExportTraceServiceResponse, IngestTally), StoreError> {
    let batch = map_request(request, options);
    let mut rejected = batch.rejected;
    let mut tally = IngestTally::default();
    if !batch.spans.is_empty() {
        let report = store.import_spans(batch.spans).await?;
        tally = IngestTally {
            created: report.created,
            completed: report.completed,
            refreshed: report.refreshed,
            unchanged: report.unchanged,
            rejected: 0,
            events_added: report.events_added,
        };
        rejected.extend(report.rejected.into_iter().map(|refused| RejectedSpan {
            index: None,
            span_id: Some(refused.span_id),
            reason: refused.reason,
        }));
    }
    tally.rejected = rejected.len() as u64;
    Ok((export_response(&rejected), tally))
}

/// The OTLP/gRPC trace service: authorize, [`ingest`], tell `observe`, answer.
pub struct FlightlogTraceService {
    store: Arc<dyn ActivityStore>,
    authorize: Arc<Authorize>,
    options: MappingOptions,
    observe: Arc<ObserveIngest>,
}

impl FlightlogTraceService {
    /// A service importing into `store`, admitting the calls `authorize` accepts, telling
    /// `observe` what each export did.
    pub fn new(
        store: Arc<dyn ActivityStore>,
        authorize: Arc<Authorize>,
        options: MappingOptions,
        observe: Arc<ObserveIngest>,
    ) -> Self {
        Self {
            store,
            authorize,
            options,
            observe,
        }
    }
}

/// A store failure as a gRPC status: a full queue, a closing store, a write lock another
/// process holds too long or a full disk is
/// `unavailable` (the exporter retries later, with backoff, as OTLP prescribes for that code);
/// input the store cannot keep is `invalid_argument`; anything else is `internal`.
fn store_status(error: StoreError) -> Status {
    match error {
        StoreError::Overloaded
        | StoreError::Closed
        | StoreError::Busy(_)
        | StoreError::StorageFull(_)
        | StoreError::FileLost(_)
        | StoreError::DiskFailed(_) => Status::unavailable(error.to_string()),
        StoreError::InvalidInput(_) => Status::invalid_argument(error.to_string()),
        other => Status::internal(other.to_string()),
    }
}

#[tonic::async_trait]
impl TraceService for FlightlogTraceService {
    async fn export(
        &self,
        request: Request<ExportTraceServiceRequest>,
    ) -> Result<Response<ExportTraceServiceResponse>, Status> {
        (self.authorize)(request.metadata())?;
        let request = request.into_inner();
        crate::decoded_size::check_copied_attributes(&request)
            .map_err(|error| Status::resource_exhausted(error.to_string()))?;
        let (response, tally) = ingest(self.store.as_ref(), request, &self.options)
            .await
            .map_err(store_status)?;
        (self.observe)(&tally);
        Ok(Response::new(response))
    }
}

/// The tonic server of [`FlightlogTraceService`], accepting gzip-compressed requests (the
/// OpenTelemetry Collector's default) and deflate-compressed ones (the Python exporter's other
/// choice). Tonic's default 4 MiB decoded-message limit applies;
/// raise it with `.max_decoding_message_size(n)` on the result.
pub fn trace_service(
    store: Arc<dyn ActivityStore>,
    authorize: Arc<Authorize>,
    options: MappingOptions,
    observe: Arc<ObserveIngest>,
) -> TraceServiceServer<FlightlogTraceService> {
    TraceServiceServer::new(FlightlogTraceService::new(
        store, authorize, options, observe,
    ))
    .accept_compressed(CompressionEncoding::Gzip)
    .accept_compressed(CompressionEncoding::Deflate)
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    #[test]
    fn store_errors_become_grpc_statuses() {
        assert_eq!(
            store_status(StoreError::Overloaded).code(),
            Code::Unavailable
        );
        assert_eq!(store_status(StoreError::Closed).code(), Code::Unavailable);
        assert_eq!(
            store_status(StoreError::StorageFull("no space".into())).code(),
            Code::Unavailable
        );
        assert_eq!(
            store_status(StoreError::Busy("locked".into())).code(),
            Code::Unavailable
        );
        assert_eq!(
            store_status(StoreError::InvalidInput("attrs".into())).code(),
            Code::InvalidArgument
        );
        let internal = store_status(StoreError::Backend("disk full".into()));
        assert_eq!(internal.code(), Code::Internal);
        assert_eq!(internal.message(), "database error: disk full");
    }
}
