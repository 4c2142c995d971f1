//! The backtest's HTML report: the comparison table and the charts of the energy
//! report (power against the budget, price, queue, waits), baseline and policy overlaid.

use std::fmt::Write as _;

use telemetry::{Site, Timestamp};

use super::facility::Point;
use super::replay::Series2;
use super::{RunSummary, Summary};
use report::{bars, escape, page, Chart, Line, Rule};

const BASE: &str = "#7f7f7f";
const POL: &str = "#1f77b4";
const PRICE: &str = "#d62728";

pub(super) fn html(s: &Summary, site: &Site, series: &Series2) -> String {
    let days = Days::of(series, site);
    let (b, p) = (&s.baseline, &s.policy);
    let mut body = String::new();
    header(&mut body, s);
    let cur = escape(&site.currency);
    comparison(&mut body, s, &cur);
    decomposition(&mut body, s, &cur);
    let per_kwh = format!("{}/kWh", site.currency);
    let _ = write!(
        body,
        "<h2>Power and price</h2>{}",
        power_chart(s, &per_kwh, series, &days).svg()
    );
    let _ = write!(body, "<h2>Queue</h2>{}", queue_chart(series, &days).svg());
    let _ = write!(
        body,
        "<h2>Inlet temperature</h2>{}",
        inlet_chart(site, series, &days).svg()
    );
    demand_response(&mut body, s);
    let waits = vec![
        ("baseline mean".to_string(), b.wait_mean_s / 60.0),
        ("policy mean".to_string(), p.wait_mean_s / 60.0),
        ("baseline p95".to_string(), b.wait_p95_s / 60.0),
        ("policy p95".to_string(), p.wait_p95_s / 60.0),
    ];
    let _ = write!(
        body,
        "<h2>Waits</h2>{}",
        bars("Job wait", "minutes", &waits, POL)
    );
    page("powerplane backtest", &body)
}

/// The charts' time axis: days since the first point, with a date tick every few days
/// (ten ticks at most).
struct Days {
    t0: Timestamp,
    ticks: Vec<(f64, String)>,
}

impl Days {
    fn of(series: &Series2, site: &Site) -> Self {
        let t0 = series.policy.first().map(|p| p.t).unwrap_or(Timestamp(0));
        let x = |t: Timestamp| t.secs_since(t0) / 86400.0;
        let span_days = series.policy.last().map_or(1.0, |p| x(p.t)).max(1.0);
        let every = (span_days / 10.0).ceil().max(1.0);
        let ticks: Vec<(f64, String)> = (0..=(span_days / every) as usize)
            .map(|i| {
                let d = i as f64 * every;
                let t = t0 + d * 86400.0;
                (
                    d,
                    t.to_datetime()
                        .with_timezone(&site.timezone)
                        .format("%m-%d")
                        .to_string(),
                )
            })
            .collect();
        Days { t0, ticks }
    }

    fn x(&self, t: Timestamp) -> f64 {
        t.secs_since(self.t0) / 86400.0
    }

    fn points(&self, v: &[Point], f: &dyn Fn(&Point) -> f64) -> Vec<(f64, f64)> {
        v.iter().map(|p| (self.x(p.t), f(p))).collect()
    }
}

/// A chart line on the left axis.
fn line(
    name: &'static str,
    color: &'static str,
    points: Vec<(f64, f64)>,
    steps: bool,
) -> Line<'static> {
    Line {
        name,
        color,
        points,
        steps,
        right_axis: false,
    }
}

/// `per_kwh`: the price's unit.
fn power_chart<'a>(s: &Summary, per_kwh: &'a str, series: &Series2, days: &Days) -> Chart<'a> {
    Chart {
        title: "Facility IT power against its budget, and the price",
        y_label: "kW",
        right_label: Some(per_kwh),
        lines: vec![
            line(
                "baseline IT power",
                BASE,
                days.points(&series.baseline, &|p| p.it_kw),
                false,
            ),
            line(
                "power saving IT power",
                "#999999",
                days.points(&series.power_save, &|p| p.it_kw),
                false,
            ),
            line(
                "policy IT power",
                POL,
                days.points(&series.policy, &|p| p.it_kw),
                false,
            ),
            Line {
                name: "price",
                color: PRICE,
                points: days.points(&series.policy, &|p| p.price),
                steps: true,
                right_axis: true,
            },
        ],
        rules: vec![Rule {
            name: "budget",
            color: "#000",
            y: s.budget_kw,
        }],
        x_ticks: days.ticks.clone(),
    }
}

fn queue_chart<'a>(series: &Series2, days: &Days) -> Chart<'a> {
    Chart {
        title: "Jobs waiting (and held by the policy)",
        y_label: "jobs",
        right_label: None,
        lines: vec![
            line(
                "baseline waiting",
                BASE,
                days.points(&series.baseline, &|p| p.waiting as f64),
                true,
            ),
            line(
                "policy waiting",
                POL,
                days.points(&series.policy, &|p| p.waiting as f64),
                true,
            ),
            line(
                "policy held",
                "#9467bd",
                days.points(&series.policy, &|p| p.held as f64),
                true,
            ),
        ],
        rules: vec![],
        x_ticks: days.ticks.clone(),
    }
}

