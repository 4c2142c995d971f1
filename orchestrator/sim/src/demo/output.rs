//! The demo's files: the minute-by-minute CSV, the per-job CSV, and the HTML report.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Result;
use integrations::store::{Account, LedgerEntry};
use policies::Decision;
use telemetry::{Site, Timestamp};

use super::{hottest, local, DemoConfig, Point, Summary};
use crate::Facility;
use report::{bars, csv_field, escape, page, Chart, Line, Rule};

pub(super) fn write_outputs(
    cfg: &DemoConfig,
    site: &Site,
    points: &[Point],
    audit: &[(u64, Decision)],
    ledger: &[LedgerEntry],
    fac: &Facility,
    summary: &Summary,
) -> Result<()> {
    let out = &cfg.out;
    let mut jsonl = String::new();
    for (_, d) in audit {
        jsonl.push_str(&serde_json::to_string(d)?);
        jsonl.push('\n');
    }
    std::fs::write(out.join("audit.jsonl"), jsonl)?;
    std::fs::write(out.join("report.csv"), timeseries_csv(site, points))?;
    std::fs::write(out.join("jobs.csv"), jobs_csv(fac, ledger))?;
    std::fs::write(
        out.join("report.html"),
        html(site, points, ledger, audit, summary),
    )?;
    Ok(())
}

fn timeseries_csv(site: &Site, points: &[Point]) -> String {
    let mut s = String::from("time,it_kw,cooling_kw,budget_kw,price_per_kwh,carbon_g_per_kwh,hottest_inlet_c,hottest_rack,capped_gpus,held_jobs,running_jobs");
    for r in &site.racks {
        let _ = write!(s, ",{0}_kw,{0}_inlet_c", csv_field(&r.id));
    }
    s.push('\n');
    for p in points {
        let (ri, hot) = hottest(&p.inlets);
        let _ = write!(
            s,
            "{},{:.3},{:.3},{:.3},{:.4},{:.1},{:.2},{},{},{},{}",
            p.t,
            p.it_kw,
            p.cooling_kw,
            site.facility_budget_kw(),
            p.price,
            p.carbon,
            hot,
            csv_field(&site.racks[ri].id),
            p.capped_gpus,
            p.held_jobs,
            p.running_jobs
        );
        for (kw, t) in p.rack_kw.iter().zip(&p.inlets) {
            let _ = write!(s, ",{kw:.3},{t:.2}");
        }
        s.push('\n');
    }
    s
}

