//! Node power states: nodes with no work, and none planned within their boot time, are
//! powered down; they are brought back before planned work needs them.
//!
//! Pure: [`decide`] takes each node's power state, what work needs GPUs and when (jobs
//! waiting now, held jobs at their planned start), the price now against its median,
//! and the time, and says which nodes to power down and which to power up. It keeps:
//!
//! - a warm reserve: `reserve_gpus`, or `reserve_share` of the site's GPUs if more (with
//!   `reserve = "forecast"`, the default, no more than the GPUs the recent arrivals
//!   bring within a boot time, in whole nodes), idle and on (or booting) beyond what
//!   the work due within a boot time needs, counted once across the GPU models;
//! - a minimum idle time before a power-down (`idle_s`; `idle_s_expensive` while the
//!   price is above its median: deeper off-time in expensive hours);
//! - a minimum off time before a node is brought back for the reserve (never for work
//!   that waits: work first);
//! - at most `max_downs_per_min` power-downs per minute (per minute of the interval
//!   to the next decision, where decisions are minutes apart);
//! - failed resumes: a node not back within `resume_timeout_s` is marked failed and
//!   reported, and another node is powered up in its place.
//!
//! What it never does: power down a node that runs work, or a node whose GPUs the work
//! due within its boot time needs (property tested).

use telemetry::Timestamp;

pub use crate::policy::{NodePowerRule, ReserveMode};

/// A node's power state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Power {
    On,
    /// Powered up at `since`, not taking work yet.
    Booting {
        since: Timestamp,
    },
    /// Powering down since `since`.
    ShuttingDown {
        since: Timestamp,
    },
    Off {
        since: Timestamp,
    },
    /// Did not come back within its resume timeout: out of service until an operator
    /// clears it.
    Failed,
}

/// A node as the decision sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeView {
    pub id: String,
    pub model: String,
    pub gpus: u32,
    /// GPUs not running work.
    pub free: u32,
    pub power: Power,
    /// Since when it has had no work (None: it has work).
    pub idle_since: Option<Timestamp>,
}

/// Work that needs GPUs from `at` (now for waiting jobs, the planned start of held
/// ones).
#[derive(Debug, Clone, PartialEq)]
pub struct Need {
    pub at: Timestamp,
    pub gpus: u32,
    /// The GPU model it must run on, if any.
    pub model: Option<String>,
}

/// When a job's GPUs are due, for [`decide`]: a waiting job's now; a held one's at its
/// planned start, else at its latest start (its deadline less its run time), else never:
/// a hold with no end in sight (a rule's, a threshold's, the budget's) keeps no node on
/// idle for it; once released, the job brings back what it needs, as under Slurm's
/// power saving.
pub fn due_at(
    job: &telemetry::Job,
    planned: Option<Timestamp>,
    now: Timestamp,
) -> Option<Timestamp> {
    match job.state {
        telemetry::JobState::Pending => Some(now),
        telemetry::JobState::Held => planned.or_else(|| job.latest_start()).map(|t| t.max(now)),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeAction {
    Down {
        node: String,
        reason: String,
    },
    Up {
        node: String,
        reason: String,
    },
    /// A resume that did not complete in time: the node is marked failed.
    Failed {
        node: String,
        reason: String,
    },
}

impl NodeAction {
    pub fn node(&self) -> &str {
        match self {
            NodeAction::Down { node, .. }
            | NodeAction::Up { node, .. }
            | NodeAction::Failed { node, .. } => node,
        }
    }
}

/// What a decision looked at.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Inputs {
    /// The price now is above the mean of the next 24 h.
    pub expensive: bool,
    /// A grid event is in force (see [`crate::grid`]): nodes with no work and none due
    /// within their boot time go down at once, the reserve kept.
    pub grid_event: bool,
    /// Power-downs issued in the last minute.
    pub downs_last_min: u32,
    /// Seconds until the next decision, where that is over a minute (a backtest's
    /// tick): `max_downs_per_min` for each minute of it, as a controller deciding
    /// every few seconds would spread them; 0 (or under 60): one minute's worth.
    pub interval_s: f64,
    /// GPUs submitted per second lately ([`arrival_rate`]): with `reserve =
    /// "forecast"`, the warm reserve is what this brings within a boot time (`None`:
    /// not measured, the whole reserve).
    pub arrivals_gpus_per_s: Option<f64>,
}

/// GPUs submitted per second over the `window_s` before `now`: the forecast the warm
/// reserve is sized from.
pub fn arrival_rate<'a>(
    jobs: impl IntoIterator<Item = &'a telemetry::Job>,
    now: Timestamp,
    window_s: f64,
) -> f64 {
    let from = now.plus_secs(-window_s);
    let gpus: u64 = jobs
        .into_iter()
        .filter(|j| j.submit_time > from && j.submit_time <= now)
        .map(|j| u64::from(j.gpus))
        .sum();
    gpus as f64 / window_s.max(1.0)
}

