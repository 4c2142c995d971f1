//! `powerplane backtest --capacity`: how many GPUs the contract holds.
//!
//! The site is grown by whole racks of its own kind (copies of its last rack, each
//! with its own PDU on the same feed, on the cooling unit with the fewest racks) and
//! the trace replayed under the same contract with its load grown with the site (as
//! many jobs per GPU as on the site given; see `trace::scaled`), until the policy's
//! run has any
//! time over the contract or over an inlet limit, or delivers more than 1% fewer
//! GPU-hours than the unconstrained run (the same policy on the same site with no
//! contract: the scenario's `[contract]` left out and every feed rated 100 times
//! higher) by the day that run's last job ended. The largest site that passed
//! is reported against nameplate provisioning: the contract ÷ what one GPU may draw at
//! its maximum limit with its share of its node's base power and of its cooling.

use anyhow::{Context, Result};
use serde::Serialize;
use telemetry::Site;

use super::{BacktestConfig, Input, Summary};

/// GPU-hours the policy's run may lose against the unconstrained run.
pub const MAX_LOST: f64 = 0.01;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub racks: usize,
    pub gpus: usize,
    pub budget_violation_s: f64,
    pub thermal_violation_s: f64,
    /// Share of the unconstrained run's GPU-hours the policy's run had not delivered
    /// by the day the unconstrained run's last job ended.
    pub gpu_hours_lost: f64,
    /// The factor the trace's load was scaled by at this size: `--load` times its GPUs
    /// over the site's.
    pub load: f64,
    pub passed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CapacityReport {
    pub contract_kw: f64,
    /// What one GPU may draw at its peak with its node and cooling share, W.
    pub gpu_peak_w: f64,
    /// contract ÷ gpu_peak_w.
    pub nameplate_gpus: f64,
    /// The largest site that passed (0 when none did).
    pub largest_gpus: usize,
    pub largest_racks: usize,
    /// largest_gpus ÷ nameplate_gpus − 1, in %.
    pub over_nameplate_pct: f64,
    /// Every size tried held: the contract holds at least `largest_gpus` (raise
    /// `--capacity-max-steps` or `--capacity-step` to search further).
    pub at_least: bool,
    pub steps: Vec<Step>,
}

/// One GPU's peak with its node's base power and its cooling, W (the site's mean).
pub fn gpu_peak_w(site: &Site) -> f64 {
    let (mut w, mut n) = (0.0, 0.0);
    for node in &site.nodes {
        let Some(model) = site.gpu_models.get(&node.gpu_model) else {
            continue;
        };
        let cooling = site
            .racks
            .iter()
            .find(|r| r.id == node.rack)
            .and_then(|r| site.cooling_of(&r.id))
            .map_or(0.0, crate::cooling_kw_per_kw);
        let g = f64::from(node.gpus);
        w += (g * model.max_w + node.base_w) * (1.0 + cooling);
        n += g;
    }
    w / n.max(1.0)
}

/// The site's text with `extra` more racks, copies of its last one.
pub fn grow(text: &str, file: &str, extra: usize) -> Result<String> {
    let mut doc: toml::Table = toml::from_str(text).with_context(|| format!("{file}: TOML"))?;
    let racks = doc
        .get("racks")
        .and_then(|r| r.as_array())
        .cloned()
        .with_context(|| format!("{file}: no [[racks]] to grow"))?;
    let last = racks
        .last()
        .and_then(|r| r.as_table())
        .cloned()
        .with_context(|| format!("{file}: no [[racks]] to grow"))?;
    let pdus = doc
        .get("pdus")
        .and_then(|p| p.as_array())
        .cloned()
        .unwrap_or_default();
    let mut new_racks = racks.clone();
    let mut new_pdus = pdus.clone();
    let mut cooling = doc
        .get("cooling")
        .and_then(|c| c.as_array())
        .cloned()
        .unwrap_or_default();
    let id = last.get("id").and_then(|v| v.as_str()).unwrap_or("rack");
    for k in 0..extra {
        let mut r = last.clone();
        let rid = format!("{id}-x{}", k + 1);
        r.insert("id".into(), rid.clone().into());
        // each copy gets copies of its PDUs, on the same feeds
        if let Some(list) = last.get("pdus").and_then(|p| p.as_array()) {
            let mut ids = Vec::new();
            for p in list.iter().filter_map(|p| p.as_str()) {
                let src = pdus
                    .iter()
                    .filter_map(|x| x.as_table())
                    .find(|x| x.get("id").and_then(|v| v.as_str()) == Some(p));
                if let Some(src) = src {
                    let mut c = src.clone();
                    let pid = format!("{p}-x{}", k + 1);
                    c.insert("id".into(), pid.clone().into());
                    new_pdus.push(c.into());
                    ids.push(toml::Value::from(pid));
                }
            }
            r.insert("pdus".into(), ids.into());
        }
        // on the cooling unit with the fewest racks
        if let Some(u) = cooling
            .iter_mut()
            .filter_map(|u| u.as_table_mut())
            .min_by_key(|u| {
                u.get("racks")
                    .and_then(|r| r.as_array())
                    .map_or(0, Vec::len)
            })
        {
            if let Some(list) = u.get_mut("racks").and_then(|r| r.as_array_mut()) {
                list.push(rid.into());
            }
        }
        new_racks.push(r.into());
    }
    doc.insert("racks".into(), new_racks.into());
    if !new_pdus.is_empty() {
        doc.insert("pdus".into(), new_pdus.into());
    }
    if !cooling.is_empty() {
        doc.insert("cooling".into(), cooling.into());
    }
    Ok(toml::to_string(&doc)?)
}

