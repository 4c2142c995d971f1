//! The energy report as one self-contained page: inline SVG, no script, no external
//! fetch.

use std::fmt::Write as _;

use telemetry::Timestamp;

use super::{EnergyReport, Row};
use crate as report;
use crate::{escape, Chart, Line};

impl EnergyReport {
    /// One self-contained page: inline SVG, no script, no external fetch.
    pub fn html(&self, site: &str) -> String {
        let mut body = self.header(site);
        let hours = Hours::of_report(self);
        self.power_section(&hours, &mut body);
        self.caps_section(&hours, &mut body);
        self.inlets_section(&hours, &mut body);
        self.groups_section(&mut body);
        self.grid_section(&mut body);
        report::page(&format!("Energy report — {site}"), &body)
    }

    /// The grid events of the period, each against every baseline it could be settled
    /// on.
    fn grid_section(&self, body: &mut String) {
        if self.demand_response.is_empty() {
            return;
        }
        body.push_str("<h2>Demand response</h2><table><tr><th>event</th><th>asked</th><th>baseline</th><th class=\"n\">baseline kW</th><th class=\"n\">metered kW</th><th class=\"n\">delivered kW</th><th class=\"n\">kWh</th><th class=\"n\">committed kW</th><th class=\"n\">performance</th></tr>");
        for e in &self.demand_response {
            let name = format!(
                "{} ({}, {})<br><span class=\"muted\">{} to {}</span>",
                escape(&e.id),
                escape(&e.source),
                escape(&e.status),
                e.start,
                e.end
            );
            if e.settlements.is_empty() {
                let _ = write!(
                    body,
                    "<tr><td>{name}</td><td>{}</td><td colspan=\"7\">not settled: {}</td></tr>",
                    escape(&e.asked),
                    escape(&e.not_settled.join("; "))
                );
            }
            for p in &e.settlements {
                let _ = write!(
                    body,
                    "<tr><td>{name}</td><td>{}</td><td>{}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.1}</td><td class=\"n\">{:.2}</td></tr>",
                    escape(&e.asked),
                    escape(&p.method),
                    p.baseline_kw,
                    p.metered_kw,
                    p.delivered_kw,
                    p.delivered_kwh,
                    p.committed_kw,
                    p.performance_factor
                );
            }
        }
        body.push_str("</table>");
    }

    /// The title, the totals and the demand charge.
    fn header(&self, site: &str) -> String {
        let mut body = format!(
            "<h1>Energy report — {}</h1><p class=\"muted\">{} to {}, by {}. Saving against a no-policy baseline: see <code>powerplane backtest</code>.</p>",
            escape(site),
            self.from,
            self.to,
            escape(&self.group_by)
        );
        let _ = write!(
            body,
            "<table><tr><th>total</th><td class=\"n\">{:.1} kWh</td><td class=\"n\">{:.2} {}</td><td class=\"n\">{:.1} kg CO2</td><td class=\"n\">peak {:.1} kW</td><td class=\"n\">PUE {}</td></tr></table>",
            self.total.energy_kwh,
            self.total.cost,
            escape(&self.currency),
            self.total.carbon_kg,
            self.total.peak_kw,
            self.pue.map_or("–".into(), |p| format!("{p:.2}"))
        );
        if let Some(d) = self.demand_charge {
            let periods: Vec<String> = self
                .demand_periods
                .iter()
                .map(|p| {
                    format!(
                        "{}: peak {:.1} kW at {}, {:.2}",
                        escape(&p.period),
                        p.peak_kw,
                        p.start,
                        p.demand_charge
                    )
                })
                .collect();
            let _ = write!(
                body,
                "<p>Demand charge {d:.2} {cur} ({}); total cost (energy + demand) {:.2} {cur}.</p>",
                periods.join("; "),
                self.total.cost + d,
                cur = escape(&self.currency)
            );
        }
        body
    }

    /// The facility's power and the price paid over time.
    fn power_section(&self, hours: &Hours, body: &mut String) {
        let power: Vec<(f64, f64)> = self
            .intervals
            .iter()
            .filter(|(s, e, ..)| e.secs_since(*s) > 0.0)
            .map(|(s, e, kwh, _)| (hours.of(*s), kwh / (e.secs_since(*s) / 3600.0)))
            .collect();
        let price: Vec<(f64, f64)> = self
            .intervals
            .iter()
            .filter(|(.., kwh, _)| *kwh > 0.0)
            .map(|(s, _, kwh, cost)| (hours.of(*s), cost / kwh))
            .collect();
        body.push_str("<h2>Power and price over time</h2>");
        let price_label = format!("{}/kWh", self.currency);
        body.push_str(
            &Chart {
                title: "Facility power (ledger) and the price paid",
                y_label: "kW",
                right_label: Some(&price_label),
                lines: vec![
                    Line {
                        name: "power",
                        color: "#1a73e8",
                        points: power,
                        steps: true,
                        right_axis: false,
                    },
                    Line {
                        name: "price",
                        color: "#e37400",
                        points: price,
                        steps: true,
                        right_axis: true,
                    },
                ],
                rules: Vec::new(),
                x_ticks: hours.ticks.clone(),
            }
            .svg(),
        );
    }

