//! The range checks the contract puts on values serde alone accepts: ids (non-empty, at most 256
//! bytes), times and durations (integers below 2^53 in magnitude, as the journal already
//! requires), usage (token counts from 0 to 2^53 - 1, a cost that is finite and not negative),
//! and page sizes (`limit`, prune `batch`: 0 to 10,000).
//!
//! They run at the HTTP edge so the stores keep the reference's wider semantics for in-process
//! callers (the reference accepts a negative `limit`, for example) while the wire stays strict.

use flightlog_core::activity::{SpanUsage, MAX_COST_USD, MAX_TOKEN_COUNT};
use flightlog_core::journal::SAFE_INTEGER_LIMIT;

use crate::error::ApiError;

/// The longest id (`spanId`, `runId`, `engagementId`, a writer name) the server accepts, in bytes.
pub const MAX_ID_BYTES: usize = 256;

/// The largest page size (`limit`) or prune `batch` the server accepts.
pub const MAX_LIMIT: i64 = 10_000;

/// `id` is a non-empty string of at most [`MAX_ID_BYTES`] bytes; `field` names it in the error.
pub fn check_id(field: &str, id: &str) -> Result<(), ApiError> {
    if id.is_empty() {
        return Err(ApiError::invalid(format!(
            "{field} must be a non-empty string"
        )));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(ApiError::invalid(format!(
            "{field} must be at most {MAX_ID_BYTES} bytes, got {} bytes",
            id.len()
        )));
    }
    Ok(())
}

/// Like [`check_id`] for an optional id, except that the empty string is allowed (the reference
/// stores `parentSpanId: ""` as given).
pub fn check_reference(field: &str, id: Option<&str>) -> Result<(), ApiError> {
    match id {
        Some(id) if id.len() > MAX_ID_BYTES => Err(ApiError::invalid(format!(
            "{field} must be at most {MAX_ID_BYTES} bytes, got {} bytes",
            id.len()
        ))),
        _ => Ok(()),
    }
}

/// A time or duration in milliseconds: below 2^53 in magnitude, so it survives a JavaScript
/// client and no `now - duration` in a store can overflow.
pub fn check_time(field: &str, value: i64) -> Result<(), ApiError> {
    if value.unsigned_abs() >= SAFE_INTEGER_LIMIT.unsigned_abs() {
        return Err(ApiError::invalid(format!(
            "{field} must be an integer below 2^53 in magnitude, got {value}"
        )));
    }
    Ok(())
}

/// [`check_time`] for an optional value.
pub fn check_optional_time(field: &str, value: Option<i64>) -> Result<(), ApiError> {
    value.map_or(Ok(()), |value| check_time(field, value))
}

/// Usage a client reports: token counts from 0 to 2^53 (a negative count made a run's totals
/// negative; beyond 2^53 a JavaScript reader rounds them), a cost that is a non-negative finite
/// number below 10^15 (so a run's sum stays finite). `field` names the object (`usage`), for
/// the message.
pub fn check_usage(field: &str, usage: Option<&SpanUsage>) -> Result<(), ApiError> {
    let Some(usage) = usage else {
        return Ok(());
    };
    for (name, count) in [
        ("inputTokens", usage.input_tokens),
        ("outputTokens", usage.output_tokens),
        ("cacheReadTokens", usage.cache_read_tokens),
        ("cacheCreationTokens", usage.cache_creation_tokens),
    ] {
        if let Some(count) = count {
            if !(0..MAX_TOKEN_COUNT).contains(&count) {
                return Err(ApiError::invalid(format!(
                    "{field}.{name} must be an integer from 0 to 2^53 - 1, got {count}"
                )));
            }
        }
    }
    if let Some(cost) = usage.cost_usd {
        if !(0.0..MAX_COST_USD).contains(&cost) {
            return Err(ApiError::invalid(format!(
                "{field}.costUsd must be a number from 0 to below 10^15, got {cost}"
            )));
        }
    }
    Ok(())
}

/// A page size or batch: 0 to [`MAX_LIMIT`].
pub fn check_limit(field: &str, value: i64) -> Result<(), ApiError> {
    if !(0..=MAX_LIMIT).contains(&value) {
        return Err(ApiError::invalid(format!(
            "{field} must be an integer from 0 to {MAX_LIMIT}, got {value}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_non_empty_and_at_most_256_bytes() {
        assert!(check_id("spanId", "s").is_ok());
        assert!(check_id("spanId", &"x".repeat(256)).is_ok());
        assert!(check_id("spanId", &"x".repeat(257)).is_err());
        // Bytes, not characters: 129 two-byte characters are 258 bytes.
        assert!(check_id("spanId", &"é".repeat(129)).is_err());
        assert_eq!(
            check_id("runId", ""),
            Err(ApiError::invalid("runId must be a non-empty string"))
        );
        assert!(check_reference("parentSpanId", Some("")).is_ok());
        assert!(check_reference("parentSpanId", Some(&"x".repeat(257))).is_err());
    }

    #[test]
    fn times_stay_below_2_pow_53_and_limits_within_0_to_10000() {
        assert!(check_time("at", -(SAFE_INTEGER_LIMIT - 1)).is_ok());
        assert!(check_time("at", SAFE_INTEGER_LIMIT).is_err());
        assert!(check_time("at", i64::MIN).is_err());
        assert!(check_limit("limit", 0).is_ok());
        assert!(check_limit("limit", 10_000).is_ok());
        assert!(check_limit("limit", 10_001).is_err());
        assert!(check_limit("limit", -1).is_err());
    }
}
