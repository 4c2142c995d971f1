//! Sample records for store and restart tests.

use std::collections::BTreeMap;

use integrations::store::{Account, LedgerEntry};
use policies::plan::ThermalLevel;
use policies::{Action, Cap, Decision, Hold, State, Target};
use telemetry::{EntityId, Job, JobState, Timestamp};

pub fn t(secs: i64) -> Timestamp {
    Timestamp::from_secs(1_717_387_200 + secs)
}

pub fn decision(i: i64) -> Decision {
    let mut values = BTreeMap::new();
    values.insert("inlet_temp_c".to_string(), 33.0 + i as f64 / 10.0);
    Decision {
        time: t(i),
        rule: "thermal.inlet".into(),
        target: Target::Gpus {
            entity: EntityId::rack("b01"),
            gpus: vec![EntityId::gpu("b01-n01", 0)],
        },
        action: Action::Cap { watts: 270.0 },
        values,
        reason: format!("inlet above limit #{i}"),
        observe_only: false,
        release: String::new(),
    }
}

pub fn ledger(i: i64) -> LedgerEntry {
    LedgerEntry {
        start: t(i * 60),
        end: t(i * 60 + 60),
        account: Account::Job {
            job: "slurm:7".into(),
            project: "vision".into(),
            user: "ada".into(),
        },
        rack: Some("a01".into()),
        energy_kwh: 0.25 + i as f64,
        cost: 0.05,
        carbon_kg: 0.1,
        integrated_kwh: 0.0,
        shared_kwh: 0.0,
    }
}

pub fn job(id: &str, state: JobState) -> Job {
    Job {
        id: id.into(),
        scheduler: "slurm".into(),
        name: format!("train-{id}"),
        user: "ada".into(),
        project: "vision".into(),
        class: "training".into(),
        priority: 5,
        gpus: 8,
        allocated: vec![],
        state,
        submit_time: t(0),
        start_time: None,
        end_time: None,
        deadline: Some(t(86_400)),
        est_duration_s: 7200.0,
        deferrable: true,
        preemptible: false,
        gpu_power_limit: None,
    }
}

/// Caps on two GPUs, a hold, a thermal level.
pub fn state_a() -> State {
    let mut s = State::default();
    for (i, w) in [(0, 250.0), (1, 240.0)] {
        s.caps.insert(
            EntityId::gpu("a01-n01", i),
            Cap {
                watts: w,
                rule: "budget.rack".into(),
                since: t(0),
                lease_until: t(300),
            },
        );
    }
    s.holds.insert(
        "slurm:7".into(),
        Hold {
            rule: "price.defer".into(),
            since: t(0),
            lease_until: t(600),
            reason: "price 0.31 above 0.22".into(),
        },
    );
    s.thermal.insert(
        "b01".into(),
        ThermalLevel {
            fraction: 0.9,
            since: t(0),
        },
    );
    s.clocks.insert(
        EntityId::gpu("b01-n01", 2),
        policies::ClockLock {
            mhz: 1200.0,
            rule: "rules.slow".into(),
            since: t(0),
            lease_until: t(300),
        },
    );
    s.suspended.insert(
        "slurm:9".into(),
        Hold {
            rule: "rules.price-spike".into(),
            since: t(0),
            lease_until: t(1800),
            reason: "price > 0.50 for 5m".into(),
        },
    );
    let mut memory = policies::RuleMemories::new();
    memory.insert(
        "rack/b01",
        policies::RuleMemory {
            active: true,
            since: t(0),
            when_true: [(0usize, t(0))].into_iter().collect(),
            release_true: Default::default(),
            level: Some(85.0),
            level_at: t(0),
            done: false,
        },
    );
    s.rules.insert("hot-racks".into(), memory);
    s
}

/// state_a with one cap removed, one changed, the hold released.
pub fn state_b() -> State {
    let mut s = state_a();
    s.caps.remove(&EntityId::gpu("a01-n01", 0));
    if let Some(c) = s.caps.get_mut(&EntityId::gpu("a01-n01", 1)) {
        c.watts = 200.0;
    }
    s.holds.clear();
    s.clocks.clear();
    if let Some(m) = s
        .rules
        .get_mut("hot-racks")
        .and_then(|m| m.get_mut("rack/b01"))
    {
        m.level = Some(80.0);
    }
    s
}
