//! The backtest's inputs: the site, policy, scenario, feeds and trace read, and the
//! trace's jobs aligned, classed and given deadlines and curves.

use anyhow::Result;
use chrono::{Datelike, Duration, NaiveDate, NaiveDateTime, TimeZone};
use chrono_tz::Tz;
use policies::Policy;
use telemetry::prices::Series;
use telemetry::{Job, JobState, Site, Timestamp};

use super::facility::SimJob;
use super::scenario::{ClassRule, Scenario};
use super::trace::{self, Format, TraceJob, When};
use super::{BacktestConfig, Input};
use crate::curves::{self, CurveSet};
use crate::rng::Rng;

/// Reads a price or carbon file as the scenario says it is written.
fn read_series(
    input: &Input,
    format: Option<&control::feeds::FeedFormat>,
    column: &str,
) -> Result<Series> {
    let default = control::feeds::FeedFormat::default();
    Ok(format
        .unwrap_or(&default)
        .read(&input.name, &input.text, column)?)
}

/// The local year most of a series lies in.
fn series_year(s: &Series, tz: Tz) -> Option<i32> {
    let pts = s.points();
    let mid = pts.get(pts.len() / 2)?;
    Some(mid.0.to_datetime().with_timezone(&tz).year())
}

fn localize(tz: Tz, n: NaiveDateTime) -> Timestamp {
    use chrono::LocalResult;
    let pick = |dt: chrono::DateTime<Tz>| Timestamp::from(dt.with_timezone(&chrono::Utc));
    match tz.from_local_datetime(&n) {
        LocalResult::Single(d) => pick(d),
        LocalResult::Ambiguous(a, _) => pick(a),
        // skipped by a DST change: an hour later exists
        LocalResult::None => match tz.from_local_datetime(&(n + Duration::hours(1))) {
            LocalResult::Single(d) | LocalResult::Ambiguous(d, _) => pick(d),
            LocalResult::None => Timestamp::from(chrono::Utc.from_utc_datetime(&n)),
        },
    }
}

/// Moves trace times into the price year by whole weeks; returns a function from trace
/// times to instants, and the statement of what was done.
pub(super) fn alignment(
    jobs: &[TraceJob],
    tz: Tz,
    price_year: Option<i32>,
    anchor: Timestamp,
) -> (impl Fn(&When) -> Timestamp, String) {
    let naive = |w: &When| match w {
        When::Local(n) => Some(*n),
        When::Instant(t) => Some(t.to_datetime().with_timezone(&tz).naive_local()),
        When::Offset(_) => None,
    };
    let first = jobs.iter().filter_map(|j| naive(&j.submit)).min();
    let (weeks, statement) = match (first, price_year) {
        (Some(first), Some(year)) if first.year() != year => {
            let d = first.date();
            let target = NaiveDate::from_ymd_opt(year, d.month(), d.day())
                .or_else(|| NaiveDate::from_ymd_opt(year, d.month(), 28))
                .unwrap_or(d);
            let days = (target - d).num_days();
            let weeks = (days as f64 / 7.0).round() as i64;
            let moved = first + Duration::weeks(weeks);
            (
                weeks,
                format!(
                    "trace from another year: every submit time moved by {weeks} weeks ({} days), so that each job keeps its weekday and local hour ({}); its first job, {} ({}), replays at {} ({}), in the prices' year {year}",
                    weeks * 7,
                    tz,
                    first.format("%Y-%m-%d %H:%M"),
                    first.format("%a"),
                    moved.format("%Y-%m-%d %H:%M"),
                    moved.format("%a"),
                ),
            )
        }
        (Some(_), Some(year)) => (
            0,
            format!("trace in the prices' year {year}: replayed at its own times ({tz})"),
        ),
        (Some(_), None) => (0, "no price year: trace replayed at its own times".into()),
        (None, _) => (
            0,
            format!(
                "trace of offsets: replayed from {} ({tz})",
                anchor
                    .to_datetime()
                    .with_timezone(&tz)
                    .format("%Y-%m-%d %H:%M %a")
            ),
        ),
    };
    let shift = Duration::weeks(weeks);
    let f = move |w: &When| match w {
        When::Local(n) => localize(tz, *n + shift),
        When::Instant(t) => localize(tz, t.to_datetime().with_timezone(&tz).naive_local() + shift),
        When::Offset(s) => anchor + *s,
    };
    (f, statement)
}