fn inlet_chart<'a>(site: &Site, series: &Series2, days: &Days) -> Chart<'a> {
    Chart {
        title: "Hottest rack inlet",
        y_label: "°C",
        right_label: None,
        lines: vec![
            line(
                "baseline",
                BASE,
                days.points(&series.baseline, &|p| p.hottest_inlet_c),
                false,
            ),
            line(
                "policy",
                POL,
                days.points(&series.policy, &|p| p.hottest_inlet_c),
                false,
            ),
        ],
        rules: vec![Rule {
            name: "lowest inlet limit",
            color: PRICE,
            y: site
                .racks
                .iter()
                .map(|r| r.inlet_limit_c)
                .fold(f64::INFINITY, f64::min),
        }],
        x_ticks: days.ticks.clone(),
    }
}

/// Per grid event: the meter per interval from an hour before to an hour after it (with
/// and without the events), its baseline and its target; and its figures.
fn demand_response(body: &mut String, s: &Summary) {
    if s.demand_response.is_empty() {
        return;
    }
    body.push_str("<h2>Demand response</h2>");
    let f = |v: Option<f64>, unit: &str| v.map_or("never".to_string(), |v| format!("{v:.1}{unit}"));
    for e in &s.demand_response {
        let Some(t0) = Timestamp::parse_rfc3339(&e.start).ok() else {
            continue;
        };
        let min = |t: Timestamp| t.secs_since(t0) / 60.0;
        let pts = |g: &dyn Fn(&super::dr::ChartPoint) -> Option<f64>| {
            e.chart
                .iter()
                .filter_map(|p| g(p).map(|kw| (min(p.t), kw)))
                .collect::<Vec<_>>()
        };
        let flat = |kw: Option<f64>, from: f64| {
            kw.map_or(Vec::new(), |kw| vec![(from, kw), (e.duration_min, kw)])
        };
        let title = format!(
            "Grid event {}: the meter (IT + cooling) against its baseline and target",
            e.id
        );
        let x_ticks = (-1..=((e.duration_min / 60.0).ceil() as i64 + 1))
            .map(|h| (h as f64 * 60.0, format!("{h:+} h")))
            .collect();
        let chart = Chart {
            title: &title,
            y_label: "kW",
            right_label: None,
            lines: vec![
                line(
                    "metered without the events",
                    BASE,
                    pts(&|p| p.without_event_kw),
                    true,
                ),
                line("metered", POL, pts(&|p| p.metered_kw), true),
                line(
                    "baseline (hour before)",
                    "#2ca02c",
                    flat(e.baseline_kw, -60.0),
                    false,
                ),
                line("target", PRICE, flat(e.target_kw, 0.0), false),
            ],
            rules: vec![],
            x_ticks,
        };
        let _ = write!(
            body,
            "{}<p>From {} for {:.0} min: baseline {} kW, target {} kW, delivered {} kW; at the target after {} (tolerance 1%), tracking error p95 {}; GPU-hours lost {}; jobs suspended {} ({:.1} GPU-hours held suspended); rebound peak {} kW (without the events {} kW); deadline misses {} (without the events {}).</p>",
            chart.svg(),
            escape(&e.start),
            e.duration_min,
            f(e.baseline_kw, ""),
            f(e.target_kw, ""),
            f(e.delivered_kw, ""),
            f(e.time_to_target_s, " s"),
            f(e.tracking_error_p95_pct, "%"),
            f(e.gpu_hours_lost_pct, "%"),
            e.jobs_suspended,
            e.suspended_gpu_hours,
            f(e.rebound_peak_kw, ""),
            f(e.rebound_peak_without_event_kw, ""),
            e.deadline_misses,
            e.deadline_misses_without_event
        );
    }
}

/// The title, the run's inputs and its scenario.
fn header(body: &mut String, s: &Summary) {
    let _ = write!(
        body,
        "<h1>powerplane backtest</h1><p class=\"muted\">Site {} ({} GPUs) · trace {} ({}, {} jobs, {} deferrable) · {} to {} · seed {} · tick {} s · simulated facility</p><p>{}</p>",
        escape(&s.site),
        s.gpus,
        escape(&s.trace),
        escape(&s.trace_format),
        s.jobs,
        s.deferrable_jobs,
        escape(&s.start),
        escape(&s.end),
        s.seed,
        s.tick_s,
        escape(&s.alignment)
    );
    for l in &s.scenario {
        let _ = write!(body, "<p>Scenario: {}</p>", escape(l));
    }
}

