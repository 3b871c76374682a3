//! Append inputs: validating raw JSON into an [`AppendInput`] that every backend can trust.
//!
//! Validation is a type boundary: an `AppendInput` can only be made through [`AppendInput::new`]
//! or [`AppendInput::from_json`], so a backend never re-checks. The checks and their order follow
//! the reference (FORMAT.md §4.4) — `engagementId`, then `at`, then `data` — plus flightlog's
//! deliberate additions: `type` must be a non-empty string (§8), `at` an integer below 2^53 in
//! magnitude, and `data` at most [`MAX_DATA_DEPTH`] levels deep. A full journal is checked later,
//! by the backend, so it is reported only for an otherwise valid input.

use std::sync::Arc;

use serde_json::{Number, Value};

use super::types::{EngagementEvent, JsonObject, SAFE_INTEGER_LIMIT};

/// How deeply `data` may nest: `data` itself is level 1, an object or array inside it level 2, …
pub const MAX_DATA_DEPTH: usize = crate::json_depth::MAX_JSON_DEPTH;

/// Why an append input was rejected. Nothing is written and no seq is consumed. Every variant
/// names the offending path ([`AppendValidationError::path`]); the reference throws `TypeError`
/// for all of them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppendValidationError {
    /// The input itself is not a JSON object.
    #[error("an append input must be a JSON object, got {found}")]
    NotAnObject {
        /// What was given instead (`an array`, `null`, …).
        found: &'static str,
    },
    /// `engagementId` is absent, not a string, or empty.
    #[error("engagementId must be a non-empty string, got {found}")]
    EngagementId {
        /// What was given instead.
        found: &'static str,
    },
    /// `at` is absent or not a number (a numeric string is not a number).
    #[error("at must be an integer number of epoch milliseconds, got {found}")]
    AtNotANumber {
        /// What was given instead.
        found: &'static str,
    },
    /// `at` has a fractional part.
    #[error("at must be an integer number of epoch milliseconds, got {value}")]
    AtNotAnInteger {
        /// The number given.
        value: Number,
    },
    /// `at` is 2^53 or more in magnitude (JavaScript could not hold it exactly).
    #[error("at must be below 2^53 in magnitude, got {value}")]
    AtOutOfRange {
        /// The number given.
        value: Number,
    },
    /// `data` is absent or not a JSON object (`null`, an array, a string, a number, a boolean).
    #[error("data must be a JSON object, got {found}")]
    DataNotAnObject {
        /// What was given instead.
        found: &'static str,
    },
    /// A value inside `data` nests deeper than [`MAX_DATA_DEPTH`] levels.
    #[error("{path} nests deeper than {limit} levels")]
    DataTooDeep {
        /// Where the first too-deep object or array sits, e.g. `data.a.b[0]`.
        path: String,
        /// The limit, [`MAX_DATA_DEPTH`].
        limit: usize,
    },
    /// `type` is absent, not a string, or empty (a deliberate difference from the reference,
    /// which stored such events).
    #[error("type must be a non-empty string, got {found}")]
    Type {
        /// What was given instead.
        found: &'static str,
    },
}

impl AppendValidationError {
    /// The JSON path of the offending value (`""` for the input itself).
    pub fn path(&self) -> &str {
        match self {
            Self::NotAnObject { .. } => "",
            Self::EngagementId { .. } => "engagementId",
            Self::AtNotANumber { .. } | Self::AtNotAnInteger { .. } | Self::AtOutOfRange { .. } => {
                "at"
            }
            Self::DataNotAnObject { .. } => "data",
            Self::DataTooDeep { path, .. } => path,
            Self::Type { .. } => "type",
        }
    }
}

/// A validated append: what the caller wants written, and optionally the seq it must get.
#[derive(Debug, Clone, PartialEq)]
pub struct AppendInput {
    engagement_id: String,
    at: i64,
    event_type: String,
    data: JsonObject,
    expected_seq: Option<i64>,
}

impl AppendInput {
    /// Validate typed parts (the same rules as [`AppendInput::from_json`], in the same order).
    pub fn new(
        engagement_id: impl Into<String>,
        at: i64,
        event_type: impl Into<String>,
        data: JsonObject,
    ) -> Result<Self, AppendValidationError> {
        let engagement_id = engagement_id.into();
        if engagement_id.is_empty() {
            return Err(AppendValidationError::EngagementId {
                found: "the empty string",
            });
        }
        if at.unsigned_abs() >= SAFE_INTEGER_LIMIT.unsigned_abs() {
            return Err(AppendValidationError::AtOutOfRange { value: at.into() });
        }
        check_depth(&data)?;
        let event_type = event_type.into();
        if event_type.is_empty() {
            return Err(AppendValidationError::Type {
                found: "the empty string",
            });
        }
        Ok(Self {
            engagement_id,
            at,
            event_type,
            data,
            expected_seq: None,
        })
    }

