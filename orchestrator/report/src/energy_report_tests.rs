use super::*;
use policies::plan::{Action, Target};
use telemetry::EntityId;

fn t(h: f64) -> Timestamp {
    Timestamp::parse_rfc3339("2024-10-26T22:00:00Z")
        .expect("t")
        .plus_secs(h * 3600.0)
}

fn job(j: &str, p: &str, u: &str) -> Account {
    Account::Job {
        job: j.into(),
        project: p.into(),
        user: u.into(),
    }
}

fn entry(h: f64, account: Account, rack: Option<&str>, kwh: f64, price: f64) -> LedgerEntry {
    LedgerEntry {
        start: t(h),
        end: t(h + 1.0),
        account,
        rack: rack.map(String::from),
        energy_kwh: kwh,
        cost: kwh * price,
        carbon_kg: kwh * 0.4,
        integrated_kwh: 0.0,
        shared_kwh: 0.0,
    }
}

fn racks() -> BTreeMap<String, String> {
    [
        ("gpu/a01-n01:0", "a01"),
        ("gpu/a01-n01:1", "a01"),
        ("gpu/b01-n01:0", "b01"),
    ]
    .into_iter()
    .map(|(g, r)| (g.to_string(), r.to_string()))
    .collect()
}

fn decision(h: f64, target: Target, action: Action) -> Decision {
    Decision {
        time: t(h),
        rule: "test".into(),
        target,
        action,
        values: BTreeMap::new(),
        reason: String::new(),
        observe_only: false,
        release: String::new(),
    }
}

fn ledger() -> Vec<LedgerEntry> {
    let mut l = Vec::new();
    for h in 0..4 {
        let h = f64::from(h);
        l.push(entry(
            h,
            job("slurm:1", "climate", "ana"),
            Some("a01"),
            2.0,
            0.10 + 0.1 * h,
        ));
        l.push(entry(
            h,
            job("slurm:2", "climate", "bo"),
            Some("b01"),
            1.0,
            0.10 + 0.1 * h,
        ));
        l.push(entry(h, Account::Idle, Some("b01"), 0.5, 0.10 + 0.1 * h));
        l.push(entry(h, Account::Overhead, None, 0.7, 0.10 + 0.1 * h));
    }
    l
}

#[test]
fn groups_add_up_to_the_total_and_carry_cost_peak_held_and_capped_time() {
    let gpus = |g: &[&str]| Target::Gpus {
        entity: EntityId::rack("a01"),
        gpus: g.iter().map(|s| s.parse().expect("id")).collect(),
    };
    let audit = vec![
        decision(
            0.0,
            Target::Job {
                job: "slurm:2".into(),
            },
            Action::Hold { until: t(3.0) },
        ),
        decision(
            1.5,
            Target::Job {
                job: "slurm:2".into(),
            },
            Action::Release,
        ),
        decision(
            1.0,
            gpus(&["gpu/a01-n01:0", "gpu/a01-n01:1"]),
            Action::Cap { watts: 200.0 },
        ),
        decision(3.0, gpus(&["gpu/a01-n01:0"]), Action::Uncap),
    ];
    let r = build(
        &racks(),
        &ledger(),
        &audit,
        GroupBy::Job,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    );
    let keys: Vec<_> = r.rows.iter().map(|r| r.key.as_str()).collect();
    assert_eq!(
        keys,
        vec!["slurm:1", "slurm:2", "(overhead)", "(idle)"],
        "by energy"
    );
    let sum: f64 = r.rows.iter().map(|r| r.energy_kwh).sum();
    assert!((sum - r.total.energy_kwh).abs() < 1e-9 && (r.total.energy_kwh - 16.8).abs() < 1e-9);
    let j1 = &r.rows[0];
    // the price changed every hour while the job ran: 2 kWh at 0.1, 0.2, 0.3, 0.4
    assert!((j1.cost - 2.0).abs() < 1e-9, "{}", j1.cost);
    assert!((j1.peak_kw - 2.0).abs() < 1e-9);
    assert_eq!(r.rows[1].held_hours, Some(1.5));
    assert_eq!(r.rows[0].held_hours, None, "never held");
    assert!((r.total.peak_kw - 4.2).abs() < 1e-9);
    // 2.8 kWh of cooling on 14 kWh of IT
    assert!(r.pue.is_some_and(|p| (p - 16.8 / 14.0).abs() < 1e-9));
    // two GPUs from 1 h; one uncapped at 3 h, the other to the end: 2 + 3 GPU-hours
    assert_eq!(r.total.capped_gpu_hours, Some(5.0));
    assert_eq!(
        r.capped_over_time.iter().map(|c| c.1).collect::<Vec<_>>(),
        vec![2, 1]
    );

    let by_rack = build(
        &racks(),
        &ledger(),
        &audit,
        GroupBy::Rack,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    );
    let a01 = by_rack.rows.iter().find(|r| r.key == "a01").expect("a01");
    assert_eq!(a01.capped_gpu_hours, Some(5.0));
    assert!(by_rack.rows.iter().any(|r| r.key == "(facility)"));
    let by_project = build(
        &racks(),
        &ledger(),
        &audit,
        GroupBy::Project,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    );
    let climate = by_project
        .rows
        .iter()
        .find(|r| r.key == "climate")
        .expect("climate");
    assert!((climate.energy_kwh - 12.0).abs() < 1e-9);
    assert_eq!(climate.held_hours, Some(1.5));
}

