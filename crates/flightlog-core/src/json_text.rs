//! Error messages for JSON text that serde_json refuses where JavaScript reads it.
//!
//! JavaScript's `JSON.stringify` writes half a character as a lone UTF-16 surrogate escape
//! (`"\ud83d"`, an emoji cut in two by `slice`), and `JSON.parse` reads it back; Rust strings
//! are UTF-8 and cannot hold it, so serde_json refuses the text, with a message about a "hex
//! escape" that sent an agent's author looking for a typo (an audit's finding).

/// `message` (serde_json's, perhaps behind a path or a prefix), with what a lone surrogate
/// escape is and what to send instead when that is what it reports, and each piece of it in
/// backticks or double quotes cut to [`MOST_QUOTED_CHARS`] (see [`cut_long_quotes`]).
pub fn explain_json_error(message: String) -> String {
    let mut message = match cut_long_quotes(&message) {
        std::borrow::Cow::Borrowed(_) => message,
        std::borrow::Cow::Owned(cut) => cut,
    };
    // serde names the Rust type it wanted (`expected f64` for `costUsd: "0.1"`, an audit's
    // finding); a client knows JSON's.
    for (rust, json) in RUST_TYPE_NAMES {
        if let Some(at) = message.find(rust) {
            if message[at + rust.len()..]
                .chars()
                .next()
                .is_none_or(|next| !next.is_ascii_alphanumeric())
            {
                message.replace_range(at..at + rust.len(), json);
            }
        }
    }
    if message.contains("hex escape") {
        format!(
            "{message} (a lone UTF-16 surrogate escape such as \\ud83d, half of a character, \
             is not text: send the whole surrogate pair, or \\ufffd in its place)"
        )
    } else {
        message
    }
}

/// `text` (JSON) with each lone UTF-16 surrogate escape inside its strings (`\ud83d` not
/// followed by its low half, or a low half alone) replaced by `\ufffd`, the replacement
/// character, as a protobuf encoder, Go's `encoding/json` and the OpenTelemetry Collector
/// take it; `None` when there is none (nothing to mend). For OTLP/JSON: an exporter cannot
/// change what it sends, and refusing the body drops every span of its batch for half a
/// character in one attribute (an audit: the JavaScript exporter's default JSON). The native
/// API refuses such text instead, saying how to mend it (see [`explain_json_error`]).
pub fn replace_lone_surrogate_escapes(text: &[u8]) -> Option<Vec<u8>> {
    /// The code unit of the `\uXXXX` escape starting at `at` (its backslash), if one is there.
    fn escaped_unit(text: &[u8], at: usize) -> Option<u32> {
        if text.get(at) != Some(&b'\\') || text.get(at + 1) != Some(&b'u') {
            return None;
        }
        let digits = text.get(at + 2..at + 6)?;
        let digits = std::str::from_utf8(digits).ok()?;
        u32::from_str_radix(digits, 16).ok()
    }
    const HIGH: std::ops::Range<u32> = 0xD800..0xDC00;
    const LOW: std::ops::Range<u32> = 0xDC00..0xE000;
    let mut mended: Option<Vec<u8>> = None;
    let mut copied_to = 0;
    let mut in_string = false;
    let mut at = 0;
    while at < text.len() {
        match (in_string, text[at]) {
            (false, b'"') => {
                in_string = true;
                at += 1;
            }
            (false, _) => at += 1,
            (true, b'"') => {
                in_string = false;
                at += 1;
            }
            (true, b'\\') => match escaped_unit(text, at) {
                Some(unit) if HIGH.contains(&unit) || LOW.contains(&unit) => {
                    let paired = HIGH.contains(&unit)
                        && escaped_unit(text, at + 6).is_some_and(|next| LOW.contains(&next));
                    if paired {
                        at += 12;
                    } else {
                        let out = mended.get_or_insert_with(|| Vec::with_capacity(text.len()));
                        out.extend_from_slice(&text[copied_to..at]);
                        out.extend_from_slice(br"\ufffd");
                        at += 6;
                        copied_to = at;
                    }
                }
                Some(_) => at += 6,
                // Any other escape (a bad one is the parser's to name).
                None => at += 2,
            },
            (true, _) => at += 1,
        }
    }
    mended.map(|mut out| {
        out.extend_from_slice(&text[copied_to.min(text.len())..]);
        out
    })
}

/// What serde's messages call a number field by its Rust type, and what a JSON client calls it.
const RUST_TYPE_NAMES: [(&str, &str); 6] = [
    ("expected f64", "expected a JSON number"),
    ("expected f32", "expected a JSON number"),
    ("expected i64", "expected an integer"),
    ("expected u64", "expected a non-negative integer"),
    ("expected u32", "expected a non-negative integer"),
    ("expected usize", "expected a non-negative integer"),
];

/// The most characters of one quoted piece of an error message, and of any text of a client's
/// a message repeats.
pub const MOST_QUOTED_CHARS: usize = 120;

/// `text` as an error message repeats it: whole up to [`MOST_QUOTED_CHARS`] characters, else
/// its beginning and `…` (cut on a character boundary).
pub fn echoed(text: &str) -> std::borrow::Cow<'_, str> {
    match text.char_indices().nth(MOST_QUOTED_CHARS) {
        None => std::borrow::Cow::Borrowed(text),
        Some((end, _)) => std::borrow::Cow::Owned(format!("{}…", &text[..end])),
    }
}

