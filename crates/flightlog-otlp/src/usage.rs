//! A span's token usage, model and cost, from whichever naming its instrumentation used.
//!
//! Counts may arrive as an int, a double or a numeric string (instrumentations disagree): each
//! is accepted when it is a finite, non-negative whole number (a double is rounded). A count no
//! attribute carries stays absent: nothing invents a zero. The cost is the reported one when
//! present; otherwise it is computed from the price table when the model has a price and at
//! least one count is known, and the span records which table version priced it.

use flightlog_core::activity::SpanUsage;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};

use crate::facts::{as_str, first_of, Facts};
use crate::prices::{cost_usd, PriceTable, TokenCounts};

/// Where a span's cost came from; recorded in its attrs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CostSource {
    /// An attribute of the span carried it.
    Reported,
    /// Computed from the price table of this version.
    PriceTable(String),
}

/// Counts above this are refused as implausible (and would lose precision as a double).
const MAX_TOKENS: f64 = 9_007_199_254_740_992.0;

/// A token count from an int, a double or a numeric string.
pub(crate) fn token_count(value: &AnyValue) -> Option<i64> {
    match value.value.as_ref()? {
        any_value::Value::IntValue(count) => (*count >= 0).then_some(*count),
        any_value::Value::DoubleValue(count) => count_from_double(*count),
        any_value::Value::StringValue(text) => {
            let text = text.trim();
            match text.parse::<i64>() {
                Ok(count) => (count >= 0).then_some(count),
                Err(_) => text.parse::<f64>().ok().and_then(count_from_double),
            }
        }
        _ => None,
    }
}

fn count_from_double(count: f64) -> Option<i64> {
    // The range check makes the cast exact (and rules out NaN and infinities).
    (count.is_finite() && (0.0..MAX_TOKENS).contains(&count)).then(|| count.round() as i64)
}

/// A cost in USD from an int, a double or a numeric string; finite and not negative.
pub(crate) fn cost_value(value: &AnyValue) -> Option<f64> {
    let cost = match value.value.as_ref()? {
        any_value::Value::IntValue(cost) => *cost as f64,
        any_value::Value::DoubleValue(cost) => *cost,
        any_value::Value::StringValue(text) => text.trim().parse::<f64>().ok()?,
        _ => return None,
    };
    (cost.is_finite() && cost >= 0.0).then_some(cost)
}

fn non_empty_str(value: &AnyValue) -> Option<&str> {
    as_str(value).map(str::trim).filter(|text| !text.is_empty())
}

/// The usage of a span with these attributes, and where its cost came from.
pub(crate) fn span_usage(
    facts: &Facts<'_>,
    prices: &PriceTable,
) -> (SpanUsage, Option<CostSource>) {
    let tokens = TokenCounts {
        input: first_of(&facts.input_tokens, token_count),
        output: first_of(&facts.output_tokens, token_count),
        cache_read: first_of(&facts.cache_read_tokens, token_count),
        cache_creation: first_of(&facts.cache_creation_tokens, token_count),
    };
    let model = first_of(&facts.model, non_empty_str);
    let reported = first_of(&facts.cost, cost_value);
    let any_count = tokens.input.is_some()
        || tokens.output.is_some()
        || tokens.cache_read.is_some()
        || tokens.cache_creation.is_some();
    let (cost, source) = match reported {
        Some(cost) => (Some(cost), Some(CostSource::Reported)),
        None => match model.and_then(|model| prices.lookup(model)) {
            Some(price) if any_count => (
                Some(cost_usd(tokens, price)),
                Some(CostSource::PriceTable(prices.version().to_owned())),
            ),
            _ => (None, None),
        },
    };
    let usage = SpanUsage {
        input_tokens: tokens.input,
        output_tokens: tokens.output,
        cache_read_tokens: tokens.cache_read,
        cache_creation_tokens: tokens.cache_creation,
        cost_usd: cost,
        model: model.map(str::to_owned),
    };
    (usage, source)
}

#[cfg(test)]
mod tests {
    use opentelemetry_proto::tonic::common::v1::KeyValue;

    use super::*;
    use crate::facts::{
        CACHE_CREATION_TOKEN_KEYS, CACHE_READ_TOKEN_KEYS, COST_KEYS, INPUT_TOKEN_KEYS, MODEL_KEYS,
        OUTPUT_TOKEN_KEYS,
    };
    use crate::test_support::{double, int, kv, string};

