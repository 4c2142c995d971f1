//! What a simulated facility reports each tick, as both the demo's and the backtest's
//! facilities publish it: its GPUs, racks, cooling units, the site, and the price and
//! carbon intensity in force.

use telemetry::metric::names::*;
use telemetry::prices::Series;
use telemetry::{EntityId, EntityKind, Sample, Site, Timestamp};

use super::gpu::Gpu;
use control::demand::DemandTracker;

/// What each GPU reports.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum GpuReadings {
    /// Power, energy counter and power limit (for the ledger and the API).
    Full,
    /// Power only: what the rules read (the backtest integrates energy itself).
    Power,
}

/// A simulated facility's state, to report.
pub(crate) struct Readings<'a> {
    pub site: &'a Site,
    pub gpus: &'a [Gpu],
    pub gpu_readings: GpuReadings,
    pub rack_power_w: &'a [f64],
    pub inlet_c: &'a [f64],
    pub cooling_power_w: &'a [f64],
    pub prices: &'a Series,
    pub carbon: &'a Series,
    /// Each cooling unit's share of its capacity now.
    pub capacity_factors: Vec<f64>,
    /// With a demand charge: the billing period's peak as the ledger follows it.
    pub demand: Option<&'a DemandTracker>,
}

impl Readings<'_> {
    /// Every reading at `now`, from source `src`: the GPUs', the racks', the cooling
    /// units', the site's, the demand tracker's, and each cooling unit's capacity.
    pub fn samples(&self, now: Timestamp, src: &'static str) -> Vec<Sample> {
        let per_gpu = match self.gpu_readings {
            GpuReadings::Full => 3,
            GpuReadings::Power => 1,
        };
        // room for all of them at once (no copy on growth)
        let mut out = Vec::with_capacity(
            self.gpus.len() * per_gpu + self.site.racks.len() * 2 + self.site.cooling.len() * 2 + 8,
        );
        self.gpu_samples(now, src, &mut out);
        self.facility_samples(now, src, &mut out);
        if let Some(d) = self.demand {
            out.extend(d.samples(&self.site.site_entity(), now));
        }
        // what each cooling unit reports it can remove (its BMC's capacity reading)
        for (unit, f) in self.site.cooling.iter().zip(&self.capacity_factors) {
            out.push(Sample::new(
                EntityId::new(EntityKind::Cooling, &unit.id),
                COOLING_CAPACITY_KW,
                unit.capacity_kw * f,
                now,
                src,
            ));
        }
        out
    }

    fn gpu_samples(&self, now: Timestamp, src: &'static str, out: &mut Vec<Sample>) {
        for g in self.gpus {
            let id = || EntityId::clone(&g.id);
            out.push(Sample::from_static(id(), POWER_W, g.power_w, now, src));
            if self.gpu_readings == GpuReadings::Full {
                out.push(Sample::from_static(id(), ENERGY_J, g.energy_j, now, src));
                out.push(Sample::from_static(
                    id(),
                    POWER_LIMIT_W,
                    g.limit_w,
                    now,
                    src,
                ));
            }
        }
    }

    /// Rack power and inlet, cooling power, the site's IT power, and the price and
    /// carbon intensity in force.
    fn facility_samples(&self, now: Timestamp, src: &str, out: &mut Vec<Sample>) {
        for (ri, rack) in self.site.racks.iter().enumerate() {
            let e = EntityId::rack(&rack.id);
            out.push(Sample::new(
                e.clone(),
                POWER_W,
                self.rack_power_w[ri],
                now,
                src,
            ));
            out.push(Sample::new(e, INLET_TEMP_C, self.inlet_c[ri], now, src));
        }
        for (ci, unit) in self.site.cooling.iter().enumerate() {
            let e = EntityId::new(EntityKind::Cooling, &unit.id);
            out.push(Sample::new(
                e,
                COOLING_POWER_W,
                self.cooling_power_w[ci],
                now,
                src,
            ));
        }
        let site = self.site.site_entity();
        let it_power_w: f64 = self.rack_power_w.iter().sum();
        out.push(Sample::new(site.clone(), POWER_W, it_power_w, now, src));
        if let Some(p) = self.prices.at(now) {
            out.push(Sample::new(site.clone(), PRICE_PER_KWH, p, now, src));
        }
        if let Some(c) = self.carbon.at(now) {
            out.push(Sample::new(site, CARBON_G_PER_KWH, c, now, src));
        }
    }
}