/// The warm reserve, GPUs: `reserve_gpus` or `reserve_share` of `total` (the larger);
/// with `reserve = "forecast"` and a measured rate, no more than the GPUs expected to
/// be submitted within a boot and a shutdown time, in whole nodes of `node_gpus`
/// (rounded down: a node is kept warm only for a node's worth of expected work, so a
/// trickle keeps none on, as suspend-after-idle would not).
fn reserve_of(rule: &NodePowerRule, inputs: &Inputs, total: u32, node_gpus: f64) -> u32 {
    let most = rule
        .reserve_gpus
        .max((rule.reserve_share * f64::from(total)).ceil() as u32);
    match (rule.reserve, inputs.arrivals_gpus_per_s) {
        (ReserveMode::Forecast, Some(rate)) => {
            let node = node_gpus.max(1.0);
            let coming = rate.max(0.0) * (rule.boot_s + rule.shutdown_s);
            let gpus = (coming / node).floor() * node;
            most.min(gpus.min(f64::from(u32::MAX)) as u32)
        }
        _ => most,
    }
}

/// Which nodes to power down and up now.
pub fn decide(
    nodes: &[NodeView],
    needs: &[Need],
    rule: &NodePowerRule,
    inputs: Inputs,
    now: Timestamp,
) -> Vec<NodeAction> {
    if !rule.enabled {
        return bring_back(nodes);
    }
    let mut out = Vec::new();
    let total: u32 = nodes.iter().map(|n| n.gpus).sum();
    let node_gpus = f64::from(total) / nodes.len().max(1) as f64;
    let reserve = reserve_of(rule, &inputs, total, node_gpus);
    // failed resumes first: they no longer count as supply
    let failed = failed_resumes(nodes, rule, now, &mut out);
    // per GPU model, in the order the site lists them (the order the scheduler prefers
    // their nodes in, as Slurm's node weights; work of any model and the reserve are
    // placed in it): the GPUs due within the model's boot time, then the work and the
    // reserve any model may take, against what is on or coming
    let mut models: Vec<&str> = Vec::new();
    for n in nodes {
        if !models.contains(&n.model.as_str()) {
            models.push(&n.model);
        }
    }
    let minutes = (inputs.interval_s / 60.0).clamp(1.0, 1e6);
    let allowed = (f64::from(rule.max_downs_per_min) * minutes).min(f64::from(u32::MAX)) as u32;
    let mut downs_left = allowed.saturating_sub(inputs.downs_last_min);
    let idle_s = if inputs.grid_event {
        0.0
    } else if inputs.expensive {
        rule.idle_s_expensive.unwrap_or(rule.idle_s)
    } else {
        rule.idle_s
    };
    let mut per_model: Vec<ModelNeed> = models
        .into_iter()
        .map(|model| ModelNeed::of(model, nodes, needs, &failed, rule, now))
        .collect();
    share_any_model(&mut per_model, needs, rule, now);
    // the reserve is for work of any model, kept warm where GPUs are idle already
    place(&mut per_model, reserve, |_| true, ModelNeed::add_reserve);
    for mut m in per_model {
        if m.supply < m.want {
            m.power_up(nodes, rule, now, &mut out);
            continue;
        }
        m.power_down(nodes, idle_s, &mut downs_left, now, &mut out);
    }
    out
}

