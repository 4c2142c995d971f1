//! Paths named in config files (`powerplane.toml`, the agent's file): relative ones are
//! relative to the file's folder.

use std::path::{Path, PathBuf};

/// A path from a config file: relative ones are relative to the file's folder.
pub fn resolve(base: &Path, p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        base.join(p)
    }
}