/// `message` with each piece between backticks or double quotes (what serde's messages quote
/// the client's text in: a field name, a variant, a string value) cut to its first
/// [`MOST_QUOTED_CHARS`] characters and `…`. Such messages repeated the client's text whole: a
/// 6 KB message for a long unknown JSON key, 3 KB for a bad `kind` (an audit's finding).
pub fn cut_long_quotes(message: &str) -> std::borrow::Cow<'_, str> {
    if message.len() <= MOST_QUOTED_CHARS {
        return std::borrow::Cow::Borrowed(message);
    }
    let mut cut = String::with_capacity(message.len().min(1024));
    let mut rest = message;
    let mut changed = false;
    while let Some(open) = rest.find(['`', '"']) {
        let quote = &rest[open..open + 1];
        let (before, after) = rest.split_at(open + 1);
        cut.push_str(before);
        let Some(close) = after.find(quote) else {
            rest = after;
            break;
        };
        let quoted = echoed(&after[..close]);
        changed |= matches!(quoted, std::borrow::Cow::Owned(_));
        cut.push_str(&quoted);
        cut.push_str(quote);
        rest = &after[close + 1..];
    }
    if !changed {
        return std::borrow::Cow::Borrowed(message);
    }
    cut.push_str(rest);
    std::borrow::Cow::Owned(cut)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lone_surrogate_escapes_are_replaced_and_pairs_kept() {
        let mend = |text: &str| {
            replace_lone_surrogate_escapes(text.as_bytes())
                .map(|out| String::from_utf8(out).expect("UTF-8 in, UTF-8 out"))
        };
        assert_eq!(
            mend(r#"{"a":"hello \ud83d"}"#).as_deref(),
            Some(r#"{"a":"hello \ufffd"}"#)
        );
        assert_eq!(
            mend(r#"["\udc00x", "\ud83d\u0041"]"#).as_deref(),
            Some(r#"["\ufffdx", "\ufffd\u0041"]"#)
        );
        assert_eq!(
            mend(r#"["\ud83d\ud83d\ude00"]"#).as_deref(),
            Some(r#"["\ufffd\ud83d\ude00"]"#)
        );
        // Nothing to mend: a whole pair, other escapes, an escaped backslash before `u`, text
        // outside strings, a string cut short.
        for text in [
            r#""\ud83d\ude00""#,
            r#""\n\"\\ud83d""#,
            r#"{"k": 1, "\u0041": "\\\\"}"#,
            r#""\ud8"#,
            r#""abc"#,
        ] {
            assert_eq!(mend(text), None, "{text}");
        }
        // What it gives back parses, with the replacement character in place.
        let mended = mend(r#"{"a":"x\ud83d","b":"\udead"}"#).expect("mended");
        let value: serde_json::Value = serde_json::from_str(&mended).expect("parses");
        assert_eq!(value["a"], "x\u{fffd}");
        assert_eq!(value["b"], "\u{fffd}");
    }

    #[test]
    fn a_lone_surrogate_is_explained_and_other_errors_are_left_alone() {
        for text in [
            r#""\ud83d""#,
            r#""\ud83d x""#,
            r#""\udc00""#,
            r#"{"a": "\ud83d\u0041"}"#,
        ] {
            let err = serde_json::from_str::<serde_json::Value>(text)
                .err()
                .map(|err| explain_json_error(err.to_string()))
                .unwrap_or_default();
            assert!(err.contains("lone UTF-16 surrogate"), "{text}: {err}");
        }
        let err = serde_json::from_str::<serde_json::Value>("{")
            .err()
            .map(|err| err.to_string())
            .unwrap_or_default();
        assert_eq!(explain_json_error(err.clone()), err);
        // A whole pair is text.
        assert!(serde_json::from_str::<serde_json::Value>(r#""\ud83d\ude00""#).is_ok());
    }

    #[test]
    fn a_number_fields_rust_type_is_named_as_json_names_it() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Usage {
            cost: f64,
            count: u64,
        }
        for (text, named) in [
            (r#"{"cost": "0.1", "count": 1}"#, "expected a JSON number"),
            (
                r#"{"cost": 0.1, "count": -1}"#,
                "expected a non-negative integer",
            ),
        ] {
            let err = serde_json::from_str::<Usage>(text)
                .err()
                .map(|err| explain_json_error(err.to_string()))
                .unwrap_or_default();
            assert!(err.contains(named), "{text}: {err}");
            assert!(!err.contains("f64") && !err.contains("u64"), "{err}");
        }
        // A word that only begins like a type name is left alone.
        let other = "expected f64x".to_owned();
        assert_eq!(explain_json_error(other.clone()), other);
    }

    #[test]
    fn long_quoted_pieces_are_cut_and_the_rest_is_kept() {
        let long = "é".repeat(500);
        let message = format!(
            "data: unknown field `{long}`, expected one of `key`, `kind`; got \"{long}\" at 1"
        );
        let cut = cut_long_quotes(&message);
        let short = "é".repeat(MOST_QUOTED_CHARS);
        assert_eq!(
            cut,
            format!(
                "data: unknown field `{short}…`, expected one of `key`, `kind`; got \"{short}…\" at 1"
            )
        );
        assert_eq!(explain_json_error(message.clone()), cut);
        // Short pieces, and a quote that is never closed, are left as they are.
        let open = format!("unknown field `a`, and `{long}");
        assert_eq!(cut_long_quotes(&open), open);
    }
}