/// Jobs as the replay runs them: aligned, classed, with deadlines and curves; a job
/// larger than the site is refused with its file and line.
#[allow(clippy::too_many_arguments)]
fn build_jobs(
    trace: &[TraceJob],
    scenario: &Scenario,
    align: &dyn Fn(&When) -> Timestamp,
    curves: &[curves::Curve],
    from: Option<Timestamp>,
    to: Option<Timestamp>,
    file: &str,
    site: &Site,
) -> Result<(Vec<SimJob>, usize)> {
    let mut rng = Rng::new(scenario.seed);
    let mut out = Vec::with_capacity(trace.len());
    let mut infeasible = 0;
    for t in trace {
        // two draws per job whatever it has, so one job's columns never move another's
        let u_class = rng.f64();
        let u_curve = rng.f64();
        let submit = align(&t.submit);
        if from.is_some_and(|f| submit < f) || to.is_some_and(|e| submit >= e) {
            continue;
        }
        fits_site(t, site, file)?;
        let rule = class_rule(t, scenario, u_class);
        let class = t
            .class
            .clone()
            .or_else(|| rule.map(|r| r.class.clone()))
            .unwrap_or_else(|| scenario.default_class.clone());
        let (deadline, deferrable, feasible) = deadline(t, rule, submit, align);
        if !feasible {
            infeasible += 1;
        }
        let curve = t
            .workload
            .as_ref()
            .and_then(|w| curves.iter().position(|c| &c.name == w))
            .unwrap_or(((u_curve * curves.len() as f64) as usize).min(curves.len() - 1));
        let job = Job {
            id: t.id.clone(),
            scheduler: "trace".into(),
            name: t.id.clone(),
            user: "trace".into(),
            project: class.clone(),
            class,
            priority: rule.map_or(0, |r| r.priority),
            gpus: t.gpus,
            allocated: Vec::new(),
            state: JobState::Pending,
            submit_time: submit,
            start_time: None,
            end_time: None,
            deadline,
            est_duration_s: t.duration_s,
            deferrable,
            preemptible: rule.is_some_and(|r| r.preemptible),
            gpu_power_limit: None,
        };
        out.push(SimJob::new(job, t.duration_s, curve, t.gpu_model.clone()));
    }
    Ok((out, infeasible))
}

/// A job the site can never run is bad input, not a job to replay forever.
fn fits_site(t: &TraceJob, site: &Site, file: &str) -> Result<()> {
    let have: u32 = site
        .nodes
        .iter()
        .filter(|n| t.gpu_model.as_ref().is_none_or(|m| &n.gpu_model == m))
        .map(|n| n.gpus)
        .sum();
    if t.gpus > have {
        anyhow::bail!(
            "{file}:{}: job {} needs {} GPUs{}, the site has {have}",
            t.line,
            t.id,
            t.gpus,
            t.gpu_model
                .as_ref()
                .map_or(String::new(), |m| format!(" of model {m}"))
        );
    }
    Ok(())
}

/// The scenario's class rule for a job: its own class's, else one drawn by the
/// classes' shares (`u_class` in [0, 1)).
fn class_rule<'a>(t: &TraceJob, scenario: &'a Scenario, u_class: f64) -> Option<&'a ClassRule> {
    match &t.class {
        Some(c) => scenario.classes.iter().find(|r| &r.class == c),
        None => {
            let mut acc = 0.0;
            scenario.classes.iter().find(|r| {
                acc += r.share;
                u_class < acc
            })
        }
    }
}

/// A job's deadline and whether it may be deferred: the trace's deadline, else its
/// class rule's. The last value is false where the rule's deadline cannot be met even
/// at once (then the job is not a deadline job).
fn deadline(
    t: &TraceJob,
    rule: Option<&ClassRule>,
    submit: Timestamp,
    align: &dyn Fn(&When) -> Timestamp,
) -> (Option<Timestamp>, bool, bool) {
    let mut deadline = t.deadline.as_ref().map(align);
    let mut deferrable = match rule {
        Some(r) => r.deferrable,
        None => deadline.is_some(),
    };
    let mut feasible = true;
    if deadline.is_none() {
        if let Some(r) = rule {
            deadline = match (r.deadline_h, r.slack_h) {
                (Some(h), _) => Some(submit + h * 3600.0),
                (None, Some(s)) => Some(submit + t.duration_s + s * 3600.0),
                _ => None,
            };
            if deadline.is_some_and(|d| d < submit + t.duration_s) {
                feasible = false;
                deadline = None;
                deferrable = false;
            }
        }
    }
    (deadline, deferrable, feasible)
}

/// What a backtest replays: the site, the policy (with a contract's limit as its site
/// budget), the scenario, the price and carbon feeds, and the trace's jobs aligned to
/// the prices' year.
pub(super) struct Inputs {
    pub site: Site,
    pub policy: Policy,
    pub scenario: Scenario,
    pub format: Format,
    pub prices: Series,
    pub carbon: Series,
    /// The facility's limit (the contract, or the feeds' usable capacity).
    pub budget_kw: f64,
    pub curves: CurveSet,
    pub jobs: Vec<SimJob>,
    /// Jobs whose class rule's deadline could not be met even at once.
    pub infeasible: usize,
    /// What the alignment did, in words.
    pub alignment: String,
    /// The replay's start: the first submission, on the tick grid.
    pub start: Timestamp,
}