fn jobs_csv(fac: &Facility, ledger: &[LedgerEntry]) -> String {
    let mut per_job: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
    for e in ledger {
        if let Account::Job { job, .. } = &e.account {
            let v = per_job.entry(job.as_str()).or_default();
            v.0 += e.energy_kwh;
            v.1 += e.cost;
            v.2 += e.carbon_kg;
        }
    }
    let mut s = String::from("job,project,user,class,gpus,state,submitted,started,finished,wait_s,energy_kwh,cost,carbon_kg\n");
    for j in fac.jobs() {
        let (kwh, cost, co2) = per_job.get(j.id.as_str()).copied().unwrap_or_default();
        let wait = j.start_time.map(|st| st.secs_since(j.submit_time).max(0.0));
        let opt = |t: Option<Timestamp>| t.map(|t| t.to_string()).unwrap_or_default();
        let _ = writeln!(
            s,
            "{},{},{},{},{},{:?},{},{},{},{},{:.4},{:.4},{:.4}",
            csv_field(&j.id),
            csv_field(&j.project),
            csv_field(&j.user),
            csv_field(&j.class),
            j.gpus,
            j.state,
            j.submit_time,
            opt(j.start_time),
            opt(j.end_time),
            wait.map(|w| format!("{w:.0}")).unwrap_or_default(),
            kwh,
            cost,
            co2
        );
    }
    s
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

/// The x-axis labels: every 30 minutes, in the site's time.
fn ticks_of(site: &Site, points: &[Point], s: &Summary) -> Vec<(f64, String)> {
    points
        .iter()
        .filter(|p| (p.t.secs_since(s.start) / 60.0).rem_euclid(30.0) < 1e-6)
        .map(|p| (p.t.secs_since(s.start) / 60.0, local(site, p.t, "%H:%M")))
        .collect()
}

/// Predicted against measured inlet, one chart per rack: each tick's prediction is drawn
/// at the time it is for (the tick plus the horizon), beside what the inlet then was,
/// with the mean error over the predictions whose time came within the run.
fn predicted_inlets(
    site: &Site,
    points: &[Point],
    s: &Summary,
    ticks: &[(f64, String)],
    body: &mut String,
) {
    body.push_str("<h2>Predicted against measured inlet</h2>");
    if points
        .iter()
        .all(|p| p.predicted.iter().all(Option::is_none))
    {
        body.push_str("<p class=\"muted\">No prediction: the thermal rule is reactive.</p>");
        return;
    }
    let x = |t: Timestamp| t.secs_since(s.start) / 60.0;
    let end = points.last().map_or(0.0, |p| x(p.t));
    for (i, r) in site.racks.iter().enumerate() {
        let measured: Vec<(f64, f64)> = points.iter().map(|p| (x(p.t), p.inlets[i])).collect();
        let predicted: Vec<(f64, f64)> = points
            .iter()
            .filter_map(|p| p.predicted.get(i).copied().flatten().map(|q| (p.t, q)))
            .map(|(t, (c, ahead_s))| (x(t) + ahead_s / 60.0, c))
            .filter(|(at, _)| *at <= end + 1e-9)
            .collect();
        // the error of each prediction against the inlet measured at its time
        let errors: Vec<f64> = predicted
            .iter()
            .filter_map(|&(at, c)| {
                let k = measured.partition_point(|m| m.0 < at - 1e-9);
                measured.get(k).map(|m| (c - m.1).abs())
            })
            .collect();
        let title = format!("Rack {}: inlet measured and predicted", r.id);
        let chart = Chart {
            title: &title,
            y_label: "°C",
            right_label: None,
            lines: vec![
                Line {
                    name: "measured",
                    color: COLORS[0],
                    points: measured,
                    steps: false,
                    right_axis: false,
                },
                Line {
                    name: "predicted (at the time predicted for)",
                    color: COLORS[1],
                    points: predicted,
                    steps: false,
                    right_axis: false,
                },
            ],
            rules: vec![Rule {
                name: "limit",
                color: "#d62728",
                y: r.inlet_limit_c,
            }],
            x_ticks: ticks.to_vec(),
        };
        body.push_str(&chart.svg());
        if errors.is_empty() {
            body.push_str("<p class=\"muted\">No prediction came due within the run.</p>");
        } else {
            let _ = write!(
                body,
                "<p class=\"muted\">Rack {}: {} predictions came due; mean error {:.2} °C, largest {:.2} °C.</p>",
                escape(&r.id),
                errors.len(),
                errors.iter().sum::<f64>() / errors.len() as f64,
                errors.iter().copied().fold(0.0, f64::max)
            );
        }
    }
}

fn html(
    site: &Site,
    points: &[Point],
    ledger: &[LedgerEntry],
    audit: &[(u64, Decision)],
    s: &Summary,
) -> String {
    let ticks = ticks_of(site, points, s);
    let price_unit = format!("{}/kWh", s.currency);
    let mut body = String::new();
    let _ = write!(body, "<h1>powerplane demo report</h1><p class=\"muted\">Site {} · {} minutes from {} · seed {} · simulated facility</p>", escape(&s.site), s.minutes, escape(&local(site, s.start, "%Y-%m-%d %H:%M %Z")), s.seed);
    body.push_str("<h2>Summary</h2><table>");
    for (k, v) in summary_rows(s) {
        let _ = write!(body, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    body.push_str("</table>");
    let power = power_chart(points, s, &ticks, &price_unit);
    let _ = write!(body, "<h2>Power and price</h2>{}", power.svg());
    let inlets = inlet_chart(site, points, s, &ticks);
    let _ = write!(body, "<h2>Inlet temperatures</h2>{}", inlets.svg());
    predicted_inlets(site, points, s, &ticks_of(site, points, s), &mut body);
    let actions = actions_chart(points, s, &ticks);
    let _ = write!(body, "<h2>Caps and holds</h2>{}", actions.svg());
    let (energy_rows, cost_rows) = per_project(ledger);
    let _ = write!(
        body,
        "<h2>Energy and cost per project</h2>{}{}",
        bars("Energy per project", "kWh", &energy_rows, COLORS[0]),
        bars("Cost per project", &s.currency, &cost_rows, COLORS[1])
    );
    first_decisions(site, audit, &mut body);
    page("powerplane demo report", &body)
}

/// The report's summary table: a label and its value per row.
fn summary_rows(s: &Summary) -> [(&'static str, String); 9] {
    [
        (
            "Energy",
            format!("{:.1} kWh IT + {:.1} kWh cooling", s.it_kwh, s.cooling_kwh),
        ),
        ("Cost", format!("{:.2} {}", s.cost, escape(&s.currency))),
        ("Carbon", format!("{:.1} kg CO2", s.carbon_kg)),
        (
            "Peak IT power",
            format!(
                "{:.1} kW against a {:.1} kW budget",
                s.peak_it_kw, s.budget_kw
            ),
        ),
        ("Time over budget", format!("{:.0} s", s.over_budget_s)),
        (
            "Hottest inlet",
            format!(
                "{:.1} °C at rack {} (limit {:.1} °C)",
                s.hottest_inlet_c,
                escape(&s.hottest_rack),
                s.hottest_limit_c
            ),
        ),
        (
            "Caps",
            format!(
                "{} decisions; at most {} GPUs capped; {:.1} GPU-hours capped",
                s.cap_decisions, s.peak_capped_gpus, s.capped_gpu_hours
            ),
        ),
        (
            "Deferred jobs",
            format!(
                "{} held; {} released on price, {} at latest start",
                s.jobs_deferred, s.releases_by_price, s.releases_by_deadline
            ),
        ),
        (
            "Jobs",
            format!(
                "{} submitted, {} finished, {} deadline misses",
                s.sim.jobs_submitted, s.sim.jobs_finished, s.sim.deadline_misses
            ),
        ),
    ]
}

/// IT power against the budget, and the price (in `price_unit`).
fn power_chart<'a>(
    points: &[Point],
    s: &Summary,
    ticks: &[(f64, String)],
    price_unit: &'a str,
) -> Chart<'a> {
    let x = |p: &Point| p.t.secs_since(s.start) / 60.0;
    Chart {
        title: "Facility IT power against its budget, and the price",
        y_label: "kW",
        right_label: Some(price_unit),
        lines: vec![
            Line {
                name: "IT power (kW)",
                color: COLORS[0],
                points: points.iter().map(|p| (x(p), p.it_kw)).collect(),
                steps: false,
                right_axis: false,
            },
            Line {
                name: "price",
                color: COLORS[3],
                points: points.iter().map(|p| (x(p), p.price)).collect(),
                steps: true,
                right_axis: true,
            },
        ],
        rules: vec![Rule {
            name: "budget",
            color: "#000",
            y: s.budget_kw,
        }],
        x_ticks: ticks.to_vec(),
    }
}

/// Every rack's inlet, against the lowest limit.
fn inlet_chart<'a>(
    site: &'a Site,
    points: &[Point],
    s: &Summary,
    ticks: &[(f64, String)],
) -> Chart<'a> {
    let x = |p: &Point| p.t.secs_since(s.start) / 60.0;
    Chart {
        title: "Rack inlet temperatures",
        y_label: "°C",
        right_label: None,
        lines: site
            .racks
            .iter()
            .enumerate()
            .map(|(i, r)| Line {
                name: &r.id,
                color: COLORS[i % COLORS.len()],
                points: points.iter().map(|p| (x(p), p.inlets[i])).collect(),
                steps: false,
                right_axis: false,
            })
            .collect(),
        rules: vec![Rule {
            name: "limit",
            color: "#d62728",
            y: site
                .racks
                .iter()
                .map(|r| r.inlet_limit_c)
                .fold(f64::INFINITY, f64::min),
        }],
        x_ticks: ticks.to_vec(),
    }
}

