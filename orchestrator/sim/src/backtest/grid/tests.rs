use super::*;
use crate::backtest::scenario::Scenario;

fn at(s: &str) -> Timestamp {
    Timestamp::parse_rfc3339(s).expect("time")
}

fn scenario(entries: &str) -> anyhow::Result<Scenario> {
    Scenario::parse("s.toml", entries)
}

#[test]
fn grid_events_are_read_with_a_shed_or_a_cap_and_a_default_id() {
    let s = scenario(
        "[[grid_events]]\nstart = \"2024-06-03T17:00:00+02:00\"\nduration_min = 180\nshed_pct = 25\n\
         [[grid_events]]\nid = \"cap\"\nstart = \"2024-06-04T15:00:00Z\"\nduration_min = 60\ntarget_kw = 400\n",
    )
    .expect("scenario");
    let e = s.grid_events();
    assert_eq!(e.len(), 2);
    assert_eq!(e[0].id, "grid-event-1");
    assert_eq!(e[0].start, at("2024-06-03T15:00:00Z"));
    assert_eq!(e[0].end, at("2024-06-03T18:00:00Z"));
    assert_eq!(e[0].target, GridTarget::ShedFraction(0.25));
    assert_eq!(e[0].target_w(800_000.0), 600_000.0);
    assert_eq!(e[1].id, "cap");
    assert_eq!(e[1].target, GridTarget::CapW(400_000.0));
    assert_eq!(e[1].target_w(800_000.0), 400_000.0);
}

#[test]
fn bad_grid_events_are_all_named_in_one_message() {
    let text = "\
[[grid_events]]
start = \"2024-06-03T17:00:00Z\"
duration_min = 60
shed_pct = 25
target_kw = 100
[[grid_events]]
id = \"none\"
start = \"2024-06-04T17:00:00Z\"
duration_min = 60
[[grid_events]]
id = \"neg\"
start = \"2024-06-05T17:00:00Z\"
duration_min = 60
shed_pct = -5
[[grid_events]]
id = \"over\"
start = \"2024-06-06T17:00:00Z\"
duration_min = 60
shed_pct = 120
[[grid_events]]
id = \"zero\"
start = \"2024-06-07T17:00:00Z\"
duration_min = 0
shed_pct = 10
[[grid_events]]
id = \"a\"
start = \"2024-06-08T17:00:00Z\"
duration_min = 120
target_kw = 300
[[grid_events]]
id = \"b\"
start = \"2024-06-08T18:00:00Z\"
duration_min = 60
target_kw = -1
[[grid_events]]
id = \"a\"
start = \"2024-06-09T18:00:00Z\"
duration_min = 60
shed_pct = 10
";
    let e = format!("{:#}", scenario(text).expect_err("refused"));
    for part in [
        "grid event 1 (grid-event-1): give exactly one of shed_pct or target_kw, got both",
        "grid event 2 (none): give exactly one of shed_pct or target_kw, got neither",
        "grid event 3 (neg): shed_pct must be more than 0 and at most 100, got -5",
        "grid event 4 (over): shed_pct must be more than 0 and at most 100, got 120",
        "grid event 5 (zero): duration_min must be positive, got 0",
        "grid event 7 (b): target_kw must be positive, got -1",
        "grid event 7 (b) overlaps grid event 6 (a)",
        "grid event 8 (a): its id is taken by grid event 6",
    ] {
        assert!(e.contains(part), "{part:?} missing from: {e}");
    }
}

fn meter() -> Meter {
    // 300 s steps: 600 kW from 08:00 to 10:00, then 400 kW to 11:00
    let mut m = Meter::default();
    let t0 = at("2024-06-03T08:00:00Z");
    for k in 0..24 {
        m.push(MeterStep {
            t0: t0 + k as f64 * 300.0,
            dt_s: 300.0,
            kw: 600.0,
            work_gpu_s: 3600.0,
            suspended_gpu_s: 0.0,
        });
    }
    for k in 0..12 {
        m.push(MeterStep {
            t0: at("2024-06-03T10:00:00Z") + k as f64 * 300.0,
            dt_s: 300.0,
            kw: 400.0,
            work_gpu_s: 1800.0,
            suspended_gpu_s: 900.0,
        });
    }
    m
}

