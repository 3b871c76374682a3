//! Ingest: map a request, import its spans, answer; and the OTLP/gRPC `TraceService` on top.
//!
//! [`ingest`] is the one path from a decoded request to the store, shared by the OTLP/HTTP
//! handler (in the server crate) and the gRPC service here, so both answer identically. Spans
//! the mapping rejected and spans the store refused are reported together in `partialSuccess`.

use std::sync::Arc;

use flightlog_core::activity::{ActivityStore, ImportReport, StoreError};
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

/// Map `request`, import its spans into `store`, and build the response: `partialSuccess`
/// counts the spans the mapping rejected plus those the store refused. A request with no
/// importable span does not call the store (the report is then all zero). The request is
/// consumed by the mapping, so none of it is held while the store writes.
pub async fn ingest(
    store: &dyn ActivityStore,
    request: ExportTraceServiceRequest,
    options: &MappingOptions,
) -> Result<(ExportTraceServiceResponse, ImportReport), StoreError> {
    let batch = map_request(request, options);
    let mut rejected = batch.rejected;
    let report = if batch.spans.is_empty() {
        ImportReport::default()
    } else {
        store.import_spans(batch.spans).await?
    };
    rejected.extend(report.rejected.iter().map(|refused| RejectedSpan {
        index: None,
        span_id: Some(refused.span_id.clone()),
        reason: refused.reason.clone(),
    }));
    Ok((export_response(&rejected), report))
}

/// The OTLP/gRPC trace service: authorize, [`ingest`], answer.
pub struct FlightlogTraceService {
    store: Arc<dyn ActivityStore>,
    authorize: Arc<Authorize>,
    options: MappingOptions,
}

impl FlightlogTraceService {
    /// A service importing into `store`, admitting the calls `authorize` accepts.
    pub fn new(
        store: Arc<dyn ActivityStore>,
        authorize: Arc<Authorize>,
        options: MappingOptions,
    ) -> Self {
        Self {
            store,
            authorize,
            options,
        }
    }
}

/// A store failure as a gRPC status: a full queue, a closing store or a full disk is
/// `unavailable` (the exporter retries later, with backoff, as OTLP prescribes for that code);
/// input the store cannot keep is `invalid_argument`; anything else is `internal`.
fn store_status(error: StoreError) -> Status {
    match error {
        StoreError::Overloaded | StoreError::Closed | StoreError::StorageFull(_) => {
            Status::unavailable(error.to_string())
        }
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
        let (response, _report) = ingest(self.store.as_ref(), request.into_inner(), &self.options)
            .await
            .map_err(store_status)?;
        Ok(Response::new(response))
    }
}

/// The tonic server of [`FlightlogTraceService`], accepting gzip-compressed requests (the
/// OpenTelemetry Collector's default). Tonic's default 4 MiB decoded-message limit applies;
/// raise it with `.max_decoding_message_size(n)` on the result.
pub fn trace_service(
    store: Arc<dyn ActivityStore>,
    authorize: Arc<Authorize>,
    options: MappingOptions,
) -> TraceServiceServer<FlightlogTraceService> {
    TraceServiceServer::new(FlightlogTraceService::new(store, authorize, options))
        .accept_compressed(CompressionEncoding::Gzip)
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
            store_status(StoreError::InvalidInput("attrs".into())).code(),
            Code::InvalidArgument
        );
        let internal = store_status(StoreError::Backend("disk full".into()));
        assert_eq!(internal.code(), Code::Internal);
        assert_eq!(internal.message(), "database error: disk full");
    }
}
