//! The model price table: what a span's tokens cost when the instrumentation reported no cost.
//!
//! The bundled table (`prices.json`, compiled in) carries a `version`; a span whose cost it
//! computed records that version in its attrs, so costs can be recomputed when prices change.
//! Prices are USD per million tokens. A model is found by its exact name, else by the longest
//! table name it starts with followed by a version suffix only: `-`, `@` or `:` and then
//! numbers, `v`-numbers or `latest` (dated snapshots such as `-2024-08-06`, Vertex-style
//! `@20250514`, `-001`, `:0`), after lower-casing and dropping any `provider/` path before the
//! last `/`. Any other suffix is another model: `o1-mini` is not priced as `o1` (at about 14
//! times its price), and a model the table lacks gets no computed cost rather than a wrong one.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use serde::Deserialize;

pub use flightlog_core::activity::pricing::ModelPrice;
pub(crate) use flightlog_core::activity::pricing::{cost_usd, to_nano_dollar, TokenCounts};

/// The bundled price table's JSON text.
const BUNDLED_PRICES: &str = include_str!("prices.json");

/// Why a price table could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum PriceTableError {
    /// The text is not a price table (`{"version": …, "models": {name: {input, output, …}}}`).
    #[error("invalid price table: {0}")]
    Invalid(#[from] serde_json::Error),
    /// A price is negative or not finite.
    #[error("invalid price for model {model:?}: prices must be finite and not negative")]
    BadPrice { model: String },
}

/// A versioned table of model prices.
#[derive(Debug, Clone, PartialEq)]
pub struct PriceTable {
    version: String,
    /// Lower-case model name → price.
    models: BTreeMap<String, ModelPrice>,
}

#[derive(Deserialize)]
struct PriceTableFile {
    version: String,
    models: BTreeMap<String, ModelPrice>,
}

impl PriceTable {
    /// Parse a table in the bundled file's format (unknown top-level fields are ignored).
    pub fn from_json(text: &str) -> Result<Self, PriceTableError> {
        let file: PriceTableFile = serde_json::from_str(text)?;
        let mut models = BTreeMap::new();
        for (name, price) in file.models {
            if !price.is_valid() {
                return Err(PriceTableError::BadPrice { model: name });
            }
            models.insert(name.to_ascii_lowercase(), price);
        }
        Ok(Self {
            version: file.version,
            models,
        })
    }

    /// The table compiled into this crate, parsed once. A unit test guarantees it parses; were
    /// it ever broken, the result is an empty table (no computed costs) rather than a panic.
    pub fn bundled() -> Arc<PriceTable> {
        static BUNDLED: OnceLock<Arc<PriceTable>> = OnceLock::new();
        BUNDLED
            .get_or_init(|| {
                Arc::new(
                    PriceTable::from_json(BUNDLED_PRICES).unwrap_or_else(|_| PriceTable {
                        version: "unavailable".to_owned(),
                        models: BTreeMap::new(),
                    }),
                )
            })
            .clone()
    }

    /// The table's version, recorded on every span whose cost it computed.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The price of `model`: exact name, else the longest known prefix (see the module doc).
    pub fn lookup(&self, model: &str) -> Option<&ModelPrice> {
        let lowered = model.trim().to_ascii_lowercase();
        let name = without_cloud_prefixes(lowered.rsplit('/').next().unwrap_or(&lowered));
        let dashed;
        let name = match claude_with_dashes(name) {
            Some(renamed) => {
                dashed = renamed;
                dashed.as_str()
            }
            None => name,
        };
        if let Some(price) = self.models.get(name) {
            return Some(price);
        }
        self.models
            .iter()
            .filter(|(known, _)| {
                name.strip_prefix(known.as_str())
                    .is_some_and(is_version_suffix)
            })
            .max_by_key(|(known, _)| known.len())
            .map(|(_, price)| price)
    }
}

/// A Bedrock model id without its cross-region inference prefix (`us.`, `eu.`, `apac.`,
/// `global.`, `us-gov.`) and its vendor prefix (`anthropic.`, `amazon.`, `meta.`, …):
/// `us.anthropic.claude-sonnet-4-20250514-v1:0` is `claude-sonnet-4-20250514-v1:0`. A name with
/// no vendor prefix is left whole (`gpt-4.1` has a dot of its own).
fn without_cloud_prefixes(name: &str) -> &str {
    const REGIONS: [&str; 5] = ["us.", "eu.", "apac.", "global.", "us-gov."];
    const VENDORS: [&str; 8] = [
        "anthropic.",
        "amazon.",
        "meta.",
        "cohere.",
        "mistral.",
        "ai21.",
        "openai.",
        "deepseek.",
    ];
    let after_region = REGIONS
        .iter()
        .find_map(|region| name.strip_prefix(region))
        .unwrap_or(name);
    VENDORS
        .iter()
        .find_map(|vendor| after_region.strip_prefix(vendor))
        .unwrap_or(name)
}

