//! `powerplane policy explain`: one tick of the engine, every decision with the rule,
//! the values that triggered it and what would release it, and what is in force after.

use std::fmt::Write;

use policies::{Decision, Plan, Policy, State};
use serde_json::json;

use super::{caps_by_rack, rule_modes, World};

/// The report as text: decisions, then caps and holds in force, then observe mode.
pub fn text(policy_file: &str, policy: &Policy, w: &World, plan: &Plan) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "policy {policy_file} on site {} ({} racks, {} GPUs) at {}",
        w.site.name,
        w.site.racks.len(),
        w.site.gpu_count(),
        w.now
    );
    let enforced: Vec<&Decision> = plan.decisions.iter().filter(|d| !d.observe_only).collect();
    let observed: Vec<&Decision> = plan.decisions.iter().filter(|d| d.observe_only).collect();
    let _ = writeln!(s, "\nDECISIONS ({})", enforced.len());
    if enforced.is_empty() {
        let _ = writeln!(s, "  none: nothing changes this tick");
    }
    for (i, d) in enforced.iter().enumerate() {
        decision(&mut s, i + 1, d, &plan.state, false);
    }
    let _ = writeln!(s, "\nCAPS IN FORCE AFTER THE TICK");
    caps(&mut s, w, &plan.state.caps);
    let _ = writeln!(s, "\nHOLDS IN FORCE AFTER THE TICK");
    holds(&mut s, &plan.state.holds);
    if !plan.state.clocks.is_empty() {
        let _ = writeln!(s, "\nCLOCKS LOCKED AFTER THE TICK");
        clocks(&mut s, w, &plan.state);
    }
    if !plan.state.suspended.is_empty() {
        let _ = writeln!(s, "\nSUSPENDED JOBS AFTER THE TICK");
        holds(&mut s, &plan.state.suspended);
    }
    let (observe, disabled) = rule_modes(policy);
    let _ = writeln!(
        s,
        "\nOBSERVE MODE (computed, logged, never actuated): {}",
        if observe.is_empty() {
            "no rule".to_string()
        } else {
            observe.join(", ")
        }
    );
    for (i, d) in observed.iter().enumerate() {
        decision(&mut s, i + 1, d, &plan.state, true);
    }
    if !plan.state.observed_caps.is_empty() {
        let _ = writeln!(s, "  caps these rules would have in force:");
        caps(&mut s, w, &plan.state.observed_caps);
    }
    if !plan.state.observed_holds.is_empty() {
        let _ = writeln!(s, "  holds these rules would have in force:");
        holds(&mut s, &plan.state.observed_holds);
    }
    if !disabled.is_empty() {
        let _ = writeln!(s, "\nDISABLED: {}", disabled.join(", "));
    }
    s
}

/// The locked clocks per (rack, clock, rule), with their GPUs and lease.
fn clocks(s: &mut String, w: &World, state: &State) {
    let mut rows: Vec<(String, usize, f64, String, String)> = Vec::new();
    for g in w.site.gpus() {
        let Some(c) = state.clocks.get(&g.id) else {
            continue;
        };
        match rows
            .iter_mut()
            .find(|r| r.0 == g.rack.id && (r.2 - c.mhz).abs() < 0.5 && r.3 == c.rule)
        {
            Some(r) => r.1 += 1,
            None => rows.push((
                g.rack.id.clone(),
                1,
                c.mhz,
                c.rule.clone(),
                c.lease_until.to_string(),
            )),
        }
    }
    let wide = rows.iter().map(|r| r.3.len()).max().unwrap_or(0).max(16);
    let _ = writeln!(
        s,
        "  {:<10} {:>5} {:>9}  {:<wide$}  LEASE UNTIL",
        "RACK", "GPUS", "CLOCK", "RULE"
    );
    for (rack, n, mhz, rule, lease) in rows {
        let _ = writeln!(
            s,
            "  {rack:<10} {n:>5} {mhz:>5.0} MHz  {rule:<wide$}  {lease}"
        );
    }
}