    fn usage_of(attributes: Vec<KeyValue>) -> (SpanUsage, Option<CostSource>) {
        span_usage(&Facts::scan(&attributes), &PriceTable::bundled())
    }

    /// A usage field's names and how to read it back.
    type Field = (&'static [&'static str], fn(&SpanUsage) -> Option<i64>);

    #[test]
    fn every_token_name_variant_is_read() {
        let tables: [Field; 4] = [
            (INPUT_TOKEN_KEYS, |usage| usage.input_tokens),
            (OUTPUT_TOKEN_KEYS, |usage| usage.output_tokens),
            (CACHE_READ_TOKEN_KEYS, |usage| usage.cache_read_tokens),
            (CACHE_CREATION_TOKEN_KEYS, |usage| {
                usage.cache_creation_tokens
            }),
        ];
        for (names, field) in tables {
            for (position, name) in names.iter().enumerate() {
                let count = 100 + i64::try_from(position).unwrap();
                let (usage, source) = usage_of(vec![kv(name, int(count))]);
                assert_eq!(field(&usage), Some(count), "{name}");
                // No model: nothing prices it.
                assert_eq!((usage.cost_usd, source), (None, None), "{name}");
            }
        }
    }

    #[test]
    fn counts_arrive_as_int_double_or_numeric_string() {
        assert_eq!(token_count(&int(12)), Some(12));
        assert_eq!(token_count(&double(12.0)), Some(12));
        assert_eq!(token_count(&double(11.6)), Some(12));
        assert_eq!(token_count(&string("12")), Some(12));
        assert_eq!(token_count(&string(" 12.0 ")), Some(12));
        assert_eq!(token_count(&int(-1)), None);
        assert_eq!(token_count(&double(f64::NAN)), None);
        assert_eq!(token_count(&string("many")), None);
    }

    #[test]
    fn absent_counts_stay_absent() {
        let (usage, source) = usage_of(vec![kv("gen_ai.request.model", string("gpt-4o"))]);
        assert_eq!(
            usage,
            SpanUsage {
                model: Some("gpt-4o".into()),
                ..SpanUsage::default()
            }
        );
        // A known model but no count: no cost (not a computed zero).
        assert_eq!(source, None);
    }

    #[test]
    fn the_answering_model_beats_the_requested_one() {
        for (position, name) in MODEL_KEYS.iter().enumerate() {
            let (usage, _) = usage_of(vec![kv(name, string(&format!("model-{position}")))]);
            assert_eq!(usage.model, Some(format!("model-{position}")), "{name}");
        }
        let (usage, _) = usage_of(vec![
            kv("gen_ai.request.model", string("gpt-4o")),
            kv("gen_ai.response.model", string("gpt-4o-2024-08-06")),
        ]);
        assert_eq!(usage.model.as_deref(), Some("gpt-4o-2024-08-06"));
    }

    #[test]
    fn a_reported_cost_wins_over_the_table() {
        for name in COST_KEYS {
            let (usage, source) = usage_of(vec![
                kv("gen_ai.response.model", string("gpt-4o")),
                kv("gen_ai.usage.input_tokens", int(1_000)),
                kv(name, double(0.5)),
            ]);
            assert_eq!(usage.cost_usd, Some(0.5), "{name}");
            assert_eq!(source, Some(CostSource::Reported), "{name}");
        }
        let (usage, _) = usage_of(vec![kv("llm.cost.total", string("0.25"))]);
        assert_eq!(usage.cost_usd, Some(0.25));
    }

    #[test]
    fn the_table_prices_a_known_model_and_names_its_version() {
        let (usage, source) = usage_of(vec![
            kv("gen_ai.response.model", string("gpt-4o-2024-08-06")),
            kv("gen_ai.usage.input_tokens", int(1_000_000)),
            kv("gen_ai.usage.output_tokens", string("100000")),
        ]);
        // 1M input × $2.50 + 100k output × $10.
        assert_eq!(usage.cost_usd, Some(3.5));
        assert_eq!(source, Some(CostSource::PriceTable("2025-11-01".into())));
        let (usage, source) = usage_of(vec![
            kv("llm.model_name", string("unknown-model")),
            kv("llm.token_count.prompt", int(10)),
        ]);
        assert_eq!((usage.cost_usd, source), (None, None));
    }
}