/// A Claude name with its version dotted as routers write it (`claude-3.5-sonnet`,
/// `claude-sonnet-4.5`, OpenRouter's and Vercel's AI Gateway's ids) in Anthropic's own dashed
/// form (`claude-3-5-sonnet`, `claude-sonnet-4-5`); `None` for any other name. Only Claude's:
/// other families have dots in their real names (`gpt-4.1`, `gemini-2.5-pro`).
fn claude_with_dashes(name: &str) -> Option<String> {
    if !name.starts_with("claude") {
        return None;
    }
    let bytes = name.as_bytes();
    let dotted_version = |at: usize| {
        bytes[at] == b'.'
            && at > 0
            && bytes[at - 1].is_ascii_digit()
            && bytes.get(at + 1).is_some_and(u8::is_ascii_digit)
    };
    if !(0..bytes.len()).any(dotted_version) {
        return None;
    }
    Some(
        name.char_indices()
            .map(|(at, c)| if dotted_version(at) { '-' } else { c })
            .collect(),
    )
}

/// Whether `rest` (what follows a known model name) only names a version of that model: a
/// separator (`-`, `@`, `:`), then parts separated by `-`, `.`, `@`, `:`, each digits,
/// `v` and digits, or `latest`; but not a first part of one or two digits, which names a newer
/// minor version (`claude-opus-4-6` is not `claude-opus-4`, and was priced at its $15/$75 where
/// its own price is unknown to the table), not a snapshot (`-20250514`, `-0613`, `-001`).
fn is_version_suffix(rest: &str) -> bool {
    let Some(parts) = rest.strip_prefix(['-', '@', ':']) else {
        return false;
    };
    let first = parts.split(['-', '.', '@', ':']).next().unwrap_or_default();
    if (1..=2).contains(&first.len()) && first.bytes().all(|b| b.is_ascii_digit()) {
        return false;
    }
    parts.split(['-', '.', '@', ':']).all(|part| {
        let digits = part.strip_prefix('v').unwrap_or(part);
        part == "latest" || (!digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_table_parses_and_has_a_version() {
        let table = PriceTable::from_json(BUNDLED_PRICES).unwrap();
        assert_eq!(table.version(), "2026-12-03");
        assert_eq!(PriceTable::bundled().version(), "2026-12-03");
        assert!(table.models.len() >= 30, "{}", table.models.len());
        for family in ["gpt-4o", "gpt-4o-mini", "gpt-4.1", "o3", "o4-mini"] {
            assert!(table.models.contains_key(family), "{family}");
        }
        for family in [
            "claude-sonnet-4",
            "claude-opus-4",
            "claude-3-5-haiku",
            "gemini-2.5-pro",
        ] {
            assert!(table.models.contains_key(family), "{family}");
        }
    }

    #[test]
    fn exact_names_then_the_longest_prefix_at_a_boundary() {
        let table = PriceTable::bundled();
        let input_price = |model: &str| table.lookup(model).map(|price| price.input);
        assert_eq!(input_price("gpt-4o"), Some(2.5));
        assert_eq!(input_price("gpt-4o-2024-08-06"), Some(2.5));
        assert_eq!(input_price("gpt-4o-mini-2024-07-18"), Some(0.15));
        assert_eq!(input_price("gpt-4.1-nano-2025-04-14"), Some(0.1));
        assert_eq!(input_price("claude-sonnet-4-20250514"), Some(3.0));
        assert_eq!(input_price("claude-opus-4-5-20251101"), Some(5.0));
        assert_eq!(input_price("claude-opus-4-20250514"), Some(15.0));
        assert_eq!(input_price("claude-sonnet-4@20250514"), Some(3.0));
        assert_eq!(input_price("models/gemini-2.5-flash"), Some(0.3));
        assert_eq!(input_price("GPT-4o"), Some(2.5));
        assert_eq!(input_price("o3-pro-2025-06-10"), Some(20.0));
        // A prefix must end at a boundary: "gpt-4o" does not price "gpt-4o2".
        assert_eq!(input_price("gpt-4o2"), None);
        assert_eq!(input_price("llama-3-70b"), None);
        // Only a version may follow: another model is not priced as the one it starts with.
        assert_eq!(input_price("o1-mini"), None);
        assert_eq!(input_price("o1-preview-2024-09-12"), None);
        assert_eq!(input_price("gpt-4o-audio-preview"), None);
        assert_eq!(input_price("gemini-2.5-flash-preview-05-20"), None);
        assert_eq!(input_price("o1-2024-12-17"), input_price("o1"));
        assert_eq!(input_price("gemini-2.5-flash-001"), Some(0.3));
        assert_eq!(input_price("claude-sonnet-4-5-latest"), Some(3.0));
        assert_eq!(input_price("gpt-4o:v2"), Some(2.5));
        assert_eq!(input_price("gpt-4o-"), None);
        // A newer minor version is another model, whose price the table does not know.
        assert_eq!(input_price("claude-opus-4-6"), None);
        assert_eq!(input_price("claude-opus-4-6-20260201"), None);
        assert_eq!(input_price("claude-sonnet-4.7"), None);
        assert_eq!(input_price("gpt-4-0613"), input_price("gpt-4"));
    }

    #[test]
    fn bedrock_ids_and_dotted_claude_versions_find_their_model() {
        let table = PriceTable::bundled();
        let input_price = |model: &str| table.lookup(model).map(|price| price.input);
        assert_eq!(
            input_price("anthropic.claude-3-5-sonnet-20241022-v2:0"),
            Some(3.0)
        );
        assert_eq!(
            input_price("us.anthropic.claude-sonnet-4-20250514-v1:0"),
            Some(3.0)
        );
        assert_eq!(
            input_price("bedrock/eu.anthropic.claude-3-haiku-20240307-v1:0"),
            Some(0.25)
        );
        assert_eq!(input_price("anthropic/claude-3.5-sonnet"), Some(3.0));
        assert_eq!(input_price("anthropic/claude-sonnet-4.5"), Some(3.0));
        assert_eq!(input_price("claude-3.7-sonnet-20250219"), Some(3.0));
        assert_eq!(input_price("claude-opus-4.1"), Some(15.0));
        assert_eq!(input_price("claude-3.5-haiku"), Some(0.8));
        // Only a vendor prefix is dropped, and only Claude's dots become dashes.
        assert_eq!(input_price("us.gpt-4o"), None);
        assert_eq!(input_price("gpt-4.1"), Some(2.0));
        assert_eq!(input_price("anthropic.llama-3"), None);
    }

    #[test]
    fn older_models_still_in_use_are_priced() {
        let table = PriceTable::bundled();
        let prices = |model: &str| table.lookup(model).map(|price| (price.input, price.output));
        assert_eq!(prices("gpt-4-turbo-2024-04-09"), Some((10.0, 30.0)));
        assert_eq!(prices("gpt-4-0613"), Some((30.0, 60.0)));
        assert_eq!(prices("gpt-3.5-turbo-0125"), Some((0.5, 1.5)));
        assert_eq!(prices("gpt-4o-2024-05-13"), Some((5.0, 15.0)));
        assert_eq!(prices("gpt-4o-2024-08-06"), Some((2.5, 10.0)));
        assert_eq!(prices("chatgpt-4o-latest"), Some((5.0, 15.0)));
        assert_eq!(prices("text-embedding-ada-002"), Some((0.1, 0.0)));
        assert_eq!(prices("models/gemini-1.5-pro-002"), Some((1.25, 5.0)));
        assert_eq!(prices("gemini-1.5-flash-8b"), Some((0.0375, 0.15)));
        assert_eq!(prices("claude-3-sonnet-20240229"), Some((3.0, 15.0)));
        // Neither gpt-4 nor gpt-4-turbo prices a model that only starts with their name.
        assert_eq!(prices("gpt-4-32k"), None);
        assert_eq!(prices("gpt-4o"), Some((2.5, 10.0)));
    }

    #[test]
    fn cost_charges_cached_input_at_its_own_price() {
        let price = ModelPrice {
            input: 3.0,
            output: 15.0,
            cache_read: Some(0.3),
            cache_write: Some(3.75),
        };
        let tokens = TokenCounts {
            input: Some(1_000_000),
            output: Some(100_000),
            cache_read: Some(400_000),
            cache_creation: Some(100_000),
        };
        // 500k uncached × 3 + 400k × 0.3 + 100k × 3.75 + 100k × 15, per million.
        assert_eq!(cost_usd(tokens, &price), 3.495);
        let output_only = TokenCounts {
            output: Some(2_000),
            ..TokenCounts::default()
        };
        assert_eq!(cost_usd(output_only, &price), 0.03);
    }

    #[test]
    fn negative_prices_are_refused() {
        let error = PriceTable::from_json(
            r#"{"version": "x", "models": {"m": {"input": -1, "output": 1}}}"#,
        )
        .err()
        .map(|error| error.to_string());
        assert_eq!(
            error.as_deref(),
            Some("invalid price for model \"m\": prices must be finite and not negative")
        );
        assert!(
            PriceTable::from_json(r#"{"version": "x", "models": {"m": {"input": 1}}}"#).is_err()
        );
    }
}
