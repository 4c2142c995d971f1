//! The backtest facility's scheduler: waiting jobs start on free GPUs of nodes that
//! are on, with backfill.

use policies::node_power::Power;
use telemetry::{JobState, Timestamp};

use super::{Facility, Node};

impl Facility {
    /// Starts waiting jobs on free GPUs: priority first, then submission order; a job
    /// that does not fit does not block smaller ones behind it (backfill).
    pub(super) fn schedule(&mut self, now: Timestamp) {
        let jobs = &self.jobs;
        self.waiting
            .sort_by_key(|&i| (-jobs[i].job.priority, jobs[i].job.submit_time, i));
        let mut free: u32 = self
            .nodes
            .iter()
            .filter(|n| n.power == Power::On)
            .map(|n| n.free)
            .sum();
        let mut left = Vec::with_capacity(self.waiting.len());
        let waiting = std::mem::take(&mut self.waiting);
        for ji in waiting {
            let j = &self.jobs[ji];
            if j.job.state != JobState::Pending || j.job.gpus > free || !self.place(ji, now) {
                left.push(ji);
            } else {
                free -= self.jobs[ji].job.gpus;
            }
        }
        self.waiting = left;
    }

    /// Places a job: on the nodes of the site's earliest GPU model that has room (as
    /// Slurm's node weights order them), the node with the fewest free GPUs that fits
    /// it, else the nodes with the most free GPUs first.
    fn place(&mut self, ji: usize, now: Timestamp) -> bool {
        let want = self.jobs[ji].job.gpus;
        let model = self.jobs[ji].gpu_model.clone();
        let ok = |n: &Node| {
            n.free > 0 && n.power == Power::On && model.as_ref().is_none_or(|m| &n.model == m)
        };
        let total: u32 = self.nodes.iter().filter(|n| ok(n)).map(|n| n.free).sum();
        if total < want {
            return false;
        }
        let best = self
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| ok(n) && n.free >= want)
            .min_by_key(|(i, n)| (n.rank, n.free, *i))
            .map(|(i, _)| i);
        let order: Vec<usize> = match best {
            Some(i) => vec![i],
            None => {
                let mut v: Vec<usize> = (0..self.nodes.len())
                    .filter(|&i| ok(&self.nodes[i]))
                    .collect();
                v.sort_by_key(|&i| (self.nodes[i].rank, std::cmp::Reverse(self.nodes[i].free), i));
                v
            }
        };
        let mut chosen = Vec::with_capacity(want as usize);
        for ni in order {
            for &g in &self.nodes[ni].gpus {
                if chosen.len() as u32 == want {
                    break;
                }
                if self.gpus[g].job.is_none() {
                    chosen.push(g);
                }
            }
        }
        for &g in &chosen {
            self.gpus[g].job = Some(ji);
            let n = &mut self.nodes[self.gpus[g].node];
            n.free -= 1;
            n.idle_since = None;
        }
        let j = &mut self.jobs[ji];
        j.job.allocated = chosen.iter().map(|&g| self.gpus[g].id.clone()).collect();
        j.gpus = chosen;
        j.job.state = JobState::Running;
        j.job.start_time = Some(now);
        j.hold_until = None;
        self.running.push(ji);
        self.touch(ji);
        true
    }
}
