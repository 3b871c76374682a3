//! Error messages for JSON text that serde_json refuses where JavaScript reads it.
//!
//! JavaScript's `JSON.stringify` writes half a character as a lone UTF-16 surrogate escape
//! (`"\ud83d"`, an emoji cut in two by `slice`), and `JSON.parse` reads it back; Rust strings
//! are UTF-8 and cannot hold it, so serde_json refuses the text, with a message about a "hex
//! escape" that sent an agent's author looking for a typo (an audit's finding).

/// `message` (serde_json's, perhaps behind a path or a prefix), with what a lone surrogate
/// escape is and what to send instead when that is what it reports.
pub fn explain_json_error(message: String) -> String {
    if message.contains("hex escape") {
        format!(
            "{message} (a lone UTF-16 surrogate escape such as \\ud83d, half of a character, \
             is not text: send the whole surrogate pair, or \\ufffd in its place)"
        )
    } else {
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
