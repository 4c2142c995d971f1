//! `/healthz` and `/readyz`: whether `serve` is alive, and whether it is fit to steer
//! (the loop ticks, the store took the last tick's writes, the sources deliver), read
//! from the board the control loop publishes after every tick. A policy file on disk
//! that does not load is reported in the body, not failed on: the policy in force
//! keeps running, and a load balancer must not take every replica out over a typo.

use serde_json::json;
use telemetry::Timestamp;

use super::{json_reply, Board, Reply};

/// What the control loop tells `/readyz` after every tick.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    /// Whether the last tick's writes reached the store (`None` before the first tick).
    pub store_ok: Option<bool>,
    /// The store's last error, while it fails.
    pub store_error: Option<String>,
    /// Telemetry sources configured (MQTT, Redfish, the agents' reports).
    pub sources: usize,
    /// When a source last delivered a sample.
    pub last_source_sample: Option<Timestamp>,
    /// Sources are stale when none delivered for this long.
    pub stale_after_s: f64,
    /// The loop is stalled when no tick completed for this long.
    pub stall_after_s: f64,
}

/// The least time without a tick that counts as a stall, whatever the tick period.
pub const MIN_STALL_S: f64 = 5.0;

impl Readiness {
    /// For a `serve` that ticks every `tick_s` with these telemetry sources (each
    /// `true` when configured).
    pub fn new(sources: &[bool], tick_s: f64, http: Option<&super::HttpSection>) -> Self {
        let ticks = http.map_or_else(super::server::default_ready_stall_ticks, |h| {
            h.ready_stall_ticks
        });
        Readiness {
            sources: sources.iter().filter(|s| **s).count(),
            stale_after_s: http
                .map_or_else(super::server::default_ready_stale_s, |h| h.ready_stale_s),
            stall_after_s: (ticks * tick_s).max(MIN_STALL_S),
            ..Default::default()
        }
    }

    /// What a tick saw: the store's error, if any, and a source's last delivery.
    pub fn after_tick(&mut self, store_error: Option<&str>, last_source_sample: Option<Timestamp>) {
        self.store_ok = Some(store_error.is_none());
        self.store_error = store_error.map(str::to_string);
        self.last_source_sample = last_source_sample;
    }
}

/// One check: its name, whether it passes, and what it saw.
fn check(name: &str, ok: bool, detail: serde_json::Value) -> (String, bool, serde_json::Value) {
    (name.to_string(), ok, detail)
}

/// `/readyz`'s checks at `now`.
pub fn checks(b: &Board, now: Timestamp) -> Vec<(String, bool, serde_json::Value)> {
    let r = &b.ready;
    // the tick's writes reached the store, and (Redis) the server answers now: while
    // the journal absorbs an outage the controller runs but is not ready
    let reachable = b.store_reachable();
    let journal = b
        .store_health
        .as_ref()
        .map(|h| h.journal_depth.load(std::sync::atomic::Ordering::Relaxed));
    let store = match r.store_ok {
        None => check("store", false, json!({ "error": "no tick yet" })),
        Some(ok) => check(
            "store",
            ok && reachable,
            json!({ "error": r.store_error, "reachable": reachable, "journal_depth": journal }),
        ),
    };
    // ticks go on: a loop stuck in a call that does not return fails, whatever the
    // store last said (before the first tick, the store check already fails)
    let tick_age = r.store_ok.map(|_| now.secs_since(b.time).max(0.0));
    let ticking = check(
        "loop",
        tick_age.is_none_or(|a| a <= r.stall_after_s || r.stall_after_s <= 0.0),
        json!({ "last_tick": b.time, "age_s": tick_age, "stall_after_s": r.stall_after_s }),
    );
    // the policy in force runs whatever the file on disk holds: an invalid edit is
    // reported (and on /metrics as powerplane_policy_valid 0), not failed on
    let p = &b.policy_status;
    let policy = check(
        "policy",
        true,
        json!({
            "sha256": p.sha256,
            "file_valid": p.valid,
            "error": p.last_error,
            "rejected_sha256": p.rejected_sha256,
        }),
    );
    let age = r.last_source_sample.map(|t| now.secs_since(t).max(0.0));
    let fresh = r.sources == 0 || age.is_some_and(|a| a <= r.stale_after_s);
    let sources = check(
        "sources",
        fresh,
        json!({
            "configured": r.sources,
            "last_sample": r.last_source_sample,
            "age_s": age,
            "stale_after_s": r.stale_after_s,
        }),
    );
    vec![ticking, store, policy, sources]
}

