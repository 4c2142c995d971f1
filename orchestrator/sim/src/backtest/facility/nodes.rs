//! The backtest facility's nodes and their power: always on, Slurm-style power saving,
//! or powered down and up by the controller, with boot and shutdown times.

use policies::node_power::{NodeAction, NodeView, Power};
use telemetry::{JobState, Site, Timestamp};

use super::{Facility, SimJob};
use crate::gpu::Gpus;

pub(super) struct Node {
    pub(super) id: String,
    pub(super) model: String,
    /// Its GPU model's place among the site's models, in the order the site lists them:
    /// the scheduler takes the nodes of earlier models first, as Slurm's node weights
    /// make it (all 0 in a hall of one model).
    pub(super) rank: u8,
    pub(super) gpus: Vec<usize>,
    pub(super) free: u32,
    pub(super) base_w: f64,
    pub(super) rack: usize,
    pub(super) power: Power,
    /// Since when it has had no work (None: it runs work).
    pub(super) idle_since: Option<Timestamp>,
    /// Managed mode: the lease of its power-down; the node comes back when it ends.
    pub(super) off_lease: Option<Timestamp>,
}

/// How the facility's nodes are powered.
#[derive(Debug, Clone, PartialEq)]
pub enum NodeMode {
    /// Every node always on (no management).
    AlwaysOn,
    /// Slurm-style power saving: a node idle for `suspend_s` is suspended, and resumed
    /// when a waiting job needs it (no price awareness, no planning).
    PowerSave { suspend_s: f64 },
    /// Powered down and up by the controller (`apply_node_actions`); like Slurm, a
    /// waiting job that finds no node on resumes the nodes it needs, so a controller
    /// that stops never leaves nodes off that work waits for.
    Managed,
}

/// Node power physics: boot and shutdown times, what an off node draws. A node
/// booting or shutting down draws its full base power and its GPUs' idle power.
#[derive(Debug, Clone, PartialEq)]
pub struct NodePowerModel {
    pub boot_s: f64,
    pub boot_s_by_model: std::collections::BTreeMap<String, f64>,
    pub shutdown_s: f64,
    pub off_w: f64,
}

impl Default for NodePowerModel {
    fn default() -> Self {
        let r = policies::node_power::NodePowerRule::default();
        NodePowerModel {
            boot_s: r.boot_s,
            boot_s_by_model: r.boot_s_by_model,
            shutdown_s: r.shutdown_s,
            off_w: r.off_w,
        }
    }
}

impl NodePowerModel {
    fn boot_s(&self, model: &str) -> f64 {
        self.boot_s_by_model
            .get(model)
            .copied()
            .unwrap_or(self.boot_s)
    }
}

/// The site's nodes, on and idle since `start`, with the GPUs of each.
pub(super) fn of(site: &Site, gpus: &Gpus, start: Timestamp) -> Vec<Node> {
    let mut models: Vec<&str> = Vec::new();
    for n in &site.nodes {
        if !models.contains(&n.gpu_model.as_str()) {
            models.push(&n.gpu_model);
        }
    }
    let rank = |m: &str| models.iter().position(|x| *x == m).unwrap_or(0).min(255) as u8;
    let mut nodes: Vec<Node> = site
        .nodes
        .iter()
        .map(|n| Node {
            id: n.id.clone(),
            model: n.gpu_model.clone(),
            rank: rank(&n.gpu_model),
            gpus: Vec::new(),
            free: 0,
            base_w: n.base_w,
            rack: 0,
            power: Power::On,
            idle_since: Some(start),
            off_lease: None,
        })
        .collect();
    for (gi, g) in gpus.iter().enumerate() {
        let node = &mut nodes[g.node];
        node.gpus.push(gi);
        node.free += 1;
        node.rack = g.rack;
    }
    nodes
}

impl Facility {
    /// Nodes as the node power decision sees them.
    pub fn node_views(&self) -> Vec<NodeView> {
        self.nodes
            .iter()
            .map(|n| NodeView {
                id: n.id.clone(),
                model: n.model.clone(),
                gpus: n.gpus.len() as u32,
                free: n.free,
                power: n.power,
                idle_since: n.idle_since,
            })
            .collect()
    }

    /// The jobs waiting (pending or held).
    pub fn waiting_jobs(&self) -> impl Iterator<Item = &SimJob> {
        self.waiting.iter().map(|&i| &self.jobs[i])
    }

    /// GPUs submitted per second over the `window_s` before `now` (the jobs are in
    /// submission order; only those of the window are looked at).
    pub fn arrivals_gpus_per_s(&self, now: Timestamp, window_s: f64) -> f64 {
        let from = now.plus_secs(-window_s);
        policies::node_power::arrival_rate(
            self.jobs[..self.next_arrival]
                .iter()
                .rev()
                .take_while(|j| j.job.submit_time > from)
                .map(|j| &j.job),
            now,
            window_s,
        )
    }