    /// Validate a raw append input `{engagementId, at, type, data}`. Other keys (even `seq`) are
    /// ignored. `data` is moved, not copied.
    pub fn from_json(raw: Value) -> Result<Self, AppendValidationError> {
        let input = match raw {
            Value::Object(input) => input,
            other => {
                return Err(AppendValidationError::NotAnObject {
                    found: json_kind(Some(&other)),
                })
            }
        };
        // One pass by value: no key is hashed and nothing is copied.
        let (mut engagement_id, mut at, mut data, mut event_type) = (None, None, None, None);
        for (key, value) in input {
            match key.as_str() {
                "engagementId" => engagement_id = Some(value),
                "at" => at = Some(value),
                "data" => data = Some(value),
                "type" => event_type = Some(value),
                _ => {}
            }
        }
        let engagement_id = match engagement_id {
            Some(Value::String(id)) if !id.is_empty() => id,
            other => {
                return Err(AppendValidationError::EngagementId {
                    found: json_kind(other.as_ref()),
                })
            }
        };
        let at = parse_at(at.as_ref())?;
        let data = match data {
            Some(Value::Object(data)) => data,
            other => {
                return Err(AppendValidationError::DataNotAnObject {
                    found: json_kind(other.as_ref()),
                })
            }
        };
        check_depth(&data)?;
        let event_type = match event_type {
            Some(Value::String(kind)) if !kind.is_empty() => kind,
            other => {
                return Err(AppendValidationError::Type {
                    found: json_kind(other.as_ref()),
                })
            }
        };
        Ok(Self {
            engagement_id,
            at,
            event_type,
            data,
            expected_seq: None,
        })
    }

    /// The same input, to be written only if it gets `seq` (optimistic concurrency).
    #[must_use]
    pub fn with_expected_seq(mut self, seq: i64) -> Self {
        self.expected_seq = Some(seq);
        self
    }

    /// The engagement to append to (never empty).
    pub fn engagement_id(&self) -> &str {
        &self.engagement_id
    }

    /// When it happened, epoch ms (|at| < 2^53).
    pub fn at(&self) -> i64 {
        self.at
    }

    /// The event type (never empty).
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The payload.
    pub fn data(&self) -> &JsonObject {
        &self.data
    }

    /// The seq the caller requires, if any.
    pub fn expected_seq(&self) -> Option<i64> {
        self.expected_seq
    }

    /// The event this input becomes at position `seq`.
    pub fn into_event(self, seq: i64) -> EngagementEvent {
        EngagementEvent {
            engagement_id: Arc::from(self.engagement_id),
            seq,
            at: self.at,
            event_type: Arc::from(self.event_type),
            data: Arc::new(self.data),
        }
    }

    /// The event this input becomes at position `seq`, sharing the engagement's id `Arc`
    /// (`engagement_id` must equal the input's).
    pub(crate) fn into_event_of(self, engagement_id: Arc<str>, seq: i64) -> EngagementEvent {
        debug_assert_eq!(*engagement_id, *self.engagement_id);
        EngagementEvent {
            engagement_id,
            seq,
            at: self.at,
            event_type: Arc::from(self.event_type),
            data: Arc::new(self.data),
        }
    }
}

fn parse_at(at: Option<&Value>) -> Result<i64, AppendValidationError> {
    let Some(Value::Number(number)) = at else {
        return Err(AppendValidationError::AtNotANumber {
            found: json_kind(at),
        });
    };
    let out_of_range = || AppendValidationError::AtOutOfRange {
        value: number.clone(),
    };
    if let Some(integer) = number.as_i64() {
        return if integer.unsigned_abs() < SAFE_INTEGER_LIMIT.unsigned_abs() {
            Ok(integer)
        } else {
            Err(out_of_range())
        };
    }
    if number.is_u64() {
        return Err(out_of_range());
    }
    let float = number.as_f64().unwrap_or(f64::NAN);
    if float.fract() != 0.0 {
        // NaN (impossible from serde_json) lands here too.
        return Err(AppendValidationError::AtNotAnInteger {
            value: number.clone(),
        });
    }
    if float.abs() >= SAFE_INTEGER_LIMIT as f64 {
        return Err(out_of_range());
    }
    // Exact: integral and below 2^53.
    Ok(float as i64)
}

fn check_depth(data: &JsonObject) -> Result<(), AppendValidationError> {
    match crate::json_depth::too_deep_path_in_object("data", data) {
        Some(path) => Err(AppendValidationError::DataTooDeep {
            path,
            limit: MAX_DATA_DEPTH,
        }),
        None => Ok(()),
    }
}