/// The table of the three runs, and the savings.
fn comparison(body: &mut String, s: &Summary, cur: &str) {
    body.push_str(
        "<h2>Baseline against policy</h2><table><tr><th></th><th>baseline (no management)</th><th>power saving (Slurm-style)</th><th>policy</th></tr>",
    );
    let runs = [&s.baseline, &s.power_save, &s.policy];
    for (k, f) in rows(cur) {
        let _ = write!(body, "<tr><th>{k}</th>");
        for r in runs {
            let _ = write!(body, "<td>{}</td>", f(r));
        }
        body.push_str("</tr>");
    }
    let carbon = |c: Option<f64>| c.map_or("not measured".to_string(), |c| format!("{c:.1}%"));
    let _ = write!(
        body,
        "</table><p>Savings against no management: cost {:.1}%, energy {:.1}%, carbon {}; against power saving: cost {:.1}%, energy {:.1}%. {}</p>",
        s.savings_pct.cost,
        s.savings_pct.energy,
        carbon(s.savings_pct.carbon),
        s.savings_vs_power_save_pct.cost,
        s.savings_vs_power_save_pct.energy,
        if s.policy.jobs_deferred == 0 {
            "No job was deferred.".to_string()
        } else {
            format!(
                "Deferred jobs waited {:.1} h on average; {:.2} {cur} saved per hour of added wait.",
                s.deferred_wait_mean_s / 3600.0,
                s.saving_per_wait_hour
            )
        }
    );
}

/// Where the saving against power saving comes from, and what it cost.
fn decomposition(body: &mut String, s: &Summary, cur: &str) {
    let d = &s.against_power_save;
    let _ = write!(
        body,
        "<h2>The saving against power saving</h2><table><tr><th>from</th><th>{cur}</th><th>kWh</th></tr>\
         <tr><th>node power (the idle floor: {:+.1} node-hours off, {:+} power-downs)</th><td>{:+.2}</td><td>{:+.0}</td></tr>\
         <tr><th>caps (the jobs' energy)</th><td>{:+.2}</td><td>{:+.0}</td></tr>\
         <tr><th>cooling</th><td>{:+.2}</td><td>{:+.0}</td></tr>\
         <tr><th>price shifting (when the energy was drawn)</th><td>{:+.2}</td><td></td></tr>\
         <tr><th>demand charge</th><td>{:+.2}</td><td></td></tr>\
         <tr><th>saving</th><td>{:+.2}</td><td></td></tr></table>\
         <p>Each energy part's kWh (power saving's less the policy's) at power saving's mean price for it; price shifting is what is left of the energy cost's difference. What it cost: {:.1} h more waiting than under power saving (summed over the jobs that waited longer), {:.1} GPU-hours capped, {} jobs held ({:.1} h mean wait).</p>",
        d.node_off_h,
        d.power_downs,
        d.node_power,
        d.node_power_kwh,
        d.caps,
        d.caps_kwh,
        d.cooling,
        d.cooling_kwh,
        d.price_shifting,
        d.demand_charge,
        d.saving,
        d.added_wait_h,
        d.capped_gpu_hours,
        d.jobs_deferred,
        d.deferred_wait_mean_h,
    );
}

type Cell<'a> = Box<dyn Fn(&RunSummary) -> String + 'a>;

/// The table's rows: a label, and the cell of each run (`cur`: the currency, escaped).
fn rows(cur: &str) -> Vec<(&'static str, Cell<'_>)> {
    vec![
        (
            "Energy (IT + cooling)",
            Box::new(move |r| format!("{:.0} kWh", r.energy_kwh)),
        ),
        (
            "Cost (energy + demand charge)",
            Box::new(move |r| format!("{:.2} {cur}", r.cost)),
        ),
        (
            "Demand charge",
            Box::new(move |r| format!("{:.2} {cur}", r.demand_charge)),
        ),
        (
            "Carbon",
            Box::new(move |r| {
                r.carbon_kg
                    .map_or("not measured".into(), |c| format!("{c:.0} kg"))
            }),
        ),
        (
            "Peak IT power",
            Box::new(move |r| format!("{:.1} kW", r.peak_kw)),
        ),
        (
            "Time over budget",
            Box::new(move |r| format!("{:.0} s", r.budget_violation_s)),
        ),
        (
            "Time over an inlet limit",
            Box::new(move |r| format!("{:.0} s", r.thermal_violation_s)),
        ),
        (
            "Deadline misses",
            Box::new(move |r| r.deadline_misses.to_string()),
        ),
        (
            "Wait, mean / p95",
            Box::new(move |r| format!("{:.0} / {:.0} s", r.wait_mean_s, r.wait_p95_s)),
        ),
        (
            "Slowdown, mean / p95",
            Box::new(move |r| format!("{:.2} / {:.2}", r.slowdown_mean, r.slowdown_p95)),
        ),
        (
            "GPU-hours delivered",
            Box::new(move |r| format!("{:.0}", r.gpu_hours)),
        ),
        (
            "Node power-downs / node-hours off",
            Box::new(move |r| format!("{} / {:.0}", r.power_downs, r.node_off_h)),
        ),
        (
            "Jobs deferred",
            Box::new(move |r| r.jobs_deferred.to_string()),
        ),
    ]
}
