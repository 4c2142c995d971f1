//! `powerplane policy explain`, `policy diff` and `policy test`: the engine run on
//! inputs from files, the same code `serve` runs live.
//!
//! - [`inputs`]: snapshot, jobs, prior state and forecast files.
//! - [`explain`]: every decision with the rule, its values and what releases it, and
//!   what is in force after the tick.
//! - [`diff`]: two policies on the same inputs: what would change.
//! - [`cases`]: test files of cases, each a sequence of ticks with expectations.

pub mod cases;
pub mod diff;
pub mod explain;
pub mod inputs;

use std::path::{Path, PathBuf};

use policies::{Cap, Forecast, Policy, State};
use serde_json::Value;
use telemetry::{EntityId, Job, Site, Snapshot, Timestamp};

use inputs::Problems;

/// The inputs every command evaluates on.
#[derive(Debug, Clone, clap::Args)]
pub struct InputArgs {
    /// The site file.
    #[arg(long)]
    pub site: PathBuf,
    /// Readings: a TOML or JSON snapshot file (see docs/policy.md).
    #[arg(long)]
    pub snapshot: PathBuf,
    /// Jobs: a TOML or JSON jobs file.
    #[arg(long)]
    pub jobs: Option<PathBuf>,
    /// When to evaluate: RFC 3339, or an offset (+30s) from the snapshot's `at`
    /// (default: the snapshot's `at`, else now).
    #[arg(long)]
    pub at: Option<String>,
    /// What is in force before the tick: the engine's state as JSON (or the JSON of
    /// `policy explain`).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Price (and carbon) CSV: start,price_per_kwh[,carbon_g_per_kwh].
    #[arg(long)]
    pub prices: Option<PathBuf>,
}

/// Everything but the policy, read and placed at one instant.
#[derive(Debug, Clone)]
pub struct World {
    pub site: Site,
    pub snapshot: Snapshot,
    pub jobs: Vec<Job>,
    pub prior: State,
    pub forecast: Forecast,
    pub now: Timestamp,
}

impl World {
    /// Reads every input; every problem of every file at once.
    pub fn load(a: &InputArgs) -> Result<World, Problems> {
        let site = load_site(&a.site)?;
        let mut problems = Vec::new();
        let (sn, st) = inputs::read(&a.snapshot)?;
        let file = inputs::SnapshotFile::parse(&sn, &st)?;
        let base = file.time()?;
        let now = match &a.at {
            Some(at) => inputs::parse_time(at, base.unwrap_or_else(common::wall_clock))
                .map_err(|e| vec![format!("--at: {e}")])?,
            None => base.unwrap_or_else(common::wall_clock),
        };
        let (mut snapshot, mut forecast) = match file.build(&site, now) {
            Ok(x) => x,
            Err(p) => {
                problems.extend(p);
                Default::default()
            }
        };
        let jobs = match &a.jobs {
            Some(p) => {
                match inputs::read(p)
                    .map_err(Problems::from)
                    .and_then(|(n, t)| inputs::jobs_file(&n, &t, &site, now))
                {
                    Ok(j) => j,
                    Err(p) => {
                        problems.extend(p);
                        Vec::new()
                    }
                }
            }
            None => Vec::new(),
        };
        let prior = match &a.state {
            Some(p) => match inputs::read(p)
                .map_err(Problems::from)
                .and_then(|(n, t)| inputs::state_file(&n, &t))
            {
                Ok(s) => s,
                Err(p) => {
                    problems.extend(p);
                    State::default()
                }
            },
            None => State::default(),
        };
        if let Some(p) = &a.prices {
            match inputs::read(p)
                .map_err(Problems::from)
                .and_then(|(n, t)| inputs::prices_file(&n, &t))
            {
                Ok(f) => forecast = f,
                Err(p) => problems.extend(p),
            }
        }
        if !problems.is_empty() {
            return Err(problems);
        }
        let site_id = site.site_entity();
        let own: Vec<&str> = [
            telemetry::metric::names::PRICE_PER_KWH,
            telemetry::metric::names::CARBON_G_PER_KWH,
        ]
        .into_iter()
        .filter(|m| snapshot.reading(&site_id, m).is_some())
        .collect();
        inputs::signals_from_forecast(&site, &mut snapshot, &forecast, now, &own);
        Ok(World {
            site,
            snapshot,
            jobs,
            prior,
            forecast,
            now,
        })
    }

