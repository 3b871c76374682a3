//! The mapping of one OTLP trace export to the spans flightlog imports: pure, no I/O.
//!
//! Each OTLP trace is a run and each OTLP span a span (ids in lower-case hex). A span that
//! cannot be mapped (bad ids, no start time) is rejected alone with a reason; the others of the
//! same request are unaffected. `docs/otlp.md` holds the full table; the modules `kind`, `usage`
//! and `attributes` hold the individual rules.

use std::collections::HashSet;
use std::sync::Arc;

use flightlog_core::activity::{
    EncodedAttrs, ImportedAttrs, ImportedEnd, ImportedEvent, ImportedSpan, JsonObject,
    RemoteParent, SpanKind, SpanOrigin, SpanOutcome, COST_SOURCE_PRICE_TABLE, COST_SOURCE_REPORTED,
};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, InstrumentationScope};
use opentelemetry_proto::tonic::trace::v1::{span, status, Span};
use serde_json::Value;

use crate::attributes::{
    attributes_into_json, attributes_into_json_with_room, attributes_to_json, capped_owned,
    capped_string, MAX_ATTRIBUTE_VALUE_BYTES,
};
use crate::attrs_text::{attrs_object_text, Extra};
use crate::facts::{
    as_str, first_of, Facts, EXCEPTION_EVENT, EXCEPTION_MESSAGE, LOGFIRE_PENDING_PARENT,
};
use crate::ids::{self, to_hex};
use crate::kind::span_kind;
use crate::prices::PriceTable;
use crate::usage::{span_usage, CostSource};

/// attrs key: the resource's attributes, as an object.
pub(crate) const RESOURCE_KEY: &str = "resource";
/// attrs key: the instrumentation scope (`name`, `version`, `attributes`).
pub(crate) const SCOPE_KEY: &str = "scope";
/// attrs key: the span's links.
pub(crate) const LINKS_KEY: &str = "links";
/// attrs key: the OTLP span kind (`internal`, `server`, `client`, `producer`, `consumer`).
pub(crate) const OTEL_SPAN_KIND_KEY: &str = "otel.span_kind";
/// attrs key: `"reported"` or `"price_table"`, when the span has a cost.
pub(crate) const COST_SOURCE_KEY: &str = flightlog_core::activity::COST_SOURCE_ATTR;
/// attrs key: the version of the price table that computed the span's cost.
pub(crate) const PRICE_TABLE_KEY: &str = flightlog_core::activity::PRICE_TABLE_ATTR;
/// attrs key: the id of a span's remote parent (see `remote_parent`), which is not its
/// `parentSpanId`.
pub(crate) const REMOTE_PARENT_KEY: &str = "flightlog.remote_parent_span_id";
/// The attrs keys flightlog itself writes start with this: a span's own attributes with it are
/// dropped, so such a key always says what flightlog decided (a client's
/// `flightlog.price_table` on a span with a reported cost, or `flightlog.cost_source` on one
/// with none, passed for the provenance of its cost).
pub(crate) const RESERVED_KEY_PREFIX: &str = "flightlog.";
/// attrs key: how many of the span's events were not stored (over [`MAX_EVENTS_PER_SPAN`], or
/// dropped by the exporter).
pub(crate) const DROPPED_EVENTS_KEY: &str = "flightlog.dropped_events";
/// The most events one delivered span stores, the first ones as sent (OpenTelemetry SDKs keep
/// 128 by default; one span of 300,000 events in an 8 MiB body made a 34 MB run snapshot). The
/// rest are counted under [`DROPPED_EVENTS_KEY`].
pub const MAX_EVENTS_PER_SPAN: usize = 1_024;
/// attrs key: how many of the span's links were not stored (over [`MAX_LINKS_PER_SPAN`], ids
/// that are not a trace's and a span's, or dropped by the exporter).
pub(crate) const DROPPED_LINKS_KEY: &str = "flightlog.dropped_links";
/// The most links one delivered span stores, the first valid ones as sent (OpenTelemetry SDKs
/// keep 128 by default): 150,000 links made an 11 MB span row, and a link's ids were stored
/// as sent, of any length (a 6 MB trace id became 12 MB of hex; an audit).
pub const MAX_LINKS_PER_SPAN: usize = 1_024;
/// `Span.flags` bits: the flags say whether the parent is remote, and it is.
const FLAGS_PARENT_REMOTENESS_KNOWN: u32 = 0x100;
const FLAGS_PARENT_IS_REMOTE: u32 = 0x200;
/// Logfire appends this to a pending span's name.
const PENDING_NAME_SUFFIX: &str = " (pending)";
/// A rejected span's id is reported with at most this many bytes (a huge bogus id stays short).
const MAX_REPORTED_ID_BYTES: usize = 32;

/// The longest call id kept: providers' ids are 20 to 60 bytes; a longer value is not one.
const MAX_CALL_ID_BYTES: usize = 256;

/// A call id (see [`crate::facts::CALL_ID_KEYS`]): a non-blank string of at most
/// [`MAX_CALL_ID_BYTES`].
fn call_id_text(value: &AnyValue) -> Option<String> {
    as_str(value)
        .map(str::trim)
        .filter(|text| !text.is_empty() && text.len() <= MAX_CALL_ID_BYTES)
        .map(str::to_owned)
}

/// The call id OpenInference records only inside a model span's output: the top-level `id` of
/// the provider's response (`chatcmpl-…`, `resp_…`, `msg_…`) in `output.value`, when
/// `output.mime_type` says JSON. Beside another instrumentation's span of the same call (the
/// OpenAI SDK's `responses.create`, a streamed Anthropic call, whose spans are siblings rather
/// than nested), that span's `gen_ai.response.id` and this id tell the rollup they are one call;
/// without it the call counted twice (an audit's finding). Read only for a model span with no
/// id attribute; the value is scanned, not built (a response of any size costs no allocation
/// but the id's).
fn openinference_output_call_id(facts: &Facts<'_>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Response<'a> {
        #[serde(borrow, default)]
        id: Option<&'a serde_json::value::RawValue>,
    }
    facts.openinference_kind?;
    let mime = facts.output_mime_type?.trim();
    if !mime.eq_ignore_ascii_case("application/json") {
        return None;
    }
    let response: Response<'_> = serde_json::from_str(facts.output_value?).ok()?;
    let id: String = serde_json::from_str(response.id?.get()).ok()?;
    let id = id.trim();
    (!id.is_empty() && id.len() <= MAX_CALL_ID_BYTES).then(|| id.to_owned())
}

/// How spans are mapped.
#[derive(Debug, Clone)]
pub struct MappingOptions {
    /// The most UTF-8 bytes one attribute value keeps (see `docs/otlp.md`); default 16,384.
    pub max_attribute_value_bytes: usize,
    /// The prices a cost is computed from when a span reports none; default the bundled table.
    pub price_table: Arc<PriceTable>,
}

impl Default for MappingOptions {
    fn default() -> Self {
        Self {
            max_attribute_value_bytes: MAX_ATTRIBUTE_VALUE_BYTES,
            price_table: PriceTable::bundled(),
        }
    }
}

/// One span that was not imported, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RejectedSpan {
    /// The span's position among all spans of the request (0-based, in request order); `None`
    /// when the store rejected it (the store knows spans by id only).
    pub index: Option<usize>,
    /// Lower-case hex of the span id as delivered (whatever its length, at most 32 bytes shown);
    /// `None` when the span had no id.
    pub span_id: Option<String>,
    /// Why, in a sentence for the exporter's log.
    pub reason: String,
}

/// The result of mapping one request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MappedBatch {
    /// The spans to import, in request order (a pending announcement of a span that the same
    /// request also delivers is dropped: the delivered span supersedes it).
    pub spans: Vec<ImportedSpan>,
    /// The spans that could not be mapped, in request order.
    pub rejected: Vec<RejectedSpan>,
}

/// Map every span of `request` (see `docs/otlp.md` for the rules).
pub fn map_request(request: ExportTraceServiceRequest, options: &MappingOptions) -> MappedBatch {
    let max_bytes = options.max_attribute_value_bytes;
    let mut batch = MappedBatch::default();
    let mut pending_ids: Vec<usize> = Vec::new();
    let mut index = 0usize;
    // The request is consumed as it is mapped: each span's strings move into its ImportedSpan,
    // and what the mapping does not keep is freed span by span.
    for resource_spans in request.resource_spans {
        let resource = resource_spans
            .resource
            .map(|resource| attributes_into_json(resource.attributes, max_bytes))
            .filter(|attributes| !attributes.is_empty())
            .map(Value::Object);
        let resource_text = resource.as_ref().map(Value::to_string);
        for scope_spans in resource_spans.scope_spans {
            let scope = scope_spans
                .scope
                .as_ref()
                .and_then(|scope| scope_to_json(scope, max_bytes));
            let scope_text = scope.as_ref().map(Value::to_string);
            let shared_bytes = resource_text.as_ref().map_or(0, String::len)
                + scope_text.as_ref().map_or(0, String::len);
            let context = SpanContext {
                resource: resource.as_ref(),
                scope: scope.as_ref(),
                resource_text: resource_text.as_deref(),
                scope_text: scope_text.as_deref(),
                attrs_size_hint: shared_bytes + 256,
            };
            for mut span in scope_spans.spans {
                match map_span(&mut span, &context, options) {
                    Ok(Mapped { span, pending }) => {
                        if pending {
                            pending_ids.push(batch.spans.len());
                        }
                        batch.spans.push(span);
                    }
                    Err(reason) => batch.rejected.push(RejectedSpan {
                        index: Some(index),
                        span_id: reported_id(&span.span_id),
                        reason,
                    }),
                }
                index += 1;
            }
        }
    }
    if !pending_ids.is_empty() {
        drop_superseded_pending(&mut batch.spans, &pending_ids);
    }
    batch
}