/// How a JSON value reads in an error message (`None`: the member is absent).
pub fn json_kind(value: Option<&Value>) -> &'static str {
    match value {
        None => "nothing",
        Some(Value::Null) => "null",
        Some(Value::Bool(_)) => "a boolean",
        Some(Value::Number(_)) => "a number",
        Some(Value::String(text)) if text.is_empty() => "the empty string",
        Some(Value::String(_)) => "a string",
        Some(Value::Array(_)) => "an array",
        Some(Value::Object(_)) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(raw: Value) -> Result<AppendInput, AppendValidationError> {
        AppendInput::from_json(raw)
    }

    /// `{"k": {"k": … {}}}` with `levels` objects in all, `data` included.
    fn nested(levels: usize) -> Value {
        let mut value = json!({});
        for _ in 1..levels {
            value = json!({ "k": value });
        }
        value
    }

    #[test]
    fn checks_run_in_reference_order() {
        let all_bad = json!({"engagementId": 1, "at": "x", "data": [], "type": 3});
        assert_eq!(
            check(all_bad).err().map(|e| e.path().to_owned()).as_deref(),
            Some("engagementId")
        );
        let at_and_data_bad = json!({"engagementId": "e", "at": null, "data": null});
        assert_eq!(
            check(at_and_data_bad)
                .err()
                .map(|e| e.path().to_owned())
                .as_deref(),
            Some("at")
        );
        let data_and_type_bad = json!({"engagementId": "e", "at": 1, "data": 5});
        assert_eq!(
            check(data_and_type_bad)
                .err()
                .map(|e| e.path().to_owned())
                .as_deref(),
            Some("data")
        );
        let type_bad = json!({"engagementId": "e", "at": 1, "data": {}, "type": ""});
        assert_eq!(
            check(type_bad).err(),
            Some(AppendValidationError::Type {
                found: "the empty string"
            })
        );
    }

    #[test]
    fn at_must_be_a_safe_integer_negative_allowed() {
        let with_at =
            |at: Value| check(json!({"engagementId": "e", "at": at, "type": "t", "data": {}}));
        assert_eq!(with_at(json!(-5)).map(|input| input.at()), Ok(-5));
        assert_eq!(with_at(json!(1000.0)).map(|input| input.at()), Ok(1000));
        assert_eq!(
            with_at(json!(9_007_199_254_740_991_i64)).map(|i| i.at()),
            Ok(9_007_199_254_740_991)
        );
        assert!(matches!(
            with_at(json!(1.5)),
            Err(AppendValidationError::AtNotAnInteger { .. })
        ));
        assert!(matches!(
            with_at(json!(9_007_199_254_740_992_i64)),
            Err(AppendValidationError::AtOutOfRange { .. })
        ));
        assert!(matches!(
            with_at(json!(-9_007_199_254_740_992_i64)),
            Err(AppendValidationError::AtOutOfRange { .. })
        ));
        assert!(matches!(
            with_at(json!(u64::MAX)),
            Err(AppendValidationError::AtOutOfRange { .. })
        ));
        assert!(matches!(
            with_at(json!(1e300)),
            Err(AppendValidationError::AtOutOfRange { .. })
        ));
        assert!(matches!(
            with_at(json!("1000")),
            Err(AppendValidationError::AtNotANumber { found: "a string" })
        ));
    }

    #[test]
    fn data_may_nest_64_levels_but_not_65() {
        let with_data =
            |data: Value| check(json!({"engagementId": "e", "at": 1, "type": "t", "data": data}));
        assert!(with_data(nested(MAX_DATA_DEPTH)).is_ok());
        let error = with_data(nested(MAX_DATA_DEPTH + 1)).err();
        let expected_path = format!("data{}", ".k".repeat(MAX_DATA_DEPTH));
        assert_eq!(
            error.as_ref().map(AppendValidationError::path),
            Some(expected_path.as_str())
        );
        // Arrays count as levels and show as indexes; scalars do not count.
        let mut deep_array = json!([[]]);
        for _ in 0..MAX_DATA_DEPTH - 2 {
            deep_array = json!([1, deep_array]);
        }
        let error = with_data(json!({"list": deep_array})).err();
        assert!(
            error.as_ref().is_some_and(
                |e| e.path().starts_with("data.list[1][1]") && e.path().ends_with("[0]")
            ),
            "{error:?}"
        );
    }

    #[test]
    fn extra_keys_are_ignored_and_data_is_kept_in_order() {
        let input = check(json!({"engagementId": "e", "at": 1, "type": "t", "seq": 99,
                                 "data": {"z": 1, "a": [1, {"x": null}]}}));
        let event = input.map(|input| input.into_event(0));
        let value = event
            .ok()
            .and_then(|event| serde_json::to_string(&event).ok());
        assert_eq!(
            value.as_deref(),
            Some(
                r#"{"engagementId":"e","seq":0,"at":1,"type":"t","data":{"z":1,"a":[1,{"x":null}]}}"#
            )
        );
    }

    #[test]
    fn typed_constructor_applies_the_same_rules() {
        assert!(AppendInput::new("", 1, "t", JsonObject::new()).is_err());
        assert!(AppendInput::new("e", 1, "", JsonObject::new()).is_err());
        assert!(AppendInput::new("e", 1 << 53, "t", JsonObject::new()).is_err());
        let deep = nested(MAX_DATA_DEPTH + 1)
            .as_object()
            .cloned()
            .unwrap_or_default();
        assert!(AppendInput::new("e", 1, "t", deep).is_err());
        assert!(AppendInput::new("e", -1, "t", JsonObject::new()).is_ok());
    }
}
