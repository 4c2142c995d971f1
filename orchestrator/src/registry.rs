//! The job registry: every job powerplane knows, as its scheduler last reported it.

use std::collections::BTreeMap;

use telemetry::Job;

#[derive(Debug, Clone, Default)]
pub struct JobRegistry {
    jobs: BTreeMap<String, Job>,
}

impl JobRegistry {
    /// A registry holding the jobs restored from the store.
    pub fn from_jobs(jobs: impl IntoIterator<Item = Job>) -> Self {
        JobRegistry {
            jobs: jobs.into_iter().map(|j| (j.id.clone(), j)).collect(),
        }
    }

    /// Takes the scheduler's current view; returns the jobs that are new or changed.
    pub fn sync(&mut self, incoming: impl IntoIterator<Item = Job>) -> Vec<Job> {
        let mut changed = Vec::new();
        for job in incoming {
            if self.jobs.get(&job.id) != Some(&job) {
                changed.push(job.clone());
                self.jobs.insert(job.id.clone(), job);
            }
        }
        changed
    }

    /// Jobs that are not finished or cancelled, in id order.
    pub fn active(&self) -> Vec<Job> {
        self.jobs
            .values()
            .filter(|j| !j.state.is_done())
            .cloned()
            .collect()
    }

    pub fn get(&self, id: &str) -> Option<&Job> {
        self.jobs.get(id)
    }

    pub fn all(&self) -> impl Iterator<Item = &Job> {
        self.jobs.values()
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }
}
