//! How deep stored JSON may nest: one limit and one path-naming check for every JSON value a
//! client hands flightlog to keep (journal event data, span attrs, event payloads).
//!
//! Stored values are read back inside response envelopes a few levels deep (a snapshot's span
//! in its `spans` array, a change in a page of changes), and common JSON parsers refuse input
//! nested past a fixed depth (serde_json's default is 128 levels). A value accepted at 125
//! levels would make every later read that includes it unparseable for such a client, so
//! writes are refused past [`MAX_JSON_DEPTH`] levels, well inside that bound.

use serde_json::Value;

use crate::activity::JsonObject;

/// The deepest an object or array may sit in a stored value, counting the value itself as
/// level 1.
pub const MAX_JSON_DEPTH: usize = 64;

/// The path of the first object or array in `value` deeper than [`MAX_JSON_DEPTH`] levels
/// (`value` itself is level 1), written from `root`: e.g. `payload.a.b[0]`. `None` when
/// nothing is too deep. The walk stops at the limit, so its stack stays shallow whatever the
/// input.
pub fn too_deep_path(root: &str, value: &Value) -> Option<String> {
    let mut steps = Vec::new();
    too_deep(value, 1, &mut steps).then(|| path(root, &steps))
}

/// [`too_deep_path`] for an object (level 1).
pub fn too_deep_path_in_object(root: &str, object: &JsonObject) -> Option<String> {
    let mut steps = Vec::new();
    too_deep_in_object(object, 1, &mut steps).then(|| path(root, &steps))
}

/// `Err` with a message naming the path (`attrs.a.b`) when `object` nests too deep.
pub fn check_object(root: &str, object: Option<&JsonObject>) -> Result<(), String> {
    match object.and_then(|object| too_deep_path_in_object(root, object)) {
        Some(path) => Err(too_deep_message(&path)),
        None => Ok(()),
    }
}

/// `Err` with a message naming the path (`payload[0].a`) when `value` nests too deep.
pub fn check_value(root: &str, value: Option<&Value>) -> Result<(), String> {
    match value.and_then(|value| too_deep_path(root, value)) {
        Some(path) => Err(too_deep_message(&path)),
        None => Ok(()),
    }
}

fn too_deep_message(path: &str) -> String {
    format!("{path} nests deeper than {MAX_JSON_DEPTH} levels")
}

/// How deep `value` nests: 0 for a scalar, 1 for an object or array holding only scalars, and
/// so on. Stops counting past [`MAX_JSON_DEPTH`] + 1 (the answer is then that bound).
pub fn nesting_depth(value: &Value) -> usize {
    fn walk(value: &Value, depth: usize) -> usize {
        if depth > MAX_JSON_DEPTH {
            return depth;
        }
        match value {
            Value::Object(object) => object
                .values()
                .map(|item| walk(item, depth + 1))
                .max()
                .unwrap_or(depth),
            Value::Array(items) => items
                .iter()
                .map(|item| walk(item, depth + 1))
                .max()
                .unwrap_or(depth),
            _ => depth - 1,
        }
    }
    walk(value, 1)
}

/// One step of a JSON path, collected while unwinding from a too-deep value.
enum Step<'a> {
    Key(&'a str),
    Index(usize),
}

fn path(root: &str, steps: &[Step<'_>]) -> String {
    let mut path = String::from(root);
    for step in steps.iter().rev() {
        match step {
            Step::Key(key) => {
                path.push('.');
                path.push_str(key);
            }
            Step::Index(index) => path.push_str(&format!("[{index}]")),
        }
    }
    path
}

/// Whether a container inside `object` (itself at `depth`) exceeds the limit; on `true`,
/// `steps` holds the path to it, innermost first.
fn too_deep_in_object<'a>(object: &'a JsonObject, depth: usize, steps: &mut Vec<Step<'a>>) -> bool {
    object.iter().any(|(key, value)| {
        let found = too_deep(value, depth + 1, steps);
        if found {
            steps.push(Step::Key(key));
        }
        found
    })
}

fn too_deep<'a>(value: &'a Value, depth: usize, steps: &mut Vec<Step<'a>>) -> bool {
    let is_container = matches!(value, Value::Object(_) | Value::Array(_));
    if is_container && depth > MAX_JSON_DEPTH {
        return true;
    }
    match value {
        Value::Object(object) => too_deep_in_object(object, depth, steps),
        Value::Array(items) => items.iter().enumerate().any(|(index, item)| {
            let found = too_deep(item, depth + 1, steps);
            if found {
                steps.push(Step::Index(index));
            }
            found
        }),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// An object nested `levels` deep through the key `k` (`levels` = 1 is `{}`).
    fn nested(levels: usize) -> Value {
        let mut value = json!({});
        for _ in 1..levels {
            value = json!({ "k": value });
        }
        value
    }

    #[test]
    fn the_limit_is_inclusive_and_the_path_names_the_first_too_deep_container() {
        assert_eq!(too_deep_path("attrs", &nested(MAX_JSON_DEPTH)), None);
        assert_eq!(
            too_deep_path("attrs", &nested(MAX_JSON_DEPTH + 1)),
            Some(format!("attrs{}", ".k".repeat(MAX_JSON_DEPTH)))
        );
        let Value::Object(object) = nested(MAX_JSON_DEPTH + 1) else {
            unreachable!()
        };
        assert!(too_deep_path_in_object("attrs", &object).is_some());
        // Arrays count as levels, and their indexes appear in the path.
        let mut value = json!([1, []]);
        for _ in 2..=MAX_JSON_DEPTH {
            value = json!([value]);
        }
        let path = too_deep_path("payload", &value).unwrap_or_default();
        assert!(path.starts_with("payload[0][0]"), "{path}");
        assert!(path.ends_with("[1]"), "{path}");
        // Scalars never count, however long.
        assert_eq!(too_deep_path("payload", &json!("x".repeat(10_000))), None);
    }

    #[test]
    fn nesting_depth_counts_containers_and_stops_past_the_limit() {
        assert_eq!(nesting_depth(&json!(3)), 0);
        assert_eq!(nesting_depth(&json!({})), 1);
        assert_eq!(nesting_depth(&json!({"a": 1, "b": [2, {"c": []}]})), 4);
        assert_eq!(nesting_depth(&nested(MAX_JSON_DEPTH)), MAX_JSON_DEPTH);
        assert_eq!(nesting_depth(&nested(500)), MAX_JSON_DEPTH + 1);
    }
}