/// The site with no power limit: every feed rated 100 times higher.
fn unlimited_site(text: &str) -> Result<String> {
    let mut doc: toml::Table = toml::from_str(text)?;
    if let Some(feeds) = doc.get_mut("feeds").and_then(|f| f.as_array_mut()) {
        for f in feeds.iter_mut().filter_map(|f| f.as_table_mut()) {
            if let Some(r) = f
                .get("rating_kw")
                .and_then(|r| r.as_float().or(r.as_integer().map(|i| i as f64)))
            {
                f.insert("rating_kw".into(), (r * 100.0).into());
            }
        }
    }
    Ok(toml::to_string(&doc)?)
}

/// The scenario without its contract.
fn without_contract(text: &str) -> Result<String> {
    let mut doc: toml::Table = toml::from_str(text)?;
    doc.remove("contract");
    Ok(toml::to_string(&doc)?)
}

fn lost(s: &Summary, free: &Summary) -> f64 {
    let base = &free.policy.gpu_hours_per_day;
    let days = base.len();
    let b: f64 = base.iter().sum();
    let p: f64 = s.policy.gpu_hours_per_day.iter().take(days).sum();
    if b <= 0.0 {
        0.0
    } else {
        ((b - p) / b).max(0.0)
    }
}

/// Grows the site `step` racks at a time until a run fails (at most `max_steps`).
pub fn run(
    cfg: &BacktestConfig,
    step: usize,
    max_steps: usize,
    progress: &mut dyn std::io::Write,
) -> Result<CapacityReport> {
    let site = Site::parse(&cfg.site.name, &cfg.site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let base_racks = site.racks.len();
    let base_gpus = site.gpus().len();
    let peak = gpu_peak_w(&site);
    let mut steps = Vec::new();
    let mut contract_kw = 0.0;
    let mut best: Option<(usize, usize)> = None;
    for i in 0..=max_steps {
        let racks = base_racks + i * step.max(1);
        let (st, budget_kw) = try_size(cfg, i * step.max(1), racks, base_gpus, progress)?;
        contract_kw = budget_kw;
        let (passed, gpus) = (st.passed, st.gpus);
        steps.push(st);
        if !passed {
            break;
        }
        best = Some((racks, gpus));
    }
    let nameplate = contract_kw * 1000.0 / peak.max(1.0);
    let (racks, gpus) = best.unwrap_or((0, 0));
    let report = CapacityReport {
        contract_kw,
        gpu_peak_w: peak,
        nameplate_gpus: nameplate,
        largest_gpus: gpus,
        largest_racks: racks,
        over_nameplate_pct: if gpus > 0 {
            100.0 * (gpus as f64 / nameplate - 1.0)
        } else {
            0.0
        },
        at_least: steps.iter().all(|s| s.passed),
        steps,
    };
    std::fs::create_dir_all(&cfg.out)?;
    std::fs::write(
        cfg.out.join("capacity.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    Ok(report)
}

/// One size: the site grown by `extra` racks (`racks` in all) replayed under its
/// contract and without limits; the step, and the contract's limit (kW).
fn try_size(
    cfg: &BacktestConfig,
    extra: usize,
    racks: usize,
    base_gpus: usize,
    progress: &mut dyn std::io::Write,
) -> Result<(Step, f64)> {
    let text = grow(&cfg.site.text, &cfg.site.name, extra)?;
    let gpus = Site::parse(&cfg.site.name, &text)
        .map_err(|e| anyhow::anyhow!("{e}"))?
        .gpus()
        .len();
    let mut c = cfg.clone();
    c.site = Input {
        name: cfg.site.name.clone(),
        text,
    };
    // the load grows with the site: as many jobs per GPU as the trace has on the site
    c.load = cfg.load * gpus as f64 / base_gpus.max(1) as f64;
    c.out = cfg.out.join(format!("racks-{racks}"));
    let s = super::run(&c, progress)?;
    let mut u = c.clone();
    u.site.text = unlimited_site(&c.site.text)?;
    if let Some(sc) = &mut u.scenario {
        sc.text = without_contract(&sc.text)?;
    }
    u.out = cfg.out.join(format!("racks-{racks}-unconstrained"));
    let free = super::run(&u, progress)?;
    let l = lost(&s, &free);
    let passed =
        s.policy.budget_violation_s == 0.0 && s.policy.thermal_violation_s == 0.0 && l <= MAX_LOST;
    writeln!(
        progress,
        "capacity: {} racks, {} GPUs, load x{:.2}: {:.0} s over the contract, {:.0} s over an inlet limit, {:.2}% GPU-hours lost: {}",
        racks,
        s.gpus,
        c.load,
        s.policy.budget_violation_s,
        s.policy.thermal_violation_s,
        l * 100.0,
        if passed { "holds" } else { "does not hold" }
    )?;
    let st = Step {
        racks,
        gpus: s.gpus,
        budget_violation_s: s.policy.budget_violation_s,
        thermal_violation_s: s.policy.thermal_violation_s,
        gpu_hours_lost: l,
        load: c.load,
        passed,
    };
    Ok((st, s.budget_kw))
}
