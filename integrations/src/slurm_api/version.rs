//! Which slurmrestd API version to speak: the versions powerplane knows, the config
//! pin, and the choice from the paths the server's `/openapi/v3` lists (the first
//! step of every [`super::ApiClient`]).

use std::fmt;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A slurmrestd OpenAPI version powerplane speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ApiVersion {
    /// `openapi/v0.0.38`: Slurm 22.05 (Debian 12) serves it; 24.11 does not.
    V0038,
    /// `data_parser/v0.0.40`: the oldest that Slurm 24.11 (Debian 13) serves.
    V0040,
    /// `data_parser/v0.0.41`: served by Slurm 24.11.
    V0041,
    /// `data_parser/v0.0.42`: the newest that Slurm 24.11 serves.
    V0042,
}

impl ApiVersion {
    /// Newest first: the order `auto` tries them in.
    pub const ALL: [ApiVersion; 4] = [
        ApiVersion::V0042,
        ApiVersion::V0041,
        ApiVersion::V0040,
        ApiVersion::V0038,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApiVersion::V0038 => "v0.0.38",
            ApiVersion::V0040 => "v0.0.40",
            ApiVersion::V0041 => "v0.0.41",
            ApiVersion::V0042 => "v0.0.42",
        }
    }

    pub fn parse(s: &str) -> Option<ApiVersion> {
        ApiVersion::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// `/slurm/v0.0.42`: where its slurmctld paths start.
    pub fn prefix(self) -> String {
        format!("/slurm/{}", self.as_str())
    }

    /// The data_parser shapes (state a list, numbers as `{set, infinite, number}`).
    pub fn is_data_parser(self) -> bool {
        self >= ApiVersion::V0040
    }

    /// What powerplane speaks, newest first, as strings.
    pub fn ours() -> Vec<String> {
        ApiVersion::ALL
            .iter()
            .map(|v| v.as_str().to_string())
            .collect()
    }
}

impl fmt::Display for ApiVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An `api_version` powerplane does not speak.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("api_version must be \"auto\" or one of {ours:?}, got {0:?}", ours = ApiVersion::ours())]
pub struct UnknownVersion(pub String);

/// The config's `api_version`: `"auto"` (the newest both sides speak) or one version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApiPin {
    #[default]
    Auto,
    Exact(ApiVersion),
}

impl ApiPin {
    pub fn parse(s: &str) -> Result<ApiPin, UnknownVersion> {
        if s == "auto" {
            return Ok(ApiPin::Auto);
        }
        ApiVersion::parse(s)
            .map(ApiPin::Exact)
            .ok_or_else(|| UnknownVersion(s.to_string()))
    }
}

impl<'de> Deserialize<'de> for ApiPin {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        ApiPin::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The versions an OpenAPI document has slurmctld paths for (`/slurm/vX/...`),
/// sorted, each once; unknown ones too (they name what the server offers).
pub fn offered(openapi: &Value) -> Vec<String> {
    let mut out: Vec<String> = openapi
        .get("paths")
        .and_then(Value::as_object)
        .map(|paths| {
            paths
                .keys()
                .filter_map(|p| p.strip_prefix("/slurm/"))
                .filter_map(|rest| rest.split('/').next())
                .filter(|v| v.starts_with('v'))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out.dedup();
    out
}

/// The version to speak: the pinned one if offered, else the newest both speak.
/// `Err((offered, ours))`: nothing in common, or the pinned one not offered (the
/// caller names the server and the pin).
pub fn choose(pin: ApiPin, offered: &[String]) -> Result<ApiVersion, (Vec<String>, Vec<String>)> {
    let has = |v: ApiVersion| offered.iter().any(|o| o == v.as_str());
    let found = match pin {
        ApiPin::Auto => ApiVersion::ALL.into_iter().find(|v| has(*v)),
        ApiPin::Exact(v) => Some(v).filter(|v| has(*v)),
    };
    found.ok_or_else(|| (offered.to_vec(), ApiVersion::ours()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(paths: &[&str]) -> Value {
        let mut m = serde_json::Map::new();
        for p in paths {
            m.insert((*p).to_string(), Value::Null);
        }
        serde_json::json!({ "paths": m })
    }

    #[test]
    fn the_newest_common_version_wins_and_a_pin_is_kept() {
        let d = doc(&[
            "/slurm/v0.0.40/jobs/",
            "/slurm/v0.0.41/jobs/",
            "/openapi/v3",
        ]);
        let offered = offered(&d);
        assert_eq!(offered, ["v0.0.40", "v0.0.41"]);
        assert_eq!(choose(ApiPin::Auto, &offered), Ok(ApiVersion::V0041));
        assert_eq!(
            choose(ApiPin::Exact(ApiVersion::V0040), &offered),
            Ok(ApiVersion::V0040)
        );
        let (o, ours) = choose(ApiPin::Exact(ApiVersion::V0042), &offered).expect_err("refused");
        assert_eq!((o.len(), ours.len()), (2, 4));
    }

    #[test]
    fn a_server_with_only_unknown_versions_is_refused_naming_both_sides() {
        let offered = offered(&doc(&["/slurm/v0.0.44/jobs/", "/slurm/v0.0.43/ping/"]));
        let (o, ours) = choose(ApiPin::Auto, &offered).expect_err("refused");
        assert_eq!(o, ["v0.0.43", "v0.0.44"]);
        assert_eq!(ours, ["v0.0.42", "v0.0.41", "v0.0.40", "v0.0.38"]);
    }

    #[test]
    fn the_pin_parses_auto_and_each_version_and_names_what_it_accepts() {
        assert_eq!(ApiPin::parse("auto"), Ok(ApiPin::Auto));
        assert_eq!(
            ApiPin::parse("v0.0.38"),
            Ok(ApiPin::Exact(ApiVersion::V0038))
        );
        let e = ApiPin::parse("v0.0.39").expect_err("refused").to_string();
        assert!(e.contains("v0.0.39") && e.contains("v0.0.42"), "{e}");
        let p: ApiPin = serde_json::from_str("\"v0.0.41\"").expect("pin");
        assert_eq!(p, ApiPin::Exact(ApiVersion::V0041));
    }
}
