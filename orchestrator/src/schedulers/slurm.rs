//! Slurm glue: the adapter opened from `[schedulers.slurm]`, with the holds the store
//! says are powerplane's.

use std::time::Duration;

use anyhow::Result;
use integrations::scheduler::Scheduler;
use integrations::slurm::{Client, Endpoint};
use integrations::slurm_sync::SlurmSync;
use integrations::store::Store;
use tracing::info;

use super::config::SlurmSection;

/// The Slurm adapter of `[schedulers.slurm]` and its poll interval.
pub fn open(s: &SlurmSection, store: &mut Store) -> Result<(Box<dyn Scheduler>, f64)> {
    let endpoint = Endpoint::parse(&s.endpoint).map_err(anyhow::Error::msg)?;
    let mut client = Client::new(endpoint);
    client.user = s.user.clone();
    client.timeout = Duration::from_secs_f64(s.timeout_s);
    client.scontrol = s.scontrol.clone();
    let mut sync = SlurmSync::restore(client, s.mapping.clone(), store)?;
    sync.hold_with = s.hold_with;
    info!(endpoint = %s.endpoint, poll_s = s.poll_s, holds = sync.ours().len(), "steering Slurm through slurmrestd");
    Ok((Box::new(sync), s.poll_s))
}
