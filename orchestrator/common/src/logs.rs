//! Logging for the binaries: to stderr, as text for people (the default) or one JSON
//! object a line with `POWERPLANE_LOG_FORMAT=json`; `POWERPLANE_LOG` filters.

use std::io::IsTerminal;

/// Installs the global subscriber; `default_filter` applies without `POWERPLANE_LOG`.
pub fn init(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("POWERPLANE_LOG")
        .unwrap_or_else(|_| default_filter.into());
    let format = std::env::var("POWERPLANE_LOG_FORMAT").unwrap_or_default();
    if format.eq_ignore_ascii_case("json") {
        tracing_subscriber::fmt()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    } else {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .init();
        if !format.is_empty() && !format.eq_ignore_ascii_case("text") {
            tracing::warn!(
                value = %format,
                "POWERPLANE_LOG_FORMAT must be \"text\" or \"json\"; logging text"
            );
        }
    }
}
