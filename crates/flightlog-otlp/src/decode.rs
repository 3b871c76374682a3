//! An OTLP/HTTP request body into an `ExportTraceServiceRequest`: content type, bounded gzip
//! inflation, and protobuf or OTLP/JSON decoding with the traps of the JSON form closed.
//!
//! OTLP/JSON is not the protobuf canonical JSON mapping, and opentelemetry-proto's serde
//! support (0.33.1) is stricter or more lenient than the OpenTelemetry Collector, whose
//! receiver is what exporters are written against:
//! - snake_case keys (`trace_id`, `resource_spans`, the protobuf field names) would be ignored
//!   as unknown fields, so a span would lose its ids, times or parent without an error. The
//!   Collector reads them as the lowerCamelCase keys, and so does this decoder (an object
//!   holding both spellings of one field is refused as ambiguous).
//! - enums (span kind, status code) may be numbers, as OTLP/JSON writes them, or the enum's
//!   value names (`SPAN_KIND_SERVER`, `STATUS_CODE_ERROR`), as the protobuf JSON mapping and
//!   the Collector accept them; another string is refused, naming its path.
//! - ids must be hex (not base64, the canonical protobuf JSON form): a non-hex id refuses the
//!   body with its JSON path instead of the library's bare hex error.
//! - 64-bit integers may arrive as strings or numbers: the library accepts both (tested here);
//!   so may the 32-bit ones (`flags`, the dropped counts), which the library reads as numbers
//!   only.
//! - `null` for a field means its default, as the mapping says (the library refused it for
//!   most fields): such members are dropped before decoding.
//! - `bytesValue` may be standard or URL-safe base64, with or without padding (the mapping's
//!   rule); the library reads only the padded standard form.
//! - an `AnyValue` holding two of its oneof's members is refused (the library kept the last),
//!   and an `intValue` that is no integer is refused with its path and what to give.
//!
//! Id *lengths* are checked per span by the mapping, which rejects just that span.

use std::io::Read;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig, STANDARD};
use base64::engine::DecodePaddingMode;
use base64::Engine as _;
use flate2::bufread::{DeflateDecoder, ZlibDecoder};
use flate2::read::MultiGzDecoder;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use serde_json::Value;

pub use crate::decoded_size::ExportSchema;
use crate::error::OtlpError;

/// The two OTLP/HTTP encodings; a response is sent in the request's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OtlpEncoding {
    /// Binary protobuf (`application/x-protobuf`).
    Protobuf,
    /// OTLP/JSON (`application/json`).
    Json,
}

impl OtlpEncoding {
    /// The `Content-Type` of a body in this encoding.
    pub fn content_type(self) -> &'static str {
        match self {
            Self::Protobuf => "application/x-protobuf",
            Self::Json => "application/json",
        }
    }

    /// The encoding a `Content-Type` header names; parameters (`; charset=utf-8`) and case are
    /// ignored. `None` for anything that is not an OTLP encoding.
    pub fn from_content_type(content_type: &str) -> Option<Self> {
        let essence = content_type
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase();
        match essence.as_str() {
            "application/x-protobuf" | "application/protobuf" => Some(Self::Protobuf),
            "application/json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// Decode an OTLP/HTTP trace export body.
///
/// `max_decompressed` bounds the body after inflation (and an uncompressed body too): a larger
/// one is refused with [`OtlpError::TooLarge`], and a gzip or deflate stream is never inflated
/// past it.
/// Both headers are checked before the body is touched.
pub fn decode_request(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decompressed: usize,
) -> Result<(ExportTraceServiceRequest, OtlpEncoding), OtlpError> {
    read_body(
        content_type,
        content_encoding,
        body,
        max_decompressed,
        ExportSchema::Traces,
        |body, encoding| {
            let request = match encoding {
                OtlpEncoding::Protobuf => ExportTraceServiceRequest::decode(body)
                    .map_err(|error| OtlpError::malformed(format!("invalid protobuf: {error}")))?,
                OtlpEncoding::Json => decode_json(body)?,
            };
            crate::decoded_size::check_copied_attributes(&request)?;
            Ok(request)
        },
    )
}

/// The steps every OTLP/HTTP body takes (traces, metrics, logs): its encoding from
/// `Content-Type`, its `Content-Encoding` inflated within `max_decompressed`, its decoded size
/// checked (walked along `schema`; see `decoded_size`), then `decode`
/// on the plain bytes.
pub(crate) fn read_body<T>(
    content_type: Option<&str>,
    content_encoding: Option<&str>,
    body: &[u8],
    max_decompressed: usize,
    schema: ExportSchema,
    decode: impl FnOnce(&[u8], OtlpEncoding) -> Result<T, OtlpError>,
) -> Result<(T, OtlpEncoding), OtlpError> {
    let encoding = content_type
        .and_then(OtlpEncoding::from_content_type)
        .ok_or_else(|| OtlpError::UnsupportedContentType {
            content_type: content_type.unwrap_or_default().to_owned(),
        })?;
    let compression = match content_encoding.map(|value| value.trim().to_ascii_lowercase()) {
        None => None,
        Some(value) if value.is_empty() || value == "identity" => None,
        Some(value) if value == "gzip" || value == "x-gzip" => Some(Compression::Gzip),
        Some(value) if value == "deflate" => Some(Compression::Deflate),
        Some(_) => {
            return Err(OtlpError::UnsupportedContentEncoding {
                content_encoding: content_encoding.unwrap_or_default().to_owned(),
            })
        }
    };
    let inflated;
    let body = match compression {
        Some(Compression::Gzip) => {
            inflated = gunzip_bounded(body, max_decompressed)?;
            inflated.as_bytes()
        }
        Some(Compression::Deflate) => {
            inflated = deflate_bounded(body, max_decompressed)?;
            inflated.as_bytes()
        }
        None => {
            if body.len() > max_decompressed {
                return Err(OtlpError::TooLarge {
                    limit: max_decompressed,
                });
            }
            body
        }
    };
    crate::decoded_size::check_decoded_size(body, encoding, schema)?;
    Ok((decode(body, encoding)?, encoding))
}

/// The length-prefixed messages of a gRPC request body, each with its flag (1: compressed), up
/// to the first one cut short.
pub fn grpc_frames(body: &[u8]) -> impl Iterator<Item = (u8, &[u8])> {
    let mut rest = body;
    std::iter::from_fn(move || {
        let (&flag, length) = (rest.first()?, rest.get(1..5)?);
        let length = u32::from_be_bytes([length[0], length[1], length[2], length[3]]) as usize;
        let message = rest.get(5..5usize.checked_add(length)?)?;
        rest = &rest[5 + length..];
        Some((flag, message))
    })
}

/// Check the messages of a gRPC request body (its length-prefixed frames) before tonic decodes
/// them, as an OTLP/HTTP body is checked (see `decoded_size`): a frame flagged compressed is
/// inflated first when the call's `grpc-encoding` is gzip or deflate, within `max_decompressed`
/// ([`OtlpError::TooLarge`] past it, as an OTLP/HTTP body). The messages are walked along
/// `schema`. What cannot be checked (a frame cut short, a message that does not inflate,
/// another compression) passes: tonic refuses it itself.
pub fn check_grpc_messages(
    body: &[u8],
    grpc_encoding: Option<&str>,
    schema: ExportSchema,
    max_decompressed: usize,
) -> Result<GrpcMessages, OtlpError> {
    let mut found = GrpcMessages::default();
    for (flag, message) in grpc_frames(body) {
        found.count += 1;
        let inflated;
        let compression = match grpc_encoding.map(str::trim) {
            Some(encoding) if encoding.eq_ignore_ascii_case("gzip") => Some(GrpcCompression::Gzip),
            Some(encoding) if encoding.eq_ignore_ascii_case("deflate") => {
                Some(GrpcCompression::Deflate)
            }
            _ => None,
        };
        let message = match (flag, compression) {
            (0, _) => message,
            (_, Some(compression)) => {
                match inflate_one_stream(message, max_decompressed, compression) {
                    Ok(OneMember::Followed { rest }) => {
                        let bytes = if rest == 1 { "byte" } else { "bytes" };
                        let (name, unit) = match compression {
                            GrpcCompression::Gzip => ("gzip", "gzip member"),
                            GrpcCompression::Deflate => ("deflate", "zlib stream"),
                        };
                        return Err(OtlpError::malformed(format!(
                            "the {name}-compressed message has {rest} {bytes} after its first \
                             {unit}, which gRPC's decompression does not read: compress each \
                             message as one {unit}; nothing was stored"
                        )));
                    }
                    Ok(OneMember::Alone(plain)) => {
                        inflated = plain;
                        found.inflated_bytes = found
                            .inflated_bytes
                            .saturating_add(inflated.as_bytes().len());
                        inflated.as_bytes()
                    }
                    Err(error @ OtlpError::TooLarge { .. }) => return Err(error),
                    Err(_) => return Ok(found),
                }
            }
            _ => return Ok(found),
        };
        crate::decoded_size::check_decoded_size(message, OtlpEncoding::Protobuf, schema)?;
    }
    Ok(found)
}

/// What [`check_grpc_messages`] found in a gRPC request body.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GrpcMessages {
    /// How many messages the body holds (an export is unary: one).
    pub count: usize,
    /// What its compressed messages inflate to, in all (0 when none is compressed): what a
    /// server sets memory aside for beside the body before tonic inflates them again.
    pub inflated_bytes: usize,
}

/// The `grpc-encoding`s a message may come in (besides `identity`), as the gRPC listener
/// accepts them: gzip, which every OTLP exporter offers, and deflate, the OpenTelemetry Python
/// gRPC exporter's other choice (`Compression.Deflate`, `OTEL_EXPORTER_OTLP_COMPRESSION=deflate`:
/// refused `UNIMPLEMENTED`, which that exporter does not retry, it lost every span).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GrpcCompression {
    Gzip,
    /// gRPC's `deflate` is the zlib format (RFC 1950), as tonic and grpc-core read it.
    Deflate,
}

