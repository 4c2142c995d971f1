//! The `powerplane backtest` command line.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use chrono::{NaiveDate, TimeZone};
use telemetry::{Site, Timestamp};

use super::{BacktestConfig, Input};

/// Replay a job trace and prices under the policy and under a no-policy baseline, and
/// compare: energy, cost, carbon, peak, violations, deadline misses, waits.
#[derive(Debug, Clone, clap::Args)]
pub struct Args {
    /// Site file (site.toml).
    #[arg(long)]
    pub site: PathBuf,
    /// Policy file (policy.toml).
    #[arg(long)]
    pub policy: PathBuf,
    /// Job trace: the Philly-derived trace, a Pollux workload, or the generic CSV
    /// (submit,duration_s,gpus[,id,class,deadline,gpu_model,workload]).
    #[arg(long)]
    pub jobs: PathBuf,
    /// Price series (format from the scenario's [prices]; default: start,price_per_kwh).
    #[arg(long)]
    pub prices: PathBuf,
    /// Carbon-intensity series (format from the scenario's [carbon]; default:
    /// start,carbon_g_per_kwh).
    #[arg(long)]
    pub carbon: Option<PathBuf>,
    /// Replay only jobs submitted from this time on (after alignment to the price year):
    /// RFC 3339 or YYYY-MM-DD (midnight in the site's time zone).
    #[arg(long)]
    pub from: Option<String>,
    /// ... and before this time.
    #[arg(long)]
    pub to: Option<String>,
    /// Scenario file (TOML): classes and deadlines, heat wave, contract limit, price
    /// spikes, feed formats, seed, tick.
    #[arg(long)]
    pub scenario: Option<PathBuf>,
    /// Where to write summary.json and report.html.
    #[arg(long, default_value = "backtest-out")]
    pub out: PathBuf,
    /// How many GPUs the contract holds: grow the site by whole racks of its own kind
    /// and replay until a budget or thermal violation or more than 1% of GPU-hours lost
    /// against the unconstrained run; writes OUT/capacity.json (and each size's run
    /// under OUT/racks-N).
    #[arg(long)]
    pub capacity: bool,
    /// With --capacity: racks added per step.
    #[arg(long, default_value_t = 1)]
    pub capacity_step: usize,
    /// With --capacity: at most this many steps.
    #[arg(long, default_value_t = 32)]
    pub capacity_max_steps: usize,
    /// Scale the trace's load: 0.05 replays a deterministic 5% of its jobs, 2 every job
    /// twice (copies submitted with it). With --capacity, each size's load is this
    /// times its GPUs over the site's.
    #[arg(long, default_value_t = 1.0, value_parser = load_factor)]
    pub load: f64,
}

/// A `--load` that is not a factor above 0 and at most 1000.
#[derive(Debug, thiserror::Error)]
#[error("{0:?}: a factor above 0 and at most 1000")]
struct LoadFactorError(String);

fn load_factor(s: &str) -> Result<f64, LoadFactorError> {
    match s.parse::<f64>() {
        Ok(f) if f.is_finite() && f > 0.0 && f <= 1000.0 => Ok(f),
        _ => Err(LoadFactorError(s.to_string())),
    }
}

fn when(s: &str, site: &Site, flag: &str) -> Result<Timestamp> {
    if let Ok(t) = Timestamp::parse_rfc3339(s) {
        return Ok(t);
    }
    let d = NaiveDate::parse_from_str(s, "%Y-%m-%d")
        .with_context(|| format!("{flag} {s:?} is neither RFC 3339 nor YYYY-MM-DD"))?;
    let midnight = d
        .and_hms_opt(0, 0, 0)
        .with_context(|| format!("{flag} {s:?}"))?;
    let local = site
        .timezone
        .from_local_datetime(&midnight)
        .earliest()
        .with_context(|| format!("{flag} {s:?} does not exist in {}", site.timezone))?;
    Ok(Timestamp::from(local.with_timezone(&chrono::Utc)))
}

impl Args {
    pub fn run(self) -> Result<ExitCode> {
        let site = Input::read(&self.site)?;
        let parsed = Site::parse(&site.name, &site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let from = self
            .from
            .as_deref()
            .map(|s| when(s, &parsed, "--from"))
            .transpose()?;
        let to = self
            .to
            .as_deref()
            .map(|s| when(s, &parsed, "--to"))
            .transpose()?;
        let cfg = BacktestConfig {
            site,
            policy: Input::read(&self.policy)?,
            jobs: Input::read(&self.jobs)?,
            prices: Input::read(&self.prices)?,
            carbon: self.carbon.as_deref().map(Input::read).transpose()?,
            scenario: self.scenario.as_deref().map(Input::read).transpose()?,
            from,
            to,
            out: self.out.clone(),
            load: self.load,
        };
        let mut err = std::io::stderr();
        if self.capacity {
            let r =
                super::capacity::run(&cfg, self.capacity_step, self.capacity_max_steps, &mut err)?;
            println!(
                "\npowerplane backtest --capacity: the {:.0} kW contract holds {}{} GPUs ({} racks) at most {:.0}% GPU-hours lost with no violation; nameplate provisioning ({:.0} W per GPU at its peak with its node and cooling share) gives {:.0}: {:+.1}% over nameplate{}\n  wrote {}/capacity.json",
                r.contract_kw,
                if r.at_least { "at least " } else { "" },
                r.largest_gpus,
                r.largest_racks,
                super::capacity::MAX_LOST * 100.0,
                r.gpu_peak_w,
                r.nameplate_gpus,
                r.over_nameplate_pct,
                if r.at_least {
                    " (every size tried held: the search stopped at its last step)"
                } else {
                    ""
                },
                cfg.out.display()
            );
            return Ok(ExitCode::SUCCESS);
        }
        let summary = super::run(&cfg, &mut err)?;
        print!("{}", summary.table(&cfg.out));
        Ok(ExitCode::SUCCESS)
    }
}
