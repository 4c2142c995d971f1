//! The real Slurm the scheduler tests use (`scripts/slurm up` starts it; `scripts/test`
//! runs that first), and the Slurm commands they check with.

use std::process::Command;
use std::time::{Duration, Instant};

use integrations::slurm::{Client, Endpoint};

/// slurmrestd's socket: `PP_SLURMRESTD` or the one `scripts/slurm` opens.
pub fn socket() -> String {
    std::env::var("PP_SLURMRESTD")
        .unwrap_or_else(|_| "/var/lib/powerplane-slurm/slurmrestd.sock".to_string())
}

/// A client of the test Slurm.
///
/// # Panics
/// When slurmrestd does not answer: the test fails loudly, it does not skip.
pub fn client() -> Client {
    let c = Client::new(Endpoint::Unix(socket().into()));
    if let Err(e) = c.ping() {
        panic!(
            "this test needs a real Slurm with slurmrestd on {} (run scripts/slurm up): {e}",
            socket()
        );
    }
    c
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
