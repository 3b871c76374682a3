//! Integer fields read from JSON the way the reference's JavaScript reads them: a JSON number
//! is a number, so `1000`, `1000.0`, `1e3` and `-0` are all the integer 1000 (or 0), as
//! `JSON.parse` gives the reference. serde reads an `i64` only from a number written without a
//! fraction or exponent, so a client whose JSON library writes whole floats (`1000.0`, as
//! Python's `json` does for a float) was refused with "invalid type: floating point".
//!
//! A number with a fractional part, or a float of magnitude 2^53 or more (where a double no
//! longer holds every integer), is still refused: these fields are integers. Integers written
//! as such keep their full `i64` range here; the range checks of times and counts are the
//! callers'.
//!
//! The other direction lives here too: a double written as JavaScript's `JSON.stringify`
//! writes it ([`write_js_double`]), for the numbers flightlog computes where the reference's
//! JavaScript computed them (event payloads as the cap measures them, journal summaries).

use serde::{Deserialize, Deserializer};

/// 2^53: from here on a double does not hold every integer.
const EXACT_FLOAT_LIMIT: f64 = 9_007_199_254_740_992.0;

/// `value` as an integer when it is one a double holds exactly: whole, and below 2^53 in
/// magnitude (JavaScript's `Number.isSafeInteger` for a whole value).
pub fn exact_integer(value: f64) -> Option<i64> {
    // `as` is exact here: the value is whole and below 2^53 in magnitude.
    (value.fract() == 0.0 && value.abs() < EXACT_FLOAT_LIMIT).then_some(value as i64)
}

fn integral<E: serde::de::Error>(number: &serde_json::Number) -> Result<i64, E> {
    if let Some(integer) = number.as_i64() {
        return Ok(integer);
    }
    if number.is_u64() {
        // Written as an integer, past `i64` (so past every field's range).
        return Err(E::custom(format!(
            "expected an integer below 2^53 in magnitude, got {number}"
        )));
    }
    match number.as_f64().and_then(exact_integer) {
        Some(integer) => Ok(integer),
        // The number as JavaScript writes it (`1e+16`, not Rust's `-9007199254740992.0`).
        None => Err(E::custom(format!(
            "expected an integer (below 2^53 in magnitude when written with a fraction or \
             exponent), got {}",
            js_double_text(number.as_f64().unwrap_or(f64::NAN))
        ))),
    }
}

/// An integer field (`#[serde(deserialize_with = "integral_i64")]`).
pub fn integral_i64<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    integral(&serde_json::Number::deserialize(deserializer)?)
}

/// An optional integer field, `null` reading as absent (`#[serde(default, deserialize_with =
/// "optional_integral_i64")]`).
pub fn optional_integral_i64<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    match Option::<serde_json::Number>::deserialize(deserializer)? {
        None => Ok(None),
        Some(number) => integral(&number).map(Some),
    }
}

/// A finite double as JavaScript's `Number.prototype.toString` writes it (ECMAScript
/// Number::toString): the shortest digits that read back as the same double (Rust's `{:e}`
/// gives exactly those), placed by the decimal exponent `n` (value = 0.d₁d₂…d_k × 10ⁿ): an
/// integer when k ≤ n ≤ 21, a decimal point inside the digits when 0 < n ≤ 21, `0.000…` when
/// −6 < n ≤ 0, else `d.ddde±x`. Zero (negative too) is `0`. JSON holds no NaN or infinity.
pub fn write_js_double(out: &mut Vec<u8>, value: f64) {
    if value == 0.0 || !value.is_finite() {
        out.push(b'0');
        return;
    }
    if value < 0.0 {
        out.push(b'-');
    }
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: Vec<u8> = mantissa.bytes().filter(u8::is_ascii_digit).collect();
    let k = digits.len() as i32;
    let n = exponent + 1;
    let zeros = |out: &mut Vec<u8>, count: i32| {
        out.extend(std::iter::repeat_n(b'0', count.max(0) as usize));
    };
    if k <= n && n <= 21 {
        out.extend_from_slice(&digits);
        zeros(out, n - k);
    } else if 0 < n && n <= 21 {
        let (whole, fraction) = digits.split_at(n as usize);
        out.extend_from_slice(whole);
        out.push(b'.');
        out.extend_from_slice(fraction);
    } else if -6 < n && n <= 0 {
        out.extend_from_slice(b"0.");
        zeros(out, -n);
        out.extend_from_slice(&digits);
    } else {
        out.push(digits[0]);
        if k > 1 {
            out.push(b'.');
            out.extend_from_slice(&digits[1..]);
        }
        out.push(b'e');
        out.push(if n - 1 > 0 { b'+' } else { b'-' });
        out.extend_from_slice((n - 1).abs().to_string().as_bytes());
    }
}

