//! Secrets named in config files (`password_file`, `url_file`): read once, when the
//! config is loaded, relative to the config file's folder, without the trailing line
//! break an editor leaves.

use std::path::{Path, PathBuf};

use thiserror::Error;

/// Why a secret file gave no secret.
#[derive(Debug, Error)]
pub enum SecretError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is empty", .0.display())]
    Empty(PathBuf),
}

/// Why a config's `password` and `password_file` give no password.
#[derive(Debug, Error)]
pub enum PasswordError {
    #[error("give one of password or password_file, not both")]
    Both,
    #[error("auth needs password or password_file")]
    Missing,
    #[error("password_file: {0}")]
    File(#[source] SecretError),
}

/// The secret in `file` (relative to `base`); an empty file is an error.
pub fn read(base: &Path, file: &Path) -> Result<String, SecretError> {
    let p = if file.is_absolute() {
        file.to_path_buf()
    } else {
        base.join(file)
    };
    let text = match std::fs::read_to_string(&p) {
        Ok(t) => t,
        Err(source) => return Err(SecretError::Read { path: p, source }),
    };
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(SecretError::Empty(p));
    }
    Ok(secret.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_secret_is_read_relative_to_the_config_without_its_line_break() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("pw"), "s3cret\n").expect("write");
        assert_eq!(read(dir.path(), Path::new("pw")).expect("read"), "s3cret");
        std::fs::write(dir.path().join("empty"), "\n").expect("write");
        assert!(read(dir.path(), Path::new("empty")).is_err());
        assert!(read(dir.path(), Path::new("missing"))
            .expect_err("missing")
            .to_string()
            .starts_with("cannot read"));
    }
}
