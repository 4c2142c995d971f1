//! Slurm glue: the adapter opened from `[schedulers.slurm]`, with the holds the store
//! says are powerplane's. Its REST client is built later, on the reconciler's thread
//! (the build finds slurmrestd's version, which is IO; a failed build is retried
//! after the reconciler's backoff).

use anyhow::Result;
use integrations::scheduler::Scheduler;
use integrations::slurm_sync::SlurmSync;
use integrations::store::Store;
use tracing::info;

use super::config::SchedulersSection;
use super::Opened;

/// The Slurm adapter of `[schedulers.slurm]` and its poll interval (`base`: the
/// config file's folder, for relative paths).
pub fn open(
    section: &SchedulersSection,
    base: &std::path::Path,
    store: &mut Store,
) -> Result<Option<Opened>> {
    let Some(s) = &section.slurm else {
        return Ok(None);
    };
    let api = s.api_config(base);
    api.validate()?;
    let mut sync = SlurmSync::restore(api, s.mapping.clone(), store)?;
    sync.hold_with = s.hold_with;
    info!(endpoint = %s.endpoint, api_version = ?s.api_version, poll_s = s.poll_s, holds = sync.ours().len(), "steering Slurm through slurmrestd");
    let adapter: Box<dyn Scheduler> = Box::new(sync);
    Ok(Some(Opened {
        adapter,
        poll_s: Some(s.poll_s),
    }))
}