/// The answer to `GET /healthz` or `GET /readyz`.
pub fn answer(path: &str, b: &Board) -> Reply {
    if path == "/healthz" {
        return json_reply(200, &json!({ "alive": true }));
    }
    let list = checks(b, common::wall_clock());
    let failing: Vec<&str> = list
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(n, _, _)| n.as_str())
        .collect();
    let by_name: serde_json::Map<String, serde_json::Value> = list
        .iter()
        .map(|(n, ok, d)| {
            let mut v = d.clone();
            v["ok"] = json!(ok);
            (n.clone(), v)
        })
        .collect();
    let status = if failing.is_empty() { 200 } else { 503 };
    json_reply(
        status,
        &json!({
            "ready": failing.is_empty(),
            "role": b.ha_status().role,
            "ha": b.ha_status(),
            "failing": failing,
            "checks": by_name,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn board() -> Board {
        let site =
            telemetry::Site::parse("site.toml", control::examples::DEFAULT_SITE).expect("site");
        let mut b = Board::new(site, "policy.toml".into(), Timestamp::from_secs(0));
        b.policy_status.valid = true;
        b
    }

    #[test]
    fn ready_only_after_a_tick_reached_the_store_and_with_fresh_sources() {
        let mut b = board();
        let failing = |b: &Board, now| {
            checks(b, Timestamp::from_secs(now))
                .into_iter()
                .filter(|c| !c.1)
                .map(|c| c.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(failing(&b, 10), ["store"], "no tick yet");
        b.ready.store_ok = Some(true);
        assert!(
            failing(&b, 10).is_empty(),
            "no sources: nothing to be stale"
        );
        b.ready.sources = 1;
        b.ready.stale_after_s = 60.0;
        assert_eq!(
            failing(&b, 10),
            ["sources"],
            "a source that never delivered"
        );
        b.ready.last_source_sample = Some(Timestamp::from_secs(5));
        assert!(failing(&b, 60).is_empty());
        assert_eq!(failing(&b, 100), ["sources"]);
        b.ready.store_ok = Some(false);
        assert_eq!(failing(&b, 30), ["store"]);
        let r = answer("/readyz", &b);
        assert_eq!(r.status, 503);
        assert_eq!(answer("/healthz", &b).status, 200);
    }

    #[test]
    fn a_loop_that_stopped_ticking_is_not_ready_and_an_invalid_policy_file_is_only_reported() {
        let mut b = board();
        b.ready = Readiness::new(&[false], 0.5, None);
        assert_eq!(b.ready.stall_after_s, MIN_STALL_S, "at least 5 s");
        assert_eq!(Readiness::new(&[], 15.0, None).stall_after_s, 45.0);
        b.ready.store_ok = Some(true);
        b.time = Timestamp::from_secs(100);
        let failing = |b: &Board, now| {
            checks(b, Timestamp::from_secs(now))
                .into_iter()
                .filter(|c| !c.1)
                .map(|c| c.0)
                .collect::<Vec<_>>()
        };
        assert!(failing(&b, 104).is_empty());
        assert_eq!(failing(&b, 106), ["loop"], "no tick for 6 s");
        // a broken edit on disk: the replica stays in, the body says why
        b.time = Timestamp::from_secs(200);
        b.policy_status.valid = false;
        b.policy_status.last_error = Some("policy.toml:3:1: unknown key `rulez`".into());
        assert!(failing(&b, 201).is_empty());
        let list = checks(&b, Timestamp::from_secs(201));
        let policy = &list.iter().find(|c| c.0 == "policy").expect("policy").2;
        assert_eq!(policy["file_valid"], false);
        assert!(policy["error"]
            .as_str()
            .is_some_and(|e| e.contains("rulez")));
    }
}