/// What every span of one scope shares.
struct SpanContext<'a> {
    resource: Option<&'a Value>,
    scope: Option<&'a Value>,
    /// The same two as compact JSON text, encoded once for all the scope's spans.
    resource_text: Option<&'a str>,
    scope_text: Option<&'a str>,
    /// A starting capacity for one span's attrs text (the shared parts plus typical own ones).
    attrs_size_hint: usize,
}

struct Mapped {
    span: ImportedSpan,
    /// A Logfire pending announcement rather than the span itself.
    pending: bool,
}

fn reported_id(bytes: &[u8]) -> Option<String> {
    if bytes.is_empty() {
        return None;
    }
    let shown = &bytes[..bytes.len().min(MAX_REPORTED_ID_BYTES)];
    let mut hex = to_hex(shown);
    if shown.len() < bytes.len() {
        hex.push('…');
    }
    Some(hex)
}

fn nanos_to_ms(nanos: u64) -> i64 {
    i64::try_from(nanos / 1_000_000).unwrap_or(i64::MAX)
}

/// Map one span, taking its attributes, events and name out of it (the caller keeps its ids,
/// for the rejection report).
fn map_span(
    span: &mut Span,
    context: &SpanContext<'_>,
    options: &MappingOptions,
) -> Result<Mapped, String> {
    let max_bytes = options.max_attribute_value_bytes;
    let run_id = ids::trace_id(&span.trace_id)?;
    let own_id = ids::span_id(&span.span_id)?;
    let own_parent = ids::parent_id(&span.parent_span_id)?;
    if span.start_time_unix_nano == 0 {
        return Err("start time is missing (startTimeUnixNano is 0)".to_owned());
    }
    let facts = Facts::scan(&span.attributes);
    let pending = facts
        .logfire_span_type
        .is_some_and(|span_type| span_type == "pending_span");
    // A pending span stands for its parent (the real span, still running); the real span's own
    // parent travels in an attribute.
    let (span_id, parent_span_id, name) = if pending {
        let Some(real_id) = own_parent else {
            return Err(
                "pending span (logfire.span_type = pending_span) has no parent: the parent is \
                 the span it announces"
                    .to_owned(),
            );
        };
        let real_parent = match facts.logfire_pending_parent {
            None => None,
            Some(value) => pending_parent(value)?,
        };
        let name = match logfire_message(&facts) {
            Some(message) => message,
            None => span
                .name
                .strip_suffix(PENDING_NAME_SUFFIX)
                .unwrap_or(&span.name),
        };
        (real_id, real_parent, capped_string(name, max_bytes))
    } else if let Some(message) = logfire_message(&facts) {
        (own_id, own_parent, capped_string(message, max_bytes))
    } else {
        // Capped like an attribute value: a name is as much the sender's text as they are.
        let name = if span.name.len() <= max_bytes {
            std::mem::take(&mut span.name)
        } else {
            capped_string(&span.name, max_bytes)
        };
        (own_id, own_parent, name)
    };
    if parent_span_id.as_deref() == Some(span_id.as_str()) {
        return Err("the span names itself as its parent (parentSpanId = spanId)".to_owned());
    }
    let (parent_span_id, remote_parent) = if !pending && is_parent_remote(span.flags) {
        (None, parent_span_id)
    } else {
        (parent_span_id, None)
    };

    let kind = span_kind(&facts, parent_span_id.is_none());
    // The store keeps a remote parent that is stored in the same run (see `docs/otlp.md`); the
    // span is then not a root, and its kind is a child's.
    let remote_parent_kind = remote_parent.as_ref().map(|_| span_kind(&facts, false));
    let started_at = nanos_to_ms(span.start_time_unix_nano);
    let end = (!pending && span.end_time_unix_nano != 0)
        .then(|| span_end(span, facts.error_type, max_bytes));
    // An agent's span (a turn, a subagent) that reports its tokens reports the totals of its
    // model calls, which may be several models, with cache discounts: priced as one call of its
    // model they were wrong (an audit: $0.00795 for calls that cost $0.00545, and 24 times the
    // cost when the calls ran on a cheaper model), and that price hid the model calls' sum in
    // the run's rollup. Its calls are priced; its own cost is a reported one or none.
    let priceable = !matches!(kind, SpanKind::Turn | SpanKind::Subagent);
    let (usage, cost_source) = span_usage(&facts, &options.price_table, priceable);
    let priced_at = match &cost_source {
        Some(CostSource::PriceTable(_, price)) => Some(*price),
        _ => None,
    };
    let session_id = first_of(&facts.session, |value| session_text(value, max_bytes));
    // Only the rollup reads it, and only on model spans.
    let call_id = if kind == SpanKind::Model {
        first_of(&facts.call_id, call_id_text).or_else(|| openinference_output_call_id(&facts))
    } else {
        None
    };

    if pending {
        // Said by `parentSpanId` already; the real span does not carry it, and when it completes
        // this one its attrs merge over these, so the key stayed on the finished span.
        span.attributes
            .retain(|attribute| attribute.key != LOGFIRE_PENDING_PARENT);
    }
    // The events not stored: those the exporter dropped already (its `droppedEventsCount`; an
    // SDK keeps 128 a span by default) and those past the first 1,024.
    let dropped_events = if pending {
        0
    } else {
        let exporters = usize::try_from(span.dropped_events_count).unwrap_or(usize::MAX);
        span.events
            .len()
            .saturating_sub(MAX_EVENTS_PER_SPAN)
            .saturating_add(exporters)
    };
    let attrs = span_attrs(
        span,
        context,
        cost_source,
        remote_parent.as_deref(),
        dropped_events,
        max_bytes,
    );
    let remote_parent = remote_parent
        .zip(remote_parent_kind)
        .map(|(span_id, kind_under_it)| RemoteParent {
            span_id,
            kind_under_it,
        });
    let events = if pending {
        Vec::new()
    } else {
        let mut events = std::mem::take(&mut span.events);
        events.truncate(MAX_EVENTS_PER_SPAN);
        events
            .into_iter()
            .map(|event| ImportedEvent {
                ts: if event.time_unix_nano == 0 {
                    started_at
                } else {
                    nanos_to_ms(event.time_unix_nano)
                },
                event_type: if event.name.is_empty() {
                    "event".to_owned()
                } else {
                    capped_owned(event.name, max_bytes)
                },
                payload: Value::Object(attributes_into_json(event.attributes, max_bytes)),
            })
            .collect()
    };

    Ok(Mapped {
        span: ImportedSpan {
            span_id,
            run_id,
            parent_span_id,
            name,
            kind,
            origin: SpanOrigin::Otlp,
            session_id,
            job_name: None,
            attrs,
            started_at,
            end,
            usage,
            priced_at,
            call_id,
            remote_parent,
            events,
        },
        pending,
    })
}

/// The keys the mapping adds to a span's own attributes, in the order it adds them.
const ADDED_KEYS: [&str; 9] = [
    RESOURCE_KEY,
    SCOPE_KEY,
    LINKS_KEY,
    OTEL_SPAN_KIND_KEY,
    COST_SOURCE_KEY,
    PRICE_TABLE_KEY,
    REMOTE_PARENT_KEY,
    DROPPED_EVENTS_KEY,
    DROPPED_LINKS_KEY,
];

/// Whether the span's parent lives in another process: the SDK continued a trace from an
/// incoming `traceparent` (`Span.flags`, set by current SDKs). Such a span is a root of its run,
/// with the parent's id kept in attrs under [`REMOTE_PARENT_KEY`]: the parent is the caller's,
/// which exports elsewhere or nowhere, so a span waiting for it left the run with no root (no
/// rollup, not listed, not live) for good. When the caller does export here too, its span and
/// this one are two roots of the run, and the key links them.
fn is_parent_remote(flags: u32) -> bool {
    let both = FLAGS_PARENT_REMOTENESS_KNOWN | FLAGS_PARENT_IS_REMOTE;
    flags & both == both
}