/// An optional double field written as JavaScript writes a number where it is a whole one
/// (`#[serde(serialize_with = "optional_js_whole_double")]`): `3`, not serde's `3.0`, so a
/// client comparing types strictly reads what the reference writes for `costUsd` (an audit's
/// finding: every whole cost differed). Other values are written as serde writes a double (the
/// same value; the digits may be placed differently from JavaScript's for tiny or huge ones).
pub fn optional_js_whole_double<S: serde::Serializer>(
    value: &Option<f64>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    match value {
        None => serializer.serialize_none(),
        Some(value) => match exact_integer(*value) {
            // `-0.0` too: JavaScript writes it `0`.
            Some(whole) => serializer.serialize_some(&whole),
            None => serializer.serialize_some(value),
        },
    }
}

/// [`write_js_double`]'s text as a string (the summaries' numbers).
pub fn js_double_text(value: f64) -> String {
    let mut out = Vec::with_capacity(24);
    write_js_double(&mut out, value);
    // Only ASCII digits, signs, `.` and `e` were written.
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Fields {
        #[serde(deserialize_with = "integral_i64")]
        required: i64,
        #[serde(default, deserialize_with = "optional_integral_i64")]
        optional: Option<i64>,
    }

    fn read(json: &str) -> Result<Fields, String> {
        serde_json::from_str(json).map_err(|err| err.to_string())
    }

    #[derive(serde::Serialize)]
    struct Cost {
        #[serde(serialize_with = "optional_js_whole_double")]
        cost: Option<f64>,
    }

    #[test]
    fn whole_doubles_are_written_as_javascript_writes_them() {
        for (cost, json) in [
            (Some(3.0), r#"{"cost":3}"#),
            (Some(0.0), r#"{"cost":0}"#),
            (Some(-0.0), r#"{"cost":0}"#),
            (Some(999_999_999_999_999.0), r#"{"cost":999999999999999}"#),
            (Some(0.1), r#"{"cost":0.1}"#),
            (Some(2.5), r#"{"cost":2.5}"#),
            (None, r#"{"cost":null}"#),
        ] {
            let written = serde_json::to_string(&Cost { cost }).unwrap_or_default();
            assert_eq!(written, json, "{cost:?}");
        }
    }

    #[test]
    fn whole_numbers_however_written_are_integers() {
        for (json, required, optional) in [
            (r#"{"required": 1000}"#, 1000, None),
            (r#"{"required": 1000.0, "optional": 1e3}"#, 1000, Some(1000)),
            (r#"{"required": -0, "optional": -0.0}"#, 0, Some(0)),
            (r#"{"required": -5, "optional": null}"#, -5, None),
            (
                r#"{"required": 9223372036854775807, "optional": 9007199254740991.0}"#,
                i64::MAX,
                Some(9_007_199_254_740_991),
            ),
        ] {
            let fields = read(json).unwrap_or_else(|err| panic!("{json}: {err}"));
            assert_eq!(fields.required, required, "{json}");
            assert_eq!(fields.optional, optional, "{json}");
        }
    }

    #[test]
    fn fractions_huge_floats_and_other_types_are_refused() {
        for json in [
            r#"{"required": 1000.5}"#,
            r#"{"required": 1, "optional": 0.1}"#,
            r#"{"required": 9007199254740992.0}"#,
            r#"{"required": 1e300}"#,
            r#"{"required": "1000"}"#,
            r#"{"required": null}"#,
            r#"{"required": 1, "optional": true}"#,
        ] {
            assert!(read(json).is_err(), "{json} was accepted");
        }
    }

    /// The message says what was wrong with the number as it was written, in JavaScript's
    /// spelling of it (an audit's finding: `9223372036854775808` was told about fractions, and
    /// `-9.007199254740993e15` was quoted back as `-9007199254740992.0`).
    #[test]
    fn a_refused_number_is_quoted_as_a_json_client_writes_it() {
        for (json, says) in [
            (
                r#"{"required": 9223372036854775808}"#,
                "expected an integer below 2^53 in magnitude, got 9223372036854775808",
            ),
            (
                r#"{"required": -9.007199254740993e15}"#,
                "got -9007199254740992",
            ),
            (r#"{"required": 1e16}"#, "got 10000000000000000"),
            (r#"{"required": 1000.5}"#, "got 1000.5"),
        ] {
            let err = read(json)
                .err()
                .map(|err| err.to_string())
                .unwrap_or_default();
            assert!(err.contains(&format!("{says} at line")), "{json}: {err}");
        }
    }
}
