//! The real Slurm 24.11 the versioned REST tests use (`scripts/slurm up 24.11` starts
//! it in a chroot; `scripts/test` runs that and exports `scripts/slurm env 24.11`),
//! and the Slurm commands they check with, run inside that chroot.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use integrations::slurm_api::{ApiClient, SlurmApiConfig};

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The chroot: `PP_SLURM24_ROOT`.
pub fn root() -> String {
    var("PP_SLURM24_ROOT", "/var/lib/powerplane-slurm24/root")
}

/// slurmrestd's unix socket (rest_auth/local), as this machine sees it.
pub fn socket() -> String {
    var(
        "PP_SLURM24_RESTD",
        "/var/lib/powerplane-slurm24/root/var/lib/pp/rest/slurmrestd.sock",
    )
}

/// slurmrestd's TCP listener (rest_auth/jwt), `host:port`.
pub fn tcp() -> String {
    var("PP_SLURM24_TCP", "127.0.0.1:6830")
}

/// The token file `scripts/slurm up 24.11` writes.
pub fn token_file() -> PathBuf {
    var("PP_SLURM24_TOKEN", "/var/lib/powerplane-slurm24/token").into()
}

/// The user slurmrestd runs as (and the tests' jobs run as).
pub fn rest_user() -> String {
    var("PP_SLURM24_USER", "slurmrest")
}

/// `scontrol` inside the chroot, for [`SlurmApiConfig::scontrol`].
pub fn scontrol_command() -> Vec<String> {
    vec!["chroot".into(), root(), "scontrol".into()]
}

/// A client of the 24.11 over its unix socket, built from `config` (its endpoint set).
///
/// # Panics
/// When slurmrestd does not answer: the test fails loudly, it does not skip.
pub fn build(config: &SlurmApiConfig) -> ApiClient {
    config.build().unwrap_or_else(|e| {
        panic!(
            "this test needs the real Slurm 24.11 at {} (run scripts/slurm up 24.11): {e}",
            config.endpoint
        )
    })
}

/// The unix-socket config (rest_auth/local).
pub fn local_config() -> SlurmApiConfig {
    let mut c = SlurmApiConfig::new(&format!("unix:{}", socket()));
    c.scontrol = scontrol_command();
    c
}

fn run(args: &[&str]) -> String {
    let out = Command::new("chroot")
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("chroot {args:?} (the Slurm 24.11 chroot; scripts/slurm up 24.11): {e}")
        });
    assert!(
        out.status.success(),
        "chroot {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Submits a batch job as the REST user (the only user rest_auth/local may update
/// the jobs of); returns its id.
pub fn sbatch(args: &[&str]) -> u64 {
    let user = rest_user();
    let spec = format!("--userspec={user}:{user}");
    let root = root();
    let mut all = vec![
        spec.as_str(),
        root.as_str(),
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "--chdir=/tmp",
    ];
    all.extend_from_slice(args);
    let out = run(&all);
    out.split(';')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("sbatch answered {out:?}"))
}

/// Submits a batch job as root (the REST user may not update it).
pub fn sbatch_as_root(args: &[&str]) -> u64 {
    let root = root();
    let mut all = vec![
        root.as_str(),
        "sbatch",
        "--parsable",
        "--output=/dev/null",
        "--chdir=/tmp",
    ];
    all.extend_from_slice(args);
    let out = run(&all);
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("sbatch answered {out:?}"))
}

/// `squeue`'s state and reason for a job (`None` once it left the queue).
pub fn squeue(id: u64) -> Option<(String, String)> {
    let out = Command::new("chroot")
        .args([
            &root(),
            "squeue",
            "-h",
            "-j",
            &id.to_string(),
            "-o",
            "%T %r",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (state, reason) = text.split_once(' ')?;
    Some((state.to_string(), reason.to_string()))
}

/// Waits until `squeue` shows what `ok` accepts.
///
/// # Panics
/// When it does not within `within`.
pub fn wait_squeue(id: u64, within: Duration, ok: impl Fn(&str, &str) -> bool) -> (String, String) {
    let end = Instant::now() + within;
    loop {
        let now = squeue(id).unwrap_or_default();
        if ok(&now.0, &now.1) {
            return now;
        }
        assert!(Instant::now() < end, "job {id}: squeue still shows {now:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A fresh JWT for the REST user from `scontrol token`.
pub fn token(lifespan_s: u64) -> String {
    token_for(&rest_user(), lifespan_s)
}

/// A fresh JWT for `user` (root may make one for anybody).
pub fn token_for(user: &str, lifespan_s: u64) -> String {
    let out = run(&[
        &root(),
        "scontrol",
        "token",
        &format!("username={user}"),
        &format!("lifespan={lifespan_s}"),
    ]);
    out.trim_start_matches("SLURM_JWT=").to_string()
}

/// Cancels its 24.11 jobs when dropped, so a failing test leaves none behind.
pub struct Cancel(pub Vec<u64>);

impl Drop for Cancel {
    fn drop(&mut self) {
        for id in &self.0 {
            let _ = Command::new("chroot")
                .args([&root(), "scancel", &id.to_string()])
                .output();
        }
    }
}
