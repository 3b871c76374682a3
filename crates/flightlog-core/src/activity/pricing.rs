//! What a model call's tokens cost at a model's prices: the one formula both the OTLP importer
//! (pricing a span from its price table) and a store (pricing the counts an open span holds once
//! a later delivery completes it) use, so the two can never disagree.

use serde::{Deserialize, Serialize};

/// One model's prices in USD per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelPrice {
    pub input: f64,
    pub output: f64,
    /// Cached input read; absent: charged at the input price.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Cached input written; absent: charged at the input price.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

impl ModelPrice {
    /// Every price finite and not negative.
    pub fn is_valid(&self) -> bool {
        [
            Some(self.input),
            Some(self.output),
            self.cache_read,
            self.cache_write,
        ]
        .into_iter()
        .flatten()
        .all(|price| price.is_finite() && price >= 0.0)
    }
}

/// Token counts a cost is computed from (absent counts cost nothing).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TokenCounts {
    pub input: Option<i64>,
    pub output: Option<i64>,
    pub cache_read: Option<i64>,
    pub cache_creation: Option<i64>,
}

/// The cost in USD of `tokens` at `price`, rounded to a nano-dollar.
///
/// Input tokens are taken to *include* cached ones (the OpenTelemetry GenAI and OpenInference
/// convention): the uncached remainder `input − cache_read − cache_creation` (never below 0) is
/// charged at the input price and the cached parts at their own prices.
pub fn cost_usd(tokens: TokenCounts, price: &ModelPrice) -> f64 {
    let cache_read = tokens.cache_read.unwrap_or(0);
    let cache_creation = tokens.cache_creation.unwrap_or(0);
    let uncached = tokens
        .input
        .map(|input| {
            input
                .saturating_sub(cache_read)
                .saturating_sub(cache_creation)
                .max(0)
        })
        .unwrap_or(0);
    let output = tokens.output.unwrap_or(0);
    // Token counts are far below 2^53, so the conversions are exact.
    let per_million = uncached as f64 * price.input
        + cache_read as f64 * price.cache_read.unwrap_or(price.input)
        + cache_creation as f64 * price.cache_write.unwrap_or(price.input)
        + output as f64 * price.output;
    to_nano_dollar(per_million / 1_000_000.0)
}

/// `usd` rounded to a nano-dollar: how every cost this crate computes is stored (no
/// `0.30000000000000004` from a sum).
pub fn to_nano_dollar(usd: f64) -> f64 {
    (usd * 1e9).round() / 1e9
}

/// Input tokens *include* cached ones in flightlog (the GenAI and OpenInference convention),
/// but some producers report Anthropic's raw count, which excludes them (Logfire's Anthropic
/// integration, the Claude Agent SDK, Strands: input 3 next to a cache read of 7,166). When the
/// cached counts exceed the input count, the input cannot include them: they are added to it,
/// so the run's input and the computed cost are right. (A count that excludes the cache but is
/// still the larger cannot be told apart, and is read as including it.)
pub fn count_cache_into_input(tokens: &mut TokenCounts) {
    let cached = tokens
        .cache_read
        .unwrap_or(0)
        .saturating_add(tokens.cache_creation.unwrap_or(0));
    if let Some(input) = tokens.input {
        if cached > input {
            tokens.input = Some(input.saturating_add(cached));
        }
    }
}