#[test]
fn days_follow_the_site_time_zone_across_a_dst_change() {
    // Europe/Berlin leaves summer time on 2024-10-27: that local day has 25 hours
    let mut l = Vec::new();
    for h in 0..27 {
        l.push(entry(f64::from(h), Account::Idle, Some("a01"), 1.0, 0.1));
    }
    // t(0) is 2024-10-27 00:00 in Berlin (22:00 UTC the day before, summer time)
    let r = build(
        &racks(),
        &l,
        &[],
        GroupBy::Day,
        chrono_tz::Europe::Berlin,
        "EUR",
        t(0.0),
        t(27.0),
    );
    let days: Vec<(&str, f64)> = r
        .rows
        .iter()
        .map(|r| (r.key.as_str(), r.energy_kwh))
        .collect();
    assert_eq!(days, vec![("2024-10-27", 25.0), ("2024-10-28", 2.0)]);
    let utc = build(
        &racks(),
        &l,
        &[],
        GroupBy::Day,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(27.0),
    );
    assert_eq!(utc.rows[0].key, "2024-10-26");
}

#[test]
fn csv_and_json_keep_their_documented_schema() {
    let r = build(
        &racks(),
        &ledger(),
        &[],
        GroupBy::User,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    );
    let csv = r.csv();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some(EnergyReport::CSV_HEADER));
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.iter().all(|c| c.len() == 9));
    assert_eq!(rows.last().expect("total")[0], "total");
    let ana = rows.iter().find(|c| c[0] == "ana").expect("ana");
    assert_eq!(ana[1].parse::<f64>().ok(), Some(8.0));
    assert_eq!(ana[2].parse::<f64>().ok(), Some(0.0), "all from counters");
    let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
    for k in ["from", "to", "group_by", "currency", "rows", "total"] {
        assert!(!v[k].is_null(), "{k}");
    }
    for k in [
        "key",
        "energy_kwh",
        "estimated_kwh",
        "cost",
        "carbon_kg",
        "peak_kw",
        "capped_gpu_hours",
        "held_hours",
        "saving_cost",
    ] {
        assert!(v["rows"][0].get(k).is_some(), "row member {k}");
    }
    assert_eq!(v["group_by"], "user");
    let html = r.html("demo-hall");
    assert!(html.contains("<svg"));
    for external in ["<script", "<link", "src=", "href=", "@import", "url("] {
        assert!(
            !html.contains(external),
            "{external} in a self-contained page"
        );
    }
}

