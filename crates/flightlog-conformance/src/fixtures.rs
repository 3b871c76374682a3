//! Loading fixture files and comparing results the way FORMAT.md §2.2 prescribes.
//!
//! Fixtures are read as written ([`flightlog_core::json_as_written`]): a key spelt as
//! serde_json's private raw-value token is an ASCII key like any other, which the reference
//! copies and stores as it does every key, so an argument or a result holding it must reach
//! the store unchanged (serde_json's own `Value` would swap the object for the JSON text in
//! its string, or refuse the whole file when that string is not JSON).

use std::path::{Path, PathBuf};

use flightlog_core::json_as_written::{self, AsWritten};
use serde::de::{DeserializeOwned, DeserializeSeed};
use serde::Deserialize;
use serde_json::Value;

/// One scenario file.
#[derive(Debug, Clone, Deserialize)]
pub struct Fixture {
    pub name: String,
    pub store: String,
    #[serde(default, deserialize_with = "as_written")]
    pub setup: Value,
    pub steps: Vec<Step>,
}

/// One operation and its recorded result.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Step {
    pub op: String,
    #[serde(default, deserialize_with = "as_written")]
    pub args: Value,
    #[serde(default)]
    pub clock: Option<i64>,
    #[serde(default)]
    pub writer: Option<String>,
    /// Present (possibly `null`) when the step succeeds.
    #[serde(default, deserialize_with = "present")]
    pub expect: Option<Value>,
    #[serde(default)]
    pub expect_error: Option<String>,
}

/// Distinguish `"expect": null` (Some(Null)) from an absent key (None).
fn present<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Option<Value>, D::Error> {
    AsWritten.deserialize(deserializer).map(Some)
}

/// Any JSON value, read as written (see the module's comment).
fn as_written<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Value, D::Error> {
    AsWritten.deserialize(deserializer)
}

/// The fixture folder: `FLIGHTLOG_CONFORMANCE_DIR`, else `../shared/conformance` beside the
/// repository. A relative path is taken from the repository root.
pub fn conformance_dir() -> PathBuf {
    let repo_root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    match std::env::var_os("FLIGHTLOG_CONFORMANCE_DIR") {
        Some(dir) => {
            let dir = PathBuf::from(dir);
            if dir.is_absolute() {
                dir
            } else {
                repo_root.join(dir)
            }
        }
        None => repo_root.join("../shared/conformance"),
    }
}

/// Every fixture under `dir` (recursively) whose `store` is `store`, sorted by path.
pub fn load_fixtures(dir: &Path, store: &str) -> Result<Vec<(PathBuf, Fixture)>, String> {
    let mut paths = Vec::new();
    collect_json(dir, &mut paths)
        .map_err(|err| format!("cannot read fixture folder {}: {err}", dir.display()))?;
    paths.sort();
    let mut fixtures = Vec::new();
    for path in paths {
        let text =
            std::fs::read_to_string(&path).map_err(|err| format!("{}: {err}", path.display()))?;
        let raw = json_as_written::from_slice(text.as_bytes())
            .map_err(|err| format!("{}: {err}", path.display()))?;
        if raw.get("store").and_then(Value::as_str) != Some(store) {
            continue;
        }
        let fixture =
            Fixture::deserialize(raw).map_err(|err| format!("{}: {err}", path.display()))?;
        fixtures.push((path, fixture));
    }
    Ok(fixtures)
}

fn collect_json(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_json(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "json") {
            out.push(path);
        }
    }
    Ok(())
}

/// JSON equality of FORMAT.md §2.2: key order ignored, arrays ordered, numbers by value.
pub fn json_equal(left: &Value, right: &Value) -> bool {
    match (left, right) {
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| json_equal(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, x)| b.get(key).is_some_and(|y| json_equal(x, y)))
        }
        _ => left == right,
    }
}

/// A short, readable account of where two JSON values differ.
pub fn describe_difference(expected: &Value, actual: &Value) -> String {
    fn walk(path: &str, expected: &Value, actual: &Value, out: &mut Vec<String>) {
        if out.len() >= 5 || json_equal(expected, actual) {
            return;
        }
        match (expected, actual) {
            (Value::Object(a), Value::Object(b)) => {
                for (key, x) in a {
                    match b.get(key) {
                        Some(y) => walk(&format!("{path}.{key}"), x, y, out),
                        None => out.push(format!("{path}.{key}: missing (expected {x})")),
                    }
                }
                for key in b.keys().filter(|key| !a.contains_key(*key)) {
                    out.push(format!("{path}.{key}: unexpected"));
                }
            }
            (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
                for (index, (x, y)) in a.iter().zip(b).enumerate() {
                    walk(&format!("{path}[{index}]"), x, y, out);
                }
            }
            _ => {
                let clip = |v: &Value| v.to_string().chars().take(300).collect::<String>();
                out.push(format!(
                    "{path}: expected {} got {}",
                    clip(expected),
                    clip(actual)
                ));
            }
        }
    }
    let mut out = Vec::new();
    walk("$", expected, actual, &mut out);
    out.join("; ")
}

/// Compare what a step did (`Ok(result)` or `Err(error kind)`) with what it expects.
pub fn check_step(step: &Step, outcome: Result<Value, String>) -> Result<(), String> {
    match (&step.expect_error, outcome) {
        (Some(expected), Err(kind)) if *expected == kind => Ok(()),
        (Some(expected), Err(kind)) => Err(format!("expected error {expected}, got {kind}")),
        (Some(expected), Ok(value)) => Err(format!("expected error {expected}, got {value}")),
        (None, Err(kind)) => Err(format!("unexpected error {kind}")),
        (None, Ok(value)) => {
            let expected = step.expect.clone().unwrap_or(Value::Null);
            if json_equal(&expected, &value) {
                Ok(())
            } else {
                Err(describe_difference(&expected, &value))
            }
        }
    }
}

/// A step's named argument, deserialized.
pub fn arg<T: DeserializeOwned>(args: &Value, name: &str) -> Result<T, String> {
    let value = args.get(name).cloned().unwrap_or(Value::Null);
    serde_json::from_value(value).map_err(|err| format!("argument {name}: {err}"))
}

/// A step's optional argument: absent and `null` are both "not given".
pub fn optional_arg<T: DeserializeOwned>(args: &Value, name: &str) -> Result<Option<T>, String> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => serde_json::from_value(value.clone())
            .map(Some)
            .map_err(|err| format!("argument {name}: {err}")),
    }
}

/// A result as the JSON the fixture compares.
pub fn to_json<T: serde::Serialize>(value: T) -> Result<Value, String> {
    serde_json::to_value(value).map_err(|err| format!("cannot serialize result: {err}"))
}
