//! The JSON bodies of the API's read routes (`/api/v1/status`, `racks`, `gpus`,
//! `policy`, `decisions`), made from the board of the last tick.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use policies::Decision;
use serde_json::json;
use telemetry::metric::names::{INLET_TEMP_C, POWER_W, PRICE_PER_KWH};
use telemetry::{EntityId, EntityKind, Timestamp};

use super::{action_kind, query, Board, RECENT_DECISIONS};
use control::fleet::Fleet;

/// The policy in force, as written, and the outcome of the last reload.
pub(super) fn policy(b: &Board) -> serde_json::Value {
    let p = &b.policy_status;
    json!({
        "file": b.policy_file,
        "text": b.policy_text,
        "sha256": p.sha256,
        "loaded_at": p.loaded_at,
        "valid": p.valid,
        "last_error": p.last_error,
        "last_error_at": p.last_error_at,
        "rejected_sha256": p.rejected_sha256,
        "reloads": { "ok": p.reloads_ok, "error": p.reloads_error },
        "reload_error": p.last_error,
    })
}

pub(super) fn status(b: &Board) -> serde_json::Value {
    let site = b.site.site_entity();
    let obs = |m: &str| b.snapshot.observe(&site, m, b.time);
    json!({
        "site": b.site.name,
        "time": b.time,
        "started": b.started,
        "policy_file": b.policy_file,
        "policy_reload_error": b.policy_status.last_error,
        "facility": {
            "budget_w": b.site.facility_budget_kw() * 1000.0,
            "power_w": obs(POWER_W).map(|o| o.value),
            "power_stale": obs(POWER_W).map(|o| o.stale),
        },
        "price_per_kwh": obs(PRICE_PER_KWH).map(|o| o.value),
        "price_source": b.price_source,
        "tariff_period": b.site.tariff.as_ref().map(|t| t.at(b.time, b.site.timezone).1.to_string()),
        "demand_charge_per_kw": b.site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw),
        "currency": b.site.currency,
        "caps_in_force": b.state.caps.len(),
        "holds_in_force": b.state.holds.len(),
        "gpus": b.site.gpu_count(),
        "ticks": b.counters.ticks,
        "stale_readings": b.snapshot.stale(b.time).len(),
        "ha": b.ha_status(),
        "predicted_headroom": b
            .predictions
            .iter()
            .map(|(rack, p)| (rack.clone(), predicted_json(p)))
            .collect::<serde_json::Map<_, _>>(),
    })
}

/// A rack's predicted inlet for the API: the prediction and its headroom.
fn predicted_json(p: &policies::RackPrediction) -> serde_json::Value {
    json!({
        "inlet_c": p.inlet_c,
        "predicted_c": p.predicted_c,
        "peak_c": p.peak_c,
        "peak_in_s": p.peak_in_s,
        "horizon_s": p.horizon_s,
        "limit_c": p.limit_c,
        "margin_c": p.margin_c,
        "headroom_c": round3(p.headroom_c()),
    })
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(super) fn racks(b: &Board) -> serde_json::Value {
    let gpus = b.site.gpus();
    let list: Vec<_> = b
        .site
        .racks
        .iter()
        .map(|r| {
            let id = EntityId::new(EntityKind::Rack, r.id.clone());
            let p = b.snapshot.observe(&id, POWER_W, b.time);
            let t = b.snapshot.observe(&id, INLET_TEMP_C, b.time);
            let caps: Vec<f64> = gpus
                .iter()
                .filter(|g| g.rack.id == r.id)
                .filter_map(|g| b.state.caps.get(&g.id).map(|c| c.watts))
                .collect();
            json!({
                "id": r.id,
                "row": r.row,
                "budget_w": r.power_budget_kw * 1000.0,
                "power_w": p.map(|o| o.value),
                "power_stale": p.map(|o| o.stale),
                "headroom_w": p.map(|o| r.power_budget_kw * 1000.0 - o.value),
                "inlet_c": t.map(|o| o.value),
                "inlet_stale": t.map(|o| o.stale),
                "inlet_limit_c": r.inlet_limit_c,
                "capped_gpus": caps.len(),
                "lowest_cap_w": caps.iter().copied().reduce(f64::min),
                "thermal_level": b.state.thermal.get(&r.id),
                "predicted": b.predictions.get(&r.id).map(predicted_json),
            })
        })
        .collect();
    json!({ "racks": list })
}

pub(super) fn gpus(b: &Board, fleet: Option<&Arc<Mutex<Fleet>>>) -> serde_json::Value {
    let fleet = fleet.map(|f| f.lock().unwrap_or_else(|p| p.into_inner()));
    let books: BTreeMap<EntityId, serde_json::Value> = fleet
        .as_ref()
        .map(|f| {
            f.books()
                .map(|bk| (bk.gpu.clone(), serde_json::to_value(bk).unwrap_or_default()))
                .collect()
        })
        .unwrap_or_default();
    let list: Vec<_> = b
        .site
        .gpus()
        .iter()
        .map(|g| {
            let o = |m: &str| b.snapshot.observe(&g.id, m, b.time).map(|o| o.value);
            json!({
                "id": g.id.to_string(),
                "node": g.node.id,
                "rack": g.rack.id,
                "model": g.model.name,
                "power_w": o(POWER_W),
                "temp_c": o(telemetry::metric::names::GPU_TEMP_C),
                "cap": b.state.caps.get(&g.id),
                "agent": books.get(&g.id),
            })
        })
        .collect();
    json!({ "gpus": list })
}

/// A `/api/v1/decisions` filter that cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadFilter {
    #[error("{0}")]
    Query(#[from] query::BadQuery),
    #[error("since: {0} (use RFC 3339, e.g. 2026-11-30T08:00:00Z or ...T09:00:00%2B01:00)")]
    Since(#[source] chrono::ParseError),
    #[error("limit: {0:?} is not a number")]
    Limit(String),
    #[error("limit must be within 1..={RECENT_DECISIONS}")]
    LimitRange,
    #[error("unknown filter {0:?} (rule, action, target, since, limit)")]
    Unknown(String),
}

pub(super) fn decisions(b: &Board, query: &str) -> Result<serde_json::Value, BadFilter> {
    let mut rule = None;
    let mut action = None;
    let mut target = None;
    let mut since = None;
    let mut limit = 100usize;
    for (k, v) in query::pairs(query)? {
        match k.as_str() {
            "rule" => rule = Some(v),
            "action" => action = Some(v),
            "target" => target = Some(v),
            "since" => {
                since = Some(
                    Timestamp::parse_rfc3339(&query::offset_plus(&v)).map_err(BadFilter::Since)?,
                )
            }
            "limit" => {
                limit = v.parse().map_err(|_| BadFilter::Limit(v.clone()))?;
                if limit == 0 || limit > RECENT_DECISIONS {
                    return Err(BadFilter::LimitRange);
                }
            }
            other => return Err(BadFilter::Unknown(other.to_string())),
        }
    }
    let list: Vec<&Decision> = b
        .recent
        .iter()
        .rev()
        .filter(|d| {
            rule.as_ref()
                .is_none_or(|r| d.rule == *r || d.rule.starts_with(&format!("{r}.")))
        })
        .filter(|d| {
            action
                .as_deref()
                .is_none_or(|a| action_kind(&d.action) == a)
        })
        .filter(|d| {
            target
                .as_ref()
                .is_none_or(|t| d.target.to_string().contains(t.as_str()))
        })
        .filter(|d| since.is_none_or(|s| d.time >= s))
        .take(limit)
        .collect();
    Ok(json!({ "decisions": list, "newest_first": true }))
}
