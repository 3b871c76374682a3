//! Trace and span ids: the length and all-zero checks opentelemetry-proto does not make, and the
//! lower-case hex spelling flightlog stores them in.
//!
//! OTLP says a trace id is 16 bytes and a span id 8, neither all zero; a decoder accepts any
//! length, so an id of the wrong size would otherwise become a run or span id silently. Each
//! check returns the reason a span is rejected, so one bad span never fails its whole request.

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Lower-case hex of `bytes`.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    let mut text = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        text.push(char::from(HEX[usize::from(byte >> 4)]));
        text.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    text
}

fn all_zero(bytes: &[u8]) -> bool {
    bytes.iter().all(|byte| *byte == 0)
}

/// The run id of a span: its trace id, which must be 16 bytes and not all zero.
pub(crate) fn trace_id(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() != 16 {
        return Err(format!("trace id must be 16 bytes, got {}", bytes.len()));
    }
    if all_zero(bytes) {
        return Err("trace id is all zero".to_owned());
    }
    Ok(to_hex(bytes))
}

/// A span id: 8 bytes, not all zero.
pub(crate) fn span_id(bytes: &[u8]) -> Result<String, String> {
    if bytes.len() != 8 {
        return Err(format!("span id must be 8 bytes, got {}", bytes.len()));
    }
    if all_zero(bytes) {
        return Err("span id is all zero".to_owned());
    }
    Ok(to_hex(bytes))
}

/// A parent span id: absent (empty) or all zero means "root"; otherwise 8 bytes.
pub(crate) fn parent_id(bytes: &[u8]) -> Result<Option<String>, String> {
    if bytes.is_empty() || all_zero(bytes) {
        return Ok(None);
    }
    if bytes.len() != 8 {
        return Err(format!(
            "parent span id must be 8 bytes, got {}",
            bytes.len()
        ));
    }
    Ok(Some(to_hex(bytes)))
}

/// A parent span id given as hex text (Logfire's `logfire.pending_parent_id`): empty or all
/// zero means "root"; otherwise 16 hex digits (upper or lower case; stored lower case).
pub(crate) fn parent_id_from_hex(text: &str) -> Result<Option<String>, String> {
    let text = text.trim();
    if text.is_empty() {
        return Ok(None);
    }
    if text.len() != 16 || !text.bytes().all(|byte| byte.is_ascii_hexdigit()) {
        return Err(format!(
            "parent span id {text:?} is not 16 hex digits (8 bytes)"
        ));
    }
    if text.bytes().all(|byte| byte == b'0') {
        return Ok(None);
    }
    Ok(Some(text.to_ascii_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_lower_case_hex() {
        assert_eq!(to_hex(&[0x00, 0xab, 0xff, 0x10]), "00abff10");
        assert_eq!(
            trace_id(&[0x5b; 16]).as_deref(),
            Ok("5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b5b")
        );
        assert_eq!(
            span_id(&[1, 2, 3, 4, 5, 6, 7, 8]).as_deref(),
            Ok("0102030405060708")
        );
    }

    #[test]
    fn wrong_lengths_and_zero_ids_are_refused_with_a_reason() {
        assert_eq!(
            trace_id(&[1; 8]),
            Err("trace id must be 16 bytes, got 8".to_owned())
        );
        assert_eq!(trace_id(&[0; 16]), Err("trace id is all zero".to_owned()));
        assert_eq!(
            span_id(&[]),
            Err("span id must be 8 bytes, got 0".to_owned())
        );
        assert_eq!(span_id(&[0; 8]), Err("span id is all zero".to_owned()));
        assert_eq!(
            parent_id(&[1; 16]),
            Err("parent span id must be 8 bytes, got 16".to_owned())
        );
    }

    #[test]
    fn absent_or_zero_parents_are_roots() {
        assert_eq!(parent_id(&[]), Ok(None));
        assert_eq!(parent_id(&[0; 8]), Ok(None));
        assert_eq!(
            parent_id(&[0xee; 8]),
            Ok(Some("eeeeeeeeeeeeeeee".to_owned()))
        );
        assert_eq!(parent_id_from_hex(""), Ok(None));
        assert_eq!(parent_id_from_hex("0000000000000000"), Ok(None));
        assert_eq!(
            parent_id_from_hex("EEE19B7EC3C1B174"),
            Ok(Some("eee19b7ec3c1b174".to_owned()))
        );
        assert!(parent_id_from_hex("eee19b7e").is_err());
        assert!(parent_id_from_hex("zzz19b7ec3c1b174").is_err());
    }
}
