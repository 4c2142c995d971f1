//! A list kept in a JSON file, for the operators' books (overrides, grid targets): read
//! whole (a missing file is an empty list), written whole through a temporary file and
//! a rename, so that a crash leaves the old list or the new one, never half of one.

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Serialize;

/// Why a list file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ListFileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{0}")]
    Encode(#[source] serde_json::Error),
}

/// The list in `path` (missing, or no path: empty).
pub fn read<T: DeserializeOwned>(path: Option<&Path>) -> Result<Vec<T>, ListFileError> {
    let Some(p) = path else {
        return Ok(Vec::new());
    };
    match std::fs::read(p) {
        Ok(b) => serde_json::from_slice(&b).map_err(|source| ListFileError::Parse {
            path: p.to_path_buf(),
            source,
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(source) => Err(ListFileError::Io {
            path: p.to_path_buf(),
            source,
        }),
    }
}

/// Writes `list` to `path` whole (no path: nothing to do).
pub fn write<T: Serialize>(path: Option<&Path>, list: &[T]) -> Result<(), ListFileError> {
    let Some(p) = path else { return Ok(()) };
    let tmp = p.with_extension("tmp");
    let bytes = serde_json::to_vec_pretty(list).map_err(ListFileError::Encode)?;
    std::fs::write(&tmp, bytes)
        .and_then(|_| std::fs::rename(&tmp, p))
        .map_err(|source| ListFileError::Io {
            path: p.to_path_buf(),
            source,
        })
}

/// The highest number among ids `{prefix}{n}` (`o7`, `t12`; 0: none): a book numbers
/// its next entry above it.
pub fn highest_id<'a>(ids: impl Iterator<Item = &'a str>, prefix: &str) -> u64 {
    ids.filter_map(|id| id.strip_prefix(prefix)?.parse::<u64>().ok())
        .max()
        .unwrap_or(0)
}