#[test]
fn a_job_held_all_period_counts_under_its_project_though_it_used_no_energy() {
    let audit = vec![decision(
        1.0,
        Target::Job {
            job: "slurm:9".into(),
        },
        Action::Hold { until: t(9.0) },
    )];
    let job = telemetry::Job {
        id: "slurm:9".into(),
        scheduler: "slurm".into(),
        name: "sweep".into(),
        user: "cy".into(),
        project: "climate".into(),
        class: "batch".into(),
        priority: 0,
        gpus: 1,
        allocated: vec![],
        state: telemetry::JobState::Pending,
        submit_time: t(0.0),
        start_time: None,
        end_time: None,
        deadline: None,
        est_duration_s: 3600.0,
        deferrable: true,
        preemptible: false,
        gpu_power_limit: None,
    };
    let r = build(
        &racks(),
        &ledger(),
        &audit,
        GroupBy::Project,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    )
    .with_jobs(std::slice::from_ref(&job));
    let climate = r.rows.iter().find(|r| r.key == "climate").expect("climate");
    assert_eq!(
        climate.held_hours,
        Some(3.0),
        "held from 1 h to the end of the period"
    );
    let by_job = build(
        &racks(),
        &ledger(),
        &audit,
        GroupBy::Job,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(4.0),
    )
    .with_jobs(&[job]);
    let row = by_job
        .rows
        .iter()
        .find(|r| r.key == "slurm:9")
        .expect("a row for the held job");
    assert_eq!((row.energy_kwh, row.held_hours), (0.0, Some(3.0)));
}

#[test]
fn the_demand_charge_is_the_peak_of_each_billing_period_times_the_rate() {
    let tz: Tz = "Europe/Berlin".parse().expect("tz");
    let from = Timestamp::parse_rfc3339("2024-09-30T00:00:00+02:00").expect("t");
    let to = from + 3.0 * 86400.0;
    let mut r = build(
        &BTreeMap::new(),
        &[],
        &[],
        GroupBy::Day,
        tz,
        "EUR",
        from,
        to,
    );
    let h = 3600.0;
    // September: 100 kW then 150 kW over an hour each; October: 80 kW over 15 minutes
    r.intervals = vec![
        (from, from + h, 100.0, 10.0),
        (from + h, from + 2.0 * h, 150.0, 15.0),
        (
            from + 2.0 * 86400.0,
            from + 2.0 * 86400.0 + 900.0,
            20.0,
            2.0,
        ),
    ];
    let without = r.clone().with_demand_charge(None, tz, &[], &[]);
    assert_eq!(without.demand_charge, None);
    assert!(!without.table().contains("demand charge"));
    assert!(!without.csv().contains("demand_charge"));
    let r = r.with_demand_charge(Some(10.0), tz, &[], &[]);
    let peaks: Vec<(&str, f64, &str)> = r
        .demand_periods
        .iter()
        .map(|p| (p.period.as_str(), p.peak_kw, p.source.as_str()))
        .collect();
    assert_eq!(
        peaks,
        vec![
            ("2024-09", 150.0, "ledger intervals"),
            ("2024-10", 80.0, "ledger intervals")
        ]
    );
    assert_eq!(r.demand_periods[0].start, from + h);
    assert!((r.demand_charge.expect("charge") - 2300.0).abs() < 1e-9);
    assert!(
        r.table().contains("demand charge 2300.00 EUR"),
        "{}",
        r.table()
    );
    assert!(
        r.json().contains("\"demand_charge\": 2300.0"),
        "{}",
        r.json()
    );
}

/// Two projects over two hours; the second hour is the peak: `climate` drew 60 of its
/// 100 kWh, `vision` 20, idle 20.
fn peak_ledger() -> Vec<LedgerEntry> {
    vec![
        entry(
            0.0,
            job("slurm:1", "climate", "ana"),
            Some("a01"),
            30.0,
            0.1,
        ),
        entry(0.0, Account::Idle, Some("a01"), 20.0, 0.1),
        entry(
            1.0,
            job("slurm:1", "climate", "ana"),
            Some("a01"),
            60.0,
            0.2,
        ),
        entry(1.0, job("slurm:2", "vision", "bo"), Some("b01"), 20.0, 0.2),
        entry(1.0, Account::Idle, Some("b01"), 20.0, 0.2),
    ]
}

