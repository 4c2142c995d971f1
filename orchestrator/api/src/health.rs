//! `/healthz` and `/readyz`: whether `serve` is alive, and whether it is fit to steer
//! (the store took the last tick's writes, the policy file is valid, the sources
//! deliver), read from the board the control loop publishes after every tick.

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
}

impl Readiness {
    /// For a `serve` with these telemetry sources (each `true` when configured).
    pub fn new(sources: &[bool], http: Option<&super::HttpSection>) -> Self {
        Readiness {
            sources: sources.iter().filter(|s| **s).count(),
            stale_after_s: http
                .map_or_else(super::server::default_ready_stale_s, |h| h.ready_stale_s),
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
    let p = &b.policy_status;
    let policy = check(
        "policy",
        p.valid,
        json!({ "sha256": p.sha256, "error": p.last_error }),
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
    vec![store, policy, sources]
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
        b.policy_status.valid = false;
        assert_eq!(failing(&b, 30), ["store", "policy"]);
        let r = answer("/readyz", &b);
        assert_eq!(r.status, 503);
        assert_eq!(answer("/healthz", &b).status, 200);
    }
}