fn decision(s: &mut String, n: usize, d: &Decision, state: &State, observed: bool) {
    let _ = writeln!(s, "  {n:>2}. {:<16} {} on {}", d.rule, d.action, d.target);
    // (a rule name longer than the column pushes the action right; the line stays whole)
    if !d.reason.is_empty() {
        let _ = writeln!(s, "      why:     {}", d.reason);
    }
    if !d.values.is_empty() {
        let v: Vec<String> = d.values.iter().map(|(k, v)| format!("{k} = {v}")).collect();
        let _ = writeln!(s, "      values:  {}", v.join(", "));
    }
    if !d.release.is_empty() {
        let _ = writeln!(s, "      release: {}", d.release);
    }
    // the lease: what ends it if nothing renews it
    // the lease of what the decision put in force (nothing for an uncap or a release)
    use policies::{Action, Target};
    let lease = match (&d.target, &d.action) {
        (Target::Gpus { gpus, .. }, Action::Cap { .. }) => gpus.first().and_then(|g| {
            if observed {
                state.observed_caps.get(g)
            } else {
                state.caps.get(g)
            }
            .map(|c| c.lease_until)
        }),
        (Target::Gpus { gpus, .. }, Action::LockClocks { .. }) => gpus
            .first()
            .and_then(|g| state.clocks.get(g))
            .map(|c| c.lease_until),
        (Target::Job { job }, Action::Hold { .. }) => if observed {
            state.observed_holds.get(job)
        } else {
            state.holds.get(job)
        }
        .map(|h| h.lease_until),
        (Target::Job { job }, Action::Suspend { .. }) => {
            state.suspended.get(job).map(|h| h.lease_until)
        }
        _ => None,
    };
    if let Some(l) = lease {
        let _ = writeln!(s, "      lease:   until {l} unless the next tick renews it");
    }
}

fn caps(s: &mut String, w: &World, caps: &policies::GpuMap<policies::Cap>) {
    let groups = caps_by_rack(&w.site, caps);
    if groups.is_empty() {
        let _ = writeln!(s, "  none: every GPU at its default limit");
        return;
    }
    let wide = groups.iter().map(|g| g.1.len()).max().unwrap_or(0).max(16);
    let _ = writeln!(
        s,
        "  {:<10} {:>5} {:>8}  {:<wide$}  {:<22} LEASE UNTIL",
        "RACK", "GPUS", "CAP", "RULE", "SINCE"
    );
    for (rack, rule, watts, gpus, cap) in groups {
        let _ = writeln!(
            s,
            "  {:<10} {:>5} {:>6.0} W  {:<wide$}  {:<22} {}",
            rack,
            gpus.len(),
            watts,
            rule,
            cap.since.to_string(),
            cap.lease_until
        );
    }
}

fn holds(s: &mut String, holds: &std::collections::BTreeMap<String, policies::Hold>) {
    if holds.is_empty() {
        let _ = writeln!(s, "  none");
        return;
    }
    let wide = holds
        .values()
        .map(|h| h.rule.len())
        .max()
        .unwrap_or(0)
        .max(14);
    let _ = writeln!(
        s,
        "  {:<20} {:<wide$}  {:<22} {:<22} REASON",
        "JOB", "RULE", "SINCE", "LEASE UNTIL"
    );
    for (job, h) in holds {
        let _ = writeln!(
            s,
            "  {:<20} {:<wide$}  {:<22} {:<22} {}",
            job,
            h.rule,
            h.since.to_string(),
            h.lease_until.to_string(),
            h.reason
        );
    }
}

/// The report as JSON: the plan (decisions and state, as the engine gives them), caps
/// grouped by rack, and the rules in observe mode. Its `state` can be passed back as
/// `--state` to explain the next tick.
pub fn json(policy_file: &str, policy: &Policy, w: &World, plan: &Plan) -> serde_json::Value {
    let groups = |caps: &policies::GpuMap<policies::Cap>| {
        caps_by_rack(&w.site, caps)
            .into_iter()
            .map(|(rack, rule, watts, gpus, cap)| {
                json!({
                    "rack": rack,
                    "rule": rule,
                    "watts": watts,
                    "gpus": gpus,
                    "since": cap.since,
                    "lease_until": cap.lease_until,
                })
            })
            .collect::<Vec<_>>()
    };
    let (observe, disabled) = rule_modes(policy);
    json!({
        "policy": policy_file,
        "site": w.site.name,
        "at": w.now,
        "decisions": plan.decisions,
        "caps_by_rack": groups(&plan.state.caps),
        "holds": plan.state.holds,
        "observed_caps_by_rack": groups(&plan.state.observed_caps),
        "observed_holds": plan.state.observed_holds,
        "observe_mode": observe,
        "disabled": disabled,
        "state": plan.state,
    })
}
