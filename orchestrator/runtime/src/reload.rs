//! Hot reload of the policy file in `serve`.
//!
//! Every `controller.policy_reload_s` (and at once on SIGHUP) the watcher looks at the
//! file's modification time and size, and reads and hashes it when they changed (or on
//! SIGHUP, or every [`REHASH_EVERY`] polls in case an edit kept both). A file whose
//! SHA-256 differs from the policy in force is parsed and validated; a valid one is
//! handed to the control loop between two ticks (the swap is atomic: a tick runs
//! wholly on the old policy or wholly on the new), an invalid one keeps the old policy
//! running, logs the problems once per distinct error and shows them in `/metrics` and
//! `/api/v1/policy` until the file is fixed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use policies::{Action, Decision, Policy, Target};
use serde::Serialize;
use sha2::{Digest, Sha256};
use telemetry::diag::Diagnostics;
use telemetry::{Site, Timestamp};
use tracing::{info, warn};

use control::ControlLoop;

/// Polls between two reads of a file whose time and size did not change.
pub const REHASH_EVERY: u32 = 15;

/// The default of `controller.policy_reload_s`.
pub const DEFAULT_RELOAD_S: f64 = 2.0;

/// What the API and `/metrics` show of the policy in force and the last reload.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PolicyStatus {
    /// SHA-256 (hex) of the text in force.
    pub sha256: String,
    /// When the policy in force was loaded.
    pub loaded_at: Timestamp,
    /// The file on disk is the policy in force (false while it is invalid).
    pub valid: bool,
    /// The problems of the file on disk, as `file:line:col: message` lines.
    pub last_error: Option<String>,
    pub last_error_at: Option<Timestamp>,
    /// SHA-256 of the invalid file on disk.
    pub rejected_sha256: Option<String>,
    pub reloads_ok: u64,
    pub reloads_error: u64,
}

/// The hex SHA-256 of a text.
pub fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A policy that replaced the one in force.
#[derive(Debug, Clone)]
pub struct Reloaded {
    pub policy: Policy,
    pub text: String,
    /// The audit entry for it.
    pub decision: Decision,
}

/// Watches one policy file.
#[derive(Debug)]
pub struct PolicyWatch {
    path: PathBuf,
    every: Duration,
    last_poll: Instant,
    polls: u32,
    seen: Option<(SystemTime, u64)>,
    /// The hash of the last text looked at (valid or not).
    looked_at: String,
    pub status: PolicyStatus,
}

impl PolicyWatch {
    /// Watches `path`, whose `text` is the policy in force since `now`.
    pub fn new(path: &Path, text: &str, every_s: f64, now: Timestamp) -> Self {
        let sha = sha256_hex(text);
        PolicyWatch {
            path: path.to_path_buf(),
            every: Duration::from_secs_f64(every_s.max(0.05)),
            last_poll: Instant::now(),
            polls: 0,
            seen: stat(path),
            looked_at: sha.clone(),
            status: PolicyStatus {
                sha256: sha,
                loaded_at: now,
                valid: true,
                ..PolicyStatus::default()
            },
        }
    }

