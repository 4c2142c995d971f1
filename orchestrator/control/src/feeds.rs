//! How a price or carbon feed file is written: the format keys of `[prices]` and
//! `[prices.carbon]` in `powerplane.toml`, and of the backtest's scenario.

use serde::Deserialize;
use telemetry::feeds::FeedError;
use telemetry::prices::{Series, SeriesError};

/// Why a feed file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(transparent)]
    Simple(#[from] SeriesError),
    #[error(transparent)]
    Feed(#[from] FeedError),
    #[error(
        "{name}: format {format:?} with{} [csv] and with{} [json]: use format = \"simple\", \"csv\" with [csv], \"json\" with [json], or \"entsoe\"",
        if *csv { "" } else { "out" },
        if *json { "" } else { "out" }
    )]
    Mismatch {
        name: String,
        format: Option<String>,
        csv: bool,
        json: bool,
    },
}

/// How a feed file is written (see `telemetry::feeds`).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FeedFormat {
    /// `simple` (the default), `csv` (with `[csv]`), `json` (with `[json]`) or `entsoe`.
    #[serde(default)]
    pub format: Option<String>,
    #[serde(default)]
    pub csv: Option<telemetry::feeds::CsvFormat>,
    #[serde(default)]
    pub json: Option<telemetry::feeds::JsonFormat>,
}

impl FeedFormat {
    /// Reads a feed; `simple_column` is the column of the default layout.
    pub fn read(&self, name: &str, text: &str, simple_column: &str) -> Result<Series, FormatError> {
        use telemetry::feeds;
        Ok(match (self.format.as_deref(), &self.csv, &self.json) {
            (None | Some("simple"), None, None) => Series::from_csv(name, text, simple_column)?,
            (Some("csv"), Some(c), None) => feeds::parse_csv(name, text, c)?,
            (Some("json"), None, Some(j)) => feeds::parse_json(name, text, j)?,
            (Some("entsoe"), None, None) => feeds::parse_entsoe(name, text)?,
            (f, c, j) => {
                return Err(FormatError::Mismatch {
                    name: name.to_string(),
                    format: f.map(str::to_string),
                    csv: c.is_some(),
                    json: j.is_some(),
                })
            }
        })
    }
}
