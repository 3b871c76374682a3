//! How a JavaScript server holds a JSON value, for the reference models of the store tests
//! (`model.rs`, `extremes_property.rs`): the reference reads every body with `JSON.parse` and
//! writes with `JSON.stringify`, and the store measures and stores payloads in that form.

use serde_json::Value;

/// `value` as JavaScript's `JSON.parse` would hold it, for the numbers this model generates: an
/// integral double below 1e21 is written without a fraction by `JSON.stringify`, and so reads
/// back as an integer (`0.0` → `0`, `-0.0` → `0`); other doubles are kept.
pub fn js_normalized(value: &Value) -> Value {
    match value {
        Value::Number(number) if number.is_f64() => {
            let double = number.as_f64().unwrap_or(0.0);
            if double.fract() == 0.0 && double.abs() < 1e21 {
                if double >= 0.0 && double <= u64::MAX as f64 {
                    return Value::from(double as u64);
                }
                if double < 0.0 && double >= i64::MIN as f64 {
                    return Value::from(double as i64);
                }
            }
            value.clone()
        }
        Value::Array(items) => Value::Array(items.iter().map(js_normalized).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(key, item)| (key.clone(), js_normalized(item)))
                .collect(),
        ),
        other => other.clone(),
    }
}
