//! How a price or carbon feed file is written: the format keys of `[prices]` and
//! `[prices.carbon]` in `powerplane.toml`, and of the backtest's scenario.

use anyhow::Result;
use integrations::prices::Series;
use serde::Deserialize;

/// How a feed file is written (see `integrations::feeds`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FeedFormat {
    /// `simple` (the default), `csv` (with `[csv]`), `json` (with `[json]`) or `entsoe`.
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub csv: Option<integrations::feeds::CsvFormat>,
    #[serde(default)]
    pub json: Option<integrations::feeds::JsonFormat>,
}

impl FeedFormat {
    /// Reads a feed; `simple_column` is the column of the default layout.
    pub fn read(&self, name: &str, text: &str, simple_column: &str) -> Result<Series> {
        use integrations::feeds;
        Ok(match (self.format.as_deref(), &self.csv, &self.json) {
            (None | Some("simple"), None, None) => Series::from_csv(name, text, simple_column)?,
            (Some("csv"), Some(c), None) => feeds::parse_csv(name, text, c)?,
            (Some("json"), None, Some(j)) => feeds::parse_json(name, text, j)?,
            (Some("entsoe"), None, None) => feeds::parse_entsoe(name, text)?,
            (f, c, j) => anyhow::bail!(
                "{name}: format {f:?} with{} [csv] and with{} [json]: use format = \"simple\", \"csv\" with [csv], \"json\" with [json], or \"entsoe\"",
                if c.is_some() { "" } else { "out" },
                if j.is_some() { "" } else { "out" }
            ),
        })
    }
}