/// A gRPC message's first gzip member (or zlib stream), inflated as tonic inflates it, or how
/// many bytes follow it (see [`inflate_one_stream`]).
enum OneMember {
    Alone(Inflated),
    Followed { rest: usize },
}

/// Inflate a compressed gRPC message as tonic inflates it, one gzip member or zlib stream,
/// within `limit`, telling when bytes follow it: tonic reads the first and drops the rest, so a
/// message of two gzip members (a valid gzip stream, which an OTLP/HTTP body may be) was
/// answered OK with the second member's spans lost, and one with bytes of garbage after its
/// member was taken where an OTLP/HTTP body is refused (an audit's finding).
fn inflate_one_stream(
    message: &[u8],
    limit: usize,
    compression: GrpcCompression,
) -> Result<OneMember, OtlpError> {
    let (inflated, rest) = match compression {
        GrpcCompression::Gzip => {
            let mut decoder = flate2::bufread::GzDecoder::new(message);
            let inflated = inflate_bounded(&mut decoder, limit, message.len(), "gzip")?;
            (inflated, decoder.get_ref().len())
        }
        GrpcCompression::Deflate => {
            let mut decoder = ZlibDecoder::new(message);
            let inflated = inflate_bounded(&mut decoder, limit, message.len(), "deflate")?;
            (inflated, decoder.get_ref().len())
        }
    };
    if rest > 0 && inflated.as_bytes().len() <= limit {
        return Ok(OneMember::Followed { rest });
    }
    Ok(OneMember::Alone(inflated))
}

/// The `Content-Encoding`s a body may come in (besides none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    /// `gzip` (and `x-gzip`): what every OTLP SDK offers.
    Gzip,
    /// `deflate`: the OpenTelemetry Python exporter's other choice
    /// (`OTEL_EXPORTER_OTLP_COMPRESSION=deflate`), which the Collector reads too.
    Deflate,
}

/// Inflate a gzip body (concatenated members too), reading at most `limit + 1` bytes of output:
/// the extra byte tells "exactly at the limit" from "over it" without inflating the rest.
fn gunzip_bounded(body: &[u8], limit: usize) -> Result<Inflated, OtlpError> {
    inflate_bounded(MultiGzDecoder::new(body), limit, body.len(), "gzip")
}

/// Inflate a `deflate` body within the same bound. HTTP's `deflate` is the zlib format (RFC
/// 1950), which is what exporters send; some clients send a raw deflate stream (RFC 1951)
/// under that name, so a body without a zlib header is read as one. Bytes after the end of the
/// compressed stream refuse the body, as they do a gzip body's.
fn deflate_bounded(body: &[u8], limit: usize) -> Result<Inflated, OtlpError> {
    let zlib_header = matches!(body, [method, flags, ..]
        if method & 0x0f == 8 && (u16::from(*method) << 8 | u16::from(*flags)) % 31 == 0);
    let (inflated, rest) = if zlib_header {
        let mut decoder = ZlibDecoder::new(body);
        let inflated = inflate_bounded(&mut decoder, limit, body.len(), "deflate")?;
        (inflated, decoder.get_ref().len())
    } else {
        let mut decoder = DeflateDecoder::new(body);
        let inflated = inflate_bounded(&mut decoder, limit, body.len(), "deflate")?;
        (inflated, decoder.get_ref().len())
    };
    if rest > 0 {
        return Err(OtlpError::malformed(format!(
            "invalid deflate body: {rest} bytes after the end of the compressed stream"
        )));
    }
    Ok(inflated)
}

/// What a compressed body (`content_encoding` gzip, x-gzip or deflate, as [`decode_request`]
/// takes them) inflates to, counted by inflating it into nothing, at most `limit` (a body that
/// inflates past it is refused by the decoder anyway): what a server sets memory aside for
/// before the body is decoded. A gzip body's own trailer (`ISIZE`) cannot be trusted for it:
/// a body may end with an empty member that says 0, and deflate says nothing at all. `None`
/// for a body that is not compressed, or does not inflate (its decoding reports why).
pub fn inflated_len(content_encoding: Option<&str>, body: &[u8], limit: usize) -> Option<usize> {
    let encoding = content_encoding?.trim().to_ascii_lowercase();
    let most = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let counted = match encoding.as_str() {
        "gzip" | "x-gzip" => std::io::copy(
            &mut MultiGzDecoder::new(body).take(most),
            &mut std::io::sink(),
        ),
        "deflate" => {
            let zlib_header = matches!(body, [method, flags, ..]
                if method & 0x0f == 8 && (u16::from(*method) << 8 | u16::from(*flags)) % 31 == 0);
            if zlib_header {
                std::io::copy(&mut ZlibDecoder::new(body).take(most), &mut std::io::sink())
            } else {
                std::io::copy(
                    &mut DeflateDecoder::new(body).take(most),
                    &mut std::io::sink(),
                )
            }
        }
        _ => return None,
    };
    let counted = usize::try_from(counted.ok()?).unwrap_or(usize::MAX);
    Some(counted.min(limit))
}

/// Inflated bodies up to this size stay in the allocator's memory, which it reuses.
const HEAP_INFLATE_BYTES: usize = 4 << 20;

/// An inflated body: in the allocator's memory when small, else in an anonymous mapping.
///
/// A freed multi-megabyte block stays resident in the allocator until it allocates again in
/// the same place: after four concurrent gzip bombs (each inflated to the 64 MiB limit through a
/// doubling buffer) the server kept about 450 MiB resident while idle. The mapping is reserved
/// at the limit's size (address space only: pages become resident as they are written, so no
/// buffer is ever copied to grow) and unmapped when the request is done, which gives its
/// memory back to the OS at once.
#[derive(Debug)]
pub(crate) enum Inflated {
    Heap(Vec<u8>),
    Mapped { map: memmap2::MmapMut, len: usize },
}

impl Inflated {
    pub(crate) fn as_bytes(&self) -> &[u8] {
        match self {
            Inflated::Heap(bytes) => bytes,
            Inflated::Mapped { map, len } => map.get(..*len).unwrap_or_default(),
        }
    }
}

impl PartialEq<Vec<u8>> for Inflated {
    fn eq(&self, other: &Vec<u8>) -> bool {
        self.as_bytes() == other.as_slice()
    }
}

/// Read `decoder`'s output (a `format` body) up to `limit + 1` bytes (see [`gunzip_bounded`]).
fn inflate_bounded(
    decoder: impl Read,
    limit: usize,
    size_hint: usize,
    format: &str,
) -> Result<Inflated, OtlpError> {
    let invalid =
        |error: std::io::Error| OtlpError::malformed(format!("invalid {format} body: {error}"));
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let mut decoder = decoder.take(cap);
    let heap_part = limit.min(HEAP_INFLATE_BYTES);
    let mut inflated = Vec::with_capacity(size_hint.saturating_mul(4).min(heap_part));
    (&mut decoder)
        .take(heap_part as u64)
        .read_to_end(&mut inflated)
        .map_err(invalid)?;
    if inflated.len() < heap_part {
        return Ok(Inflated::Heap(inflated));
    }
    // More is coming, or the body ends exactly here: go on in a mapping of the whole bound.
    let mut map = memmap2::MmapMut::map_anon(limit.saturating_add(1)).map_err(|error| {
        OtlpError::malformed(format!(
            "cannot reserve memory to inflate the body: {error}"
        ))
    })?;
    let mut len = inflated.len();
    map[..len].copy_from_slice(&inflated);
    drop(inflated);
    while let Some(rest) = map.get_mut(len..).filter(|rest| !rest.is_empty()) {
        match decoder.read(rest) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(invalid(error)),
        }
    }
    if len > limit {
        return Err(OtlpError::TooLarge { limit });
    }
    Ok(Inflated::Mapped { map, len })
}