    /// Power-downs in the minute before `now`.
    pub fn downs_last_min(&self, now: Timestamp) -> u32 {
        self.recent_downs
            .iter()
            .filter(|t| now.secs_since(**t) < 60.0)
            .count() as u32
    }

    /// Carries out the controller's node actions (managed mode): a power-down only of
    /// a node that is on and idle, a power-up only of a node that is off.
    /// Every node this controller keeps off gets its lease renewed to `now + lease_s`.
    pub fn apply_node_actions(&mut self, actions: &[NodeAction], now: Timestamp, lease_s: f64) {
        if self.node_mode != NodeMode::Managed {
            return;
        }
        for n in &mut self.nodes {
            if n.off_lease.is_some() {
                n.off_lease = Some(now + lease_s);
            }
        }
        for a in actions {
            let Some(ni) = self.nodes.iter().position(|n| n.id == a.node()) else {
                continue;
            };
            let n = &mut self.nodes[ni];
            match a {
                NodeAction::Down { .. } => {
                    if n.power == Power::On && n.free as usize == n.gpus.len() {
                        n.power = Power::ShuttingDown { since: now };
                        n.off_lease = Some(now + lease_s);
                        self.totals.power_downs += 1;
                        self.recent_downs.push(now);
                    }
                }
                NodeAction::Up { .. } => {
                    if matches!(n.power, Power::Off { .. }) {
                        n.power = Power::Booting { since: now };
                        n.off_lease = None;
                        self.totals.power_ups += 1;
                    }
                }
                NodeAction::Failed { .. } => n.power = Power::Failed,
            }
        }
        self.recent_downs.retain(|t| now.secs_since(*t) < 60.0);
        self.update_power();
    }

    /// Boots and shutdowns that completed by `now`; power saving's suspends.
    pub(super) fn advance_node_power(&mut self, now: Timestamp) {
        for n in &mut self.nodes {
            match n.power {
                Power::Booting { since }
                    if now.secs_since(since) >= self.node_model.boot_s(&n.model) - 1e-6 =>
                {
                    n.power = Power::On;
                    n.idle_since = Some(now);
                }
                Power::ShuttingDown { since }
                    if now.secs_since(since) >= self.node_model.shutdown_s - 1e-6 =>
                {
                    n.power = Power::Off { since: now };
                }
                // the controller stopped renewing the power-down: the node comes back
                Power::Off { .. } if n.off_lease.is_some_and(|l| l <= now) => {
                    n.power = Power::Booting { since: now };
                    n.off_lease = None;
                    self.totals.power_ups += 1;
                    self.totals.lease_resumes += 1;
                }
                _ => {}
            }
        }
        if let NodeMode::PowerSave { suspend_s } = self.node_mode {
            for n in &mut self.nodes {
                if n.power == Power::On
                    && n.free as usize == n.gpus.len()
                    && n.idle_since.is_some_and(|s| now.secs_since(s) >= suspend_s)
                {
                    n.power = Power::ShuttingDown { since: now };
                    self.totals.power_downs += 1;
                }
            }
        }
    }

    /// Resumes off nodes for waiting jobs that no node on (or booting) can take, in
    /// queue order, as Slurm's power saving resumes the nodes it allocates.
    pub(super) fn resume_on_demand(&mut self, now: Timestamp) {
        if self.node_mode == NodeMode::AlwaysOn {
            return;
        }
        // GPUs still free per node on or booting, taken by the waiting jobs in turn
        let mut left: Vec<u32> = self
            .nodes
            .iter()
            .map(|n| match n.power {
                Power::On | Power::Booting { .. } => n.free,
                _ => 0,
            })
            .collect();
        // the nodes in the order the scheduler takes them: earlier models first
        let mut order: Vec<usize> = (0..self.nodes.len()).collect();
        order.sort_by_key(|&i| (self.nodes[i].rank, i));
        for k in 0..self.waiting.len() {
            let j = &self.jobs[self.waiting[k]];
            if j.job.state != JobState::Pending {
                continue;
            }
            let model = j.gpu_model.clone();
            let mut want = j.job.gpus;
            let fits = |n: &Node| model.as_ref().is_none_or(|m| &n.model == m);
            for &ni in &order {
                let n = &self.nodes[ni];
                if want == 0 {
                    break;
                }
                if fits(n) {
                    let take = left[ni].min(want);
                    left[ni] -= take;
                    want -= take;
                }
            }
            for &ni in &order {
                let (n, l) = (&mut self.nodes[ni], &mut left[ni]);
                if want == 0 {
                    break;
                }
                if matches!(n.power, Power::Off { .. } | Power::ShuttingDown { .. })
                    && model.as_ref().is_none_or(|m| &n.model == m)
                {
                    // a node shutting down finishes first, then boots
                    n.power = Power::Booting { since: now };
                    n.off_lease = None;
                    self.totals.power_ups += 1;
                    let g = n.gpus.len() as u32;
                    let take = g.min(want);
                    *l = g - take;
                    want -= take;
                }
            }
        }
    }
}
