//! The status page at `/` for the control room: rendered on the server from the last
//! tick, refreshed by the browser every few seconds, with no script and no external
//! asset.

use std::fmt::Write as _;

use telemetry::metric::names::{INLET_TEMP_C, POWER_W};
use telemetry::{EntityId, EntityKind};

use super::Board;
use control::fleet::FleetStatus;
use report::{escape, Chart, Line, Rule};

/// How a rack is doing: the worse of its power and inlet headroom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Health {
    Ok,
    Tight,
    Over,
    Unknown,
}

impl Health {
    fn class(self) -> &'static str {
        match self {
            Health::Ok => "ok",
            Health::Tight => "tight",
            Health::Over => "over",
            Health::Unknown => "unknown",
        }
    }
}

/// Power headroom as a share of the budget and inlet headroom in °C decide: over the
/// budget or the limit is `Over`; under 10% or 2 °C of headroom is `Tight`; no fresh
/// reading is `Unknown`.
pub fn rack_health(power_share_left: Option<f64>, inlet_left_c: Option<f64>) -> Health {
    let p = power_share_left.map(|h| {
        if h < 0.0 {
            Health::Over
        } else if h < 0.10 {
            Health::Tight
        } else {
            Health::Ok
        }
    });
    let t = inlet_left_c.map(|h| {
        if h < 0.0 {
            Health::Over
        } else if h < 2.0 {
            Health::Tight
        } else {
            Health::Ok
        }
    });
    match (p, t) {
        (None, None) => Health::Unknown,
        (a, b) => a.into_iter().chain(b).max().unwrap_or(Health::Unknown),
    }
}

fn gauge(label: &str, value: Option<f64>, budget: f64, unit_div: f64, unit: &str) -> String {
    let w = 600.0;
    let share = value.map_or(0.0, |v| (v / budget).clamp(0.0, 1.2));
    let color = match value {
        None => "#9aa0a6",
        Some(v) if v > budget => "#c5221f",
        Some(v) if v > 0.9 * budget => "#e37400",
        _ => "#188038",
    };
    let text = match value {
        Some(v) => format!(
            "{:.1} / {:.1} {unit} ({:.0}%)",
            v / unit_div,
            budget / unit_div,
            100.0 * v / budget
        ),
        None => format!("no fresh reading / {:.1} {unit}", budget / unit_div),
    };
    format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 880 54" role="img" aria-label="{l}"><text x="0" y="14" class="ct">{l}</text><rect x="0" y="22" width="{w}" height="20" fill="#eceff1"/><rect x="0" y="22" width="{:.1}" height="20" fill="{color}"/><line x1="{w}" x2="{w}" y1="18" y2="46" stroke="#1b1f24" stroke-width="2"/><text x="{}" y="37" class="ax">{}</text></svg>"##,
        (w * share).min(w * 1.2),
        w * 1.2 + 10.0,
        escape(&text),
        l = escape(label),
    )
}

