//! Who may call the API: the `[[http.tokens]]` of `powerplane.toml`, their roles, and
//! the tokens as kept in memory (their digests only).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::HttpSection;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Shown in logs (never the token).
    pub name: String,
    pub role: Role,
    /// A file holding the token (preferred), or the token itself.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    #[serde(default)]
    pub token: Option<String>,
}

/// What a token may do; each role may do what the ones below it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Read everything.
    Viewer,
    /// And set or remove overrides.
    Operator,
    /// And administer (reserved for policy reloads).
    Admin,
}

/// The shortest token accepted.
pub const MIN_TOKEN_CHARS: usize = 16;

/// Reads and checks the tokens of an `[http]` section.
pub fn load_tokens(sec: &HttpSection, base: &Path) -> Result<Vec<Token>> {
    anyhow::ensure!(
        !sec.tokens.is_empty(),
        "[http] needs at least one [[http.tokens]] (name, role, token_file)"
    );
    let mut out = Vec::new();
    for t in &sec.tokens {
        let secret = match (&t.token_file, &t.token) {
            (Some(f), None) => {
                let p = if f.is_absolute() {
                    f.clone()
                } else {
                    base.join(f)
                };
                std::fs::read_to_string(&p)
                    .with_context(|| {
                        format!("[http] token {:?}: cannot read {}", t.name, p.display())
                    })?
                    .trim()
                    .to_string()
            }
            (None, Some(s)) => s.clone(),
            _ => anyhow::bail!(
                "[http] token {:?}: give exactly one of token_file or token",
                t.name
            ),
        };
        anyhow::ensure!(
            secret.chars().count() >= MIN_TOKEN_CHARS,
            "[http] token {:?} is shorter than {MIN_TOKEN_CHARS} characters (make one with `openssl rand -hex 32`)",
            t.name
        );
        out.push(Token {
            name: t.name.clone(),
            role: t.role,
            digest: Sha256::digest(secret.as_bytes()).into(),
        });
    }
    Ok(out)
}

/// A token as kept in memory: its SHA-256 only.
#[derive(Debug, Clone)]
pub struct Token {
    pub name: String,
    pub role: Role,
    pub(super) digest: [u8; 32],
}