    /// Looks at the file when it is time to (or at once when `force`); a valid new
    /// policy comes back to be swapped in. `site` is what the policy must fit.
    pub fn poll(&mut self, force: bool, site: &Site, now: Timestamp) -> Option<Reloaded> {
        if !force && self.last_poll.elapsed() < self.every {
            return None;
        }
        self.last_poll = Instant::now();
        self.polls = self.polls.wrapping_add(1);
        let seen = stat(&self.path);
        let changed = seen != self.seen;
        self.seen = seen;
        if !(force || changed || self.polls.is_multiple_of(REHASH_EVERY)) {
            return None;
        }
        let name = self.path.display().to_string();
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) => {
                self.reject(format!("{name}: cannot read: {e}"), None, now);
                return None;
            }
        };
        let sha = sha256_hex(&text);
        if sha == self.looked_at && !force {
            return None;
        }
        self.looked_at = sha.clone();
        if sha == self.status.sha256 {
            // back to the text in force (an edit undone): nothing to swap
            if !self.status.valid {
                info!(file = %name, sha256 = %sha, "policy file is again the policy in force");
            }
            self.status.valid = true;
            self.status.last_error = None;
            self.status.rejected_sha256 = None;
            return None;
        }
        match validate(&name, &text, site) {
            Ok(policy) => {
                let old = std::mem::replace(&mut self.status.sha256, sha.clone());
                self.status.loaded_at = now;
                self.status.valid = true;
                self.status.last_error = None;
                self.status.rejected_sha256 = None;
                self.status.reloads_ok += 1;
                info!(file = %name, sha256 = %sha, previous = %old, "policy reloaded");
                let decision = Decision {
                    time: now,
                    rule: "policy.reload".into(),
                    target: Target::Gpus {
                        entity: site.site_entity(),
                        gpus: Vec::new(),
                    },
                    action: Action::PolicyLoaded {
                        sha256: sha.clone(),
                    },
                    values: Default::default(),
                    reason: format!(
                        "policy reloaded from {name}: sha256 {} (was {})",
                        short(&sha),
                        short(&old)
                    ),
                    release: String::new(),
                    observe_only: false,
                };
                Some(Reloaded {
                    policy,
                    text,
                    decision,
                })
            }
            Err(e) => {
                self.reject(e.to_string(), Some(sha), now);
                None
            }
        }
    }

    fn reject(&mut self, error: String, sha: Option<String>, now: Timestamp) {
        if self.status.last_error.as_deref() == Some(error.as_str()) {
            return;
        }
        self.status.reloads_error += 1;
        warn!(
            file = %self.path.display(),
            "policy file rejected; the policy in force (sha256 {}) keeps running:\n{error}",
            short(&self.status.sha256)
        );
        self.status.valid = false;
        self.status.last_error = Some(error);
        self.status.last_error_at = Some(now);
        self.status.rejected_sha256 = sha;
        // read again at the next poll, whatever the file's time says
        self.seen = None;
        self.looked_at.clear();
    }
}

/// Why a policy text cannot run: every problem of its parse, or of its check against
/// the site, one per line.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidPolicy {
    #[error("{0}")]
    Parse(#[source] Diagnostics),
    #[error("{0}")]
    Site(#[source] Diagnostics),
}

/// Checks a policy text as `serve` would run it: parsed, and checked against the site
/// (selectors that pick nothing, caps below a GPU's minimum, unknown equipment).
pub fn validate(name: &str, text: &str, site: &Site) -> Result<Policy, InvalidPolicy> {
    let p = Policy::parse(name, text).map_err(InvalidPolicy::Parse)?;
    p.check_site(name, text, site)
        .map_err(InvalidPolicy::Site)?;
    Ok(p)
}

/// `serve`'s side: the watcher, SIGHUP, and where the outcome shows.
pub struct Reloader {
    watch: PolicyWatch,
    hup: Arc<AtomicBool>,
    enabled: bool,
}

impl Reloader {
    /// Reads the policy file as it is now: the policy to start with, its text, and the
    /// watcher (polling every `every_s`; 0: only on SIGHUP).
    pub fn start(
        path: &Path,
        every_s: f64,
        site: &Site,
        now: Timestamp,
    ) -> anyhow::Result<(Self, Policy, String)> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|e| anyhow::anyhow!("{name}: cannot read: {e}"))?;
        let policy = validate(&name, &text, site).map_err(anyhow::Error::msg)?;
        let hup = Arc::new(AtomicBool::new(false));
        signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())?;
        let enabled = every_s > 0.0;
        let every = if enabled { every_s } else { f64::MAX / 4.0 };
        info!(file = %name, sha256 = %sha256_hex(&text), poll_s = every_s, "policy loaded; watching the file (SIGHUP reloads at once)");
        Ok((
            Reloader {
                watch: PolicyWatch::new(path, &text, every.min(1e9), now),
                hup,
                enabled,
            },
            policy,
            text,
        ))
    }

    /// Between two ticks: looks at the file when due (or on SIGHUP), swaps a valid new
    /// policy into the loop and audits it; returns what the board should show when
    /// something changed (the new policy's text, if one was swapped in, and the status).
    pub fn between_ticks(
        &mut self,
        control: &mut ControlLoop,
        now: Timestamp,
    ) -> Option<(Option<String>, PolicyStatus)> {
        let force = self.hup.swap(false, Ordering::Relaxed);
        if force {
            info!("SIGHUP: reading the policy file");
        }
        if !force && !self.enabled {
            return None;
        }
        let before = self.watch.status.clone();
        let reloaded = self.watch.poll(force, control.site(), now);
        if reloaded.is_none() && self.watch.status == before {
            return None;
        }
        let text = reloaded.map(|r| {
            control.set_policy(r.policy);
            control.note(r.decision);
            r.text
        });
        Some((text, self.watch.status.clone()))
    }

    pub fn status(&self) -> &PolicyStatus {
        &self.watch.status
    }
}

