//! Secrets named in config files (`password_file`, `url_file`): read once, when the
//! config is loaded, relative to the config file's folder, without the trailing line
//! break an editor leaves.

use std::path::Path;

/// The secret in `file` (relative to `base`); an empty file is an error.
pub fn read(base: &Path, file: &Path) -> Result<String, String> {
    let p = if file.is_absolute() {
        file.to_path_buf()
    } else {
        base.join(file)
    };
    let text =
        std::fs::read_to_string(&p).map_err(|e| format!("cannot read {}: {e}", p.display()))?;
    let secret = text.trim_end_matches(['\n', '\r']);
    if secret.is_empty() {
        return Err(format!("{} is empty", p.display()));
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
        assert_eq!(read(dir.path(), Path::new("pw")).as_deref(), Ok("s3cret"));
        std::fs::write(dir.path().join("empty"), "\n").expect("write");
        assert!(read(dir.path(), Path::new("empty")).is_err());
        assert!(read(dir.path(), Path::new("missing"))
            .expect_err("missing")
            .starts_with("cannot read"));
    }
}
