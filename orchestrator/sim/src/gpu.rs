//! The simulated GPUs, shared by the demo's and the backtest's facilities: what a GPU
//! draws and how fast it runs under its power limit (Zeus's measured curves), the
//! limit a cap sets, and the default an unrenewed lease reverts to.

use std::ops::{Deref, DerefMut};

use policies::State;
use telemetry::fasthash::FnvMap;
use telemetry::{EntityId, GpuModel, Site, Timestamp};

use super::curves::{Curve, Measured};

/// One simulated GPU.
pub(crate) struct Gpu {
    pub id: EntityId,
    pub node: usize,
    pub rack: usize,
    pub model: GpuModel,
    pub limit_w: f64,
    pub lease_until: Option<Timestamp>,
    /// The job it runs (an index into its facility's jobs).
    pub job: Option<usize>,
    pub power_w: f64,
    /// The energy it drew (the demo's counter; the backtest integrates energy itself).
    pub energy_j: f64,
    /// What the GPU draws (W) and the speed it runs at under its job and limit, for
    /// the (job, limit bits) they were found for: the curve is read again only when
    /// either changes.
    busy: Option<(usize, u64, f64, f64)>,
}

impl Gpu {
    /// Power (W, at least idle) and relative speed of this GPU running job `ji` (of
    /// curve `curve`) at its limit.
    pub fn busy(&mut self, ji: usize, curve: &Curve) -> (f64, f64) {
        self.busy_on(
            ji,
            Measured {
                curve,
                sweep_max_w: None,
                pace: 1.0,
            },
        )
    }

    /// The same on a model's own measurement of the job's workload: its curve's
    /// fractions in watts of the sweep's highest limit (a limit above it binds at it),
    /// its speed at the model's pace.
    pub fn busy_on(&mut self, ji: usize, m: Measured<'_>) -> (f64, f64) {
        let bits = self.limit_w.to_bits();
        match self.busy {
            Some((j, b, w, speed)) if j == ji && b == bits => (w, speed),
            _ => {
                let max_w = m.sweep_max_w.unwrap_or(self.model.max_w);
                let (p, speed) = m.curve.at(self.limit_w / max_w);
                let w = (p * max_w).max(self.model.idle_w);
                let speed = speed * m.pace;
                self.busy = Some((ji, bits, w, speed));
                (w, speed)
            }
        }
    }

    /// What it draws idle under its limit (its node on).
    pub fn idle_w(&self) -> f64 {
        self.model.idle_w.min(self.limit_w)
    }

    /// Whether its limit is below its default.
    pub fn capped(&self) -> bool {
        self.limit_w < self.model.default_w - 0.5
    }

    /// Takes a cap (watts, lease), or goes back to the default limit without one.
    fn set_cap(&mut self, cap: Option<(f64, Timestamp)>) {
        match cap {
            Some((w, lease)) => {
                self.limit_w = self.model.clamp_limit(w);
                self.lease_until = Some(lease);
            }
            None => {
                self.limit_w = self.model.default_w;
                self.lease_until = None;
            }
        }
    }

    /// An agent that hears nothing restores the default limit when the lease ends:
    /// whether it did so by `now`.
    fn expire_lease(&mut self, now: Timestamp) -> bool {
        if self.lease_until.is_some_and(|l| l <= now) {
            self.limit_w = self.model.default_w;
            self.lease_until = None;
            true
        } else {
            false
        }
    }
}

/// A facility's GPUs, in the site's order, with an index by id.
pub(crate) struct Gpus {
    list: Vec<Gpu>,
    index: FnvMap<EntityId, usize>,
}

impl Gpus {
    /// Every GPU of the site, idle at its default limit.
    pub fn of(site: &Site) -> Self {
        let list: Vec<Gpu> = site
            .gpus()
            .into_iter()
            .map(|g| Gpu {
                id: g.id.into_owned(),
                node: g.node_index,
                rack: g.rack_index,
                model: g.model.clone(),
                limit_w: g.model.default_w,
                lease_until: None,
                job: None,
                power_w: g.model.idle_w,
                energy_j: 0.0,
                busy: None,
            })
            .collect();
        let index = list
            .iter()
            .enumerate()
            .map(|(i, g)| (EntityId::clone(&g.id), i))
            .collect();
        Gpus { list, index }
    }

    /// The plan's caps: a GPU it caps takes the cap's limit and lease, every other one
    /// goes back to its default.
    pub fn apply_caps(&mut self, state: &State) {
        let mut capped: Vec<Option<(f64, Timestamp)>> = vec![None; self.list.len()];
        for (id, c) in &state.caps {
            if let Some(&i) = self.index.get(id) {
                capped[i] = Some((c.watts, c.lease_until));
            }
        }
        for (g, cap) in self.list.iter_mut().zip(capped) {
            g.set_cap(cap);
        }
    }

    /// Reverts the caps whose lease ended by `now`; how many did.
    pub fn expire_leases(&mut self, now: Timestamp) -> usize {
        let mut expired = 0;
        for g in &mut self.list {
            if g.expire_lease(now) {
                expired += 1;
            }
        }
        expired
    }
}

impl Deref for Gpus {
    type Target = [Gpu];
    fn deref(&self) -> &[Gpu] {
        &self.list
    }
}

impl DerefMut for Gpus {
    fn deref_mut(&mut self) -> &mut [Gpu] {
        &mut self.list
    }
}

/// What a node that is on draws besides its GPUs: half its base power idle, the rest
/// in proportion to the share of its GPUs (or GPU time) at work.
pub(crate) fn node_base_w(base_w: f64, busy_share: f64) -> f64 {
    base_w * (0.5 + 0.5 * busy_share)
}