impl Inputs {
    pub fn read(cfg: &BacktestConfig) -> Result<Self> {
        let site =
            Site::parse(&cfg.site.name, &cfg.site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut policy = Policy::parse(&cfg.policy.name, &cfg.policy.text)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let scenario = match &cfg.scenario {
            Some(s) => Scenario::parse(&s.name, &s.text)?,
            None => Scenario::default(),
        };
        let (format, trace) = trace::parse(&cfg.jobs.name, &cfg.jobs.text)?;
        let trace = trace::scaled(trace, cfg.load);
        let (prices, carbon, carbon_note) = read_feeds(cfg, &scenario, site.timezone)?;
        let budget_kw = apply_contract(&mut policy, &site, &scenario);
        let tz = site.timezone;
        let anchor = scenario
            .trace_start
            .or(cfg.from)
            .or_else(|| prices.points().first().map(|p| p.0))
            .unwrap_or(Timestamp::from_secs(0));
        let (align, mut alignment) = alignment(&trace, tz, series_year(&prices, tz), anchor);
        if let Some(n) = carbon_note {
            alignment = format!("{alignment}; {n}");
        }
        let curves = CurveSet::measured();
        anyhow::ensure!(!curves.workloads().is_empty(), "no measured GPU curves");
        let (jobs, infeasible) = build_jobs(
            &trace,
            &scenario,
            &align,
            curves.workloads(),
            cfg.from,
            cfg.to,
            &cfg.jobs.name,
            &site,
        )?;
        anyhow::ensure!(
            !jobs.is_empty(),
            "{}: no jobs submitted in the window given by --from/--to (after alignment: {alignment})",
            cfg.jobs.name
        );
        let first = jobs
            .iter()
            .map(|j| j.job.submit_time)
            .min()
            .unwrap_or(anchor);
        // start on the tick grid, so ticks meet the price steps
        let grid = (scenario.tick_s * 1000.0) as i64;
        let start = Timestamp(first.0.div_euclid(grid) * grid);
        Ok(Inputs {
            site,
            policy,
            scenario,
            format,
            prices,
            carbon,
            budget_kw,
            curves,
            jobs,
            infeasible,
            alignment,
            start,
        })
    }

    /// The ids of the site's cooling units, in order.
    pub fn cooling_units(&self) -> Vec<String> {
        self.site.cooling.iter().map(|u| u.id.clone()).collect()
    }
}

/// The price and carbon series as the scenario gives them: carbon from another year
/// moved into the prices' (the note says how), the scenario's price spikes applied.
fn read_feeds(
    cfg: &BacktestConfig,
    scenario: &Scenario,
    tz: Tz,
) -> Result<(Series, Series, Option<String>)> {
    let mut prices = read_series(&cfg.prices, scenario.prices.as_ref(), "price_per_kwh")?;
    let mut carbon = match &cfg.carbon {
        Some(c) => read_series(c, scenario.carbon.as_ref(), "carbon_g_per_kwh")?,
        None => Series::default(),
    };
    let mut carbon_note = None;
    if let (Some(py), Some(cy)) = (series_year(&prices, tz), series_year(&carbon, tz)) {
        if py != cy {
            // the same alignment as the trace's: whole weeks, weekday and hour kept
            let weeks = ((f64::from(py - cy) * 365.2425) / 7.0).round();
            let shift = weeks * 7.0 * 86400.0;
            carbon = Series::new(
                carbon
                    .points()
                    .iter()
                    .map(|(t, v)| (*t + shift, *v))
                    .collect(),
            );
            carbon_note = Some(format!(
                "carbon series from {cy} moved by {weeks} weeks into {py}"
            ));
        }
    }
    if !scenario.price_spike.is_empty() {
        let mut pts = prices.points().to_vec();
        scenario.spike(&mut pts);
        prices = Series::new(pts);
    }
    Ok((prices, carbon, carbon_note))
}

/// The facility's limit: the scenario's contract, else the feeds' usable capacity.
/// A contract limits what the whole facility draws, not each feed: the feeds keep
/// their ratings, and the policy is told the limit as its `site` budget (as an
/// operator would write it), unless it already has a lower one.
fn apply_contract(policy: &mut Policy, site: &Site, scenario: &Scenario) -> f64 {
    let Some(c) = &scenario.contract else {
        return site.facility_budget_kw();
    };
    let limits = &mut policy.budget.limits;
    match limits.iter_mut().find(|l| l.scope == "site") {
        Some(l) if l.limit_kw * l.derate <= c.limit_kw => {}
        Some(l) => {
            l.limit_kw = c.limit_kw;
            l.derate = 1.0;
        }
        None => limits.push(policies::policy::Limit {
            scope: "site".into(),
            name: site.name.clone(),
            limit_kw: c.limit_kw,
            derate: 1.0,
        }),
    }
    c.limit_kw
}