    pub fn evaluate(&self, policy: &Policy) -> policies::Plan {
        policies::evaluate(
            &policies::Inputs {
                site: &self.site,
                snapshot: &self.snapshot,
                jobs: &self.jobs,
                prior: &self.prior,
                policy,
                forecast: &self.forecast,
                job_table: None,
            },
            self.now,
        )
    }
}

/// Why a policy file cannot be used: it cannot be read, or `serve` would refuse it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyFileError {
    #[error("{0}")]
    Read(#[from] inputs::ReadError),
    /// Its problems, one per line.
    #[error("{0}")]
    Invalid(#[from] runtime::reload::InvalidPolicy),
}

/// Reads and checks a policy file, against the site as `serve` does; with its text.
pub fn load_policy(path: &Path, site: &Site) -> Result<(Policy, String), PolicyFileError> {
    let (n, t) = inputs::read(path)?;
    let p = runtime::reload::validate(&n, &t, site)?;
    Ok((p, t))
}

/// Reads the site file.
pub fn load_site(path: &Path) -> Result<Site, Problems> {
    let (n, t) = inputs::read(path)?;
    Site::parse(&n, &t).map_err(|e| vec![e.to_string()])
}

/// Caps grouped by rack, rule and watts, in site order: (rack, rule, watts, GPUs, cap).
pub fn caps_by_rack<'a>(
    site: &Site,
    caps: &'a policies::GpuMap<Cap>,
) -> Vec<(String, String, f64, Vec<EntityId>, &'a Cap)> {
    let mut out: Vec<(String, String, f64, Vec<EntityId>, &Cap)> = Vec::new();
    for g in site.gpus() {
        let Some(c) = caps.get(&g.id) else { continue };
        match out.iter_mut().find(|(r, rule, w, _, _)| {
            *r == g.rack.id && **rule == *c.rule && (*w - c.watts).abs() < 0.05
        }) {
            Some(e) => e.3.push(EntityId::clone(&g.id)),
            None => out.push((
                g.rack.id.clone(),
                c.rule.to_string(),
                c.watts,
                vec![EntityId::clone(&g.id)],
                c,
            )),
        }
    }
    out
}

/// The parts of a policy that are in observe mode or disabled, found in the policy's
/// own structure (a section or rule with `observe = true` or `enabled = false`).
pub fn rule_modes(policy: &Policy) -> (Vec<String>, Vec<String>) {
    let mut observe = Vec::new();
    let mut disabled = Vec::new();
    let v = serde_json::to_value(policy).unwrap_or(Value::Null);
    for (name, unit) in units(&v) {
        if unit.get("enabled") == Some(&Value::Bool(false)) {
            disabled.push(name);
        } else if unit.get("observe") == Some(&Value::Bool(true)) {
            observe.push(name);
        }
    }
    for r in &policy.rules {
        if !r.enabled {
            disabled.push(r.id());
        } else if r.observe {
            observe.push(r.id());
        }
    }
    (observe, disabled)
}

/// The rules of a policy as (name, value): each top-level table, and each element of a
/// top-level list of tables, named by its `name` or `id` (else its index).
pub fn units(v: &Value) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    if let Value::Object(m) = v {
        for (k, x) in m {
            match x {
                Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
                    for (i, it) in items.iter().enumerate() {
                        let key = ["name", "id"]
                            .iter()
                            .find_map(|f| it.get(*f).and_then(Value::as_str).map(str::to_string))
                            .unwrap_or_else(|| i.to_string());
                        out.push((format!("{k}[{key}]"), it.clone()));
                    }
                }
                _ => out.push((k.clone(), x.clone())),
            }
        }
    }
    out
}

