//! A span's token usage, model and cost, from whichever naming its instrumentation used.
//!
//! Counts may arrive as an int, a double or a numeric string (instrumentations disagree): each
//! is accepted when it is a whole number from 0 to 2^53 - 1 (a double is rounded). A count no
//! attribute carries stays absent: nothing invents a zero. The cost is the reported one when
//! present; otherwise it is computed from the price table when the model has a price and at
//! least one count is known, and the span records which table version priced it.
//!
//! Langfuse (SDK v3) puts its counts and costs in JSON objects held in string attributes
//! (`langfuse.observation.usage_details`, `…cost_details`) rather than one attribute per count;
//! they are read only when no attribute of the tables in `facts` carried a count (or a cost),
//! and read tolerantly: text that is no JSON object, or a value that is no number, is ignored.

use flightlog_core::activity::{SpanUsage, MAX_COST_USD, MAX_TOKEN_COUNT};
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
use serde_json::{Map, Value};

use crate::facts::{as_str, first_of, Facts};
use crate::prices::{cost_usd, to_nano_dollar, ModelPrice, PriceTable, TokenCounts};
use flightlog_core::activity::pricing::count_cache_into_input;

/// Where a span's cost came from; recorded in its attrs.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum CostSource {
    /// An attribute of the span carried it.
    Reported,
    /// Computed from the price table of this version, at these prices.
    PriceTable(String, ModelPrice),
}

/// Counts at or above this are refused as implausible (and would lose precision as a double):
/// 2^53, the bound the HTTP API puts on the counts native clients report.
const MAX_TOKENS: f64 = 9_007_199_254_740_992.0;

/// An integer count, if it is in range (0 to 2^53 - 1).
fn count_in_range(count: i64) -> Option<i64> {
    (0..MAX_TOKEN_COUNT).contains(&count).then_some(count)
}

/// A cost, if it is in range (0 to below 10^15 USD; not NaN): a sum of reported parts may not
/// be, though each part is.
fn cost_in_range(cost: f64) -> Option<f64> {
    (0.0..MAX_COST_USD).contains(&cost).then_some(cost)
}