fn short(sha: &str) -> &str {
    &sha[..sha.len().min(12)]
}

fn stat(path: &Path) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site() -> Site {
        Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("demo site")
    }

    #[test]
    fn a_valid_edit_is_handed_over_and_a_broken_one_is_kept_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("policy.toml");
        let v1 = "version = 1\n";
        std::fs::write(&p, v1).expect("write");
        let site = site();
        let t0 = Timestamp::from_secs(1_000);
        let mut w = PolicyWatch::new(&p, v1, 60.0, t0);
        assert!(w.poll(false, &site, t0).is_none(), "not yet time to look");
        assert!(
            w.poll(true, &site, t0).is_none(),
            "the same text: nothing to swap"
        );

        std::fs::write(&p, "version = 1\n[thermal]\nstep_pct = 20\n").expect("write");
        let r = w.poll(true, &site, t0 + 1.0).expect("reloaded");
        assert_eq!(r.policy.thermal.step_pct, 20.0);
        assert_eq!(r.decision.rule, "policy.reload");
        assert_eq!(w.status.reloads_ok, 1);
        assert_eq!(w.status.loaded_at, t0 + 1.0);

        std::fs::write(&p, "version = 1\n[thermal]\nstep_pct = 90\n").expect("write");
        assert!(w.poll(true, &site, t0 + 2.0).is_none());
        let err = w.status.last_error.clone().expect("error shown");
        assert!(err.contains("policy.toml:3:1: thermal: step_pct"), "{err}");
        assert!(!w.status.valid);
        assert_eq!(w.status.reloads_error, 1);
        // the same broken file again: counted and logged once
        assert!(w.poll(true, &site, t0 + 3.0).is_none());
        assert_eq!(w.status.reloads_error, 1);

        std::fs::write(&p, "version = 1\n[thermal]\nstep_pct = 25\n").expect("write");
        let r = w.poll(true, &site, t0 + 4.0).expect("recovered");
        assert_eq!(r.policy.thermal.step_pct, 25.0);
        assert!(w.status.valid && w.status.last_error.is_none());
        assert_eq!(
            w.status.sha256,
            sha256_hex("version = 1\n[thermal]\nstep_pct = 25\n")
        );
    }

    #[test]
    fn a_policy_that_does_not_fit_the_site_is_kept_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "version = 1\n").expect("write");
        let site = site();
        let mut w = PolicyWatch::new(&p, "version = 1\n", 60.0, Timestamp::from_secs(0));
        // valid on its own; the demo hall has no rack named z*
        std::fs::write(
            &p,
            "version = 1\n[[rules]]\nname = \"z-racks\"\nscope = \"rack\"\nselect = { name = \"z*\" }\naction = { cap_pct = 90 }\n",
        )
        .expect("write");
        assert!(w.poll(true, &site, Timestamp::from_secs(1)).is_none());
        let err = w.status.last_error.clone().expect("error");
        assert!(
            err.contains("policy.toml:") && err.contains("selects no rack"),
            "{err}"
        );
        assert!(!w.status.valid);
        assert_eq!(w.status.sha256, sha256_hex("version = 1\n"));
    }

    #[test]
    fn a_missing_file_keeps_the_policy_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("policy.toml");
        std::fs::write(&p, "version = 1\n").expect("write");
        let site = site();
        let mut w = PolicyWatch::new(&p, "version = 1\n", 60.0, Timestamp::from_secs(0));
        std::fs::remove_file(&p).expect("rm");
        assert!(w.poll(true, &site, Timestamp::from_secs(1)).is_none());
        assert!(w
            .status
            .last_error
            .as_deref()
            .is_some_and(|e| e.contains("cannot read")));
    }
}