/// Decode an OTLP/JSON body. An empty request (`{}`, `{"resourceSpans": []}`, resources or
/// scopes without spans) is valid: the OTLP specification has the server answer it with
/// success. A top-level object with none of the request's keys (`{"resourceLogs": …}`, a
/// body in another form) is refused instead of being read as an empty request.
fn decode_json(body: &[u8]) -> Result<ExportTraceServiceRequest, OtlpError> {
    // Said as such: the parser's "EOF while parsing a value at line 1 column 0" and "expected
    // value at line 1 column 1" leave the client looking at a body that seems fine.
    if body
        .iter()
        .all(|byte| matches!(byte, b' ' | b'\t' | b'\n' | b'\r'))
    {
        return Err(OtlpError::malformed(
            "the body is empty: an OTLP/JSON body is an ExportTraceServiceRequest object ({} \
             for no spans)",
        ));
    }
    if body.starts_with(&[0xEF, 0xBB, 0xBF]) {
        return Err(OtlpError::malformed(
            "the body starts with a UTF-8 byte-order mark (EF BB BF), which JSON sent over the \
             network must not have; send the text without it",
        ));
    }
    // The form exporters send is read straight into the message types; anything else (and
    // every error) goes the general way below, which says what is wrong.
    if let Some(request) = crate::json_direct::read(body) {
        return Ok(request);
    }
    let decoded = decode_json_general(body);
    if decoded.is_err() {
        // Half a character (a lone UTF-16 surrogate escape, which JavaScript's JSON.stringify
        // writes for an emoji cut in two) is read as the replacement character, as the
        // protobuf form of the same span is: refused, the exporter dropped its whole batch.
        if let Some(mended) = flightlog_core::json_text::replace_lone_surrogate_escapes(body) {
            if let Some(request) = crate::json_direct::read(&mended) {
                return Ok(request);
            }
            return decode_json_general(&mended);
        }
    }
    decoded
}

/// [`decode_json`] through a `serde_json::Value`: every form the Collector reads, and the error
/// messages (see the module's comment).
pub(crate) fn decode_json_general(body: &[u8]) -> Result<ExportTraceServiceRequest, OtlpError> {
    let mut value = parse_json_as_written(body)?;
    if check_json(&value, &mut Vec::new())? == Spelling::NeedsCanonicalForm {
        canonicalize(&mut value);
    }
    // (serde would read a struct from an array too: `[]` is no request.)
    let Value::Object(request) = &value else {
        return Err(OtlpError::malformed(
            "an OTLP/JSON body is a JSON object (an ExportTraceServiceRequest)",
        ));
    };
    if !request.is_empty() && !request.contains_key("resourceSpans") {
        let keys: Vec<&str> = request.keys().map(String::as_str).take(5).collect();
        return Err(OtlpError::malformed(format!(
            "not an ExportTraceServiceRequest: no `resourceSpans` among its keys {keys:?} \
             (OTLP/JSON keys are lowerCamelCase: resourceSpans, scopeSpans, spans)"
        )));
    }
    let mut non_finite = false;
    normalize_any_values(&mut value, &mut non_finite);
    let mut request: ExportTraceServiceRequest =
        serde_path_to_error::deserialize(value).map_err(|error| {
            let path = error.path().to_string();
            OtlpError::malformed(format!(
                "{}: {}",
                flightlog_core::json_text::echoed(&path),
                error.inner()
            ))
        })?;
    if non_finite {
        restore_non_finite_doubles(&mut request);
    }
    Ok(request)
}

/// What [`normalize_any_values`] writes as the `stringValue` of a non-finite `doubleValue` (which
/// opentelemetry-proto's serde derive cannot read), for [`restore_non_finite_doubles`] to make a
/// double again. A client's `stringValue` that begins with it gets it once more in front, taken
/// off again after decoding, so no text a client sends is ever read as a double (an audit's
/// finding: with a real non-finite double beside it, such a string became one).
const NON_FINITE_MARK: &str = "\u{0}flightlog-non-finite-double:";

/// The non-finite doubles [`normalize_any_values`] carried through decoding as marked strings,
/// made doubles again in every attribute of the request (resources, scopes, spans, events,
/// links, and inside arrays and key-value lists), so an OTLP/JSON export maps exactly as the
/// same export in protobuf does: read as the string `"Infinity"`, a non-finite `logfire.msg`
/// named its span, a `session.id` or a model name was taken, and an `openinference.span.kind`
/// made the span `other` (an audit's finding, by sending the same exports both ways).
fn restore_non_finite_doubles(request: &mut ExportTraceServiceRequest) {
    use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue, KeyValue};
    fn restore_value(value: &mut AnyValue) {
        match &mut value.value {
            Some(any_value::Value::StringValue(text)) => {
                let Some(marked) = text.strip_prefix(NON_FINITE_MARK) else {
                    return;
                };
                value.value = Some(match marked {
                    "NaN" => any_value::Value::DoubleValue(f64::NAN),
                    "Infinity" => any_value::Value::DoubleValue(f64::INFINITY),
                    "-Infinity" => any_value::Value::DoubleValue(f64::NEG_INFINITY),
                    // A client's own string that began with the mark, escaped by another.
                    other => any_value::Value::StringValue(other.to_owned()),
                });
            }
            Some(any_value::Value::ArrayValue(array)) => {
                array.values.iter_mut().for_each(restore_value);
            }
            Some(any_value::Value::KvlistValue(list)) => restore(&mut list.values),
            _ => {}
        }
    }
    fn restore(attributes: &mut [KeyValue]) {
        for pair in attributes {
            if let Some(value) = pair.value.as_mut() {
                restore_value(value);
            }
        }
    }
    for resource_spans in &mut request.resource_spans {
        if let Some(resource) = resource_spans.resource.as_mut() {
            restore(&mut resource.attributes);
        }
        for scope_spans in &mut resource_spans.scope_spans {
            if let Some(scope) = scope_spans.scope.as_mut() {
                restore(&mut scope.attributes);
            }
            for span in &mut scope_spans.spans {
                restore(&mut span.attributes);
                for event in &mut span.events {
                    restore(&mut event.attributes);
                }
                for link in &mut span.links {
                    restore(&mut link.attributes);
                }
            }
        }
    }
}

/// `body` parsed into a `serde_json::Value` exactly as written: serde_json's private raw-value
/// key is a key like any other (an unknown field, ignored as the Collector ignores it), not
/// JSON text to read from its string, which hid text from the decoded-size scan (see
/// `flightlog_core::json_as_written`).
pub(crate) fn parse_json_as_written(body: &[u8]) -> Result<Value, OtlpError> {
    flightlog_core::json_as_written::from_slice(body)
        .map_err(|error| OtlpError::malformed(format!("invalid JSON: {error}")))
}

/// OTLP field names that contain an underscore, in their protobuf (snake_case) spelling, which
/// the Collector reads as the lowerCamelCase key OTLP/JSON writes.
const SNAKE_CASE_FIELDS: &[&str] = &[
    "resource_spans",
    "scope_spans",
    "schema_url",
    "trace_id",
    "span_id",
    "parent_span_id",
    "trace_state",
    "start_time_unix_nano",
    "end_time_unix_nano",
    "time_unix_nano",
    "dropped_attributes_count",
    "dropped_events_count",
    "dropped_links_count",
    "string_value",
    "bool_value",
    "int_value",
    "double_value",
    "array_value",
    "kvlist_value",
    "bytes_value",
    "entity_refs",
    "id_keys",
    "description_keys",
    "key_strindex",
    "string_value_strindex",
];

/// JSON keys holding ids, which OTLP/JSON spells in hex.
const ID_FIELDS: &[&str] = &["traceId", "spanId", "parentSpanId"];

/// The 32-bit integer fields of a trace export, which the mapping also takes as strings.
const U32_FIELDS: &[&str] = &[
    "flags",
    "droppedAttributesCount",
    "droppedEventsCount",
    "droppedLinksCount",
];

/// The members of `AnyValue`'s oneof: an object holding one of them is an `AnyValue`.
const ANY_VALUE_KEYS: &[&str] = &[
    "stringValue",
    "boolValue",
    "intValue",
    "doubleValue",
    "arrayValue",
    "kvlistValue",
    "bytesValue",
];

/// Base64 as the protobuf JSON mapping reads `bytes`: padding optional (the URL-safe alphabet
/// is tried too, see [`lenient_base64`]).
const BASE64_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const BASE64_URL_ANY_PADDING: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A `bytesValue` in any form the mapping allows: standard or URL-safe alphabet, with or
/// without padding.
fn lenient_base64(text: &str) -> Option<Vec<u8>> {
    BASE64_ANY_PADDING
        .decode(text)
        .or_else(|_| BASE64_URL_ANY_PADDING.decode(text))
        .ok()
}

/// What kind of JSON value a value is, for messages.
fn json_kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// One step of a JSON path, for error messages.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn path_text(path: &[Step<'_>], last: &str) -> String {
    let mut text = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            Step::Index(index) => {
                text.push('[');
                text.push_str(&index.to_string());
                text.push(']');
            }
        }
    }
    if !text.is_empty() {
        text.push('.');
    }
    text.push_str(last);
    text
}

/// The span kinds by their protobuf value names (`Span.kind`).
pub(crate) const SPAN_KIND_NAMES: [(&str, i64); 6] = [
    ("SPAN_KIND_UNSPECIFIED", 0),
    ("SPAN_KIND_INTERNAL", 1),
    ("SPAN_KIND_SERVER", 2),
    ("SPAN_KIND_CLIENT", 3),
    ("SPAN_KIND_PRODUCER", 4),
    ("SPAN_KIND_CONSUMER", 5),
];
/// The status codes by their protobuf value names (`Status.code`).
pub(crate) const STATUS_CODE_NAMES: [(&str, i64); 3] = [
    ("STATUS_CODE_UNSET", 0),
    ("STATUS_CODE_OK", 1),
    ("STATUS_CODE_ERROR", 2),
];

