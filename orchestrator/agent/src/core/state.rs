//! What the agent remembers across restarts: the state file, read when the core
//! starts and written after every change of the desired state.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};
use telemetry::agent_proto::Desired;
use telemetry::Timestamp;
use tracing::error;

/// What the agent remembers across restarts (the state file).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Persisted {
    pub desired: BTreeMap<u32, Desired>,
    /// When the command behind each GPU's desired state was issued (older commands for
    /// that GPU are superseded).
    #[serde(default)]
    pub issued: BTreeMap<u32, Timestamp>,
    /// Recently accepted command ids with their issue time (replay protection).
    #[serde(default)]
    pub seen: BTreeMap<String, Timestamp>,
    /// GPUs whose clocks this agent locked.
    #[serde(default)]
    pub clocks_locked: BTreeSet<u32>,
    /// The highest fencing epoch of the commands accepted (0: none carried one): a
    /// command from a lower epoch comes from a deposed leader and is refused.
    #[serde(default)]
    pub epoch: u64,
    /// The controller's clock as its signed stamps tell: the newest stamp accepted
    /// (under the current epoch) and when it arrived by this agent's clock. Commands
    /// are aged by it, never by the agent's clock alone (which may be minutes off).
    #[serde(default)]
    pub newest: Option<Stamped>,
}

/// A command's stamp (the controller's clock) and its arrival (the agent's).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Stamped {
    pub issued_at: Timestamp,
    pub arrived: Timestamp,
}

/// Reads the state file; a missing one is an empty state, a corrupt one is set aside
/// (renamed `.corrupt`) and logged.
pub fn load_state(path: &Path) -> Persisted {
    match std::fs::read(path) {
        Ok(b) => match serde_json::from_slice(&b) {
            Ok(p) => p,
            Err(e) => {
                let aside = path.with_extension("corrupt");
                error!(path = %path.display(), error = %e, moved_to = %aside.display(), "the agent's state file is corrupt; starting without a desired state");
                let _ = std::fs::rename(path, aside);
                Persisted::default()
            }
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Persisted::default(),
        Err(e) => {
            error!(path = %path.display(), error = %e, "cannot read the agent's state file; starting without a desired state");
            Persisted::default()
        }
    }
}

/// Writes the state file atomically (temporary file, fsync, rename).
pub fn save_state(path: &Path, p: &Persisted) -> std::io::Result<()> {
    use std::io::Write;
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(p).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(tmp, path)
}
