//! The real Slurm the scheduler tests use (`scripts/slurm up` starts it; `scripts/test`
//! runs that first), and the Slurm commands they check with; [`Target`]: either real
//! Slurm (22.05, or 24.11 with local auth or JWT) for the tests that run on each.

use std::process::Command;
use std::time::{Duration, Instant};

use integrations::slurm_api::SlurmApiConfig;

use crate::slurm24;

/// slurmrestd's socket: `PP_SLURMRESTD` or the one `scripts/slurm` opens.
pub fn socket() -> String {
    std::env::var("PP_SLURMRESTD")
        .unwrap_or_else(|_| "/var/lib/powerplane-slurm/slurmrestd.sock".to_string())
}

/// The REST config of the test Slurm (rest_auth/local on its socket).
///
/// # Panics
/// When slurmrestd does not answer: the test fails loudly, it does not skip.
pub fn config() -> SlurmApiConfig {
    let c = SlurmApiConfig::new(&format!("unix:{}", socket()));
    if let Err(e) = c.build().and_then(|b| b.ping()) {
        panic!(
            "this test needs a real Slurm with slurmrestd on {} (run scripts/slurm up): {e}",
            socket()
        );
    }
    c
}

/// One of the real Slurms the adapter tests run against, and how it is reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// Slurm 22.05 (`scripts/slurm up`), v0.0.38, rest_auth/local on its socket.
    Slurm2205,
    /// Slurm 24.11 (`scripts/slurm up 24.11`), rest_auth/local on its socket.
    Slurm2411,
    /// Slurm 24.11 over TCP with a JWT of the REST user (auth/jwt).
    Slurm2411Jwt,
}

impl Target {
    fn is_24(self) -> bool {
        self != Target::Slurm2205
    }

    /// The REST config of this Slurm, checked to answer.
    ///
    /// # Panics
    /// When slurmrestd does not answer: the test fails loudly, it does not skip.
    pub fn config(self) -> SlurmApiConfig {
        let c = match self {
            Target::Slurm2205 => return config(),
            Target::Slurm2411 => slurm24::local_config(),
            Target::Slurm2411Jwt => {
                let file =
                    std::env::temp_dir().join(format!("pp-slurm24-{}.jwt", std::process::id()));
                std::fs::write(&file, format!("SLURM_JWT={}\n", slurm24::token(3600)))
                    .unwrap_or_else(|e| panic!("cannot write {}: {e}", file.display()));
                let mut c = SlurmApiConfig::new(&format!("http://{}", slurm24::tcp()));
                c.user = Some(slurm24::rest_user());
                c.token_file = Some(file);
                c.scontrol = slurm24::scontrol_command();
                c
            }
        };
        let _ = slurm24::build(&c);
        c
    }

    /// The user the test's jobs run as.
    pub fn user(self) -> String {
        if self.is_24() {
            return slurm24::rest_user();
        }
        let me = Command::new("id").arg("-un").output().expect("id");
        String::from_utf8_lossy(&me.stdout).trim().to_string()
    }

    /// Submits a batch job (as the user the REST calls may update the jobs of).
    pub fn sbatch(self, args: &[&str]) -> u64 {
        if self.is_24() {
            slurm24::sbatch(args)
        } else {
            sbatch(args)
        }
    }

    pub fn squeue(self, id: u64) -> Option<(String, String)> {
        if self.is_24() {
            slurm24::squeue(id)
        } else {
            squeue(id)
        }
    }

    /// Waits until `squeue` shows what `ok` accepts.
    ///
    /// # Panics
    /// When it does not within `within`.
    pub fn wait_squeue(
        self,
        id: u64,
        within: Duration,
        ok: impl Fn(&str, &str) -> bool,
    ) -> (String, String) {
        if self.is_24() {
            slurm24::wait_squeue(id, within, ok)
        } else {
            wait_squeue(id, within, ok)
        }
    }

    /// `scontrol <args>` as root (an admin's action).
    pub fn scontrol(self, args: &[&str]) {
        if self.is_24() {
            let root = slurm24::root();
            let mut all = vec![root.as_str(), "scontrol"];
            all.extend_from_slice(args);
            run("chroot", &all);
        } else {
            scontrol(args);
        }
    }

    /// Cancels `ids` when dropped.
    pub fn cancel(self, ids: Vec<u64>) -> TargetCancel {
        TargetCancel(self, ids)
    }
}

/// Cancels a target's jobs when dropped, so a failing test leaves none behind.
pub struct TargetCancel(pub Target, pub Vec<u64>);

impl Drop for TargetCancel {
    fn drop(&mut self) {
        if self.0.is_24() {
            drop(slurm24::Cancel(std::mem::take(&mut self.1)));
        } else {
            scancel(&self.1);
        }
    }
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| {
        panic!("{cmd} (Debian slurm-client; scripts/slurm up installs it): {e}")
    });
    assert!(
        out.status.success(),
        "{cmd} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Submits a batch job with `sbatch --parsable`; returns its id.
pub fn sbatch(args: &[&str]) -> u64 {
    let mut all = vec!["--parsable", "--output=/dev/null"];
    all.extend_from_slice(args);
    let out = run("sbatch", &all);
    out.split(';')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("sbatch answered {out:?}"))
}

/// `squeue`'s state and reason for a job (`None` once it left the queue).
pub fn squeue(id: u64) -> Option<(String, String)> {
    let out = Command::new("squeue")
        .args(["-h", "-j", &id.to_string(), "-o", "%T %r"])
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

/// `scontrol <args>` as root (an admin's action).
pub fn scontrol(args: &[&str]) {
    run("scontrol", args);
}

/// Cancels jobs (ignoring those already gone).
pub fn scancel(ids: &[u64]) {
    for id in ids {
        let _ = Command::new("scancel").arg(id.to_string()).output();
    }
}

/// Cancels its jobs when dropped, so a failing test leaves no job behind.
pub struct Cancel(pub Vec<u64>);

impl Drop for Cancel {
    fn drop(&mut self) {
        scancel(&self.0);
    }
}
