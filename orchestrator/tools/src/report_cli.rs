//! `powerplane report`'s command line: the ledger, the audit log and the inlets read
//! from a config's store or an embedded store file, grouped (see
//! `powerplane-report`'s `energy_report`), written as table, CSV, JSON or HTML.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use integrations::store::{LedgerEntry, Store};
use report::energy_report::{build, EnergyReport, GroupBy};
use telemetry::{Site, Timestamp};

/// `--group-by`: what the report's rows are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GroupByArg {
    Job,
    Project,
    User,
    Rack,
    /// Days in the site's time zone.
    Day,
}

impl From<GroupByArg> for GroupBy {
    fn from(g: GroupByArg) -> GroupBy {
        match g {
            GroupByArg::Job => GroupBy::Job,
            GroupByArg::Project => GroupBy::Project,
            GroupByArg::User => GroupBy::User,
            GroupByArg::Rack => GroupBy::Rack,
            GroupByArg::Day => GroupBy::Day,
        }
    }
}

/// `--format`: how the report is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Aligned columns, for a terminal.
    Table,
    Csv,
    Json,
    /// One self-contained page with charts.
    Html,
}

#[allow(clippy::too_many_arguments)]
pub fn run(
    config: Option<PathBuf>,
    site: Option<PathBuf>,
    store: Option<PathBuf>,
    from: Option<String>,
    to: Option<String>,
    group_by: GroupByArg,
    format: Format,
    out: Option<PathBuf>,
) -> Result<ExitCode> {
    let by = GroupBy::from(group_by);
    let (site, mut store) = open(config, site, store)?;
    let ledger = read_log(|next| store.ledger(next, 10_000))?;
    let audit = read_log(|next| store.audit(next, 10_000))?;
    let conditions = read_log(|next| store.conditions(next, 10_000))?;
    let (from, to) = period(from, to, &ledger)?;
    anyhow::ensure!(from < to, "--from must be before --to");
    let gpu_racks = site
        .gpus()
        .iter()
        .map(|g| (g.id.to_string(), g.rack.id.clone()))
        .collect();
    let mut r = build(
        &gpu_racks,
        &ledger,
        &audit,
        by,
        site.timezone,
        &site.currency,
        from,
        to,
    );
    r.site = site.name.clone();
    let jobs = store.jobs()?;
    let peaks: Vec<control::demand::PeriodPeak> = store
        .records(control::demand::COLLECTION)?
        .into_values()
        .collect();
    let r = r
        .with_inlets(&conditions)
        .with_jobs(&jobs)
        .with_demand_charge(
            site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw),
            site.timezone,
            &peaks,
            &ledger,
        );
    let grid: Vec<telemetry::grid::GridEvent> = store
        .records(control::grid::EVENTS)?
        .into_values()
        .collect();
    let r = r.with_grid_events(&grid, &ledger, site.timezone);
    write(&r, format, &site.name, out)?;
    Ok(ExitCode::SUCCESS)
}

/// The site and the store: a config's, or a site file and an embedded store file.
fn open(
    config: Option<PathBuf>,
    site: Option<PathBuf>,
    store: Option<PathBuf>,
) -> Result<(Site, Store)> {
    Ok(match (config, site, store) {
        (Some(c), _, _) => serve::open_for_report(&c)?,
        (None, Some(site), Some(store)) => {
            let text = std::fs::read_to_string(&site)
                .with_context(|| format!("cannot read {}", site.display()))?;
            let site = Site::parse(&site.display().to_string(), &text)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(store.exists(), "no store at {}", store.display());
            let backend = integrations::store::embedded::EmbeddedBackend::open(&store)?;
            (site, integrations::store::Store::new(Box::new(backend)))
        }
        _ => anyhow::bail!(
            "say where the ledger is: --config powerplane.toml, or --site FILE --store state.redb"
        ),
    })
}

/// `--from` and `--to`, by default the ledger's first start and just after its last end.
fn period(
    from: Option<String>,
    to: Option<String>,
    ledger: &[LedgerEntry],
) -> Result<(Timestamp, Timestamp)> {
    let parse = |s: &str| {
        Timestamp::parse_rfc3339(s)
            .map_err(|e| anyhow::anyhow!("{s:?}: {e} (use RFC 3339, e.g. 2026-11-01T00:00:00Z)"))
    };
    let from = match from {
        Some(f) => parse(&f)?,
        None => ledger.iter().map(|e| e.start).min().unwrap_or_default(),
    };
    let to = match to {
        Some(t) => parse(&t)?,
        None => ledger
            .iter()
            .map(|e| e.end)
            .max()
            .unwrap_or_default()
            .plus_secs(0.001),
    };
    Ok((from, to))
}

/// The report in its format, to `out` or standard output.
fn write(r: &EnergyReport, format: Format, site: &str, out: Option<PathBuf>) -> Result<()> {
    let text = match format {
        Format::Csv => r.csv(),
        Format::Json => r.json(),
        Format::Html => r.html(site),
        Format::Table => r.table(),
    };
    match out {
        Some(p) => {
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?
        }
        None => print!("{text}"),
    }
    Ok(())
}

/// Every record of one of the store's logs, read in pages of 10,000 from the first.
fn read_log<T, E>(mut read: impl FnMut(u64) -> Result<Vec<(u64, T)>, E>) -> Result<Vec<T>>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let mut all = Vec::new();
    let mut next = 1;
    loop {
        let page = read(next)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        all.extend(page.into_iter().map(|p| p.1));
        next = last + 1;
    }
    Ok(all)
}