    /// The GPUs capped over time.
    fn caps_section(&self, hours: &Hours, body: &mut String) {
        body.push_str("<h2>Caps in force</h2>");
        if self.capped_over_time.is_empty() {
            body.push_str("<p class=\"muted\">No cap decisions in the period.</p>");
        } else {
            let pts = self
                .capped_over_time
                .iter()
                .map(|(t, n)| (hours.of(*t), *n as f64))
                .collect();
            body.push_str(
                &Chart {
                    title: "GPUs capped",
                    y_label: "GPUs",
                    right_label: None,
                    lines: vec![Line {
                        name: "capped GPUs",
                        color: "#c5221f",
                        points: pts,
                        steps: true,
                        right_axis: false,
                    }],
                    rules: Vec::new(),
                    x_ticks: hours.ticks.clone(),
                }
                .svg(),
            );
        }
    }

    /// The hottest inlet per rack over time, against the lowest limit.
    fn inlets_section(&self, hours: &Hours, body: &mut String) {
        body.push_str("<h2>Rack inlet temperatures</h2>");
        if self.inlets.is_empty() {
            body.push_str("<p class=\"muted\">No inlet readings in the period.</p>");
        } else {
            const COLORS: [&str; 8] = [
                "#1a73e8", "#e37400", "#188038", "#c5221f", "#9334e6", "#12b5cb", "#f439a0",
                "#5f6368",
            ];
            let racks: std::collections::BTreeSet<&String> =
                self.inlets.iter().flat_map(|c| c.inlets.keys()).collect();
            let names: Vec<String> = racks.iter().map(|r| r.to_string()).collect();
            let lines = names
                .iter()
                .enumerate()
                .map(|(i, r)| Line {
                    name: r.as_str(),
                    color: COLORS[i % COLORS.len()],
                    points: self
                        .inlets
                        .iter()
                        .filter_map(|c| c.inlets.get(r).map(|x| (hours.of(c.start), x.max_c)))
                        .collect(),
                    steps: true,
                    right_axis: false,
                })
                .collect();
            let limit = self
                .inlets
                .iter()
                .flat_map(|c| c.inlets.values().map(|x| x.limit_c))
                .fold(f64::INFINITY, f64::min);
            body.push_str(
                &Chart {
                    title: "Hottest inlet per rack (per ledger interval)",
                    y_label: "°C",
                    right_label: None,
                    lines,
                    rules: vec![crate::Rule {
                        name: "lowest limit",
                        color: "#c5221f",
                        y: limit,
                    }],
                    x_ticks: hours.ticks.clone(),
                }
                .svg(),
            );
        }
    }

    /// Energy and cost of the top groups as bars, and every group's figures.
    fn groups_section(&self, body: &mut String) {
        let _ = write!(
            body,
            "<h2>Energy and cost by {}</h2>",
            escape(&self.group_by)
        );
        let top: Vec<&Row> = self.rows.iter().take(20).collect();
        body.push_str(&report::bars(
            "Energy",
            "kWh",
            &top.iter()
                .map(|r| (r.key.clone(), r.energy_kwh))
                .collect::<Vec<_>>(),
            "#1a73e8",
        ));
        body.push_str(&report::bars(
            "Cost",
            &self.currency,
            &top.iter()
                .map(|r| (r.key.clone(), r.cost))
                .collect::<Vec<_>>(),
            "#188038",
        ));
        body.push_str("<table><tr><th>group</th><th>kWh</th><th>cost</th><th>kg CO2</th><th>peak kW</th><th>capped GPUh</th><th>held h</th></tr>");
        for r in self.rows.iter().chain(std::iter::once(&self.total)) {
            let _ = write!(
                body,
                r#"<tr><td>{}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{:.2}</td><td class="n">{}</td><td class="n">{}</td></tr>"#,
                escape(&r.key),
                r.energy_kwh,
                r.cost,
                r.carbon_kg,
                r.peak_kw,
                r.capped_gpu_hours.map_or("–".into(), |v| format!("{v:.1}")),
                r.held_hours.map_or("–".into(), |v| format!("{v:.1}"))
            );
        }
        body.push_str("</table>");
    }
}

/// The charts' time axis: hours since the report's start, with seven ticks.
struct Hours {
    t0: f64,
    ticks: Vec<(f64, String)>,
}

impl Hours {
    fn of_report(r: &EnergyReport) -> Self {
        let t0 = r.from.as_secs_f64();
        let hours = |t: Timestamp| (t.as_secs_f64() - t0) / 3600.0;
        let span_h = hours(r.to).max(1e-9);
        let ticks: Vec<(f64, String)> = (0..=6)
            .map(|i| {
                let h = span_h * f64::from(i) / 6.0;
                (
                    h,
                    if span_h < 6.0 {
                        format!("+{h:.1} h")
                    } else {
                        format!("+{h:.0} h")
                    },
                )
            })
            .collect();
        Hours { t0, ticks }
    }

    fn of(&self, t: Timestamp) -> f64 {
        (t.as_secs_f64() - self.t0) / 3600.0
    }
}