/// A span's attrs: its own attributes, then the resource, scope, links, OTLP span kind and
/// cost source. Written straight as JSON text (see `attrs_text`), or, when a key repeats or
/// collides with an added one, built as a map (an added key replaces the span's own in place).
fn span_attrs(
    span: &mut Span,
    context: &SpanContext<'_>,
    cost_source: Option<CostSource>,
    remote_parent: Option<&str>,
    dropped_events: usize,
    max_bytes: usize,
) -> ImportedAttrs {
    span.attributes
        .retain(|attribute| !attribute.key.starts_with(RESERVED_KEY_PREFIX));
    let (links, dropped_links) = stored_links(span, max_bytes);
    let kind = otel_span_kind(span.kind);
    let (cost_source, price_table) = match &cost_source {
        Some(CostSource::Reported) => (Some(COST_SOURCE_REPORTED), None),
        Some(CostSource::PriceTable(version, _)) => {
            (Some(COST_SOURCE_PRICE_TABLE), Some(version.as_str()))
        }
        None => (None, None),
    };
    let mut extras: Vec<(&str, Extra<'_>)> = Vec::with_capacity(ADDED_KEYS.len());
    if let Some(resource) = context.resource_text {
        extras.push((RESOURCE_KEY, Extra::Text(resource)));
    }
    if let Some(scope) = context.scope_text {
        extras.push((SCOPE_KEY, Extra::Text(scope)));
    }
    if let Some(links) = &links {
        extras.push((LINKS_KEY, Extra::Value(links)));
    }
    if let Some(kind) = kind {
        extras.push((OTEL_SPAN_KIND_KEY, Extra::Str(kind)));
    }
    if let Some(source) = cost_source {
        extras.push((COST_SOURCE_KEY, Extra::Str(source)));
    }
    if let Some(version) = price_table {
        extras.push((PRICE_TABLE_KEY, Extra::Str(version)));
    }
    if let Some(parent) = remote_parent {
        extras.push((REMOTE_PARENT_KEY, Extra::Str(parent)));
    }
    let dropped_text = (dropped_events > 0).then(|| dropped_events.to_string());
    if let Some(text) = &dropped_text {
        extras.push((DROPPED_EVENTS_KEY, Extra::Text(text)));
    }
    let dropped_links_text = (dropped_links > 0).then(|| dropped_links.to_string());
    if let Some(text) = &dropped_links_text {
        extras.push((DROPPED_LINKS_KEY, Extra::Text(text)));
    }
    if let Some(text) = attrs_object_text(
        &span.attributes,
        &extras,
        &ADDED_KEYS,
        max_bytes,
        context.attrs_size_hint,
    ) {
        return ImportedAttrs::Encoded(EncodedAttrs::from_object_text(text));
    }
    let mut attrs = attributes_into_json_with_room(
        std::mem::take(&mut span.attributes),
        max_bytes,
        ADDED_KEYS.len(),
    );
    if let Some(resource) = context.resource {
        attrs.insert(RESOURCE_KEY.to_owned(), resource.clone());
    }
    if let Some(scope) = context.scope {
        attrs.insert(SCOPE_KEY.to_owned(), scope.clone());
    }
    if let Some(links) = links {
        attrs.insert(LINKS_KEY.to_owned(), links);
    }
    if let Some(kind) = kind {
        attrs.insert(OTEL_SPAN_KIND_KEY.to_owned(), Value::from(kind));
    }
    if let Some(source) = cost_source {
        attrs.insert(COST_SOURCE_KEY.to_owned(), Value::from(source));
    }
    if let Some(version) = price_table {
        attrs.insert(PRICE_TABLE_KEY.to_owned(), Value::from(version));
    }
    if let Some(parent) = remote_parent {
        attrs.insert(REMOTE_PARENT_KEY.to_owned(), Value::from(parent));
    }
    if dropped_events > 0 {
        attrs.insert(DROPPED_EVENTS_KEY.to_owned(), Value::from(dropped_events));
    }
    if dropped_links > 0 {
        attrs.insert(DROPPED_LINKS_KEY.to_owned(), Value::from(dropped_links));
    }
    ImportedAttrs::Object(attrs)
}

/// Logfire's formatted message, the name its user reads (`step 3`), where the OTLP span name is
/// the message's template (`step {i}`, the same for every step); none when blank.
fn logfire_message<'f>(facts: &Facts<'f>) -> Option<&'f str> {
    facts
        .logfire_message
        .filter(|message| !message.trim().is_empty())
}

/// The real parent named by `logfire.pending_parent_id` (hex text; all zero: a root).
fn pending_parent(value: &AnyValue) -> Result<Option<String>, String> {
    match value.value.as_ref() {
        None => Ok(None),
        Some(any_value::Value::StringValue(text)) => ids::parent_id_from_hex(text)
            .map_err(|reason| format!("logfire.pending_parent_id: {reason}")),
        Some(_) => Err("logfire.pending_parent_id must be a hex string".to_owned()),
    }
}

/// The terminal part of an ended span: ERROR is `error`, OK and UNSET are `success`. The
/// reason of an error is the status message; when that is empty, the span's `error.type`
/// (`error_type`), else the message of its first `exception` event that has one; else none.
fn span_end(span: &Span, error_type: Option<&str>, max_bytes: usize) -> ImportedEnd {
    let status = span.status.as_ref();
    let is_error = status.is_some_and(|status| status.code == status::StatusCode::Error as i32);
    let (outcome, reason) = if is_error {
        let message = status.map(|status| status.message.as_str());
        let reason = [message, error_type]
            .into_iter()
            .flatten()
            .map(str::trim)
            .find(|text| !text.is_empty())
            .or_else(|| exception_message(&span.events))
            .map(|text| capped_string(text, max_bytes));
        (SpanOutcome::Error, reason)
    } else {
        (SpanOutcome::Success, None)
    };
    ImportedEnd {
        // An end before the start (a buggy exporter's clock) is taken as the start: a negative
        // duration would skew every total it enters.
        ended_at: nanos_to_ms(span.end_time_unix_nano.max(span.start_time_unix_nano)),
        outcome,
        reason,
    }
}

/// The trimmed, non-empty `exception.message` of the first `exception` event that has one (a
/// repeated attribute: the last wins, as in the event's payload).
fn exception_message(events: &[span::Event]) -> Option<&str> {
    events
        .iter()
        .filter(|event| event.name == EXCEPTION_EVENT)
        .find_map(|event| {
            event
                .attributes
                .iter()
                .rev()
                .find(|attribute| attribute.key == EXCEPTION_MESSAGE)
                .and_then(|attribute| attribute.value.as_ref())
                .and_then(as_str)
                .map(str::trim)
                .filter(|text| !text.is_empty())
        })
}

/// A session id from a string (or an integer, spelled in decimal); empty is none.
fn session_text(value: &AnyValue, max_bytes: usize) -> Option<String> {
    match value.value.as_ref()? {
        any_value::Value::StringValue(text) => {
            let text = text.trim();
            (!text.is_empty()).then(|| capped_string(text, max_bytes))
        }
        any_value::Value::IntValue(number) => Some(number.to_string()),
        _ => None,
    }
}

fn scope_to_json(scope: &InstrumentationScope, max_bytes: usize) -> Option<Value> {
    let mut object = JsonObject::new();
    if !scope.name.is_empty() {
        object.insert(
            "name".to_owned(),
            Value::from(capped_string(&scope.name, max_bytes)),
        );
    }
    if !scope.version.is_empty() {
        object.insert(
            "version".to_owned(),
            Value::from(capped_string(&scope.version, max_bytes)),
        );
    }
    if !scope.attributes.is_empty() {
        object.insert(
            "attributes".to_owned(),
            Value::Object(attributes_to_json(&scope.attributes, max_bytes)),
        );
    }
    (!object.is_empty()).then_some(Value::Object(object))
}

/// The span's links as stored (`None` for none) and how many were not: the first
/// [`MAX_LINKS_PER_SPAN`] whose ids are a trace's (16 bytes) and a span's (8 bytes), not all
/// zero, are kept; the rest, and the exporter's `droppedLinksCount`, are counted.
fn stored_links(span: &Span, max_bytes: usize) -> (Option<Value>, usize) {
    let is_id = |bytes: &[u8], len: usize| bytes.len() == len && bytes.iter().any(|&b| b != 0);
    let valid: Vec<&span::Link> = span
        .links
        .iter()
        .filter(|link| is_id(&link.trace_id, 16) && is_id(&link.span_id, 8))
        .take(MAX_LINKS_PER_SPAN)
        .collect();
    let exporters = usize::try_from(span.dropped_links_count).unwrap_or(usize::MAX);
    let dropped = (span.links.len() - valid.len()).saturating_add(exporters);
    let links = (!valid.is_empty()).then(|| links_to_json(valid, max_bytes));
    (links, dropped)
}

fn links_to_json(links: Vec<&span::Link>, max_bytes: usize) -> Value {
    Value::Array(
        links
            .into_iter()
            .map(|link| {
                let mut object = JsonObject::new();
                object.insert("traceId".to_owned(), Value::from(to_hex(&link.trace_id)));
                object.insert("spanId".to_owned(), Value::from(to_hex(&link.span_id)));
                if !link.attributes.is_empty() {
                    object.insert(
                        "attributes".to_owned(),
                        Value::Object(attributes_to_json(&link.attributes, max_bytes)),
                    );
                }
                Value::Object(object)
            })
            .collect(),
    )
}