/// The enum whose value names the key `key` takes: `kind` is only a span's and `code` only a
/// status's in a trace export (attribute keys are values of `key` fields, never JSON keys).
fn enum_names(key: &str) -> Option<&'static [(&'static str, i64)]> {
    match key {
        "kind" => Some(&SPAN_KIND_NAMES),
        "code" => Some(&STATUS_CODE_NAMES),
        _ => None,
    }
}

/// Whether a body is already in the form opentelemetry-proto reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    Canonical,
    /// snake_case keys or enum value names: [`canonicalize`] it.
    NeedsCanonicalForm,
}

/// Check the body for what cannot be read however it is spelt: a field spelt both ways in
/// one object, an enum string that names no value, a non-hex id. Says whether the body needs
/// [`canonicalize`]. The recursion is bounded by serde_json's own nesting limit (128), which
/// the body has already passed.
fn check_json<'a>(value: &'a Value, path: &mut Vec<Step<'a>>) -> Result<Spelling, OtlpError> {
    let mut spelling = Spelling::Canonical;
    match value {
        Value::Object(object) => {
            // The oneof's members as given, in either spelling (snake_case is read as the
            // lowerCamelCase key it stands for).
            let is_member = |(key, value): &(&String, &Value)| {
                !value.is_null()
                    && (ANY_VALUE_KEYS.contains(&key.as_str())
                        || (SNAKE_CASE_FIELDS.contains(&key.as_str())
                            && ANY_VALUE_KEYS.contains(&lower_camel_case(key).as_str())))
            };
            if object.iter().filter(is_member).count() > 1 {
                let held: Vec<&str> = object
                    .iter()
                    .filter(is_member)
                    .map(|(key, _)| key.as_str())
                    .collect();
                return Err(OtlpError::malformed(format!(
                    "{}: an AnyValue holds one value; this one has {}: give one",
                    path_text(path, "").trim_end_matches('.'),
                    held.join(" and ")
                )));
            }
            for (key, child) in object {
                if child.is_null() {
                    // The field's default: dropped by `canonicalize`.
                    spelling = Spelling::NeedsCanonicalForm;
                    continue;
                }
                let camel;
                let field = if SNAKE_CASE_FIELDS.contains(&key.as_str()) {
                    camel = lower_camel_case(key);
                    if object.contains_key(&camel) {
                        return Err(OtlpError::malformed(format!(
                            "{}: the field is given twice, as {key} and as {camel}; give it once",
                            path_text(path, key),
                        )));
                    }
                    spelling = Spelling::NeedsCanonicalForm;
                    camel.as_str()
                } else {
                    key.as_str()
                };
                if ID_FIELDS.contains(&field) {
                    if let Value::String(id) = child {
                        if !is_hex(id) {
                            return Err(OtlpError::malformed(format!(
                                "{}: {id:?} is not hex; OTLP/JSON ids are hex strings, not base64",
                                path_text(path, key)
                            )));
                        }
                    }
                }
                match (field, child) {
                    (field, Value::String(text)) if U32_FIELDS.contains(&field) => {
                        if text.parse::<u32>().is_err() {
                            return Err(OtlpError::malformed(format!(
                                "{}: {text:?} is not a 32-bit unsigned integer",
                                path_text(path, key)
                            )));
                        }
                        spelling = Spelling::NeedsCanonicalForm;
                    }
                    ("bytesValue", Value::String(text)) if STANDARD.decode(text).is_err() => {
                        if lenient_base64(text).is_none() {
                            return Err(OtlpError::malformed(format!(
                                "{}: {text:?} is not base64 (standard or URL-safe, with or \
                                 without padding)",
                                path_text(path, key)
                            )));
                        }
                        spelling = Spelling::NeedsCanonicalForm;
                    }
                    ("intValue", Value::String(text)) if text.parse::<i64>().is_err() => {
                        return Err(OtlpError::malformed(format!(
                            "{}: {text:?} is not a 64-bit integer; give a whole number (a JSON \
                             number or a string of digits)",
                            path_text(path, key)
                        )));
                    }
                    ("intValue", value @ Value::Number(number)) if number.as_i64().is_none() => {
                        return Err(OtlpError::malformed(format!(
                            "{}: {value} is not a 64-bit integer; give a whole number (a JSON \
                             number or a string of digits), or a doubleValue",
                            path_text(path, key)
                        )));
                    }
                    ("intValue", value @ (Value::Bool(_) | Value::Array(_) | Value::Object(_))) => {
                        return Err(OtlpError::malformed(format!(
                            "{}: an intValue is a whole number (a JSON number or a string of \
                             digits), not {}",
                            path_text(path, key),
                            json_kind(value)
                        )));
                    }
                    ("arrayValue" | "kvlistValue", value) if !value.is_object() => {
                        return Err(OtlpError::malformed(format!(
                            "{}: an {key} is an object {{\"values\": [...]}}, not {}",
                            path_text(path, key),
                            json_kind(value)
                        )));
                    }
                    _ => {}
                }
                if let (Some(names), Value::String(name)) = (enum_names(field), child) {
                    if !names.iter().any(|(known, _)| known == name) {
                        let known: Vec<&str> = names.iter().map(|(known, _)| *known).collect();
                        return Err(OtlpError::malformed(format!(
                            "{}: {name:?} is not a value of the enum; give its number or one of \
                             {}",
                            path_text(path, key),
                            known.join(", ")
                        )));
                    }
                    spelling = Spelling::NeedsCanonicalForm;
                }
                path.push(Step::Key(key));
                if check_json(child, path)? == Spelling::NeedsCanonicalForm {
                    spelling = Spelling::NeedsCanonicalForm;
                }
                path.pop();
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                path.push(Step::Index(index));
                if check_json(item, path)? == Spelling::NeedsCanonicalForm {
                    spelling = Spelling::NeedsCanonicalForm;
                }
                path.pop();
            }
        }
        _ => {}
    }
    Ok(spelling)
}