/// GPUs capped, jobs held and jobs running.
fn actions_chart(points: &[Point], s: &Summary, ticks: &[(f64, String)]) -> Chart<'static> {
    let x = |p: &Point| p.t.secs_since(s.start) / 60.0;
    Chart {
        title: "Caps and holds in force",
        y_label: "count",
        right_label: None,
        lines: vec![
            Line {
                name: "GPUs capped",
                color: COLORS[1],
                points: points
                    .iter()
                    .map(|p| (x(p), p.capped_gpus as f64))
                    .collect(),
                steps: true,
                right_axis: false,
            },
            Line {
                name: "jobs held",
                color: COLORS[4],
                points: points.iter().map(|p| (x(p), p.held_jobs as f64)).collect(),
                steps: true,
                right_axis: false,
            },
            Line {
                name: "jobs running",
                color: COLORS[2],
                points: points
                    .iter()
                    .map(|p| (x(p), p.running_jobs as f64))
                    .collect(),
                steps: true,
                right_axis: false,
            },
        ],
        rules: vec![],
        x_ticks: ticks.to_vec(),
    }
}

/// Energy and cost per project from the ledger (the idle floor and cooling as their
/// own), as bar rows.
#[allow(clippy::type_complexity)]
fn per_project(ledger: &[LedgerEntry]) -> (Vec<(String, f64)>, Vec<(String, f64)>) {
    let mut by_project: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for e in ledger {
        let key = match &e.account {
            Account::Job { project, .. } => project.clone(),
            Account::Idle => "(idle)".into(),
            Account::Overhead => "(cooling)".into(),
        };
        let v = by_project.entry(key).or_default();
        v.0 += e.energy_kwh;
        v.1 += e.cost;
    }
    let energy_rows: Vec<(String, f64)> =
        by_project.iter().map(|(k, v)| (k.clone(), v.0)).collect();
    let cost_rows: Vec<(String, f64)> = by_project.iter().map(|(k, v)| (k.clone(), v.1)).collect();
    (energy_rows, cost_rows)
}

/// The first 25 decisions of the audit log, as a table.
fn first_decisions(site: &Site, audit: &[(u64, Decision)], body: &mut String) {
    body.push_str("<h2>First decisions</h2><table><tr><th>time</th><th>rule</th><th>target</th><th>action</th><th>reason</th></tr>");
    for (_, d) in audit.iter().take(25) {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(&local(site, d.time, "%H:%M:%S")),
            escape(&d.rule),
            escape(&d.target.to_string()),
            escape(&d.action.to_string()),
            escape(&d.reason)
        );
    }
    let _ = write!(
        body,
        "</table><p class=\"muted\">{} decisions in all: see audit.jsonl.</p>",
        audit.len()
    );
}