/// A disabled rule brings every node it powered down back.
fn bring_back(nodes: &[NodeView]) -> Vec<NodeAction> {
    let mut out = Vec::new();
    for n in nodes {
        if matches!(n.power, Power::Off { .. }) {
            out.push(NodeAction::Up {
                node: n.id.clone(),
                reason: "node power rule disabled".into(),
            });
        }
    }
    out
}

/// The nodes that did not come back within the resume timeout, marked failed (in
/// `out`), by node position.
fn failed_resumes(
    nodes: &[NodeView],
    rule: &NodePowerRule,
    now: Timestamp,
    out: &mut Vec<NodeAction>,
) -> Vec<bool> {
    let mut failed = vec![false; nodes.len()];
    for (i, n) in nodes.iter().enumerate() {
        if let Power::Booting { since } = n.power {
            if now.secs_since(since) > rule.resume_timeout_s {
                failed[i] = true;
                out.push(NodeAction::Failed {
                    node: n.id.clone(),
                    reason: format!(
                        "not back {:.0} s after its power-up (timeout {:.0} s): marked failed, replaced",
                        now.secs_since(since),
                        rule.resume_timeout_s
                    ),
                });
            }
        }
    }
    failed
}

/// One GPU model's demand and supply: its nodes, the GPUs due within its boot time,
/// its share of the reserve, and the free GPUs on or coming.
struct ModelNeed {
    boot: f64,
    of_model: Vec<usize>,
    due: u32,
    share: f64,
    want: u32,
    supply: u32,
    /// GPUs on nodes that are off (and not failed): what it can bring back.
    off: u32,
}

/// Work due that may run on any GPU model, counted once across the models (counted on
/// every model, it would keep each model's nodes on for the same jobs). A need counts
/// only on the models it is due within the boot time of.
fn share_any_model(
    per_model: &mut [ModelNeed],
    needs: &[Need],
    rule: &NodePowerRule,
    now: Timestamp,
) {
    let mut any: Vec<&Need> = needs.iter().filter(|d| d.model.is_none()).collect();
    any.sort_by_key(|d| d.at);
    for d in any {
        let ahead = d.at.secs_since(now);
        place(
            per_model,
            d.gpus,
            |m| ahead <= m.boot + rule.shutdown_s,
            ModelNeed::add_due,
        );
    }
}

/// Places `gpus` any model may take (`add`) on the models `fits`, in the site's order of
/// models (`per_model`'s, the order the scheduler prefers them in): on GPUs on and free
/// beyond what they already want first, so that no node is brought back for what an
/// idle node of another model can take; what is left on the models with GPUs off to
/// bring back, in that order, each as far as its GPUs off go.
fn place(
    per_model: &mut [ModelNeed],
    gpus: u32,
    fits: impl Fn(&ModelNeed) -> bool,
    add: fn(&mut ModelNeed, u32),
) {
    let mut left = gpus;
    while left > 0 {
        let Some(m) = per_model.iter_mut().find(|m| fits(m) && m.supply > m.want) else {
            break;
        };
        let take = left.min(m.supply - m.want);
        add(m, take);
        left -= take;
    }
    if left > 0 {
        // what is left brings nodes back, the first model's first, as far as each has
        // GPUs off; beyond them all, on the first model that fits
        for m in per_model.iter_mut().filter(|m| fits(m) && m.off > 0) {
            let take = left.min(m.off);
            add(m, take);
            left -= take;
            if left == 0 {
                return;
            }
        }
        if let Some(m) = per_model.iter_mut().find(|m| fits(m)) {
            add(m, left);
        }
    }
}