fn otel_span_kind(kind: i32) -> Option<&'static str> {
    match span::SpanKind::try_from(kind).ok()? {
        span::SpanKind::Unspecified => None,
        span::SpanKind::Internal => Some("internal"),
        span::SpanKind::Server => Some("server"),
        span::SpanKind::Client => Some("client"),
        span::SpanKind::Producer => Some("producer"),
        span::SpanKind::Consumer => Some("consumer"),
    }
}

/// Drop a pending announcement when the request also carries the span it announces (whole), or
/// an earlier announcement of the same span.
fn drop_superseded_pending(spans: &mut Vec<ImportedSpan>, pending_positions: &[usize]) {
    let pending: HashSet<usize> = pending_positions.iter().copied().collect();
    let delivered: HashSet<String> = spans
        .iter()
        .enumerate()
        .filter(|(position, _)| !pending.contains(position))
        .map(|(_, span)| span.span_id.clone())
        .collect();
    let mut announced: HashSet<String> = HashSet::new();
    let mut position = 0usize;
    spans.retain(|span| {
        let keep = !pending.contains(&position)
            || (!delivered.contains(&span.span_id) && announced.insert(span.span_id.clone()));
        position += 1;
        keep
    });
}

#[cfg(test)]
mod tests {
    use flightlog_core::activity::{SpanKind, SpanUsage, TRUNCATION_MARKER};
    use opentelemetry_proto::tonic::common::v1::KeyValue;
    use opentelemetry_proto::tonic::trace::v1::Status;
    use serde_json::json;

    use super::*;
    use crate::test_support::{double, int, kv, request, sid, sid_hex, span, string, TRACE_HEX};

    fn map(spans: Vec<Span>) -> MappedBatch {
        decoded(map_request(request(spans), &MappingOptions::default()))
    }

    /// The batch with every span's attrs as a map, after checking that each encoded text is
    /// the compact text of that map (so the comparisons below cover the encoded form too).
    fn decoded(mut batch: MappedBatch) -> MappedBatch {
        for span in &mut batch.spans {
            if let ImportedAttrs::Encoded(encoded) = &span.attrs {
                let object: JsonObject = serde_json::from_str(encoded.as_str()).unwrap();
                assert_eq!(serde_json::to_string(&object).unwrap(), encoded.as_str());
                span.attrs = ImportedAttrs::Object(object);
            }
        }
        batch
    }

    fn object(attrs: &ImportedAttrs) -> &JsonObject {
        match attrs {
            ImportedAttrs::Object(object) => object,
            ImportedAttrs::Encoded(encoded) => panic!("not decoded: {encoded:?}"),
        }
    }

    fn only_span(spans: Vec<Span>) -> ImportedSpan {
        let batch = map(spans);
        assert_eq!(batch.rejected, vec![]);
        assert_eq!(batch.spans.len(), 1, "{:?}", batch.spans);
        batch.spans.into_iter().next().unwrap()
    }