/// A cap as people read it.
pub fn cap_text(c: Option<&Cap>) -> String {
    match c {
        Some(c) => format!("{:.0} W ({})", c.watts, c.rule),
        None => "uncapped".into(),
    }
}

/// Prints problems to standard error; the exit code for input errors.
pub fn report(problems: &[String]) -> std::process::ExitCode {
    for p in problems {
        eprintln!("{p}");
    }
    std::process::ExitCode::from(1)
}

/// `policy explain`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExplainArgs {
    /// The policy file.
    #[arg(long)]
    pub policy: PathBuf,
    #[command(flatten)]
    pub inputs: InputArgs,
    /// text (a readable report) or json (for tools).
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

/// `policy diff`.
#[derive(Debug, Clone, clap::Args)]
pub struct DiffArgs {
    /// The policy in force.
    pub old: PathBuf,
    /// The candidate.
    pub new: PathBuf,
    #[command(flatten)]
    pub inputs: InputArgs,
    /// text or json.
    #[arg(long, default_value = "text", value_parser = ["text", "json"])]
    pub format: String,
}

/// `policy test`.
#[derive(Debug, Clone, clap::Args)]
pub struct TestArgs {
    /// Test files, or folders of them (every *.toml below).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,
    /// Run only the cases whose name contains this.
    #[arg(long)]
    pub run: Option<String>,
}

/// Runs `policy explain`: exit 0, or 1 on a problem with the inputs.
pub fn explain_cmd(a: &ExplainArgs) -> anyhow::Result<std::process::ExitCode> {
    let world = match World::load(&a.inputs) {
        Ok(w) => w,
        Err(e) => return Ok(report(&e)),
    };
    let policy = match load_policy(&a.policy, &world.site) {
        Ok((p, _)) => p,
        Err(e) => return Ok(report(&[e.to_string()])),
    };
    let plan = world.evaluate(&policy);
    let name = a.policy.display().to_string();
    if a.format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&explain::json(&name, &policy, &world, &plan))?
        );
    } else {
        print!("{}", explain::text(&name, &policy, &world, &plan));
    }
    Ok(std::process::ExitCode::SUCCESS)
}

/// Runs `policy diff`: exit 0 when the same, 1 when different, 2 on a problem.
pub fn diff_cmd(a: &DiffArgs) -> anyhow::Result<std::process::ExitCode> {
    let fail = |p: &[String]| {
        for m in p {
            eprintln!("{m}");
        }
        Ok(std::process::ExitCode::from(2))
    };
    let world = match World::load(&a.inputs) {
        Ok(w) => w,
        Err(e) => return fail(&e),
    };
    let ((old, old_src), (new, new_src)) = match (
        load_policy(&a.old, &world.site),
        load_policy(&a.new, &world.site),
    ) {
        (Ok(o), Ok(n)) => (o, n),
        (o, n) => {
            let p: Problems = [o.err(), n.err()]
                .into_iter()
                .flatten()
                .map(|e| e.to_string())
                .collect();
            return fail(&p);
        }
    };
    let (pa, pb) = (world.evaluate(&old), world.evaluate(&new));
    let d = diff::diff((&old, &old_src), (&new, &new_src), &world, &pa, &pb);
    let (on, nn) = (a.old.display().to_string(), a.new.display().to_string());
    if a.format == "json" {
        println!(
            "{}",
            serde_json::to_string_pretty(&diff::json(&on, &nn, &world, &d))?
        );
    } else {
        print!("{}", diff::text(&on, &nn, &world, &d));
    }
    Ok(std::process::ExitCode::from(u8::from(!d.is_empty())))
}

/// Runs `policy test`: exit 0 when every case passes, else 1.
pub fn test_cmd(a: &TestArgs) -> anyhow::Result<std::process::ExitCode> {
    let (text, ok) = cases::run(&a.paths, a.run.as_deref());
    print!("{text}");
    Ok(std::process::ExitCode::from(u8::from(!ok)))
}