impl ModelNeed {
    /// The model's own work due; the work any model may take and the reserve are
    /// placed afterwards (`share_any_model`, `place`).
    fn of(
        model: &str,
        nodes: &[NodeView],
        needs: &[Need],
        failed: &[bool],
        rule: &NodePowerRule,
        now: Timestamp,
    ) -> ModelNeed {
        let boot = rule.boot_s_of(model);
        let of_model: Vec<usize> = (0..nodes.len())
            .filter(|&i| nodes[i].model == model)
            .collect();
        // work that may run on any model is counted once, by `share_any_model`
        let due: u32 = needs
            .iter()
            .filter(|d| d.model.as_deref() == Some(model))
            .filter(|d| d.at.secs_since(now) <= boot + rule.shutdown_s)
            .map(|d| d.gpus)
            .sum();
        let (share, want) = (0.0, due);
        // supply: free GPUs on nodes that are on or booting (failed ones left out)
        let supply: u32 = of_model
            .iter()
            .filter(|&&i| !failed[i])
            .filter(|&&i| matches!(nodes[i].power, Power::On | Power::Booting { .. }))
            .map(|&i| nodes[i].free)
            .sum();
        let off: u32 = of_model
            .iter()
            .filter(|&&i| !failed[i] && matches!(nodes[i].power, Power::Off { .. }))
            .map(|&i| nodes[i].gpus)
            .sum();
        ModelNeed {
            boot,
            of_model,
            due,
            share,
            want,
            supply,
            off,
        }
    }

    /// `gpus` more of work due on this model.
    fn add_due(&mut self, gpus: u32) {
        self.due = self.due.saturating_add(gpus);
        self.want = self.want.saturating_add(gpus);
    }

    /// `gpus` more of the reserve kept warm on this model.
    fn add_reserve(&mut self, gpus: u32) {
        self.share += f64::from(gpus);
        self.want = self.want.saturating_add(gpus);
    }

    /// Power up: nodes off longest first; the reserve waits for `min_off_s`, work that
    /// is due does not.
    fn power_up(
        &mut self,
        nodes: &[NodeView],
        rule: &NodePowerRule,
        now: Timestamp,
        out: &mut Vec<NodeAction>,
    ) {
        let (due, boot, want) = (self.due, self.boot, self.want);
        let mut off: Vec<(Timestamp, usize)> = self
            .of_model
            .iter()
            .filter_map(|&i| match nodes[i].power {
                Power::Off { since } => Some((since, i)),
                _ => None,
            })
            .collect();
        off.sort();
        for (since, i) in off {
            if self.supply >= want {
                break;
            }
            let for_work = self.supply < due;
            if !for_work && now.secs_since(since) < rule.min_off_s {
                continue;
            }
            self.supply += nodes[i].gpus;
            out.push(NodeAction::Up {
                node: nodes[i].id.clone(),
                reason: if for_work {
                    format!("{due} GPUs of work due within its boot time ({boot:.0} s)")
                } else {
                    format!("warm reserve of {} GPUs", self.share as u32)
                },
            });
        }
    }

    /// Power down: idle nodes, idle longest first, while what stays covers `want` and
    /// `downs_left` allows.
    fn power_down(
        &mut self,
        nodes: &[NodeView],
        idle_s: f64,
        downs_left: &mut u32,
        now: Timestamp,
        out: &mut Vec<NodeAction>,
    ) {
        let (due, boot, want) = (self.due, self.boot, self.want);
        let mut idle: Vec<(Timestamp, usize)> = self
            .of_model
            .iter()
            .filter(|&&i| nodes[i].power == Power::On && nodes[i].free == nodes[i].gpus)
            .filter_map(|&i| nodes[i].idle_since.map(|s| (s, i)))
            .filter(|(s, _)| now.secs_since(*s) >= idle_s)
            .collect();
        idle.sort();
        for (since, i) in idle {
            if *downs_left == 0 {
                break;
            }
            let g = nodes[i].gpus;
            if self.supply.saturating_sub(g) < want {
                break;
            }
            self.supply -= g;
            *downs_left -= 1;
            let supply = self.supply;
            out.push(NodeAction::Down {
                node: nodes[i].id.clone(),
                reason: format!(
                    "no work for {:.0} s, none due within its boot time ({boot:.0} s); {supply} GPUs stay on for {due} due and a reserve of {}",
                    now.secs_since(since),
                    self.share as u32
                ),
            });
        }
    }
}

#[cfg(test)]
mod tests;