    #[test]
    fn typical_attrs_are_encoded_as_text_and_repeated_keys_fall_back_to_the_map() {
        let options = MappingOptions::default();
        let plain = map_request(
            request(vec![span(1, None, "root", vec![kv("a", int(1))])]),
            &options,
        );
        assert!(matches!(plain.spans[0].attrs, ImportedAttrs::Encoded(_)));
        let repeated = map_request(
            request(vec![span(
                1,
                None,
                "root",
                vec![kv("a", int(1)), kv("b", int(2)), kv("a", int(3))],
            )]),
            &options,
        );
        let ImportedAttrs::Object(attrs) = &repeated.spans[0].attrs else {
            panic!("{:?}", repeated.spans[0].attrs);
        };
        let keys: Vec<&str> = attrs.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "b", "resource", "scope"]);
        assert_eq!(attrs["a"], json!(3));
    }

    #[test]
    fn a_span_maps_field_by_field() {
        let mut model_call = span(
            2,
            Some(1),
            "chat gpt-4o",
            vec![
                kv("gen_ai.operation.name", string("chat")),
                kv("gen_ai.request.model", string("gpt-4o")),
                kv("gen_ai.usage.input_tokens", int(1_000)),
                kv("gen_ai.usage.output_tokens", int(200)),
                kv("session.id", string("sess-1")),
            ],
        );
        model_call.kind = span::SpanKind::Client as i32;
        model_call.events = vec![span::Event {
            time_unix_nano: 1_700_000_000,
            name: "gen_ai.choice".into(),
            attributes: vec![kv("index", int(0))],
            dropped_attributes_count: 0,
        }];
        model_call.links = vec![span::Link {
            trace_id: vec![2; 16],
            span_id: sid(9),
            attributes: vec![kv("why", string("follows"))],
            ..span::Link::default()
        }];
        let mapped = only_span(vec![model_call]);
        assert_eq!(
            mapped,
            ImportedSpan {
                priced_at: PriceTable::bundled().lookup("gpt-4o").copied(),
                span_id: sid_hex(2),
                run_id: TRACE_HEX.into(),
                parent_span_id: Some(sid_hex(1)),
                name: "chat gpt-4o".into(),
                kind: SpanKind::Model,
                origin: SpanOrigin::Otlp,
                session_id: Some("sess-1".into()),
                job_name: None,
                attrs: json!({
                    "gen_ai.operation.name": "chat",
                    "gen_ai.request.model": "gpt-4o",
                    "gen_ai.usage.input_tokens": 1000,
                    "gen_ai.usage.output_tokens": 200,
                    "session.id": "sess-1",
                    "resource": {"service.name": "svc"},
                    "scope": {"name": "agent-lib", "version": "1.2"},
                    "links": [{
                        "traceId": "02020202020202020202020202020202",
                        "spanId": "0909090909090909",
                        "attributes": {"why": "follows"},
                    }],
                    "otel.span_kind": "client",
                    "flightlog.cost_source": "price_table",
                    "flightlog.price_table": "2026-12-03",
                })
                .as_object()
                .cloned()
                .unwrap()
                .into(),
                started_at: 1_000,
                end: Some(ImportedEnd {
                    ended_at: 2_500,
                    outcome: SpanOutcome::Success,
                    reason: None,
                }),
                usage: SpanUsage {
                    input_tokens: Some(1_000),
                    output_tokens: Some(200),
                    // 1,000 × $2.50 + 200 × $10 per million.
                    cost_usd: Some(0.0045),
                    model: Some("gpt-4o".into()),
                    ..SpanUsage::default()
                },
                call_id: None,
                remote_parent: None,
                events: vec![ImportedEvent {
                    ts: 1_700,
                    event_type: "gen_ai.choice".into(),
                    payload: json!({"index": 0}),
                }],
            }
        );
    }

    #[test]
    fn error_status_is_an_error_outcome_with_its_message() {
        let mut failed = span(1, None, "root", vec![]);
        failed.status = Some(Status {
            message: "tool crashed".into(),
            code: status::StatusCode::Error as i32,
        });
        let mut silent = span(2, Some(1), "child", vec![]);
        silent.status = Some(Status {
            message: String::new(),
            code: status::StatusCode::Error as i32,
        });
        let mut fine = span(3, Some(1), "ok", vec![]);
        fine.status = Some(Status {
            message: "ignored".into(),
            code: status::StatusCode::Ok as i32,
        });
        let batch = map(vec![failed, silent, fine]);
        let ends: Vec<_> = batch.spans.iter().map(|span| span.end.clone()).collect();
        assert_eq!(
            ends,
            vec![
                Some(ImportedEnd {
                    ended_at: 2_500,
                    outcome: SpanOutcome::Error,
                    reason: Some("tool crashed".into()),
                }),
                Some(ImportedEnd {
                    ended_at: 2_500,
                    outcome: SpanOutcome::Error,
                    reason: None,
                }),
                Some(ImportedEnd {
                    ended_at: 2_500,
                    outcome: SpanOutcome::Success,
                    reason: None,
                }),
            ]
        );
    }

    fn error_span(id: u8, message: &str, attributes: Vec<KeyValue>) -> Span {
        let mut failed = span(id, Some(1), "step", attributes);
        failed.status = Some(Status {
            message: message.into(),
            code: status::StatusCode::Error as i32,
        });
        failed
    }

    fn event(name: &str, attributes: Vec<KeyValue>) -> span::Event {
        span::Event {
            time_unix_nano: 1_200_000_000,
            name: name.into(),
            attributes,
            dropped_attributes_count: 0,
        }
    }

    fn reason_of(span: Span) -> (SpanOutcome, Option<String>) {
        let end = only_span(vec![span]).end.unwrap();
        (end.outcome, end.reason)
    }

    #[test]
    fn an_error_without_a_message_takes_its_reason_from_error_type() {
        let typed = error_span(2, "", vec![kv("error.type", string(" TimeoutError "))]);
        assert_eq!(
            reason_of(typed),
            (SpanOutcome::Error, Some("TimeoutError".into()))
        );
        // The status message still comes first.
        let both = error_span(
            2,
            "deadline exceeded after 30 s",
            vec![kv("error.type", string("TimeoutError"))],
        );
        assert_eq!(
            reason_of(both),
            (
                SpanOutcome::Error,
                Some("deadline exceeded after 30 s".into())
            )
        );
        // error.type beats an exception event.
        let mut typed_and_raised = error_span(2, " ", vec![kv("error.type", string("500"))]);
        typed_and_raised.events = vec![event(
            "exception",
            vec![kv("exception.message", string("boom"))],
        )];
        assert_eq!(
            reason_of(typed_and_raised),
            (SpanOutcome::Error, Some("500".into()))
        );
    }

    #[test]
    fn an_error_without_a_message_or_type_takes_the_first_exception_message() {
        let mut raised = error_span(2, "", vec![kv("error.type", string(""))]);
        raised.events = vec![
            event(
                "log",
                vec![kv("exception.message", string("not an exception"))],
            ),
            event(
                "exception",
                vec![kv("exception.type", string("ValueError"))],
            ),
            event(
                "exception",
                vec![
                    kv("exception.message", string("stale")),
                    kv("exception.message", string(" connection reset ")),
                ],
            ),
            event("exception", vec![kv("exception.message", string("later"))]),
        ];
        let mapped = only_span(vec![raised]);
        assert_eq!(
            mapped.end.map(|end| (end.outcome, end.reason)),
            Some((SpanOutcome::Error, Some("connection reset".into())))
        );
        // The events are kept as events all the same.
        assert_eq!(mapped.events.len(), 4);
        // Nothing to say: no reason, as before.
        let mut silent = error_span(2, "", vec![]);
        silent.events = vec![event("exception", vec![kv("exception.message", int(3))])];
        assert_eq!(reason_of(silent), (SpanOutcome::Error, None));
        // The reason is capped like the status message.
        let options = MappingOptions {
            max_attribute_value_bytes: 4,
            ..MappingOptions::default()
        };
        let long = error_span(2, "", vec![kv("error.type", string("TimeoutError"))]);
        let batch = map_request(request(vec![long]), &options);
        assert_eq!(
            batch.spans[0]
                .end
                .as_ref()
                .and_then(|end| end.reason.clone()),
            Some(format!("Time{TRUNCATION_MARKER}"))
        );
    }

    #[test]
    fn ok_and_unset_stay_success_whatever_the_error_attributes_say() {
        for code in [status::StatusCode::Ok, status::StatusCode::Unset] {
            let mut fine = span(2, Some(1), "step", vec![kv("error.type", string("500"))]);
            fine.status = Some(Status {
                message: String::new(),
                code: code as i32,
            });
            fine.events = vec![event(
                "exception",
                vec![kv("exception.message", string("handled"))],
            )];
            assert_eq!(reason_of(fine), (SpanOutcome::Success, None), "{code:?}");
        }
    }

    #[test]
    fn a_zero_end_time_means_still_running() {
        let mut running = span(
            1,
            None,
            "agent",
            vec![kv("gen_ai.operation.name", string("invoke_agent"))],
        );
        running.end_time_unix_nano = 0;
        let mapped = only_span(vec![running]);
        assert_eq!(mapped.end, None);
        assert_eq!(mapped.kind, SpanKind::Turn);
        assert_eq!(mapped.started_at, 1_000);
    }

    #[test]
    fn times_are_truncated_to_milliseconds() {
        let mut precise = span(1, None, "root", vec![]);
        precise.start_time_unix_nano = 1_544_712_660_123_999_999;
        precise.end_time_unix_nano = 1_544_712_661_000_000_001;
        let mapped = only_span(vec![precise]);
        assert_eq!(mapped.started_at, 1_544_712_660_123);
        assert_eq!(mapped.end.map(|end| end.ended_at), Some(1_544_712_661_000));
    }

    #[test]
    fn bad_ids_are_rejected_one_by_one_and_good_spans_survive() {
        let good = span(1, None, "good", vec![]);
        let mut short_trace = span(2, Some(1), "short trace", vec![]);
        short_trace.trace_id = vec![1; 8];
        let mut zero_trace = span(3, Some(1), "zero trace", vec![]);
        zero_trace.trace_id = vec![0; 16];
        let mut long_span = span(4, Some(1), "long span id", vec![]);
        long_span.span_id = vec![4; 16];
        let mut zero_span = span(5, Some(1), "zero span id", vec![]);
        zero_span.span_id = vec![0; 8];
        let mut no_span_id = span(6, Some(1), "no span id", vec![]);
        no_span_id.span_id = Vec::new();
        let mut bad_parent = span(7, Some(1), "bad parent", vec![]);
        bad_parent.parent_span_id = vec![1; 4];
        let mut no_start = span(8, Some(1), "no start", vec![]);
        no_start.start_time_unix_nano = 0;
        let also_good = span(9, Some(1), "also good", vec![]);
        let batch = map(vec![
            good,
            short_trace,
            zero_trace,
            long_span,
            zero_span,
            no_span_id,
            bad_parent,
            no_start,
            also_good,
        ]);
        let names: Vec<&str> = batch.spans.iter().map(|span| span.name.as_str()).collect();
        assert_eq!(names, vec!["good", "also good"]);
        let rejected: Vec<(Option<usize>, Option<&str>, &str)> = batch
            .rejected
            .iter()
            .map(|r| (r.index, r.span_id.as_deref(), r.reason.as_str()))
            .collect();
        let four = sid_hex(4).repeat(2);
        assert_eq!(
            rejected,
            vec![
                (
                    Some(1),
                    Some(sid_hex(2).as_str()),
                    "trace id must be 16 bytes, got 8"
                ),
                (Some(2), Some(sid_hex(3).as_str()), "trace id is all zero"),
                (
                    Some(3),
                    Some(four.as_str()),
                    "span id must be 8 bytes, got 16"
                ),
                (Some(4), Some("0000000000000000"), "span id is all zero"),
                (Some(5), None, "span id must be 8 bytes, got 0"),
                (
                    Some(6),
                    Some(sid_hex(7).as_str()),
                    "parent span id must be 8 bytes, got 4"
                ),
                (
                    Some(7),
                    Some(sid_hex(8).as_str()),
                    "start time is missing (startTimeUnixNano is 0)"
                ),
            ]
        );
    }

    #[test]
    fn a_zero_parent_is_a_root() {
        let mut root = span(1, None, "root", vec![]);
        root.parent_span_id = vec![0; 8];
        assert_eq!(only_span(vec![root]).parent_span_id, None);
    }

    /// An agent continuing an incoming `traceparent`: the SDK flags the parent as remote.
    #[test]
    fn a_span_whose_parent_is_remote_is_a_root_that_keeps_the_parents_id() {
        let mut entry = span(
            2,
            Some(0x0f),
            "invoke_agent support",
            vec![kv("gen_ai.operation.name", string("invoke_agent"))],
        );
        entry.flags = 0x301; // remoteness known, remote, and the sampled bit of the trace flags
        let mapped = only_span(vec![entry.clone()]);
        assert_eq!(mapped.parent_span_id, None);
        assert_eq!(mapped.kind, SpanKind::Turn);
        assert_eq!(
            object(&mapped.attrs)[REMOTE_PARENT_KEY],
            json!(sid_hex(0x0f))
        );
        // What the store needs to keep that parent when it is stored in the same run.
        assert_eq!(
            mapped.remote_parent,
            Some(RemoteParent {
                span_id: sid_hex(0x0f),
                kind_under_it: SpanKind::Subagent,
            })
        );

        // A local parent (remoteness known, not remote), or flags from an SDK that does not
        // say: the parent stays.
        for flags in [0x100, 0x200, 0] {
            entry.flags = flags;
            let mapped = only_span(vec![entry.clone()]);
            assert_eq!(mapped.parent_span_id, Some(sid_hex(0x0f)), "{flags:#x}");
            assert_eq!(mapped.kind, SpanKind::Subagent, "{flags:#x}");
            assert!(!object(&mapped.attrs).contains_key(REMOTE_PARENT_KEY));
            assert_eq!(mapped.remote_parent, None);
        }
    }

    #[test]
    fn a_span_that_names_itself_as_its_parent_is_rejected() {
        let batch = map(vec![
            span(3, Some(3), "loop", vec![]),
            span(4, None, "fine", vec![]),
        ]);
        assert_eq!(batch.spans.len(), 1);
        assert_eq!(batch.rejected.len(), 1);
        assert_eq!(batch.rejected[0].span_id, Some(sid_hex(3)));
        assert!(
            batch.rejected[0]
                .reason
                .contains("names itself as its parent"),
            "{}",
            batch.rejected[0].reason
        );
    }

    #[test]
    fn an_end_before_the_start_is_taken_as_the_start() {
        let mut backwards = span(5, None, "backwards", vec![]);
        backwards.end_time_unix_nano = backwards.start_time_unix_nano - 10_000_000;
        let mapped = only_span(vec![backwards]);
        assert_eq!(mapped.end.map(|end| end.ended_at), Some(mapped.started_at));
    }

    #[test]
    fn a_huge_reported_id_is_shortened() {
        let mut huge = span(1, None, "huge", vec![]);
        huge.span_id = vec![0xab; 1_000];
        let batch = map(vec![huge]);
        let shown = batch.rejected[0].span_id.clone().unwrap();
        assert_eq!(shown, format!("{}…", "ab".repeat(32)));
    }

    fn pending_span(own: u8, real: u8, pending_parent: Option<&str>, name: &str) -> Span {
        let mut attributes = vec![
            kv("logfire.span_type", string("pending_span")),
            kv("gen_ai.operation.name", string("invoke_agent")),
        ];
        if let Some(parent) = pending_parent {
            attributes.push(kv("logfire.pending_parent_id", string(parent)));
        }
        let mut pending = span(own, Some(real), name, attributes);
        // Logfire ends a pending span at its start.
        pending.end_time_unix_nano = pending.start_time_unix_nano;
        pending.events = vec![span::Event {
            time_unix_nano: 1_000_000_000,
            name: "ignored".into(),
            attributes: vec![],
            dropped_attributes_count: 0,
        }];
        pending
    }

    /// Logfire names a span by its message template and puts the message in `logfire.msg`:
    /// the message is the name, the announcement's too; a blank one is not.
    #[test]
    fn a_logfire_span_is_named_by_its_formatted_message() {
        let mut step = span(
            2,
            Some(1),
            "step {i}",
            vec![
                kv("logfire.msg_template", string("step {i}")),
                kv("logfire.msg", string("step 3")),
            ],
        );
        assert_eq!(only_span(vec![step.clone()]).name, "step 3");
        step.attributes[1] = kv("logfire.msg", string("  "));
        assert_eq!(only_span(vec![step]).name, "step {i}");
        let mut announced = pending_span(0x20, 0x10, None, "agent {name} (pending)");
        announced
            .attributes
            .push(kv("logfire.msg", string("agent scout")));
        assert_eq!(only_span(vec![announced]).name, "agent scout");
    }

    #[test]
    fn a_pending_span_announces_its_parent_as_running() {
        let below = only_span(vec![pending_span(
            0x20,
            0x10,
            Some("0F0F0F0F0F0F0F0F"),
            "agent run (pending)",
        )]);
        assert_eq!(below.span_id, sid_hex(0x10));
        assert_eq!(below.parent_span_id, Some(sid_hex(0x0f)));
        assert_eq!(below.name, "agent run");
        assert_eq!(below.kind, SpanKind::Subagent);
        assert_eq!(below.started_at, 1_000);
        assert_eq!(below.end, None);
        assert_eq!(below.events, vec![]);
        assert_eq!(
            object(&below.attrs)["logfire.span_type"],
            json!("pending_span")
        );
        assert!(
            !object(&below.attrs).contains_key("logfire.pending_parent_id"),
            "{:?}",
            below.attrs
        );

        for root_parent in [Some("0000000000000000"), None] {
            let root = only_span(vec![pending_span(0x20, 0x10, root_parent, "agent run")]);
            assert_eq!(root.span_id, sid_hex(0x10));
            assert_eq!(root.parent_span_id, None, "{root_parent:?}");
            assert_eq!(root.kind, SpanKind::Turn, "{root_parent:?}");
            assert_eq!(root.name, "agent run");
        }
    }

    #[test]
    fn bad_pending_spans_are_rejected() {
        let mut orphan = pending_span(0x20, 0x10, None, "orphan");
        orphan.parent_span_id = Vec::new();
        let bad_parent = pending_span(0x21, 0x11, Some("xyz"), "bad parent");
        let batch = map(vec![orphan, bad_parent]);
        assert_eq!(batch.spans, vec![]);
        let reasons: Vec<&str> = batch.rejected.iter().map(|r| r.reason.as_str()).collect();
        assert_eq!(
            reasons,
            vec![
                "pending span (logfire.span_type = pending_span) has no parent: the parent is \
                 the span it announces",
                "logfire.pending_parent_id: parent span id \"xyz\" is not 16 hex digits (8 bytes)",
            ]
        );
    }

    #[test]
    fn a_pending_span_delivered_with_its_real_span_is_dropped() {
        let real = span(
            0x10,
            None,
            "agent run",
            vec![kv("logfire.span_type", string("span"))],
        );
        let batch = map(vec![
            pending_span(0x20, 0x10, None, "agent run"),
            pending_span(0x21, 0x11, None, "other run"),
            pending_span(0x22, 0x11, None, "other run again"),
            real,
        ]);
        let spans: Vec<(String, bool)> = batch
            .spans
            .iter()
            .map(|span| (span.name.clone(), span.end.is_some()))
            .collect();
        assert_eq!(
            spans,
            vec![
                ("other run".to_owned(), false),
                ("agent run".to_owned(), true)
            ]
        );
    }

    #[test]
    fn a_huge_name_is_capped_like_an_attribute() {
        let huge = "n".repeat(100_000);
        let mapped = only_span(vec![span(1, None, &huge, vec![])]);
        assert_eq!(
            mapped.name.len(),
            MAX_ATTRIBUTE_VALUE_BYTES + TRUNCATION_MARKER.len()
        );
        assert!(mapped.name.ends_with(TRUNCATION_MARKER));
    }

    #[test]
    fn a_huge_attribute_is_capped() {
        let huge = "x".repeat(100_000);
        let mapped = only_span(vec![span(
            1,
            None,
            "root",
            vec![kv("prompt", string(&huge))],
        )]);
        let Value::String(text) = &object(&mapped.attrs)["prompt"] else {
            panic!("{:?}", object(&mapped.attrs)["prompt"]);
        };
        assert_eq!(
            text.len(),
            MAX_ATTRIBUTE_VALUE_BYTES + TRUNCATION_MARKER.len()
        );
        assert!(text.ends_with(TRUNCATION_MARKER));

        let options = MappingOptions {
            max_attribute_value_bytes: 4,
            ..MappingOptions::default()
        };
        let batch = decoded(map_request(
            request(vec![span(
                1,
                None,
                "root",
                vec![kv("prompt", string("abcdefgh"))],
            )]),
            &options,
        ));
        assert_eq!(
            object(&batch.spans[0].attrs)["prompt"],
            json!(format!("abcd{TRUNCATION_MARKER}"))
        );
    }

    #[test]
    fn session_from_openinference_or_the_conversation_id() {
        let conversation = only_span(vec![span(
            1,
            None,
            "root",
            vec![kv("gen_ai.conversation.id", string("conv-7"))],
        )]);
        assert_eq!(conversation.session_id.as_deref(), Some("conv-7"));
        let both = only_span(vec![span(
            1,
            None,
            "root",
            vec![
                kv("gen_ai.conversation.id", string("conv-7")),
                kv("session.id", string("sess-1")),
            ],
        )]);
        assert_eq!(both.session_id.as_deref(), Some("sess-1"));
        let none = only_span(vec![span(
            1,
            None,
            "root",
            vec![kv("session.id", string(""))],
        )]);
        assert_eq!(none.session_id, None);
    }

    #[test]
    fn session_falls_back_to_the_traceloop_association_property() {
        let traceloop = only_span(vec![span(
            1,
            None,
            "root",
            vec![kv(
                "traceloop.association.properties.session_id",
                string("tl-9"),
            )],
        )]);
        assert_eq!(traceloop.session_id.as_deref(), Some("tl-9"));
        let last = only_span(vec![span(
            1,
            None,
            "root",
            vec![
                kv(
                    "traceloop.association.properties.session_id",
                    string("tl-9"),
                ),
                kv("gen_ai.conversation.id", string("conv-7")),
            ],
        )]);
        assert_eq!(last.session_id.as_deref(), Some("conv-7"));
        // An empty one is no session.
        let empty = only_span(vec![span(
            1,
            None,
            "root",
            vec![kv(
                "traceloop.association.properties.session_id",
                string(" "),
            )],
        )]);
        assert_eq!(empty.session_id, None);
    }

    #[test]
    fn a_langfuse_trace_maps_kinds_usage_and_cost() {
        let agent = span(
            1,
            None,
            "support-agent",
            vec![kv("langfuse.observation.type", string("agent"))],
        );
        let generation = span(
            2,
            Some(1),
            "llm-call",
            vec![
                kv("langfuse.observation.type", string("generation")),
                kv("langfuse.observation.model.name", string("claude-sonnet-4")),
                kv(
                    "langfuse.observation.usage_details",
                    string(r#"{"input":200,"output":50,"cache_read_input_tokens":1500}"#),
                ),
                kv(
                    "langfuse.observation.cost_details",
                    string(r#"{"input":0.002,"output":0.001,"total":0.003}"#),
                ),
                kv("session.id", string("chat-42")),
            ],
        );
        let tool = span(
            3,
            Some(2),
            "lookup",
            vec![kv("langfuse.observation.type", string("tool"))],
        );
        let batch = map(vec![agent, generation, tool]);
        let kinds: Vec<SpanKind> = batch.spans.iter().map(|span| span.kind.clone()).collect();
        assert_eq!(kinds, [SpanKind::Turn, SpanKind::Model, SpanKind::Tool]);
        let generation = &batch.spans[1];
        assert_eq!(
            generation.usage,
            SpanUsage {
                input_tokens: Some(1_700),
                output_tokens: Some(50),
                cache_read_tokens: Some(1_500),
                cache_creation_tokens: None,
                cost_usd: Some(0.003),
                model: Some("claude-sonnet-4".into()),
            }
        );
        assert_eq!(generation.session_id.as_deref(), Some("chat-42"));
        assert_eq!(
            object(&generation.attrs)[COST_SOURCE_KEY],
            json!("reported")
        );
    }

    #[test]
    fn a_vercel_ai_sdk_trace_maps_to_a_turn_with_model_and_tool_spans() {
        let generate_text = span(
            1,
            None,
            "ai.generateText",
            vec![
                kv("ai.operationId", string("ai.generateText")),
                kv("ai.model.id", string("gpt-4o")),
                kv("ai.usage.promptTokens", int(1_000)),
                kv("ai.usage.completionTokens", int(100)),
            ],
        );
        let do_generate = span(
            2,
            Some(1),
            "ai.generateText.doGenerate",
            vec![
                kv("ai.operationId", string("ai.generateText.doGenerate")),
                kv("gen_ai.system", string("openai.chat")),
                kv("gen_ai.request.model", string("gpt-4o")),
                kv("gen_ai.usage.input_tokens", int(1_000)),
                kv("ai.usage.cachedInputTokens", int(600)),
            ],
        );
        let tool_call = span(
            3,
            Some(1),
            "ai.toolCall",
            vec![
                kv("ai.operationId", string("ai.toolCall")),
                kv("ai.toolCall.name", string("weather")),
            ],
        );
        let nested = span(
            4,
            Some(3),
            "ai.streamText",
            vec![kv("ai.operationId", string("ai.streamText"))],
        );
        let batch = map(vec![generate_text, do_generate, tool_call, nested]);
        let kinds: Vec<SpanKind> = batch.spans.iter().map(|span| span.kind.clone()).collect();
        assert_eq!(
            kinds,
            [
                SpanKind::Turn,
                SpanKind::Model,
                SpanKind::Tool,
                SpanKind::Other
            ]
        );
        let root = &batch.spans[0].usage;
        assert_eq!(
            (root.input_tokens, root.output_tokens, root.model.as_deref()),
            (Some(1_000), Some(100), Some("gpt-4o"))
        );
        // The turn's totals are not priced (its calls may be several models, with cache
        // discounts); its model call is, and the run's rollup sums the calls.
        assert_eq!(root.cost_usd, None);
        assert_eq!(batch.spans[1].usage.cache_read_tokens, Some(600));
        assert!(batch.spans[1].usage.cost_usd.is_some());
    }

    #[test]
    fn usage_on_a_non_model_span_is_kept() {
        let agent = only_span(vec![span(
            1,
            None,
            "agent",
            vec![
                kv("gen_ai.operation.name", string("invoke_agent")),
                kv("gen_ai.usage.input_tokens", double(50.0)),
                kv("gen_ai.usage.cost", double(0.01)),
            ],
        )]);
        assert_eq!(agent.kind, SpanKind::Turn);
        assert_eq!(agent.usage.input_tokens, Some(50));
        assert_eq!(agent.usage.cost_usd, Some(0.01));
        assert_eq!(object(&agent.attrs)[COST_SOURCE_KEY], json!("reported"));
        assert!(!object(&agent.attrs).contains_key(PRICE_TABLE_KEY));
    }

    /// A span's first 1,024 events are stored, the rest counted in attrs; event names and
    /// attribute keys are capped like values (an audit stored a 300,000-event span, a 500 KB
    /// key and a 300 KB event name whole).
    #[test]
    fn events_names_and_keys_are_bounded() {
        let mut crowded = span(1, None, "busy", vec![kv(&"k".repeat(20_000), int(1))]);
        crowded.events = (0..1_500)
            .map(|index| span::Event {
                time_unix_nano: 1_000_000 + index,
                name: if index == 0 {
                    "n".repeat(20_000)
                } else {
                    format!("e{index}")
                },
                ..span::Event::default()
            })
            .collect();
        let mapped = only_span(vec![crowded]);
        assert_eq!(mapped.events.len(), MAX_EVENTS_PER_SPAN);
        assert_eq!(mapped.events[1].event_type, "e1");
        assert!(mapped.events[0].event_type.len() < 16_500);
        assert!(mapped.events[0].event_type.ends_with(TRUNCATION_MARKER));
        let attrs = object(&mapped.attrs);
        assert_eq!(
            attrs[DROPPED_EVENTS_KEY],
            json!(1_500 - MAX_EVENTS_PER_SPAN)
        );
        let key = attrs
            .keys()
            .find(|key| key.starts_with("kkk"))
            .expect("the long key, capped");
        assert!(
            key.len() < 16_500 && key.ends_with(TRUNCATION_MARKER),
            "{}",
            key.len()
        );
        // A span within the bound says nothing of dropped events.
        let calm = only_span(vec![span(2, None, "calm", vec![])]);
        assert!(!object(&calm.attrs).contains_key(DROPPED_EVENTS_KEY));
        // Events the exporter dropped were not stored either (an audit: its count was lost).
        let mut thinned = span(3, None, "thinned", vec![]);
        thinned.dropped_events_count = 7;
        assert_eq!(
            object(&only_span(vec![thinned.clone()]).attrs)[DROPPED_EVENTS_KEY],
            json!(7)
        );
        thinned.events = (0..1_030)
            .map(|index| span::Event {
                time_unix_nano: 1_000_000 + index,
                name: format!("e{index}"),
                ..span::Event::default()
            })
            .collect();
        assert_eq!(
            object(&only_span(vec![thinned]).attrs)[DROPPED_EVENTS_KEY],
            json!(13)
        );
    }

    /// A span keeps its first 1,024 links whose ids are a trace's and a span's; the rest, and
    /// the exporter's `droppedLinksCount`, are counted under `flightlog.dropped_links` (an
    /// audit stored 150,000 links, and a 6 MB trace id as 12 MB of hex).
    #[test]
    fn links_are_bounded_and_their_ids_checked() {
        let link = |trace_id: Vec<u8>, span_id: Vec<u8>| span::Link {
            trace_id,
            span_id,
            ..span::Link::default()
        };
        let mut linked = span(1, None, "linked", vec![]);
        linked.links = vec![
            link(vec![7; 6_000], sid(9)),
            link(vec![0; 16], sid(9)),
            link(vec![2; 16], vec![0; 8]),
            link(vec![2; 16], vec![3; 4]),
        ];
        linked
            .links
            .extend((0..1_100).map(|_| link(vec![2; 16], sid(9))));
        linked.dropped_links_count = 2;
        let mapped = only_span(vec![linked]);
        let attrs = object(&mapped.attrs);
        let links = attrs[LINKS_KEY].as_array().expect("the links");
        assert_eq!(links.len(), MAX_LINKS_PER_SPAN);
        assert_eq!(links[0]["traceId"], json!("02".repeat(16)));
        // 4 bad ids, 76 past the bound, 2 the exporter dropped.
        assert_eq!(attrs[DROPPED_LINKS_KEY], json!(4 + 76 + 2));
        // A span with only bad links stores none, and says so.
        let mut bad = span(2, None, "bad", vec![]);
        bad.links = vec![link(vec![1; 3], sid(9))];
        let only_bad = only_span(vec![bad]);
        let attrs = object(&only_bad.attrs);
        assert!(!attrs.contains_key(LINKS_KEY));
        assert_eq!(attrs[DROPPED_LINKS_KEY], json!(1));
        let calm = only_span(vec![span(3, None, "calm", vec![])]);
        assert!(!object(&calm.attrs).contains_key(DROPPED_LINKS_KEY));
    }

    /// The `flightlog.` keys are flightlog's own: a client's are dropped, so a forged price
    /// table version or cost source never passes for the provenance of a cost (an audit).
    #[test]
    fn a_clients_flightlog_keys_are_dropped() {
        let reported = only_span(vec![span(
            1,
            None,
            "agent",
            vec![
                kv("gen_ai.operation.name", string("invoke_agent")),
                kv("gen_ai.usage.cost", double(0.01)),
                kv(PRICE_TABLE_KEY, string("fake-v0")),
                kv("flightlog.anything", string("x")),
                kv("flightlogger", string("kept")),
            ],
        )]);
        let attrs = object(&reported.attrs);
        assert_eq!(attrs[COST_SOURCE_KEY], json!("reported"));
        assert!(!attrs.contains_key(PRICE_TABLE_KEY), "{attrs:?}");
        assert!(!attrs.contains_key("flightlog.anything"), "{attrs:?}");
        assert_eq!(attrs["flightlogger"], json!("kept"));
        let unpriced = only_span(vec![span(
            1,
            None,
            "tool",
            vec![
                kv(COST_SOURCE_KEY, string("reported")),
                kv(PRICE_TABLE_KEY, string("fake")),
                kv(REMOTE_PARENT_KEY, string("0102030405060708")),
            ],
        )]);
        let attrs = object(&unpriced.attrs);
        for key in [COST_SOURCE_KEY, PRICE_TABLE_KEY, REMOTE_PARENT_KEY] {
            assert!(!attrs.contains_key(key), "{key}: {attrs:?}");
        }
    }

    /// An agent's span that reports its calls' token totals and a model: priced as one call of
    /// that model, the totals cost $0.00795 where the calls (on a cheaper model, with cache
    /// discounts) cost far less, and the rollup took that price over the calls' sum (an audit,
    /// with opentelemetry-util-genai's `invoke_agent`). An agent's span is not priced; a model
    /// call is, and a reported cost is kept on either.
    #[test]
    fn an_agents_token_totals_are_not_priced_from_the_table() {
        let totals = vec![
            kv("gen_ai.operation.name", string("invoke_agent")),
            kv("gen_ai.request.model", string("gpt-4o")),
            kv("gen_ai.usage.input_tokens", int(2_700)),
            kv("gen_ai.usage.output_tokens", int(120)),
        ];
        let batch = map(vec![
            span(1, None, "agent", totals.clone()),
            span(2, Some(1), "subagent", totals),
            span(
                3,
                Some(2),
                "chat",
                vec![
                    kv("gen_ai.operation.name", string("chat")),
                    kv("gen_ai.request.model", string("gpt-4o-mini")),
                    kv("gen_ai.usage.input_tokens", int(1_200)),
                    kv("gen_ai.usage.output_tokens", int(60)),
                ],
            ),
        ]);
        let kinds: Vec<SpanKind> = batch.spans.iter().map(|span| span.kind.clone()).collect();
        assert_eq!(kinds, [SpanKind::Turn, SpanKind::Subagent, SpanKind::Model]);
        for agent in &batch.spans[..2] {
            assert_eq!(agent.usage.input_tokens, Some(2_700));
            assert_eq!(agent.usage.model.as_deref(), Some("gpt-4o"));
            assert_eq!(agent.usage.cost_usd, None);
            assert!(!object(&agent.attrs).contains_key(COST_SOURCE_KEY));
        }
        assert!(batch.spans[2].usage.cost_usd.is_some());
        assert_eq!(
            object(&batch.spans[2].attrs)[COST_SOURCE_KEY],
            json!("price_table")
        );
    }

    /// A model span's call id comes from `gen_ai.response.id` (else the Vercel AI SDK's
    /// `ai.response.id`); a blank or implausibly long one is none, and only model spans keep it.
    #[test]
    fn a_model_spans_call_id_is_its_response_id() {
        let model = |id: u8, attributes: Vec<KeyValue>| {
            let mut attributes = attributes;
            attributes.push(kv("gen_ai.operation.name", string("chat")));
            span(id, Some(1), "chat", attributes)
        };
        let batch = map(vec![
            span(
                1,
                None,
                "agent",
                vec![
                    kv("gen_ai.operation.name", string("invoke_agent")),
                    kv("gen_ai.response.id", string("not-a-call")),
                ],
            ),
            model(2, vec![kv("gen_ai.response.id", string(" msg_01 "))]),
            model(3, vec![kv("ai.response.id", string("resp-7"))]),
            model(4, vec![kv("gen_ai.response.id", string("  "))]),
            model(5, vec![kv("gen_ai.response.id", string(&"x".repeat(300)))]),
        ]);
        let call_ids: Vec<Option<&str>> = batch
            .spans
            .iter()
            .map(|span| span.call_id.as_deref())
            .collect();
        assert_eq!(call_ids, [None, Some("msg_01"), Some("resp-7"), None, None]);
    }

    /// The Vercel AI SDK's embedding calls: `model` spans whose `ai.usage.tokens` are input
    /// tokens, priced from the table; the session from its telemetry metadata.
    #[test]
    fn a_vercel_embedding_call_is_a_priced_model_span() {
        let batch = map(vec![
            span(
                1,
                None,
                "ai.embedMany",
                vec![
                    kv("ai.operationId", string("ai.embedMany")),
                    kv("ai.usage.tokens", int(8)),
                    kv("ai.telemetry.metadata.sessionId", string("chat-7")),
                ],
            ),
            span(
                2,
                Some(1),
                "ai.embedMany.doEmbed",
                vec![
                    kv("ai.operationId", string("ai.embedMany.doEmbed")),
                    kv("ai.model.id", string("text-embedding-3-small")),
                    kv("ai.usage.tokens", int(8)),
                ],
            ),
        ]);
        assert_eq!(batch.spans[0].kind, SpanKind::Turn);
        assert_eq!(batch.spans[0].session_id.as_deref(), Some("chat-7"));
        let call = &batch.spans[1];
        assert_eq!(call.kind, SpanKind::Model);
        assert_eq!(call.usage.input_tokens, Some(8));
        assert!(
            call.usage.cost_usd.is_some_and(|cost| cost > 0.0),
            "{:?}",
            call.usage
        );
        assert_eq!(object(&call.attrs)[COST_SOURCE_KEY], json!("price_table"));
    }

    /// OpenInference keeps the call id only in its JSON output (`output.value`): read from
    /// there for its model spans, after any id attribute, and never from text output, another
    /// instrumentation's output, a nested `id` or a non-string one.
    #[test]
    fn an_openinference_model_spans_call_id_comes_from_its_json_output() {
        let model = |id: u8, attributes: Vec<KeyValue>| {
            let mut attributes = attributes;
            attributes.push(kv("llm.model_name", string("gpt-4o")));
            span(id, Some(1), "Response", attributes)
        };
        let llm = || kv("openinference.span.kind", string("LLM"));
        let json_output = |text: &str| {
            vec![
                llm(),
                kv("output.mime_type", string("application/json")),
                kv("output.value", string(text)),
            ]
        };
        let batch = map(vec![
            span(
                1,
                None,
                "agent",
                vec![kv("openinference.span.kind", string("AGENT"))],
            ),
            model(
                2,
                json_output(r#"{"object":"response","output":[{"id":"msg_x"}],"id":"resp_01"}"#),
            ),
            model(3, {
                let mut attributes = json_output(r#"{"id":"resp_02"}"#);
                attributes.push(kv("gen_ai.response.id", string("resp_attr")));
                attributes
            }),
            model(
                4,
                vec![
                    llm(),
                    kv("output.mime_type", string("text/plain")),
                    kv("output.value", string(r#"{"id":"resp_03"}"#)),
                ],
            ),
            model(5, json_output(r#"{"data":{"id":"nested"}}"#)),
            model(6, json_output(r#"{"id":42}"#)),
            model(7, json_output("not json")),
            span(
                8,
                Some(1),
                "chat",
                vec![
                    kv("gen_ai.operation.name", string("chat")),
                    kv("output.mime_type", string("application/json")),
                    kv("output.value", string(r#"{"id":"not-openinference"}"#)),
                ],
            ),
        ]);
        let call_ids: Vec<Option<&str>> = batch
            .spans
            .iter()
            .map(|span| span.call_id.as_deref())
            .collect();
        assert_eq!(
            call_ids,
            [
                None,
                Some("resp_01"),
                Some("resp_attr"),
                None,
                None,
                None,
                None,
                None
            ]
        );
    }

    #[test]
    fn spans_of_several_resources_and_scopes_keep_their_own_context() {
        let mut two = request(vec![span(1, None, "first", vec![])]);
        let mut second = two.resource_spans[0].clone();
        second.resource = None;
        second.scope_spans[0].scope = None;
        second.scope_spans[0].spans = vec![span(2, Some(1), "second", vec![])];
        two.resource_spans.push(second);
        let batch = decoded(map_request(two, &MappingOptions::default()));
        assert_eq!(batch.spans.len(), 2);
        assert_eq!(
            object(&batch.spans[0].attrs)["resource"],
            json!({"service.name": "svc"})
        );
        assert!(!object(&batch.spans[1].attrs).contains_key("resource"));
        assert!(!object(&batch.spans[1].attrs).contains_key("scope"));
    }

    #[test]
    fn empty_event_names_and_times_get_defaults() {
        let mut with_event = span(1, None, "root", vec![]);
        with_event.events = vec![span::Event::default()];
        let mapped = only_span(vec![with_event]);
        assert_eq!(
            mapped.events,
            vec![ImportedEvent {
                ts: 1_000,
                event_type: "event".into(),
                payload: json!({}),
            }]
        );
    }

    #[test]
    fn our_keys_replace_span_attributes_of_the_same_name() {
        let attributes: Vec<KeyValue> = vec![kv("resource", string("mine"))];
        let mapped = only_span(vec![span(1, None, "root", attributes)]);
        assert_eq!(
            object(&mapped.attrs)["resource"],
            json!({"service.name": "svc"})
        );
    }
}