#[test]
fn the_meter_averages_and_sums_over_any_window_by_the_time_each_step_covers() {
    let m = meter();
    let (t9, t10, t11) = (
        at("2024-06-03T09:00:00Z"),
        at("2024-06-03T10:00:00Z"),
        at("2024-06-03T11:00:00Z"),
    );
    assert_eq!(m.mean_kw(t9, t10), Some(600.0));
    assert_eq!(m.mean_kw(t9 + 1800.0, t10 + 1800.0), Some(500.0));
    // half a step on each side: 150 s at 600 kW, 150 s at 400 kW
    assert_eq!(m.mean_kw(t10 + -150.0, t10 + 150.0), Some(500.0));
    assert_eq!(m.mean_kw(t11, t11 + 60.0), None, "past the run");
    // 12 steps of 1 GPU-hour, 12 of half of one
    assert!((m.gpu_hours(t9, t11) - 18.0).abs() < 1e-9);
    // a quarter GPU-hour suspended in each of the 12 steps after 10:00, half of the
    // step at 10:00 inside the window that ends 150 s into it
    assert!((m.suspended_gpu_hours(t9, t11) - 3.0).abs() < 1e-9);
    assert!((m.suspended_gpu_hours(t10 + -150.0, t10 + 150.0) - 0.125).abs() < 1e-9);
}

#[test]
fn readings_publish_the_meter_and_the_event_in_force_with_its_hour_before_baseline() {
    let site = Site::parse(
        "site.toml",
        include_str!("../../../../tests/fixtures/backtest/site.toml"),
    )
    .expect("site");
    let events = vec![DrEvent {
        id: "e".into(),
        start: at("2024-06-03T10:30:00Z"),
        end: at("2024-06-03T11:30:00Z"),
        duration_min: 60.0,
        target: GridTarget::ShedFraction(0.25),
    }];
    let mut g = Schedule::new(events);
    let m = meter();
    let value = |samples: &[Sample], metric: &str| {
        samples
            .iter()
            .find(|s| s.metric.as_str() == metric)
            .map(|s| s.value)
    };
    let before = g.samples(&site, &m, 420_000.0, at("2024-06-03T10:25:00Z"));
    assert_eq!(value(&before, FACILITY_POWER_W), Some(420_000.0));
    assert_eq!(value(&before, GRID_EVENT_ACTIVE), Some(0.0));
    assert_eq!(value(&before, GRID_BASELINE_W), None);
    let during = g.samples(&site, &m, 410_000.0, at("2024-06-03T10:30:00Z"));
    assert_eq!(value(&during, GRID_EVENT_ACTIVE), Some(1.0));
    assert_eq!(value(&during, GRID_SHED_FRACTION), Some(0.25));
    // 09:30-10:30: half at 600 kW, half at 400 kW
    assert_eq!(value(&during, GRID_BASELINE_W), Some(500_000.0));
    assert!(during.iter().all(|s| s.entity == site.site_entity()));
    let after = g.samples(&site, &m, 410_000.0, at("2024-06-03T11:30:00Z"));
    assert_eq!(value(&after, GRID_EVENT_ACTIVE), Some(0.0));
    assert_eq!(g.baselines_kw, vec![Some(500.0)]);
}

#[test]
fn the_controllers_floor_and_shortfall_are_noted_during_the_event_not_its_rebound() {
    let mut g = Schedule::new(Vec::new());
    let memory = |rebound_until| policies::GridMemory {
        since: at("2024-06-03T10:00:00Z"),
        baseline_w: 500_000.0,
        target_w: 375_000.0,
        meter_w: 420_000.0,
        floor_w: 400_000.0,
        shortfall_w: 25_000.0,
        rebound_until,
    };
    g.note(None, at("2024-06-03T09:55:00Z"));
    g.note(Some(&memory(None)), at("2024-06-03T10:00:00Z"));
    let after = Some(at("2024-06-03T11:30:00Z"));
    g.note(Some(&memory(after)), at("2024-06-03T11:05:00Z"));
    assert_eq!(
        g.controller,
        vec![ControllerView {
            t: at("2024-06-03T10:00:00Z"),
            floor_kw: 400.0,
            shortfall_kw: 25.0
        }]
    );
}