/// A token count from an int, a double or a numeric string.
pub(crate) fn token_count(value: &AnyValue) -> Option<i64> {
    match value.value.as_ref()? {
        any_value::Value::IntValue(count) => count_in_range(*count),
        any_value::Value::DoubleValue(count) => count_from_double(*count),
        any_value::Value::StringValue(text) => {
            let text = text.trim();
            match text.parse::<i64>() {
                Ok(count) => count_in_range(count),
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
    cost_in_range(cost)
}

/// Langfuse details longer than this are ignored unread: a real one is a few dozen bytes, and
/// parsing a span's huge attribute would be a cost on the ingest path for nothing.
pub(crate) const MAX_DETAILS_BYTES: usize = 4_096;

/// `usage_details` in OpenAI's raw shape: the prompt count includes the cached tokens.
pub(crate) const OPENAI_PROMPT_TOKENS: &str = "prompt_tokens";
/// OpenAI's output count.
pub(crate) const OPENAI_COMPLETION_TOKENS: &str = "completion_tokens";
/// OpenAI's breakdown of the prompt count, an object holding [`OPENAI_CACHED_TOKENS`].
pub(crate) const OPENAI_PROMPT_DETAILS: &str = "prompt_tokens_details";
/// The cached part of OpenAI's prompt count (inside [`OPENAI_PROMPT_DETAILS`]).
pub(crate) const OPENAI_CACHED_TOKENS: &str = "cached_tokens";
/// The input count of the providers' newer usage objects (OpenAI's Responses API, Anthropic's
/// Messages API), as Langfuse copies them into `usage_details`.
pub(crate) const PROVIDER_INPUT_TOKENS: &str = "input_tokens";
/// Their output count.
pub(crate) const PROVIDER_OUTPUT_TOKENS: &str = "output_tokens";
/// OpenAI's Responses API breakdown of `input_tokens` (which includes the cached ones), an
/// object holding [`OPENAI_CACHED_TOKENS`]. Anthropic's usage has none: its `input_tokens`
/// excludes its top-level cache counts.
pub(crate) const OPENAI_INPUT_DETAILS: &str = "input_tokens_details";
/// `usage_details` in Langfuse's own shape: the *uncached* input tokens.
pub(crate) const LANGFUSE_INPUT: &str = "input";
/// Langfuse's output tokens.
pub(crate) const LANGFUSE_OUTPUT: &str = "output";
/// Langfuse's cache-read counts (Anthropic's name, LangChain's through Langfuse, OpenAI's
/// through Langfuse), preferred first; each excluded from [`LANGFUSE_INPUT`].
pub(crate) const LANGFUSE_CACHE_READ_KEYS: &[&str] = &[
    "cache_read_input_tokens",
    "input_cache_read",
    "input_cached_tokens",
];
/// Langfuse's cache-creation counts, preferred first; each excluded from [`LANGFUSE_INPUT`].
pub(crate) const LANGFUSE_CACHE_CREATION_KEYS: &[&str] = &[
    "cache_creation_input_tokens",
    "cache_write_input_tokens",
    "input_cache_creation",
];
/// `cost_details`: the total cost in USD.
pub(crate) const COST_DETAILS_TOTAL: &str = "total";

/// The JSON object in `text`, when it is one (and not over [`MAX_DETAILS_BYTES`]).
fn details_object(text: &str) -> Option<Map<String, Value>> {
    if text.len() > MAX_DETAILS_BYTES {
        return None;
    }
    serde_json::from_str(text).ok()
}

/// A token count from a JSON number (a double is rounded); anything else is none.
fn json_count(value: &Value) -> Option<i64> {
    match value.as_i64() {
        Some(count) => count_in_range(count),
        None => value.as_f64().and_then(count_from_double),
    }
}

/// A cost from a JSON number, finite and not negative; anything else is none.
fn json_cost(value: &Value) -> Option<f64> {
    value.as_f64().and_then(cost_in_range)
}

/// The counts in a Langfuse `usage_details` text, in flightlog's convention (input includes
/// the cached tokens). OpenAI's raw shape (it has `prompt_tokens` or `completion_tokens`) is
/// read as OpenAI means it; any other object in Langfuse's shape, whose `input` excludes the
/// cache keys: input = `input` + cache read + cache creation (those present).
pub(crate) fn usage_from_details(text: &str) -> TokenCounts {
    let Some(details) = details_object(text) else {
        return TokenCounts::default();
    };
    let count = |name: &str| details.get(name).and_then(json_count);
    if details.contains_key(OPENAI_PROMPT_TOKENS) || details.contains_key(OPENAI_COMPLETION_TOKENS)
    {
        return TokenCounts {
            input: count(OPENAI_PROMPT_TOKENS),
            output: count(OPENAI_COMPLETION_TOKENS),
            cache_read: details
                .get(OPENAI_PROMPT_DETAILS)
                .and_then(|breakdown| breakdown.get(OPENAI_CACHED_TOKENS))
                .and_then(json_count),
            cache_creation: None,
        };
    }
    let first = |names: &[&str]| names.iter().find_map(|name| count(name));
    let provider_shape = !details.contains_key(LANGFUSE_INPUT)
        && !details.contains_key(LANGFUSE_OUTPUT)
        && (details.contains_key(PROVIDER_INPUT_TOKENS)
            || details.contains_key(PROVIDER_OUTPUT_TOKENS));
    if provider_shape {
        if let Some(breakdown) = details.get(OPENAI_INPUT_DETAILS) {
            // OpenAI's Responses API: `input_tokens` includes the cached ones (Langfuse's
            // OpenAI integration writes this shape for `responses.create`; read as Langfuse's
            // own, its call counted no tokens at all: an audit's finding).
            return TokenCounts {
                input: count(PROVIDER_INPUT_TOKENS),
                output: count(PROVIDER_OUTPUT_TOKENS),
                cache_read: breakdown.get(OPENAI_CACHED_TOKENS).and_then(json_count),
                cache_creation: None,
            };
        }
    }
    let cache_read = first(LANGFUSE_CACHE_READ_KEYS);
    let cache_creation = first(LANGFUSE_CACHE_CREATION_KEYS);
    // Anthropic's Messages usage is read as Langfuse's own shape is: its `input_tokens`, like
    // Langfuse's `input`, excludes the cache counts beside it.
    let (input_key, output_key) = if provider_shape {
        (PROVIDER_INPUT_TOKENS, PROVIDER_OUTPUT_TOKENS)
    } else {
        (LANGFUSE_INPUT, LANGFUSE_OUTPUT)
    };
    let input = [count(input_key), cache_read, cache_creation]
        .into_iter()
        .flatten()
        .reduce(i64::saturating_add);
    TokenCounts {
        input,
        output: count(output_key),
        cache_read,
        cache_creation,
    }
}

/// The cost in a Langfuse `cost_details` text: its `total`, else the sum of its numeric values
/// (rounded to a nano-dollar); none when it holds no usable number.
pub(crate) fn cost_from_details(text: &str) -> Option<f64> {
    let details = details_object(text)?;
    if let Some(total) = details.get(COST_DETAILS_TOTAL).and_then(json_cost) {
        return Some(total);
    }
    let sum = details
        .values()
        .filter_map(json_cost)
        .reduce(|sum, cost| sum + cost)?;
    Some(to_nano_dollar(sum))
}

fn non_empty_str(value: &AnyValue) -> Option<&str> {
    as_str(value).map(str::trim).filter(|text| !text.is_empty())
}

/// The usage of a span with these attributes, and where its cost came from.
pub(crate) fn span_usage(
    facts: &Facts<'_>,
    prices: &PriceTable,
    priceable: bool,
) -> (SpanUsage, Option<CostSource>) {
    let mut tokens = TokenCounts {
        input: first_of(&facts.input_tokens, token_count),
        output: first_of(&facts.output_tokens, token_count),
        cache_read: first_of(&facts.cache_read_tokens, token_count),
        cache_creation: first_of(&facts.cache_creation_tokens, token_count),
    };
    if tokens == TokenCounts::default() {
        if let Some(details) = facts.langfuse_usage_details {
            tokens = usage_from_details(details);
        }
    }
    count_cache_into_input(&mut tokens);
    // Each count read is in range; a sum (the cache counted into the input) may not be.
    for count in [
        &mut tokens.input,
        &mut tokens.output,
        &mut tokens.cache_read,
        &mut tokens.cache_creation,
    ] {
        *count = count.and_then(count_in_range);
    }
    let model = first_of(&facts.model, non_empty_str);
    let reported = first_of(&facts.cost, cost_value)
        .or_else(|| facts.langfuse_cost_details.and_then(cost_from_details))
        .or_else(|| {
            facts
                .cost_parts
                .iter()
                .flatten()
                .filter_map(|value| cost_value(value))
                .reduce(|sum, part| sum + part)
                // As a price-table cost is: 0.1 + 0.02 is 0.12, not 0.12000000000000001.
                .map(to_nano_dollar)
        })
        .and_then(cost_in_range);
    let any_count = tokens.input.is_some()
        || tokens.output.is_some()
        || tokens.cache_read.is_some()
        || tokens.cache_creation.is_some();
    let (cost, source) = match reported {
        Some(cost) => (Some(cost), Some(CostSource::Reported)),
        None => match model.and_then(|model| prices.lookup(model)) {
            Some(price) if any_count && priceable => (
                Some(cost_usd(tokens, price)),
                Some(CostSource::PriceTable(prices.version().to_owned(), *price)),
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
        span_usage(&Facts::scan(&attributes), &PriceTable::bundled(), true)
    }

    /// opentelemetry-util-genai 1.3 writes cache writes as `gen_ai.usage.cache_write.input_tokens`
    /// (the convention's rename of `cache_creation`): they were charged as plain input.
    #[test]
    fn cache_writes_under_the_conventions_current_name_are_read() {
        let (usage, _) = usage_of(vec![
            kv("gen_ai.request.model", string("claude-sonnet-4-5-20250929")),
            kv("gen_ai.usage.input_tokens", int(2_000)),
            kv("gen_ai.usage.output_tokens", int(100)),
            kv("gen_ai.usage.cache_read.input_tokens", int(1_500)),
            kv("gen_ai.usage.cache_write.input_tokens", int(400)),
        ]);
        assert_eq!(usage.cache_creation_tokens, Some(400));
        // 100 × $3 + 1,500 × $0.30 + 400 × $3.75 + 100 × $15, per million.
        assert_eq!(usage.cost_usd, Some(0.00375));
    }

    /// Anthropic's raw counts (input without the cache, as Logfire's Anthropic integration
    /// reports them): the cached tokens are added to the input, and the cost charges the
    /// uncached 3 at the input price; a count that already includes the cache is kept.
    #[test]
    fn an_input_count_smaller_than_its_cache_counts_is_taken_to_exclude_them() {
        let (usage, _) = usage_of(vec![
            kv("gen_ai.request.model", string("claude-sonnet-4-20250514")),
            kv("gen_ai.usage.input_tokens", int(3)),
            kv("gen_ai.usage.output_tokens", int(100)),
            kv("gen_ai.usage.cache_read.input_tokens", int(7_166)),
            kv("gen_ai.usage.cache_creation.input_tokens", int(1_000)),
        ]);
        assert_eq!(usage.input_tokens, Some(8_169));
        // 3 × $3 + 7,166 × $0.30 + 1,000 × $3.75 + 100 × $15, per million.
        assert_eq!(usage.cost_usd, Some(0.0074088));
        let (included, _) = usage_of(vec![
            kv("gen_ai.usage.input_tokens", int(1_000)),
            kv("gen_ai.usage.cache_read.input_tokens", int(400)),
        ]);
        assert_eq!(included.input_tokens, Some(1_000));
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
        // The HTTP API's bound: below 2^53, however the count is written.
        assert_eq!(token_count(&int((1 << 53) - 1)), Some((1 << 53) - 1));
        assert_eq!(token_count(&int(1 << 53)), None);
        assert_eq!(token_count(&int(i64::MAX)), None);
        assert_eq!(token_count(&string("9007199254740992")), None);
        assert_eq!(
            json_count(&serde_json::json!(9_007_199_254_740_992_i64)),
            None
        );
    }

    /// Sums the mapping makes (the cache counted into the input, Langfuse's parts, a cost's
    /// parts) are bounded as the counts and costs they add up: an audit had an input of
    /// 2^54 - 2 tokens, and a cost of 1e308 + 1e308 stored as infinite and served as `null`.
    #[test]
    fn sums_of_counts_and_costs_stay_in_range() {
        let near = (1_i64 << 53) - 1;
        let (usage, _) = usage_of(vec![
            kv("gen_ai.usage.input_tokens", int(1)),
            kv("gen_ai.usage.cache_read.input_tokens", int(near)),
            kv("gen_ai.usage.cache_creation.input_tokens", int(near)),
        ]);
        assert_eq!(usage.input_tokens, None, "{usage:?}");
        assert_eq!(usage.cache_read_tokens, Some(near));
        let (usage, source) = usage_of(vec![
            kv("llm.cost.prompt", double(9e14)),
            kv("llm.cost.completion", double(9e14)),
        ]);
        assert_eq!((usage.cost_usd, source), (None, None), "{usage:?}");
        let (usage, _) = usage_of(vec![kv("llm.cost.total", double(1e308))]);
        assert_eq!(usage.cost_usd, None);
        let details = r#"{"input":9e14,"output":9e14}"#;
        let (usage, _) = usage_of(vec![kv(
            "langfuse.observation.cost_details",
            string(details),
        )]);
        assert_eq!(usage.cost_usd, None, "{usage:?}");
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
        // OpenInference's parts, without a total: their sum is the reported cost.
        let (usage, source) = usage_of(vec![
            kv("llm.model_name", string("gpt-4o")),
            kv("llm.token_count.prompt", int(1_000)),
            kv("llm.cost.prompt", double(0.25)),
            kv("llm.cost.completion", string("0.5")),
        ]);
        assert_eq!(usage.cost_usd, Some(0.75));
        assert_eq!(source, Some(CostSource::Reported));
        // Rounded to a nano-dollar, as a priced cost is (it read 0.12000000000000001).
        let (usage, _) = usage_of(vec![
            kv("llm.cost.prompt", double(0.1)),
            kv("llm.cost.completion", double(0.02)),
        ]);
        assert_eq!(usage.cost_usd, Some(0.12));
        let (usage, _) = usage_of(vec![
            kv("llm.cost.completion", double(0.5)),
            kv("llm.cost.total", double(2.0)),
        ]);
        assert_eq!(usage.cost_usd, Some(2.0), "a total wins over its parts");
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
        assert!(
            matches!(&source, Some(CostSource::PriceTable(version, _)) if version == "2026-12-03"),
            "{source:?}"
        );
        let (usage, source) = usage_of(vec![
            kv("llm.model_name", string("unknown-model")),
            kv("llm.token_count.prompt", int(10)),
        ]);
        assert_eq!((usage.cost_usd, source), (None, None));
    }

    /// Two names an audit found unread: OpenInference's embedding spans name their model in
    /// `embedding.model_name` (they had no model and no cost), and the Vercel AI SDK 6 reports
    /// its cache counts under `ai.usage.inputTokenDetails.*` (its cache writes were charged at
    /// the plain input price).
    #[test]
    fn embedding_models_and_ai_sdk_6_cache_counts_are_read() {
        let (usage, source) = usage_of(vec![
            kv("embedding.model_name", string("text-embedding-3-small")),
            kv("llm.token_count.prompt", int(12)),
        ]);
        assert_eq!(usage.model.as_deref(), Some("text-embedding-3-small"));
        assert!(usage.cost_usd.is_some_and(|cost| cost > 0.0), "{usage:?}");
        assert!(matches!(source, Some(CostSource::PriceTable(..))));
        let (usage, _) = usage_of(vec![
            kv("ai.model.id", string("claude-sonnet-4-5")),
            kv("ai.usage.inputTokens", int(7_530)),
            kv("ai.usage.inputTokenDetails.noCacheTokens", int(30)),
            kv("ai.usage.inputTokenDetails.cacheReadTokens", int(7_000)),
            kv("ai.usage.inputTokenDetails.cacheWriteTokens", int(500)),
            kv("ai.usage.outputTokens", int(120)),
        ]);
        assert_eq!(
            (
                usage.input_tokens,
                usage.cache_read_tokens,
                usage.cache_creation_tokens,
                usage.output_tokens
            ),
            (Some(7_530), Some(7_000), Some(500), Some(120))
        );
    }

    fn counts(
        input: Option<i64>,
        output: Option<i64>,
        cache_read: Option<i64>,
        cache_creation: Option<i64>,
    ) -> TokenCounts {
        TokenCounts {
            input,
            output,
            cache_read,
            cache_creation,
        }
    }

    #[test]
    fn langfuse_usage_details_count_the_cache_into_input() {
        // Langfuse's own shape: `input` is the uncached part.
        assert_eq!(
            usage_from_details(r#"{"input":200,"output":50,"cache_read_input_tokens":1500}"#),
            counts(Some(1_700), Some(50), Some(1_500), None)
        );
        assert_eq!(
            usage_from_details(
                r#"{"input":200,"output":50,"total":2750,"cache_read_input_tokens":1500,
                    "cache_creation_input_tokens":1000}"#
            ),
            counts(Some(2_700), Some(50), Some(1_500), Some(1_000))
        );
        // Other spellings of the cache keys (Mastra's, Langfuse's OpenAI mapping).
        assert_eq!(
            usage_from_details(
                r#"{"input":10,"input_cached_tokens":30,"cache_write_input_tokens":5}"#
            ),
            counts(Some(45), None, Some(30), Some(5))
        );
        // No `input`: the cached tokens are all the input known.
        assert_eq!(
            usage_from_details(r#"{"output":7,"cache_read_input_tokens":100}"#),
            counts(Some(100), Some(7), Some(100), None)
        );
        assert_eq!(
            usage_from_details(r#"{"output":7}"#),
            counts(None, Some(7), None, None)
        );
    }

    #[test]
    fn langfuse_usage_details_from_langchain_keys() {
        // Langfuse's LangChain handler moves input_token_details out of `input` as input_*.
        assert_eq!(
            usage_from_details(
                r#"{"input":120,"output":40,"total":1460,"input_cache_read":1000,
                    "input_cache_creation":300}"#
            ),
            counts(Some(1_420), Some(40), Some(1_000), Some(300))
        );
    }

    /// The providers' newer usage objects as Langfuse copies them: OpenAI's Responses API
    /// (`input_tokens` includes `input_tokens_details.cached_tokens`) and Anthropic's Messages
    /// API (`input_tokens` excludes the cache counts beside it).
    #[test]
    fn langfuse_usage_details_in_the_responses_and_messages_shapes() {
        assert_eq!(
            usage_from_details(
                r#"{"input_tokens":2000,"input_tokens_details":{"cached_tokens":1500},
                    "output_tokens":100,"output_tokens_details":{"reasoning_tokens":0},
                    "total_tokens":2100}"#
            ),
            counts(Some(2_000), Some(100), Some(1_500), None)
        );
        assert_eq!(
            usage_from_details(
                r#"{"input_tokens":3,"cache_read_input_tokens":7000,
                    "cache_creation_input_tokens":500,"output_tokens":80}"#
            ),
            counts(Some(7_503), Some(80), Some(7_000), Some(500))
        );
        assert_eq!(
            usage_from_details(r#"{"input_tokens":12,"output_tokens":4}"#),
            counts(Some(12), Some(4), None, None)
        );
        // Langfuse's own keys win over the providers' when both are there.
        assert_eq!(
            usage_from_details(r#"{"input":10,"output":2,"input_tokens":99}"#),
            counts(Some(10), Some(2), None, None)
        );
    }

    #[test]
    fn langfuse_usage_details_in_openai_shape_keep_the_prompt_count() {
        // OpenAI's prompt count already includes the cached tokens.
        assert_eq!(
            usage_from_details(
                r#"{"prompt_tokens":1000,"completion_tokens":100,"total_tokens":1100,
                    "prompt_tokens_details":{"cached_tokens":400},
                    "completion_tokens_details":{"reasoning_tokens":20}}"#
            ),
            counts(Some(1_000), Some(100), Some(400), None)
        );
        assert_eq!(
            usage_from_details(r#"{"completion_tokens":9,"input":500}"#),
            counts(None, Some(9), None, None)
        );
    }

    #[test]
    fn bad_usage_details_are_ignored() {
        for text in [
            "",
            "not json",
            "{\"input\":",
            "[1, 2]",
            "42",
            "null",
            r#"{"input":"200","output":null,"cache_read_input_tokens":-5}"#,
            r#"{"prompt_tokens":{"n":1},"prompt_tokens_details":[400]}"#,
            r#"{"input":1e300}"#,
        ] {
            assert_eq!(usage_from_details(text), TokenCounts::default(), "{text}");
        }
        // Doubles are rounded, as in attributes.
        assert_eq!(
            usage_from_details(r#"{"input":2.4,"output":3.6}"#),
            counts(Some(2), Some(4), None, None)
        );
        // Too long to be a real one: not even parsed.
        let padded = format!(r#"{{"input":5,"pad":"{}"}}"#, "x".repeat(MAX_DETAILS_BYTES));
        assert_eq!(usage_from_details(&padded), TokenCounts::default());
    }

    #[test]
    fn usage_details_are_read_only_without_usage_attributes() {
        let details = r#"{"input":200,"output":50,"cache_read_input_tokens":1500}"#;
        let (usage, _) = usage_of(vec![
            kv("langfuse.observation.type", string("generation")),
            kv("langfuse.observation.usage_details", string(details)),
        ]);
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_creation_tokens
            ),
            (Some(1_700), Some(50), Some(1_500), None)
        );
        // Any count from an attribute wins over all of the details (no mixing).
        let (usage, _) = usage_of(vec![
            kv("langfuse.observation.usage_details", string(details)),
            kv("gen_ai.usage.output_tokens", int(60)),
        ]);
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (None, Some(60), None)
        );
        // Details that are no string are ignored.
        let (usage, _) = usage_of(vec![kv("langfuse.observation.usage_details", int(5))]);
        assert_eq!(usage, SpanUsage::default());
    }

    #[test]
    fn a_langfuse_generation_is_priced_from_its_model_and_details() {
        let (usage, source) = usage_of(vec![
            kv("langfuse.observation.model.name", string("gpt-4o")),
            kv(
                "langfuse.observation.usage_details",
                string(r#"{"input":600,"output":100,"input_cached_tokens":400}"#),
            ),
        ]);
        let table = PriceTable::bundled();
        let price = table.lookup("gpt-4o").copied();
        let expected = price.map(|price| {
            cost_usd(
                TokenCounts {
                    input: Some(1_000),
                    output: Some(100),
                    cache_read: Some(400),
                    cache_creation: None,
                },
                &price,
            )
        });
        assert!(expected.is_some(), "gpt-4o is in the price table");
        assert_eq!(usage.model.as_deref(), Some("gpt-4o"));
        assert_eq!(usage.input_tokens, Some(1_000));
        assert_eq!(usage.cost_usd, expected);
        assert_eq!(
            source,
            Some(CostSource::PriceTable(
                table.version().to_owned(),
                price.expect("checked above")
            ))
        );
    }

    #[test]
    fn langfuse_cost_details_give_the_total_or_the_sum() {
        assert_eq!(
            cost_from_details(r#"{"input":0.002,"output":0.001,"total":0.003}"#),
            Some(0.003)
        );
        // No total: the sum of the numeric values, rounded to a nano-dollar.
        assert_eq!(
            cost_from_details(r#"{"input":0.1,"output":0.2,"note":"x","cache":null}"#),
            Some(0.3)
        );
        // A total that is no number is no total.
        assert_eq!(
            cost_from_details(r#"{"input":0.5,"total":"lots"}"#),
            Some(0.5)
        );
        assert_eq!(cost_from_details(r#"{"total":-1,"input":-2}"#), None);
        assert_eq!(cost_from_details(r#"{"note":"free"}"#), None);
        assert_eq!(cost_from_details("{}"), None);
        assert_eq!(cost_from_details("0.5"), None);
        assert_eq!(cost_from_details("{oops"), None);
    }

    #[test]
    fn cost_details_are_a_reported_cost_unless_an_attribute_reports_one() {
        let details = r#"{"input":0.002,"output":0.001,"total":0.003}"#;
        let (usage, source) = usage_of(vec![
            kv("langfuse.observation.model.name", string("gpt-4o")),
            kv(
                "langfuse.observation.usage_details",
                string(r#"{"input":10}"#),
            ),
            kv("langfuse.observation.cost_details", string(details)),
        ]);
        assert_eq!(usage.cost_usd, Some(0.003));
        assert_eq!(source, Some(CostSource::Reported));
        let (usage, source) = usage_of(vec![
            kv("langfuse.observation.cost_details", string(details)),
            kv("operation.cost", double(0.25)),
        ]);
        assert_eq!(
            (usage.cost_usd, source),
            (Some(0.25), Some(CostSource::Reported))
        );
        // Unusable details: the table prices the span as if they were absent.
        let (_, source) = usage_of(vec![
            kv("gen_ai.request.model", string("gpt-4o")),
            kv("gen_ai.usage.input_tokens", int(10)),
            kv("langfuse.observation.cost_details", string("{}")),
        ]);
        assert!(
            matches!(source, Some(CostSource::PriceTable(..))),
            "{source:?}"
        );
    }

    #[test]
    fn a_vercel_ai_sdk_call_reads_its_ai_usage_and_model() {
        let (usage, source) = usage_of(vec![
            kv("ai.operationId", string("ai.generateText")),
            kv("ai.model.id", string("gpt-4o-mini")),
            kv("ai.usage.promptTokens", int(300)),
            kv("ai.usage.completionTokens", int(20)),
        ]);
        assert_eq!(usage.model.as_deref(), Some("gpt-4o-mini"));
        assert_eq!(
            (usage.input_tokens, usage.output_tokens),
            (Some(300), Some(20))
        );
        assert!(
            matches!(source, Some(CostSource::PriceTable(..))),
            "{source:?}"
        );
        // AI SDK 5 names, with the cached part of the input.
        let (usage, _) = usage_of(vec![
            kv("ai.usage.inputTokens", int(500)),
            kv("ai.usage.outputTokens", int(30)),
            kv("ai.usage.cachedInputTokens", int(200)),
        ]);
        assert_eq!(
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens
            ),
            (Some(500), Some(30), Some(200))
        );
        // The GenAI names a doGenerate span also carries are preferred.
        let (usage, _) = usage_of(vec![
            kv("ai.usage.promptTokens", int(1)),
            kv("gen_ai.usage.input_tokens", int(2)),
            kv("ai.model.id", string("requested")),
            kv("gen_ai.response.model", string("answered")),
        ]);
        assert_eq!(usage.input_tokens, Some(2));
        assert_eq!(usage.model.as_deref(), Some("answered"));
    }

    #[test]
    fn new_cache_aliases_are_read_with_the_current_name_preferred() {
        for name in [
            "gen_ai.usage.details.cache_read_tokens",
            "gen_ai.usage.details.cache_read_input_tokens",
            "ai.usage.cachedInputTokens",
        ] {
            let (usage, _) = usage_of(vec![kv(name, int(9))]);
            assert_eq!(usage.cache_read_tokens, Some(9), "{name}");
        }
        for name in [
            "gen_ai.usage.details.cache_write_tokens",
            "gen_ai.usage.details.cache_creation_input_tokens",
            "gen_ai.usage.cache_write_input_tokens",
        ] {
            let (usage, _) = usage_of(vec![kv(name, int(9))]);
            assert_eq!(usage.cache_creation_tokens, Some(9), "{name}");
        }
        let (usage, _) = usage_of(vec![
            kv("gen_ai.usage.details.cache_read_tokens", int(1)),
            kv("gen_ai.usage.cache_read.input_tokens", int(2)),
            kv("gen_ai.usage.cache_write_input_tokens", int(3)),
            kv("gen_ai.usage.cache_creation.input_tokens", int(4)),
        ]);
        assert_eq!(
            (usage.cache_read_tokens, usage.cache_creation_tokens),
            (Some(2), Some(4))
        );
    }
}