/// Each rack's predicted inlet headroom (the predictive thermal rule): limit − margin −
/// the peak predicted over the horizon under the caps in force, and when.
fn predicted_headroom(b: &Board, body: &mut String) {
    body.push_str("<h2>Predicted inlet headroom</h2>");
    if b.predictions.is_empty() {
        body.push_str(r#"<p class="muted">No prediction: the thermal rule is reactive, or no rack has an inlet reading.</p>"#);
        return;
    }
    body.push_str(r#"<p class="muted">Under the caps in force and the planned load (running jobs, queued jobs, holds that end within the horizon); negative: the predictive rule caps before the limit is reached.</p>"#);
    body.push_str("<table><tr><th>rack</th><th>inlet now</th><th>predicted peak</th><th>when</th><th>limit − margin</th><th>headroom</th></tr>");
    for r in &b.site.racks {
        let Some(p) = b.predictions.get(&r.id) else {
            continue;
        };
        let h = p.headroom_c();
        let when = if p.peak_in_s > 0.0 {
            format!("in {:.0} min", p.peak_in_s / 60.0)
        } else {
            "now".to_string()
        };
        let _ = write!(
            body,
            r#"<tr><td>{}</td><td class="n">{:.1} °C</td><td class="n">{:.1} °C</td><td>{when}</td><td class="n">{:.1} °C</td><td class="n {}">{h:+.1} °C</td></tr>"#,
            escape(&r.id),
            p.inlet_c,
            p.peak_c,
            p.limit_c - p.margin_c,
            if h < 0.0 {
                "over"
            } else if h < 1.0 {
                "tight"
            } else {
                "ok"
            },
        );
    }
    body.push_str("</table>");
}

/// The whole page.
/// The whole page.
pub fn render(b: &Board, fleet: Option<&FleetStatus<'_>>, refresh_s: u32) -> String {
    let mut body = String::new();
    heading(b, &mut body, refresh_s);
    grid(b, &mut body);
    budgets(b, &mut body);
    prices(b, &mut body);
    racks(b, &mut body);
    predicted_headroom(b, &mut body);
    holds(b, &mut body);
    caps(b, &mut body);
    if let Some(f) = fleet {
        agents(f, &mut body);
    }
    let style = r#"<style>
.row { display: flex; flex-wrap: wrap; gap: 8px; margin: 6px 0; align-items: stretch; }
.rowname { width: 70px; font-weight: bold; padding-top: 6px; }
.rack { width: 150px; padding: 6px 8px; border-radius: 4px; font-size: 12px; border: 1px solid #0002; }
.rack.ok { background: #ceead6; } .rack.tight { background: #feefc3; } .rack.over { background: #fad2cf; } .rack.unknown { background: #e8eaed; }
td.ok { background: #ceead6; } td.tight { background: #feefc3; } td.over { background: #fad2cf; }
</style>"#;
    let html = report::page(&format!("{} — powerplane", b.site.name), &body);
    html.replacen(
        "<meta charset=\"utf-8\">",
        &format!(
            "<meta charset=\"utf-8\"><meta http-equiv=\"refresh\" content=\"{refresh_s}\">{style}"
        ),
        1,
    )
}

/// The site's name, the time of the board, the policy, and this replica's role.
fn heading(b: &Board, body: &mut String, refresh_s: u32) {
    let now = b.time;
    let tz = b.site.timezone;
    let local = now
        .to_datetime()
        .with_timezone(&tz)
        .format("%Y-%m-%d %H:%M:%S %Z");
    let _ = write!(
        body,
        r#"<h1>{} — powerplane</h1><p class="muted">As of {local} (tick {}), refreshed every {refresh_s} s. Policy: {}.</p>"#,
        escape(&b.site.name),
        b.counters.ticks,
        escape(&b.policy_file)
    );
    let ha = b.ha_status();
    if ha.enabled {
        let _ = write!(
            body,
            r#"<p class="muted">Replica {} is the <b>{}</b>; leader: {} (epoch {}).</p>"#,
            escape(&ha.instance),
            ha.role,
            escape(ha.leader.as_deref().unwrap_or("none (no lease holder)")),
            ha.epoch
        );
    }
}

/// A grid event in force (or its rebound limit), at the top: the meter against the
/// target, the baseline, what is delivered, and the shortfall where it cannot be met;
/// then the events still to come.
fn grid(b: &Board, body: &mut String) {
    let upcoming: Vec<&telemetry::grid::GridEvent> = b
        .grid_events
        .iter()
        .filter(|e| e.status == telemetry::grid::EventStatus::Pending)
        .collect();
    let Some(m) = &b.state.grid else {
        if !upcoming.is_empty() {
            body.push_str("<h2>Grid events to come</h2><ul>");
            for e in upcoming {
                let _ = write!(
                    body,
                    "<li>{} ({}) from {}</li>",
                    escape(&e.id),
                    escape(&e.source),
                    e.start().map_or_else(String::new, |s| s.to_string())
                );
            }
            body.push_str("</ul>");
        }
        return;
    };
    let what = if m.event_active() {
        "Grid event in force"
    } else {
        "Rebound limit after a grid event"
    };
    let _ = write!(body, "<h2>{what}</h2>");
    body.push_str(&gauge("Meter", Some(m.meter_w), m.target_w, 1000.0, "kW"));
    let _ = write!(
        body,
        r#"<p>Target {:.1} kW, baseline {:.1} kW, delivered {:.1} kW since {}.{}</p>"#,
        m.target_w / 1000.0,
        m.baseline_w / 1000.0,
        (m.baseline_w - m.meter_w) / 1000.0,
        m.since,
        if m.shortfall_w > 0.0 {
            format!(
                r#" <b class="over">{:.1} kW short</b>: protected work and the floors of the rest allow no lower than {:.1} kW."#,
                m.shortfall_w / 1000.0,
                m.floor_w / 1000.0
            )
        } else {
            String::new()
        }
    );
}

/// The facility and each feed: power against budget.
fn budgets(b: &Board, body: &mut String) {
    let now = b.time;
    body.push_str("<h2>Power against budget</h2>");
    let site = b.site.site_entity();
    let p = b
        .snapshot
        .observe(&site, POWER_W, now)
        .filter(|o| !o.stale)
        .map(|o| o.value);
    body.push_str(&gauge(
        "Facility",
        p,
        b.site.facility_budget_kw() * 1000.0,
        1000.0,
        "kW",
    ));
    for f in &b.site.feeds {
        let id = EntityId::new(EntityKind::Feed, f.id.clone());
        let p = b
            .snapshot
            .observe(&id, POWER_W, now)
            .filter(|o| !o.stale)
            .map(|o| o.value);
        body.push_str(&gauge(
            &format!("Feed {}", f.id),
            p,
            f.usable_kw() * 1000.0,
            1000.0,
            "kW",
        ));
    }
}

/// The price now and a chart of the next 24 hours.
fn prices(b: &Board, body: &mut String) {
    let now = b.time;
    body.push_str("<h2>Price now and the next 24 hours</h2>");
    if b.prices.is_empty() {
        body.push_str(r#"<p class="muted">No price series configured.</p>"#);
    } else {
        let now_price = b
            .prices
            .iter()
            .take_while(|(t, _)| *t <= now)
            .last()
            .map(|p| p.1);
        let _ = write!(
            body,
            "<p>Now: <b>{}</b> {}/kWh</p>",
            now_price.map_or("—".to_string(), |p| format!("{p:.3}")),
            escape(&b.site.currency)
        );
        let t0 = now.as_secs_f64();
        // the step in force starts now on the chart; the last price holds to +24 h
        let mut pts: Vec<(f64, f64)> = b
            .prices
            .iter()
            .map(|(t, v)| (((t.as_secs_f64() - t0) / 3600.0).max(0.0), *v))
            .collect();
        if let Some(&(_, last)) = pts.last() {
            pts.push((24.0, last));
        }
        if let Some((t, _)) = b.prices.last() {
            if now.secs_since(*t) > 3600.0 {
                let _ = write!(
                    body,
                    r#"<p class="muted">The price series ends at {t}; its last price is held.</p>"#
                );
            }
        }
        let ticks = (0..=24)
            .step_by(4)
            .map(|h| (f64::from(h), format!("+{h} h")))
            .collect();
        let label = format!("{}/kWh", b.site.currency);
        body.push_str(
            &Chart {
                title: "Day-ahead price",
                y_label: &label,
                right_label: None,
                lines: vec![Line {
                    name: "price",
                    color: "#1a73e8",
                    points: pts,
                    steps: true,
                    right_axis: false,
                }],
                rules: Vec::<Rule>::new(),
                x_ticks: ticks,
            }
            .svg(),
        );
    }
}

/// The racks by row, coloured by the worse of their power and inlet headroom.
fn racks(b: &Board, body: &mut String) {
    let now = b.time;
    body.push_str(r#"<h2>Racks</h2><p class="muted">Coloured by the worse of power headroom (under 10% of the budget: tight) and inlet headroom (under 2 °C: tight); grey: no fresh reading.</p>"#);
    let gpus = b.site.gpus();
    for row in &b.site.rows {
        let _ = write!(
            body,
            r#"<div class="row"><div class="rowname">{}</div>"#,
            escape(&row.id)
        );
        for r in b.site.racks.iter().filter(|r| r.row == row.id) {
            let id = EntityId::new(EntityKind::Rack, r.id.clone());
            let budget = r.power_budget_kw * 1000.0;
            let pw = b
                .snapshot
                .observe(&id, POWER_W, now)
                .filter(|o| !o.stale)
                .map(|o| o.value);
            let inlet = b
                .snapshot
                .observe(&id, INLET_TEMP_C, now)
                .filter(|o| !o.stale)
                .map(|o| o.value);
            let h = rack_health(
                pw.map(|p| (budget - p) / budget),
                inlet.map(|t| r.inlet_limit_c - t),
            );
            let capped: Vec<f64> = gpus
                .iter()
                .filter(|g| g.rack.id == r.id)
                .filter_map(|g| b.state.caps.get(&g.id).map(|c| c.watts))
                .collect();
            let _ = write!(
                body,
                r#"<div class="rack {}"><b>{}</b><br>{} / {:.1} kW<br>inlet {} / {:.0} °C<br>{}</div>"#,
                h.class(),
                escape(&r.id),
                pw.map_or("—".into(), |p| format!("{:.1}", p / 1000.0)),
                r.power_budget_kw,
                inlet.map_or("—".into(), |t| format!("{t:.1}")),
                r.inlet_limit_c,
                if capped.is_empty() {
                    "no caps".to_string()
                } else {
                    format!(
                        "{} GPUs capped, lowest {:.0} W",
                        capped.len(),
                        capped.iter().copied().fold(f64::MAX, f64::min)
                    )
                }
            );
        }
        body.push_str("</div>");
    }
}

/// The held jobs, the first 50 of them.
fn holds(b: &Board, body: &mut String) {
    let _ = write!(body, "<h2>Held jobs ({})</h2>", b.state.holds.len());
    if b.state.holds.is_empty() {
        body.push_str(r#"<p class="muted">None.</p>"#);
    } else {
        body.push_str("<table><tr><th>job</th><th>rule</th><th>held since</th><th>lease until</th><th>why</th></tr>");
        for (job, h) in b.state.holds.iter().take(50) {
            let _ = write!(
                body,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(job),
                escape(&h.rule),
                h.since,
                h.lease_until,
                escape(&h.reason)
            );
        }
        body.push_str("</table>");
        if b.state.holds.len() > 50 {
            let _ = write!(
                body,
                r#"<p class="muted">and {} more (see /api/v1/holds)</p>"#,
                b.state.holds.len() - 50
            );
        }
    }
}

/// The caps in force, by rule.
fn caps(b: &Board, body: &mut String) {
    let _ = write!(body, "<h2>Caps in force ({} GPUs)</h2>", b.state.caps.len());
    let mut per_rule: std::collections::BTreeMap<&str, (usize, f64)> = Default::default();
    for c in b.state.caps.values() {
        let e = per_rule.entry(&*c.rule).or_insert((0, f64::MAX));
        e.0 += 1;
        e.1 = e.1.min(c.watts);
    }
    if per_rule.is_empty() {
        body.push_str(r#"<p class="muted">None.</p>"#);
    } else {
        body.push_str("<table><tr><th>rule</th><th>GPUs</th><th>lowest cap</th></tr>");
        for (rule, (n, w)) in per_rule {
            let _ = write!(
                body,
                r#"<tr><td>{}</td><td class="n">{n}</td><td class="n">{w:.0} W</td></tr>"#,
                escape(rule)
            );
        }
        body.push_str("</table>");
    }
}

/// The GPU agents: how many GPUs run as desired, and each node's status.
fn agents(f: &FleetStatus<'_>, body: &mut String) {
    let _ = write!(
        body,
        "<h2>GPU agents</h2><p>{} of {} GPUs run as desired (acknowledged and enforced).</p>",
        f.in_sync,
        f.gpus.len()
    );
    body.push_str("<table><tr><th>node</th><th>status</th><th>GPUs under fail-safe</th><th>clock skew</th></tr>");
    for (node, n) in f.nodes {
        let skew = f
            .clock_skew_s
            .get(node)
            .map(|s| format!("{s:+.1} s"))
            .unwrap_or_else(|| "-".into());
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            escape(node),
            escape(&n.status),
            n.fail_safe_gpus.len(),
            skew
        );
    }
    body.push_str("</table>");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rack_is_as_healthy_as_its_worse_headroom() {
        assert_eq!(rack_health(Some(0.5), Some(5.0)), Health::Ok);
        assert_eq!(rack_health(Some(0.05), Some(5.0)), Health::Tight);
        assert_eq!(rack_health(Some(0.5), Some(-0.5)), Health::Over);
        assert_eq!(rack_health(None, Some(1.0)), Health::Tight);
        assert_eq!(rack_health(None, None), Health::Unknown);
    }

    /// The demo hall after one tick of the demo policy (predictive thermal rule): every
    /// rack's inlet at 30 °C, row B's GPUs busy at full power (its undersized air
    /// handler: the prediction climbs), row A's idle.
    fn board_after_a_tick() -> Board {
        use telemetry::metric::names::{INLET_TEMP_C, POWER_W};
        use telemetry::{Job, JobState, Sample, Site, Snapshot, Timestamp};
        let site = Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("demo site");
        let policy = policies::Policy::parse("policy.toml", control::examples::DEFAULT_POLICY)
            .expect("demo policy");
        let now = Timestamp::from_secs(1_780_000_000);
        let mut snap = Snapshot::new();
        let mut ingest = |e: EntityId, m: &str, v: f64| {
            snap.ingest(Sample::new(e, m, v, now, "t"), now)
                .expect("ok");
        };
        let gpus = site.gpus();
        let row_b = |g: &telemetry::site::GpuRef<'_>| g.rack.row == "row-b";
        for g in &gpus {
            ingest(
                g.id.clone().into_owned(),
                POWER_W,
                if row_b(g) { 300.0 } else { 30.0 },
            );
        }
        for r in &site.racks {
            ingest(EntityId::rack(&r.id), INLET_TEMP_C, 30.0);
        }
        let job = Job {
            id: "slurm:1".into(),
            scheduler: "slurm".into(),
            name: "train".into(),
            user: "u".into(),
            project: "p".into(),
            class: "training".into(),
            priority: 0,
            gpus: 96,
            allocated: gpus
                .iter()
                .filter(|g| row_b(g))
                .map(|g| g.id.clone().into_owned())
                .collect(),
            state: JobState::Running,
            submit_time: now,
            start_time: Some(now),
            end_time: None,
            deadline: None,
            est_duration_s: 3600.0,
            deferrable: false,
            preemptible: false,
            gpu_power_limit: None,
        };
        let plan = policies::evaluate(
            &policies::Inputs {
                site: &site,
                snapshot: &snap,
                jobs: &[job],
                prior: &policies::State::default(),
                policy: &policy,
                forecast: &policies::Forecast::default(),
                job_table: None,
            },
            now,
        );
        let mut b = Board::new(site, "policy.toml".into(), now);
        let _ = b.update(
            now,
            std::sync::Arc::new(snap),
            std::sync::Arc::new(plan.state),
            &Default::default(),
            &plan.decisions,
            0,
        );
        b.predictions = plan.predictions;
        b
    }

    #[test]
    fn the_page_and_the_status_api_show_each_racks_predicted_headroom() {
        let b = board_after_a_tick();
        assert_eq!(
            b.predictions.len(),
            6,
            "a prediction per rack: {:?}",
            b.predictions
        );
        let status = super::super::status(&b);
        let html = render(&b, None, 5);
        assert!(html.contains("<h2>Predicted inlet headroom</h2>"), "{html}");
        for r in &b.site.racks {
            let p = &status["predicted_headroom"][r.id.as_str()];
            let v = |k: &str| {
                p[k].as_f64()
                    .unwrap_or_else(|| panic!("{}: no {k} in {p}", r.id))
            };
            assert_eq!(v("inlet_c"), 30.0);
            assert_eq!(v("limit_c"), r.inlet_limit_c);
            assert!(v("peak_c") >= v("inlet_c"), "{p}");
            assert!(
                (v("headroom_c") - (v("limit_c") - v("margin_c") - v("peak_c"))).abs() < 1e-3,
                "{p}"
            );
            let when = if v("peak_in_s") > 0.0 {
                format!("in {:.0} min", v("peak_in_s") / 60.0)
            } else {
                "now".into()
            };
            let row = format!(
                "<tr><td>{}</td><td class=\"n\">30.0 °C</td><td class=\"n\">{:.1} °C</td><td>{when}</td>",
                r.id,
                v("peak_c")
            );
            assert!(html.contains(&row), "{row} not on the page");
        }
        // row B runs hot: its predicted peak is above the inlet now, row A's is not
        let peak = |r: &str| {
            status["predicted_headroom"][r]["peak_c"]
                .as_f64()
                .unwrap_or(0.0)
        };
        assert!(peak("b01") > 30.0 && peak("b01") > peak("a01"), "{status}");
    }

    #[test]
    fn a_grid_event_in_force_heads_the_page_with_its_shortfall() {
        let mut b = board_after_a_tick();
        assert!(!render(&b, None, 5).contains("Grid event"));
        std::sync::Arc::make_mut(&mut b.state).grid = Some(policies::GridMemory {
            since: b.time,
            baseline_w: 40_000.0,
            target_w: 30_000.0,
            meter_w: 33_000.0,
            floor_w: 32_000.0,
            shortfall_w: 2_000.0,
            rebound_until: None,
        });
        let html = render(&b, None, 5);
        assert!(html.contains("<h2>Grid event in force</h2>"), "{html}");
        assert!(
            html.contains("Target 30.0 kW, baseline 40.0 kW, delivered 7.0 kW"),
            "{html}"
        );
        assert!(html.contains("2.0 kW short"), "{html}");
        std::sync::Arc::make_mut(&mut b.state)
            .grid
            .as_mut()
            .expect("memory")
            .rebound_until = Some(b.time + 600.0);
        assert!(render(&b, None, 5).contains("Rebound limit after a grid event"));
    }

    #[test]
    fn without_a_prediction_the_page_says_so() {
        let mut b = board_after_a_tick();
        b.predictions.clear();
        assert!(render(&b, None, 5).contains("No prediction: the thermal rule is reactive"));
        assert_eq!(
            super::super::status(&b)["predicted_headroom"],
            serde_json::json!({})
        );
    }
}