/// Rewrite snake_case keys as lowerCamelCase and enum value names as their numbers, as the
/// Collector reads them ([`check_json`] has refused what this cannot rewrite). Bounded like it.
fn canonicalize(value: &mut Value) {
    match value {
        Value::Object(object) => {
            object.retain(|_, child| !child.is_null());
            let snake: Vec<String> = object
                .keys()
                .filter(|key| SNAKE_CASE_FIELDS.contains(&key.as_str()))
                .cloned()
                .collect();
            for key in snake {
                if let Some(child) = object.remove(&key) {
                    object.insert(lower_camel_case(&key), child);
                }
            }
            for (key, child) in object.iter_mut() {
                if let Value::String(text) = &*child {
                    if U32_FIELDS.contains(&key.as_str()) {
                        if let Ok(number) = text.parse::<u32>() {
                            *child = Value::from(number);
                        }
                    } else if key == "bytesValue" && STANDARD.decode(text).is_err() {
                        if let Some(bytes) = lenient_base64(text) {
                            *child = Value::String(STANDARD.encode(bytes));
                        }
                    }
                }
                if let (Some(names), Value::String(name)) = (enum_names(key), &*child) {
                    if let Some((_, number)) = names.iter().find(|(known, _)| known == name) {
                        *child = Value::from(*number);
                    }
                }
                canonicalize(child);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(canonicalize),
        _ => {}
    }
}

/// Bring `AnyValue`s that the protobuf JSON mapping allows, but opentelemetry-proto's serde
/// derive refuses, to a form it reads:
/// - `{"arrayValue": {}}` and `{"kvlistValue": {}}` (an empty repeated field is omitted, as Go's
///   protojson and the Collector write it) get `"values": []`;
/// - `doubleValue` as a string (the mapping writes `"NaN"`, `"Infinity"` and `"-Infinity"` so,
///   and accepts any number as a string): a finite number becomes a JSON number; a non-finite
///   one, which the derive cannot read (JSON has no such numbers), a marked `stringValue` made
///   a double again after decoding ([`restore_non_finite_doubles`]; `non_finite` is set), so it
///   maps and is stored as a protobuf body's non-finite double is; a string that is no number
///   is left for the decoder to refuse, naming its path.
///
/// - a `KeyValue` without `key` (under `attributes`, or in a `kvlistValue`'s `values`) gets `""`,
///   and an `EntityRef` (under `entityRefs`) gets `""` and `[]` for the fields it lacks: the
///   mapping leaves out a field at its default value (protobuf's `json_format` does), and a
///   protobuf body carries them so too, while the derive requires these members.
///
/// The keys are the `AnyValue` oneof's own, so whatever object holds them is an `AnyValue`;
/// `attributes`, `values` and `entityRefs` are field names, never written by a user.
/// The recursion is bounded by serde_json's nesting limit (128), which the body has passed.
fn normalize_any_values(value: &mut Value, non_finite: &mut bool) {
    match value {
        Value::Object(object) => {
            if let Some(Value::Array(pairs)) = object.get_mut("attributes") {
                fill_defaults(pairs, &[("key", Value::String(String::new()))]);
            }
            if let Some(Value::Object(list)) = object.get_mut("kvlistValue") {
                if let Some(Value::Array(pairs)) = list.get_mut("values") {
                    fill_defaults(pairs, &[("key", Value::String(String::new()))]);
                }
            }
            if let Some(Value::Array(refs)) = object.get_mut("entityRefs") {
                fill_defaults(
                    refs,
                    &[
                        ("schemaUrl", Value::String(String::new())),
                        ("type", Value::String(String::new())),
                        ("idKeys", Value::Array(Vec::new())),
                        ("descriptionKeys", Value::Array(Vec::new())),
                    ],
                );
            }
            for key in ["arrayValue", "kvlistValue"] {
                if let Some(Value::Object(list)) = object.get_mut(key) {
                    list.entry("values")
                        .or_insert_with(|| Value::Array(Vec::new()));
                }
            }
            if let Some(Value::String(text)) = object.get_mut("stringValue") {
                if text.starts_with(NON_FINITE_MARK) {
                    text.insert_str(0, NON_FINITE_MARK);
                    *non_finite = true;
                }
            }
            if let Some(Value::String(text)) = object.get("doubleValue") {
                let replacement = match text.trim().parse::<f64>() {
                    Ok(number) => serde_json::Number::from_f64(number)
                        .map(|number| ("doubleValue", Value::Number(number)))
                        .or_else(|| {
                            let name = if number.is_nan() {
                                "NaN"
                            } else if number > 0.0 {
                                "Infinity"
                            } else {
                                "-Infinity"
                            };
                            *non_finite = true;
                            Some((
                                "stringValue",
                                Value::String(format!("{NON_FINITE_MARK}{name}")),
                            ))
                        }),
                    Err(_) => None,
                };
                if let Some((key, replacement)) = replacement {
                    object.remove("doubleValue");
                    object.insert(key.to_owned(), replacement);
                }
            }
            for child in object.values_mut() {
                normalize_any_values(child, non_finite);
            }
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|item| normalize_any_values(item, non_finite)),
        _ => {}
    }
}

/// Gives each object of `messages` the `defaults` it lacks (other items are left for the
/// decoder to refuse, naming their path).
fn fill_defaults(messages: &mut [Value], defaults: &[(&str, Value)]) {
    for message in messages {
        if let Value::Object(message) = message {
            for (field, default) in defaults {
                if !message.contains_key(*field) {
                    message.insert((*field).to_owned(), default.clone());
                }
            }
        }
    }
}

pub(crate) fn is_hex(text: &str) -> bool {
    text.len().is_multiple_of(2) && text.bytes().all(|byte| byte.is_ascii_hexdigit())
}

fn lower_camel_case(snake: &str) -> String {
    let mut camel = String::with_capacity(snake.len());
    let mut upper = false;
    for character in snake.chars() {
        if character == '_' {
            upper = true;
        } else if upper {
            camel.push(character.to_ascii_uppercase());
            upper = false;
        } else {
            camel.push(character);
        }
    }
    camel
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use flate2::write::GzEncoder;
    use flate2::Compression;
    use opentelemetry_proto::tonic::common::v1::any_value;

    use super::*;
    use crate::test_support::{kv, request, span, string};

    const LIMIT: usize = 4 * 1024 * 1024;

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut encoder = GzEncoder::new(Vec::new(), Compression::default());
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    /// The inflated size is counted, not read from the trailer: a body whose last gzip member
    /// is empty (its trailer says 0) and a deflate body that compresses 100 times were let in
    /// on their wire size (an audit's finding: six such 0.7 MB bodies of a 52 MB request each
    /// took the server to 1.9 GB with a 64 MiB budget).
    #[test]
    fn inflated_len_counts_every_member_and_deflate_whatever_its_ratio() {
        let data = vec![b'x'; 1_000_000];
        let mut two_members = gzip(&data);
        two_members.extend(gzip(b""));
        assert_eq!(
            inflated_len(Some("gzip"), &two_members, LIMIT),
            Some(1_000_000)
        );
        assert_eq!(
            inflated_len(Some(" X-GZIP "), &gzip(&data), LIMIT),
            Some(1_000_000)
        );
        assert_eq!(inflated_len(Some("gzip"), &gzip(&data), 1_000), Some(1_000));
        let mut zlib = flate2::write::ZlibEncoder::new(Vec::new(), Compression::best());
        zlib.write_all(&data).unwrap();
        let zlib = zlib.finish().unwrap();
        assert!(zlib.len() * 100 < data.len());
        assert_eq!(inflated_len(Some("deflate"), &zlib, LIMIT), Some(1_000_000));
        let mut raw = flate2::write::DeflateEncoder::new(Vec::new(), Compression::best());
        raw.write_all(&data).unwrap();
        assert_eq!(
            inflated_len(Some("deflate"), &raw.finish().unwrap(), LIMIT),
            Some(1_000_000)
        );
        assert_eq!(inflated_len(Some("gzip"), b"not gzip", LIMIT), None);
        assert_eq!(inflated_len(None, &zlib, LIMIT), None);
        assert_eq!(inflated_len(Some("identity"), &zlib, LIMIT), None);
    }

    /// A lone UTF-16 surrogate escape (JavaScript's JSON for half an emoji) in a string is read
    /// as the replacement character, as the protobuf form of the span is, instead of refusing
    /// the whole batch; a body with another error still says what is wrong.
    #[test]
    fn a_lone_surrogate_in_otlp_json_is_the_replacement_character() {
        let request = decode_json_text(&with_attribute(r#"{"stringValue":"hello \ud83d"}"#))
            .expect("decoded");
        assert_eq!(
            first_attribute(&request),
            Some(any_value::Value::StringValue("hello \u{fffd}".into()))
        );
        let pair = decode_json_text(&with_attribute(r#"{"stringValue":"\ud83d\ude00"}"#))
            .expect("decoded");
        assert_eq!(
            first_attribute(&pair),
            Some(any_value::Value::StringValue("\u{1f600}".into()))
        );
        let broken = with_attribute(r#"{"stringValue":"\ud83d"}"#).replacen('{', "[", 1);
        assert!(decode_json_text(&broken).is_err());
    }

    fn decode_json_text(text: &str) -> Result<ExportTraceServiceRequest, OtlpError> {
        decode_request(Some("application/json"), None, text.as_bytes(), LIMIT)
            .map(|(request, _)| request)
    }

    fn malformed_message(result: Result<ExportTraceServiceRequest, OtlpError>) -> String {
        match result {
            Err(OtlpError::Malformed { message }) => message,
            other => panic!("expected a malformed error, got {other:?}"),
        }
    }

    /// One span in OTLP/JSON; `times` and `int` are spliced in raw so each test picks strings
    /// or numbers.
    /// [`json_body`] with its span's one attribute value replaced by `value` (JSON text).
    fn with_attribute(value: &str) -> String {
        json_body("1", "2", "3").replacen(r#"{"intValue":3}"#, value, 1)
    }

    /// The value of the first span's first attribute.
    fn first_attribute(request: &ExportTraceServiceRequest) -> Option<any_value::Value> {
        request.resource_spans[0].scope_spans[0].spans[0].attributes[0]
            .value
            .as_ref()
            .and_then(|value| value.value.clone())
    }

    fn json_body(start: &str, end: &str, int: &str) -> String {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"svc"}}}}]}},
            "scopeSpans":[{{"scope":{{"name":"lib"}},"spans":[{{
              "traceId":"5B8EFFF798038103D269B633813FC60C","spanId":"eee19b7ec3c1b174",
              "parentSpanId":"EEE19B7EC3C1B173","name":"chat","kind":3,
              "startTimeUnixNano":{start},"endTimeUnixNano":{end},
              "attributes":[{{"key":"gen_ai.usage.input_tokens","value":{{"intValue":{int}}}}}],
              "status":{{"code":2,"message":"boom"}}}}]}}]}}]}}"#
        )
    }

    #[test]
    fn protobuf_round_trips() {
        let original = request(vec![span(1, None, "root", vec![kv("k", string("v"))])]);
        let body = original.encode_to_vec();
        for content_type in [
            "application/x-protobuf",
            "application/protobuf",
            "Application/X-Protobuf; charset=binary",
        ] {
            let (decoded, encoding) =
                decode_request(Some(content_type), None, &body, LIMIT).unwrap();
            assert_eq!(decoded, original, "{content_type}");
            assert_eq!(encoding, OtlpEncoding::Protobuf);
        }
    }

    #[test]
    fn json_with_hex_ids_and_64_bit_ints_as_strings() {
        let text = json_body(
            r#""1544712660000000000""#,
            r#""1544712661000000000""#,
            r#""9007199254740993""#,
        );
        let (decoded, encoding) = decode_request(
            Some("application/json; charset=utf-8"),
            None,
            text.as_bytes(),
            LIMIT,
        )
        .unwrap();
        assert_eq!(encoding, OtlpEncoding::Json);
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(
            span.trace_id,
            vec![
                0x5b, 0x8e, 0xff, 0xf7, 0x98, 0x03, 0x81, 0x03, 0xd2, 0x69, 0xb6, 0x33, 0x81, 0x3f,
                0xc6, 0x0c
            ]
        );
        assert_eq!(
            span.span_id,
            vec![0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x74]
        );
        assert_eq!(
            span.parent_span_id,
            vec![0xee, 0xe1, 0x9b, 0x7e, 0xc3, 0xc1, 0xb1, 0x73]
        );
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(span.kind, 3);
        assert_eq!(span.status.as_ref().map(|status| status.code), Some(2));
        // Beyond 2^53: a string keeps every digit.
        assert_eq!(
            span.attributes[0]
                .value
                .as_ref()
                .and_then(|value| value.value.clone()),
            Some(any_value::Value::IntValue(9_007_199_254_740_993))
        );
    }

    #[test]
    fn json_with_64_bit_ints_as_numbers() {
        let text = json_body("1544712660000000000", "1544712661000000000", "42");
        let decoded = decode_json_text(&text).unwrap();
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!(span.start_time_unix_nano, 1_544_712_660_000_000_000);
        assert_eq!(span.end_time_unix_nano, 1_544_712_661_000_000_000);
        assert_eq!(
            span.attributes[0]
                .value
                .as_ref()
                .and_then(|value| value.value.clone()),
            Some(any_value::Value::IntValue(42))
        );
    }

    #[test]
    fn base64_ids_fail_the_request_with_the_path() {
        let text = json_body("1", "2", "3").replace(
            "5B8EFFF798038103D269B633813FC60C",
            "W47/95gDgQPSabYzgT/GDA==",
        );
        assert_eq!(
            malformed_message(decode_json_text(&text)),
            "resourceSpans[0].scopeSpans[0].spans[0].traceId: \"W47/95gDgQPSabYzgT/GDA==\" is not \
             hex; OTLP/JSON ids are hex strings, not base64"
        );
    }

    /// As the Collector reads them: the protobuf field names (snake_case) for the
    /// lowerCamelCase keys, enum value names for their numbers.
    #[test]
    fn snake_case_keys_and_enum_names_read_as_the_collector_reads_them() {
        let canonical = decode_json_text(&json_body("1", "2", "3")).expect("the canonical body");
        let mut text = json_body("1", "2", "3");
        for (camel, snake) in [
            ("\"resourceSpans\"", "\"resource_spans\""),
            ("\"scopeSpans\"", "\"scope_spans\""),
            ("\"traceId\"", "\"trace_id\""),
            ("\"spanId\"", "\"span_id\""),
            ("\"parentSpanId\"", "\"parent_span_id\""),
            ("\"startTimeUnixNano\"", "\"start_time_unix_nano\""),
            ("\"endTimeUnixNano\"", "\"end_time_unix_nano\""),
            ("\"stringValue\"", "\"string_value\""),
            ("\"intValue\"", "\"int_value\""),
            ("\"kind\":3", "\"kind\":\"SPAN_KIND_CLIENT\""),
            ("\"code\":2", "\"code\":\"STATUS_CODE_ERROR\""),
        ] {
            assert!(text.contains(camel), "{camel}");
            text = text.replace(camel, snake);
        }
        assert_eq!(
            decode_json_text(&text).expect("the Collector's spellings"),
            canonical
        );

        // A field spelt both ways in one object is ambiguous.
        let both = json_body("1", "2", "3").replace(
            "\"parentSpanId\"",
            "\"parent_span_id\":\"0000000000000001\",\"parentSpanId\"",
        );
        assert_eq!(
            malformed_message(decode_json_text(&both)),
            "resourceSpans[0].scopeSpans[0].spans[0].parent_span_id: the field is given twice, \
             as parent_span_id and as parentSpanId; give it once"
        );
        // An enum string that names no value, or a number in a string, is refused.
        for (bad, path) in [
            ("\"kind\":\"SERVER\"", "spans[0].kind"),
            ("\"kind\":\"3\"", "spans[0].kind"),
        ] {
            let text = json_body("1", "2", "3").replace("\"kind\":3", bad);
            let message = malformed_message(decode_json_text(&text));
            assert!(message.contains(path), "{message}");
            assert!(message.contains("SPAN_KIND_SERVER"), "{message}");
        }
        let text = json_body("1", "2", "3").replace("\"code\":2", "\"code\":\"ERROR\"");
        let message = malformed_message(decode_json_text(&text));
        assert!(message.contains("status.code"), "{message}");
        assert!(message.contains("STATUS_CODE_ERROR"), "{message}");
    }

    #[test]
    fn serde_jsons_raw_value_token_is_a_key_like_any_other() {
        // serde_json's `Value` (with the `raw_value` feature this workspace enables) read such
        // an object as the JSON text in its string: the attribute below was stored as
        // "smuggled", and text hidden in strings escaped the decoded-size scan. An unknown key
        // in an AnyValue is ignored, as the Collector ignores it.
        for key in [
            "$serde_json::private::RawValue",
            "\\u0024serde_json::private::RawValue",
        ] {
            let text = with_attribute(&format!(
                r#"{{"{key}":"{{\"stringValue\":\"smuggled\"}}"}}"#
            ));
            let request = decode_json_text(&text).expect("decodes");
            assert_eq!(first_attribute(&request), None, "{text}");
        }
        // The whole body in the token's string is no request either.
        let hidden = r#"{"$serde_json::private::RawValue":"{\"resourceSpans\":[]}"}"#;
        let error = decode_json_text(hidden).expect_err("refused");
        assert!(error.to_string().contains("no `resourceSpans`"), "{error}");
    }

    #[test]
    fn an_empty_request_is_valid_and_a_body_in_another_form_is_not() {
        // The OTLP specification: an empty request is answered with success.
        for text in [
            r#"{}"#,
            r#"{"resourceSpans":[]}"#,
            r#"{"resourceSpans":[{"resource":{"attributes":[]},"scopeSpans":[{"scope":{},"spans":[]}]}]}"#,
        ] {
            let decoded = decode_json_text(text).unwrap_or_else(|err| panic!("{text}: {err}"));
            assert!(
                decoded.resource_spans.iter().all(|resource| resource
                    .scope_spans
                    .iter()
                    .all(|scope| scope.spans.is_empty())),
                "{text}"
            );
        }
        let resource_only = ExportTraceServiceRequest {
            resource_spans: vec![opentelemetry_proto::tonic::trace::v1::ResourceSpans::default()],
        }
        .encode_to_vec();
        for body in [&b""[..], &resource_only] {
            let (empty, _) =
                decode_request(Some("application/x-protobuf"), None, body, LIMIT).unwrap();
            assert!(empty.resource_spans.len() <= 1);
        }
        for text in ["[]", "[[]]", "null", "1", "\"x\""] {
            assert_eq!(
                malformed_message(decode_json_text(text)),
                "an OTLP/JSON body is a JSON object (an ExportTraceServiceRequest)",
                "{text}"
            );
        }
        // A JSON object without the request's key is something else (another signal, another
        // casing), not an empty request.
        for (text, keys) in [
            (r#"{"resourceLogs":[]}"#, r#"["resourceLogs"]"#),
            (r#"{"ResourceSpans":[{"x":1}]}"#, r#"["ResourceSpans"]"#),
        ] {
            assert_eq!(
                malformed_message(decode_json_text(text)),
                format!(
                    "not an ExportTraceServiceRequest: no `resourceSpans` among its keys {keys} \
                     (OTLP/JSON keys are lowerCamelCase: resourceSpans, scopeSpans, spans)"
                ),
                "{text}"
            );
        }
    }

    /// Values the protobuf JSON mapping allows and opentelemetry-proto's derive refused (found
    /// by an audit): empty lists written without their `values`, doubles as strings.
    #[test]
    fn any_values_in_every_form_of_the_json_mapping_decode() {
        let cases: [(&str, any_value::Value); 6] = [
            (
                r#"{"arrayValue":{}}"#,
                any_value::Value::ArrayValue(Default::default()),
            ),
            (
                r#"{"kvlistValue":{}}"#,
                any_value::Value::KvlistValue(Default::default()),
            ),
            (
                r#"{"doubleValue":"1.5"}"#,
                any_value::Value::DoubleValue(1.5),
            ),
            (
                r#"{"doubleValue":" -2e3 "}"#,
                any_value::Value::DoubleValue(-2000.0),
            ),
            (
                r#"{"doubleValue":"Infinity"}"#,
                any_value::Value::DoubleValue(f64::INFINITY),
            ),
            (
                r#"{"doubleValue":"-Infinity"}"#,
                any_value::Value::DoubleValue(f64::NEG_INFINITY),
            ),
        ];
        for (value, expected) in cases {
            let text = with_attribute(value);
            assert!(text.contains(value), "the fixture holds {value}");
            let decoded = decode_json_text(&text).unwrap_or_else(|err| panic!("{value}: {err}"));
            assert_eq!(first_attribute(&decoded), Some(expected), "{value}");
        }
        // A non-finite double is a double, as in a protobuf body, not the text JSON spells it
        // with (which mapped as a string: an audit's finding); nested too.
        let nan = decode_json_text(&with_attribute(r#"{"doubleValue":"NaN"}"#)).expect("decodes");
        assert!(
            matches!(first_attribute(&nan), Some(any_value::Value::DoubleValue(number)) if number.is_nan()),
            "{:?}",
            first_attribute(&nan)
        );
        let nested = with_attribute(
            r#"{"arrayValue":{"values":[{"doubleValue":"NaN"},{"kvlistValue":{"values":[{"key":"k","value":{"doubleValue":"-Infinity"}}]}}]}}"#,
        );
        let nested = decode_json_text(&nested).expect("decodes");
        let Some(any_value::Value::ArrayValue(array)) = first_attribute(&nested) else {
            panic!("an array: {:?}", first_attribute(&nested));
        };
        let values: Vec<_> = array
            .values
            .iter()
            .map(|value| value.value.clone())
            .collect();
        assert!(
            matches!(values.first(), Some(Some(any_value::Value::DoubleValue(number))) if number.is_nan()),
            "{values:?}"
        );
        let Some(Some(any_value::Value::KvlistValue(list))) = values.get(1) else {
            panic!("a key-value list: {values:?}");
        };
        assert_eq!(
            list.values
                .first()
                .and_then(|pair| pair.value.clone())
                .and_then(|value| value.value),
            Some(any_value::Value::DoubleValue(f64::NEG_INFINITY))
        );
        // A string stays a string: the name of a non-finite number, and one that begins with
        // the mark itself, beside a real non-finite double or not.
        for text in ["Infinity", "\u{0}flightlog-non-finite-double:Infinity"] {
            let value =
                serde_json::to_string(&serde_json::json!({ "stringValue": text })).expect("JSON");
            for with_double in [false, true] {
                let mut request = with_attribute(&value);
                if with_double {
                    request = request.replacen(
                        r#""attributes":[{"key":"gen_ai"#,
                        r#""attributes":[{"key":"n","value":{"doubleValue":"NaN"}},{"key":"gen_ai"#,
                        1,
                    );
                    assert!(request.contains("NaN"), "{request}");
                }
                let decoded = decode_json_text(&request).expect("decodes");
                let attributes = &decoded.resource_spans[0].scope_spans[0].spans[0].attributes;
                let found = attributes
                    .iter()
                    .find(|pair| pair.key != "n")
                    .and_then(|pair| pair.value.clone())
                    .and_then(|value| value.value);
                assert_eq!(
                    found,
                    Some(any_value::Value::StringValue(text.into())),
                    "{request}"
                );
            }
        }
        // A string that is no number is still refused, naming where it is.
        let message = malformed_message(decode_json_text(&with_attribute(
            r#"{"doubleValue":"abc"}"#,
        )));
        assert!(
            message.contains("attributes[0].value") && message.contains("\"abc\""),
            "{message}"
        );
    }

    /// Fields at their default value left out, as protobuf's `json_format` writes them, read as
    /// their defaults (found by an audit: a `KeyValue` without `key` and an `EntityRef` without
    /// `schemaUrl` were a 400 for the whole export), as a protobuf body carries them.
    #[test]
    fn fields_left_at_their_default_decode_as_the_default() {
        let keyless = json_body("1", "2", "3").replacen(
            r#"{"key":"gen_ai.usage.input_tokens","value""#,
            r#"{"value""#,
            1,
        );
        assert!(keyless.contains(r#"[{"value":{"intValue":3}}]"#));
        let decoded = decode_json_text(&keyless).unwrap_or_else(|err| panic!("{err}"));
        let pair = &decoded.resource_spans[0].scope_spans[0].spans[0].attributes[0];
        assert_eq!(pair.key, "");
        assert_eq!(
            first_attribute(&decoded),
            Some(any_value::Value::IntValue(3))
        );
        // A null key is the default too; inside a key-value list as well.
        let nested = with_attribute(
            r#"{"kvlistValue":{"values":[{"value":{"boolValue":true}},{"key":null}]}}"#,
        );
        let decoded = decode_json_text(&nested).unwrap_or_else(|err| panic!("{err}"));
        let Some(any_value::Value::KvlistValue(list)) = first_attribute(&decoded) else {
            panic!("a key-value list");
        };
        assert_eq!(
            list.values
                .iter()
                .map(|pair| pair.key.as_str())
                .collect::<Vec<_>>(),
            ["", ""]
        );

        let with_refs = json_body("1", "2", "3").replacen(
            r#""resource":{"#,
            r#""resource":{"entityRefs":[{"type":"service","idKeys":["service.name"]},{}],"#,
            1,
        );
        let decoded = decode_json_text(&with_refs).unwrap_or_else(|err| panic!("{err}"));
        let refs = &decoded.resource_spans[0]
            .resource
            .as_ref()
            .expect("a resource")
            .entity_refs;
        assert_eq!(refs.len(), 2);
        assert_eq!(
            (refs[0].r#type.as_str(), refs[0].schema_url.as_str()),
            ("service", "")
        );
        assert_eq!(refs[0].id_keys, ["service.name"]);
        assert_eq!(refs[1], Default::default());
        // An attribute that is no object is still refused, naming where it is.
        let message = malformed_message(decode_json_text(&json_body("1", "2", "3").replacen(
            r#"{"key":"gen_ai.usage.input_tokens","value":{"intValue":3}}"#,
            "7",
            1,
        )));
        assert!(message.contains("attributes[0]"), "{message}");
    }

    /// What the protobuf JSON mapping allows and the library refused (found by an audit):
    /// `bytesValue` URL-safe or unpadded, 32-bit integers as strings, `null` for any field.
    #[test]
    fn the_rest_of_the_json_mapping_decodes() {
        for (value, bytes) in [
            (r#"{"bytesValue":"AAE="}"#, vec![0, 1]),
            (r#"{"bytesValue":"AAE"}"#, vec![0, 1]),
            (r#"{"bytesValue":"-_8"}"#, vec![0xfb, 0xff]),
            (r#"{"bytesValue":"-_8="}"#, vec![0xfb, 0xff]),
        ] {
            let decoded = decode_json_text(&with_attribute(value))
                .unwrap_or_else(|err| panic!("{value}: {err}"));
            assert_eq!(
                first_attribute(&decoded),
                Some(any_value::Value::BytesValue(bytes)),
                "{value}"
            );
        }
        let text = json_body("1", "2", "3")
            .replacen(
                r#""kind":3"#,
                r#""kind":3,"flags":"768","droppedEventsCount":"2""#,
                1,
            )
            .replacen(r#""name":"chat""#, r#""name":null"#, 1)
            .replacen(r#""message":"boom""#, r#""message":null"#, 1);
        assert!(
            text.contains(r#""flags":"768""#),
            "the fixture holds the flags"
        );
        let decoded = decode_json_text(&text).unwrap_or_else(|err| panic!("{err}"));
        let span = &decoded.resource_spans[0].scope_spans[0].spans[0];
        assert_eq!((span.flags, span.dropped_events_count), (768, 2));
        assert_eq!(span.name, "");
        assert_eq!(
            span.status
                .as_ref()
                .map(|status| (status.code, status.message.as_str())),
            Some((2, ""))
        );
        let nulls = r#"{"resourceSpans":[{"resource":null,"scopeSpans":[{"scope":null,"spans":[
            {"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"0102030405060708",
             "name":"n","startTimeUnixNano":"1","endTimeUnixNano":null,"attributes":null,
             "events":[{"timeUnixNano":null,"name":"e","attributes":[
                {"key":"k","value":{"arrayValue":{"values":null}}}]}]}]}]}]}"#;
        let decoded = decode_json_text(nulls).unwrap_or_else(|err| panic!("{err}"));
        assert_eq!(
            decoded.resource_spans[0].scope_spans[0].spans[0]
                .events
                .len(),
            1
        );
        assert!(decode_json_text(r#"{"resourceSpans":null}"#).is_ok());
    }

    /// Refused with the path and what to give, instead of the library's words ("data did not
    /// match any variant of untagged enum StringOrInt", "Invalid padding") or its silence (an
    /// AnyValue with two values kept the last).
    #[test]
    fn json_values_that_cannot_be_read_say_what_to_give() {
        for (value, said) in [
            (
                r#"{"stringValue":"x","intValue":"1"}"#,
                "attributes[0].value: an AnyValue holds one value; this one has stringValue and \
                 intValue: give one",
            ),
            (r#"{"intValue":1.5}"#, "attributes[0].value.intValue: 1.5 is not a 64-bit integer"),
            (r#"{"intValue":true}"#, "an intValue is a whole number (a JSON number or a string of digits), not a boolean"),
            (r#"{"intValue":"12x"}"#, "\"12x\" is not a 64-bit integer"),
            (r#"{"intValue":" 12 "}"#, "\" 12 \" is not a 64-bit integer"),
            (
                r#"{"stringValue":"x","int_value":1}"#,
                "an AnyValue holds one value; this one has stringValue and int_value",
            ),
            (
                r#"{"string_value":"x","int_value":1}"#,
                "an AnyValue holds one value; this one has string_value and int_value",
            ),
            (r#"{"bytesValue":"!!"}"#, "attributes[0].value.bytesValue: \"!!\" is not base64"),
            (r#"{"arrayValue":[1]}"#, "an arrayValue is an object {\"values\": [...]}, not an array"),
        ] {
            let message = malformed_message(decode_json_text(&with_attribute(value)));
            assert!(message.contains(said), "{value}: {message}");
        }
        let text = json_body("1", "2", "3").replacen(r#""kind":3"#, r#""kind":3,"flags":"-1""#, 1);
        let message = malformed_message(decode_json_text(&text));
        assert!(
            message.contains("spans[0].flags: \"-1\" is not a 32-bit unsigned integer"),
            "{message}"
        );
    }

    #[test]
    fn json_type_errors_name_their_path() {
        let text = json_body("1", "2", "3").replace("\"kind\":3", "\"kind\":true");
        let message = malformed_message(decode_json_text(&text));
        assert!(
            message.starts_with("resourceSpans[0].scopeSpans[0].spans[0].kind: invalid type"),
            "{message}"
        );
        assert!(malformed_message(decode_json_text("{not json")).starts_with("invalid JSON: "));
        assert!(malformed_message(decode_json_text(" \n")).starts_with("the body is empty"));
        assert!(malformed_message(decode_json_text("\u{feff}{}")).contains("byte-order mark"));
    }

    #[test]
    fn gzip_bodies_are_inflated() {
        let original = request(vec![span(1, None, "root", vec![])]);
        let body = gzip(&original.encode_to_vec());
        for encoding in ["gzip", "GZIP", "x-gzip"] {
            let (decoded, _) =
                decode_request(Some("application/x-protobuf"), Some(encoding), &body, LIMIT)
                    .unwrap();
            assert_eq!(decoded, original, "{encoding}");
        }
        let json = gzip(json_body("1", "2", "3").as_bytes());
        let (decoded, encoding) =
            decode_request(Some("application/json"), Some("gzip"), &json, LIMIT).unwrap();
        assert_eq!(encoding, OtlpEncoding::Json);
        assert_eq!(
            decoded.resource_spans[0].scope_spans[0].spans[0].name,
            "chat"
        );
        // identity and an empty header mean "not compressed".
        let plain = original.encode_to_vec();
        for encoding in ["identity", ""] {
            let (decoded, _) = decode_request(
                Some("application/x-protobuf"),
                Some(encoding),
                &plain,
                LIMIT,
            )
            .unwrap();
            assert_eq!(decoded, original, "{encoding:?}");
        }
    }

    /// Counts the compressed bytes the decoder pulled.
    struct CountingReader<'a> {
        inner: &'a [u8],
        consumed: &'a std::cell::Cell<usize>,
    }

    impl Read for CountingReader<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let read = self.inner.read(buf)?;
            self.consumed.set(self.consumed.get() + read);
            Ok(read)
        }
    }

    /// 1 GiB of zeros as 1,024 concatenated gzip members of 1 MiB each (about 1 MB compressed,
    /// built without ever holding the gigabyte).
    fn gzip_bomb() -> Vec<u8> {
        let member = gzip(&vec![0u8; 1 << 20]);
        member.repeat(1024)
    }

    #[test]
    fn a_gzip_bomb_is_cut_off_at_the_limit() {
        let bomb = gzip_bomb();
        assert!(bomb.len() < 2 << 20, "{}", bomb.len());
        let limit = 1 << 20;
        let result = decode_request(Some("application/x-protobuf"), Some("gzip"), &bomb, limit);
        assert_eq!(result, Err(OtlpError::TooLarge { limit }));
        assert_eq!(result.map(|_| ()).unwrap_err().http_status(), 413);
    }

    #[test]
    fn a_gzip_bomb_is_never_inflated_past_the_limit() {
        let bomb = gzip_bomb();
        let consumed = std::cell::Cell::new(0);
        let reader = CountingReader {
            inner: &bomb,
            consumed: &consumed,
        };
        let limit = 1 << 20;
        assert!(matches!(
            inflate_bounded(MultiGzDecoder::new(reader), limit, bomb.len(), "gzip"),
            Err(OtlpError::TooLarge { limit: 1_048_576 })
        ));
        // Two members (2 MiB inflated) at most were read, out of 1,024: memory stays at the
        // limit, not at the gigabyte.
        let member_len = bomb.len() / 1024;
        assert!(
            consumed.get() <= 2 * member_len + 64 * 1024,
            "read {} of {} compressed bytes",
            consumed.get(),
            bomb.len()
        );
    }

    #[test]
    fn the_bound_reads_at_most_one_byte_past_the_limit() {
        let data = vec![7u8; 10_000];
        let body = gzip(&data);
        assert_eq!(gunzip_bounded(&body, 10_000).unwrap(), data);
        assert!(matches!(
            gunzip_bounded(&body, 9_999),
            Err(OtlpError::TooLarge { limit: 9_999 })
        ));
    }

    /// `Content-Encoding: deflate`, as the Python exporter sends it (zlib) and as some clients
    /// mean it (raw deflate), inflated within the same bound; a deflate bomb is stopped too.
    #[test]
    fn deflate_bodies_are_inflated_within_the_bound() {
        use flate2::write::{DeflateEncoder, ZlibEncoder};
        let original = request(vec![span(1, None, "root", vec![])]);
        let plain = original.encode_to_vec();
        let mut zlib = ZlibEncoder::new(Vec::new(), Compression::default());
        zlib.write_all(&plain).unwrap();
        let zlib = zlib.finish().unwrap();
        let mut raw = DeflateEncoder::new(Vec::new(), Compression::default());
        raw.write_all(&plain).unwrap();
        let raw = raw.finish().unwrap();
        for (body, what) in [(&zlib, "zlib"), (&raw, "raw deflate")] {
            for encoding in ["deflate", "Deflate"] {
                let (decoded, _) =
                    decode_request(Some("application/x-protobuf"), Some(encoding), body, LIMIT)
                        .unwrap_or_else(|err| panic!("{what}: {err}"));
                assert_eq!(decoded, original, "{what}");
            }
        }
        let mut bomb = ZlibEncoder::new(Vec::new(), Compression::best());
        bomb.write_all(&vec![0u8; 8 << 20]).unwrap();
        let bomb = bomb.finish().unwrap();
        assert!(matches!(
            decode_request(
                Some("application/x-protobuf"),
                Some("deflate"),
                &bomb,
                1 << 20
            ),
            Err(OtlpError::TooLarge { limit: 1_048_576 })
        ));
        assert!(matches!(
            decode_request(
                Some("application/x-protobuf"),
                Some("deflate"),
                b"\x78\x9c!!",
                LIMIT
            ),
            Err(OtlpError::Malformed { .. })
        ));
        // Bytes after the compressed stream: refused, as after a gzip body.
        for body in [&zlib, &raw] {
            let mut trailing = body.clone();
            trailing.extend_from_slice(b"junk");
            assert!(matches!(
                decode_request(
                    Some("application/x-protobuf"),
                    Some("deflate"),
                    &trailing,
                    LIMIT
                ),
                Err(OtlpError::Malformed { .. })
            ));
        }
    }

    /// Past [`HEAP_INFLATE_BYTES`] the body goes on in a mapping; the bound and the bytes are
    /// the same on both sides of that line, and at it.
    #[test]
    fn large_bodies_inflate_into_a_mapping_with_the_same_bound() {
        let data: Vec<u8> = (0..HEAP_INFLATE_BYTES + 300_000)
            .map(|at| (at % 251) as u8)
            .collect();
        let body = gzip(&data);
        let limit = data.len();
        let inflated = gunzip_bounded(&body, limit).unwrap();
        assert!(matches!(inflated, Inflated::Mapped { .. }));
        assert_eq!(inflated, data);
        assert!(matches!(
            gunzip_bounded(&body, limit - 1),
            Err(OtlpError::TooLarge { .. })
        ));
        // Exactly at the heap part's size: complete, whichever buffer holds it.
        let exact = &data[..HEAP_INFLATE_BYTES];
        let inflated = gunzip_bounded(&gzip(exact), limit).unwrap();
        assert_eq!(inflated.as_bytes(), exact);
        let small = &data[..1000];
        let inflated = gunzip_bounded(&gzip(small), limit).unwrap();
        assert!(matches!(inflated, Inflated::Heap(_)));
        assert_eq!(inflated.as_bytes(), small);
    }

    #[test]
    fn an_uncompressed_body_over_the_limit_is_too_large() {
        let body = request(vec![span(1, None, "root", vec![])]).encode_to_vec();
        assert_eq!(
            decode_request(Some("application/x-protobuf"), None, &body, body.len() - 1),
            Err(OtlpError::TooLarge {
                limit: body.len() - 1
            })
        );
    }

    #[test]
    fn bad_gzip_is_malformed() {
        let error = decode_request(
            Some("application/x-protobuf"),
            Some("gzip"),
            b"not gzip",
            LIMIT,
        )
        .map(|_| ())
        .unwrap_err();
        assert_eq!(error.http_status(), 400);
        assert!(error.to_string().contains("invalid gzip body"), "{error}");
    }

    #[test]
    fn wrong_content_types_and_encodings_are_415() {
        for content_type in [Some("text/plain"), Some("application/grpc"), None] {
            let error = decode_request(content_type, None, b"{}", LIMIT)
                .map(|_| ())
                .unwrap_err();
            assert_eq!(
                error,
                OtlpError::UnsupportedContentType {
                    content_type: content_type.unwrap_or_default().to_owned()
                }
            );
            assert_eq!(error.http_status(), 415);
        }
        let error = decode_request(Some("application/json"), Some("br"), b"{}", LIMIT)
            .map(|_| ())
            .unwrap_err();
        assert_eq!(
            error,
            OtlpError::UnsupportedContentEncoding {
                content_encoding: "br".into()
            }
        );
        assert_eq!(error.http_status(), 415);
    }

    #[test]
    fn malformed_protobuf_is_400() {
        // Field 1 (resource_spans) announced as length-delimited with 100 bytes, then cut short.
        let error = decode_request(
            Some("application/x-protobuf"),
            None,
            &[0x0a, 100, 1, 2],
            LIMIT,
        )
        .map(|_| ())
        .unwrap_err();
        assert_eq!(error.http_status(), 400);
        assert!(
            error
                .to_string()
                .starts_with("malformed OTLP request: invalid protobuf:"),
            "{error}"
        );
    }
}