#[test]
fn the_demand_charge_is_attributed_by_share_of_the_peak_intervals_energy() {
    let l = peak_ledger();
    let r = build(
        &racks(),
        &l,
        &[],
        GroupBy::Project,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(2.0),
    )
    .with_demand_charge(Some(10.0), chrono_tz::UTC, &[], &l);
    // the peak: 100 kW over the second hour, 1,000 EUR
    assert!((r.demand_charge.expect("charge") - 1000.0).abs() < 1e-9);
    let share = |k: &str| {
        r.rows
            .iter()
            .find(|r| r.key == k)
            .and_then(|r| r.demand_charge)
            .expect(k)
    };
    assert!((share("climate") - 600.0).abs() < 1e-9);
    assert!((share("vision") - 200.0).abs() < 1e-9);
    assert!((share("(idle)") - 200.0).abs() < 1e-9);
    // the shares add up to the charge, and the total cost is energy + demand
    let sum: f64 = r.rows.iter().filter_map(|r| r.demand_charge).sum();
    assert!((sum - 1000.0).abs() < 1e-9);
    let energy = 5.0 + 20.0;
    assert!((r.total_cost.expect("total") - (energy + 1000.0)).abs() < 1e-9);
    let csv = r.csv();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().map(String::from),
        Some(format!(
            "{}{}",
            EnergyReport::CSV_HEADER,
            EnergyReport::CSV_DEMAND_COLUMNS
        ))
    );
    let climate: Vec<&str> = lines
        .find(|l| l.starts_with("climate,"))
        .expect("climate")
        .split(',')
        .collect();
    assert_eq!(climate.len(), 11);
    assert_eq!(climate[9].parse::<f64>().ok(), Some(600.0));
    assert_eq!(climate[10].parse::<f64>().ok(), Some(615.0));
    let v: serde_json::Value = serde_json::from_str(&r.json()).expect("json");
    assert_eq!(v["total_cost"], 1025.0);
    assert_eq!(v["demand_periods"][0]["period"], "2024-10");
    assert_eq!(v["demand_periods"][0]["peak_kw"], 100.0);
    let table = r.table();
    assert!(
        table.contains("total cost (energy + demand) 1025.00 EUR"),
        "{table}"
    );
    assert!(table.contains("2024-10: peak 100.0 kW at"), "{table}");
    assert!(table.contains("climate 600.00"), "{table}");
    assert!(r.html("t").contains("Demand charge 1000.00 EUR"));
}

#[test]
fn the_ledgers_record_of_the_period_wins_even_when_its_peak_is_outside_the_range() {
    let l = peak_ledger();
    // the record: a 15-minute peak of 180 kW earlier in the month, vision's alone
    let at = t(-48.0);
    let rec = control::demand::PeriodPeak {
        period: "2024-10".into(),
        start: at,
        end: at + 900.0,
        kw: 180.0,
        entries: vec![LedgerEntry {
            start: at,
            end: at + 900.0,
            ..entry(
                -48.0,
                job("slurm:7", "vision", "bo"),
                Some("b01"),
                45.0,
                0.0,
            )
        }],
        it_kw: 150.0,
        recent_it_kw: Vec::new(),
    };
    let r = build(
        &racks(),
        &l,
        &[],
        GroupBy::User,
        chrono_tz::UTC,
        "EUR",
        t(0.0),
        t(2.0),
    )
    .with_demand_charge(Some(10.0), chrono_tz::UTC, &[rec], &l);
    assert_eq!(r.demand_periods.len(), 1);
    let p = &r.demand_periods[0];
    assert_eq!(
        (p.peak_kw, p.start, p.source.as_str()),
        (180.0, at, "demand intervals")
    );
    let bo = r.rows.iter().find(|r| r.key == "bo").expect("bo");
    assert_eq!(bo.demand_charge, Some(1800.0));
    assert_eq!(
        r.rows
            .iter()
            .find(|r| r.key == "ana")
            .and_then(|r| r.demand_charge),
        None
    );
}
