//! What the Debian packages install, checked without building them (scripts/package-test
//! builds and installs them in a clean chroot): the configuration they ship checks as
//! installed, every file their metadata names is in the tree, and the man pages and
//! completions come from the binary.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn powerplane(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(args)
        .output()
        .expect("powerplane")
}

/// `/etc/powerplane` as the controller's package leaves it: its conffiles and the
/// admin token its postinst makes.
fn installed_etc(dir: &Path) -> PathBuf {
    for f in [
        "powerplane.toml",
        "site.toml",
        "policy.toml",
        "mapping.toml",
    ] {
        std::fs::copy(root().join("deploy/etc").join(f), dir.join(f)).expect("copy");
    }
    std::fs::create_dir(dir.join("tokens")).expect("tokens");
    std::fs::write(dir.join("tokens/admin"), "ab".repeat(32)).expect("token");
    dir.join("powerplane.toml")
}

#[test]
fn the_shipped_configuration_checks_as_installed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = installed_etc(dir.path());
    let cfg = cfg.to_str().expect("utf-8");
    let out = powerplane(&["serve", "--check", "--config", cfg]);
    assert!(
        out.status.success(),
        "serve --check on the shipped configuration:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let site = dir.path().join("site.toml");
    let policy = dir.path().join("policy.toml");
    let out = powerplane(&[
        "policy",
        "check",
        policy.to_str().expect("utf-8"),
        "--site",
        site.to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // it actuates nothing until the admin says so: no agents, no scheduler
    let text = std::fs::read_to_string(dir.path().join("powerplane.toml")).expect("config");
    let live: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with('['))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        live,
        [
            "[controller]",
            "[store]",
            "[mqtt]",
            "[http]",
            "[[http.tokens]]"
        ],
        "the shipped configuration's sections"
    );
}

/// The `assets` of a crate's `[package.metadata.deb]`: (source, destination).
fn assets(manifest: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(manifest).expect("manifest");
    let doc: toml::Table = toml::from_str(&text).expect("toml");
    let deb = &doc["package"]["metadata"]["deb"];
    deb["assets"]
        .as_array()
        .expect("assets")
        .iter()
        .map(|a| {
            let a = a.as_array().expect("asset");
            (
                a[0].as_str().expect("source").to_string(),
                a[1].as_str().expect("destination").to_string(),
            )
        })
        .collect()
}

#[test]
fn every_file_the_packages_name_is_in_the_tree() {
    for (crate_dir, scripts) in [
        ("orchestrator", "deploy/debian/powerplane"),
        ("orchestrator/agent", "deploy/debian/powerplane-agent"),
    ] {
        let dir = root().join(crate_dir);
        let list = assets(&dir.join("Cargo.toml"));
        assert!(list.iter().any(|(_, d)| d.starts_with("usr/bin/")));
        assert!(list.iter().any(|(_, d)| d == "lib/systemd/system/"));
        assert!(list.iter().any(|(_, d)| d.starts_with("etc/powerplane/")));
        for (src, _) in list {
            if src.starts_with("target/") {
                continue; // built by scripts/package
            }
            let pattern = dir.join(&src);
            let pattern = pattern.to_str().expect("utf-8");
            let found = match pattern.split_once('*') {
                None => Path::new(pattern).is_file(),
                Some((folder, _)) => std::fs::read_dir(folder)
                    .map(|d| d.count() > 0)
                    .unwrap_or(false),
            };
            assert!(found, "{crate_dir}: asset {src} is not in the tree");
        }
        for script in ["postinst", "prerm", "postrm"] {
            let p = root().join(scripts).join(script);
            let check = Command::new("sh").arg("-n").arg(&p).status().expect("sh");
            assert!(check.success(), "{}: not valid sh", p.display());
        }
    }
}

#[test]
fn the_man_pages_and_completions_come_from_the_command_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = powerplane(&["generate-docs", dir.path().to_str().expect("utf-8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = std::fs::read_to_string(dir.path().join("man/powerplane-serve.1")).expect("page");
    // what --help says is on the page
    let help = powerplane(&["serve", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("Validate the config and everything it names"));
    assert!(
        page.contains("Validate the config and everything it names"),
        "{page}"
    );
    for sub in ["demo", "backtest", "report", "policy-check", "site-check"] {
        assert!(
            dir.path().join(format!("man/powerplane-{sub}.1")).is_file(),
            "no powerplane-{sub}(1)"
        );
    }
    let bash = std::fs::read_to_string(dir.path().join("completions/powerplane.bash"))
        .expect("bash completion");
    assert!(bash.contains("--group-by") && bash.contains("serve"));
    // hidden: not in the pages, not in the help
    assert!(!std::fs::read_dir(dir.path().join("man"))
        .expect("man")
        .any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .contains("generate")));
    let top = powerplane(&["--help"]);
    assert!(!String::from_utf8_lossy(&top.stdout).contains("generate-docs"));
}
