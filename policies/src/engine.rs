//! The engine: runs every rule on the inputs and merges their wishes into one plan.
//!
//! Conflicts: for each GPU the lowest cap any enforcing rule wants is the one in force
//! (the most protective cap wins); it is clamped into the GPU's own constraints. Caps
//! fall at once and rise at most `raise_w_per_min`; changes under `deadband_w` are not
//! made. Rules in observe mode run the same way into a separate, never-actuated state.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use telemetry::site::GpuRef;
use telemetry::{EntityId, Job, Site, Snapshot, Timestamp};

use crate::budget::{self, ScopeView};
use crate::index::JobTable;
use crate::plan::ClockLock;
use crate::plan::{Action, Cap, Decision, Hold, Plan, State, Target};
use crate::policy::ThermalMode;
use crate::predictive;
use crate::price::{self, Verdict};
use crate::rules::Rule;
use crate::rules_eval;
use crate::thermal;
use crate::GpuMap;
use crate::Policy;

/// Everything the engine looks at.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    pub site: &'a Site,
    pub snapshot: &'a Snapshot,
    pub jobs: &'a [Job],
    /// What is in force now (the previous plan's state, as applied).
    pub prior: &'a State,
    pub policy: &'a Policy,
    /// Price and carbon forecasts (empty when there is no feed).
    pub forecast: &'a crate::Forecast,
    /// The jobs resolved at the edge (their allocated GPUs as GPU indexes, their ids to
    /// positions), where the caller keeps them with its jobs (the job registry does);
    /// `None`: the evaluation resolves them itself.
    pub job_table: Option<&'a JobTable>,
}

/// The values a rule looked at, what it says about them and what would release it.
type Explained = (BTreeMap<String, f64>, String, String);

/// Per (rule, scope): what explains a cap of the rule there. Keys borrow the rule ids
/// and the racks' scope names made once per evaluation.
type Why<'k> = BTreeMap<(&'k str, Cow<'k, str>), Explain>;

/// An explanation, or where to make it from when a cap decision needs it.
#[derive(Debug)]
enum Explain {
    Made(Explained),
    /// A budget scope: the budget's evaluation (the first or the feed-forward one) and
    /// the scope's view in it. Most scopes cap nothing: their texts are made only for
    /// the caps that change.
    Budget(usize, usize),
    /// An SRE rule's explanation: the rule's place among the rules run and the
    /// explanation's among its wants, made into texts only for the caps that change
    /// (a rule over every GPU explains itself in every rack, tick after tick).
    Rule(usize, usize),
}

/// Changed GPUs grouped by (rack, rule, new cap in tenths of a watt), with the rack's
/// index.
type Groups<'c> = Vec<((&'c str, &'c str, Option<i64>), usize, Vec<EntityId>)>;

/// A rule's wanted cap for one GPU, with what to say about it.
#[derive(Debug, Clone)]
struct Want<'r> {
    watts: f64,
    rule: &'r str,
    lease_s: f64,
}

/// Evaluates the policy. Pure: the same inputs and `now` give the same plan.
pub fn evaluate(inputs: &Inputs<'_>, now: Timestamp) -> Plan {
    let Inputs {
        site,
        snapshot,
        jobs,
        prior,
        policy,
        forecast,
        job_table,
    } = *inputs;
    let n = site.gpu_count();
    // wanted caps by GPU index
    let mut enforce: Vec<Option<Want>> = vec![None; n];
    // made on the first cap a rule in observe mode wants (most policies have none)
    let mut observe: Vec<Option<Want>> = Vec::new();
    let enabled: Vec<&Rule> = policy.rules.iter().filter(|r| r.enabled).collect();
    let ids: Vec<String> = enabled.iter().map(|r| r.id()).collect();
    // each rack's scope name (`rack/a01`), made once: explanations are keyed by it
    let rack_scopes: Vec<String> = site
        .racks
        .iter()
        .map(|r| EntityId::rack(&r.id).to_string())
        .collect();
    let site_scope = site.site_entity().to_string();
    let mut why: Why = BTreeMap::new();
    // each budget evaluation's scope views (explanations point into them)
    let mut budget_views: Vec<Vec<ScopeView>> = Vec::new();

    let mut next = State::default();
    let mut pacing = None;
    let mut planned_starts = BTreeMap::new();
    let mut predictions = BTreeMap::new();
    // the site's GPUs, listed once: every step below indexes into this
    let index = rules_eval::Index::new(site, site.gpus())
        .with_snapshot(snapshot)
        .with_job_table(jobs, job_table);
    let gpus = &index.gpus;
    let table = gpu_table(site, gpus);
    let prior_caps = by_index(&index, table, &prior.caps);
    let prepared = policy.budget.enabled.then(|| {
        let remembered = by_index(&index, table, &prior.uncapped_draws);
        budget::prepare(site, &index, jobs, remembered, &policy.budget, now)
    });
    let budget_at = |prepared: &budget::Prepared<'_>, starting: &BTreeSet<String>| {
        budget::evaluate(
            site,
            &index,
            prepared,
            snapshot,
            &prior_caps,
            jobs,
            prior,
            &policy.budget,
            starting,
            now,
        )
    };
    if let Some(prepared) = &prepared {
        let (wanted, views) = budget_at(prepared, &BTreeSet::new());
        pacing = views.last().map(|facility| price::Pacing {
            // release into half the room per tick: the rest is for what starts meanwhile
            headroom_w: 0.5
                * (facility.budget_kw * (1.0 - policy.budget.margin) - facility.demand_kw)
                * 1000.0,
            watts_per_gpu: typical_gpu_w(gpus),
            demand_w: facility.demand_kw * 1000.0,
        });
        budget_wants(
            policy,
            wanted,
            (budget_views.len(), &views),
            &rack_scopes,
            if policy.budget.observe {
                observed(&mut observe, n)
            } else {
                &mut enforce
            },
            &mut why,
        );
        budget_views.push(views);
    }
    if policy.thermal.enabled {
        let (levels, steps) = match policy.thermal.mode {
            ThermalMode::Reactive => thermal::evaluate(site, snapshot, prior, &policy.thermal, now),
            ThermalMode::Predictive => {
                let o = predictive::evaluate(
                    site,
                    &index,
                    snapshot,
                    jobs,
                    prior,
                    &prior_caps,
                    &policy.thermal,
                    policy.price.margin_s,
                    now,
                );
                next.thermal_models = o.fits;
                predictions = o.predictions;
                (o.levels, o.steps)
            }
        };
        let target = if policy.thermal.observe {
            observed(&mut observe, n)
        } else {
            &mut enforce
        };
        if !levels.is_empty() {
            // each rack's level looked up once, not once per GPU
            let fraction: Vec<Option<f64>> = site
                .racks
                .iter()
                .map(|r| levels.get(&r.id).map(|l| l.fraction))
                .collect();
            for (i, g) in gpus.iter().enumerate() {
                if let Some(f) = fraction[g.rack_index] {
                    offer(
                        target,
                        i,
                        g.model.default_w * f,
                        "thermal.inlet",
                        policy.thermal.lease_s,
                    );
                }
            }
        }
        for s in steps {
            let scope = match site.rack_index(&s.rack) {
                Some(r) => Cow::Borrowed(rack_scopes[r].as_str()),
                None => Cow::Owned(EntityId::rack(&s.rack).to_string()),
            };
            why.insert(
                ("thermal.inlet", scope),
                Explain::Made((s.values, s.reason, s.release)),
            );
        }
        next.thermal = levels;
    }

    // the SREs' rules
    let mut rule_wants: Vec<(&Rule, rules_eval::Wants)> = Vec::new();
    for (rule, id) in enabled.into_iter().zip(&ids) {
        let empty = crate::plan::RuleMemories::new();
        let memory = prior.rules.get(&rule.name).unwrap_or(&empty);
        let (wants, mem) = rules_eval::run(
            rule,
            &index,
            snapshot,
            forecast,
            jobs,
            memory,
            policy.price.margin_s,
            policy.price.max_defer_s,
            now,
        );
        if !mem.is_empty() {
            next.rules.insert(rule.name.clone(), mem);
        }
        let target = if rule.observe {
            observed(&mut observe, n)
        } else {
            &mut enforce
        };
        for &(g, watts) in &wants.caps {
            offer(target, g, watts, id, rule.lease_s);
        }
        let mut seen_racks: BTreeSet<usize> = BTreeSet::new();
        for (k, w) in wants.why.iter().enumerate() {
            for &r in &w.racks {
                // the first explanation of the rule in a rack is the one kept
                if !seen_racks.insert(r) {
                    continue;
                }
                let key = (id.as_str(), Cow::Borrowed(rack_scopes[r].as_str()));
                why.entry(key).or_insert(Explain::Rule(rule_wants.len(), k));
            }
        }
        rule_wants.push((rule, wants));
    }

    // the price rule's verdicts (its decisions are made below, after the caps')
    let mut price_out = None;
    let verdicts = if policy.price.enabled {
        let (mut verdicts, values, starts) = price::evaluate_with_starts(
            site,
            budget::facility_budget_kw(site, &policy.budget),
            snapshot,
            jobs,
            &index.allocations(jobs),
            prior,
            &policy.price,
            pacing,
            forecast,
            now,
        );
        merge_rule_holds(&mut verdicts, &index, prior, &rule_wants, now);
        price_out = Some((values, starts));
        verdicts
    } else {
        let mut verdicts = BTreeMap::new();
        for job in prior.holds.keys() {
            verdicts.insert(
                job.clone(),
                Verdict::Release {
                    reason: "price rule disabled".into(),
                },
            );
        }
        merge_rule_holds(&mut verdicts, &index, prior, &rule_wants, now);
        verdicts
    };
    // feed-forward: jobs whose hold ends this tick (an observe-only price rule keeps
    // none) may start before the next one; their power is reserved in every budget now,
    // before they start
    let keeps_holds = !(policy.price.enabled && policy.price.observe);
    let starting: BTreeSet<String> = prior
        .holds
        .keys()
        .filter(|j| !(keeps_holds && matches!(verdicts.get(*j), Some(Verdict::Hold(_)))))
        .cloned()
        .collect();
    if let Some(prepared) = prepared.as_ref().filter(|_| !starting.is_empty()) {
        let (wanted, views) = budget_at(prepared, &starting);
        budget_wants(
            policy,
            wanted,
            (budget_views.len(), &views),
            &rack_scopes,
            if policy.budget.observe {
                observed(&mut observe, n)
            } else {
                &mut enforce
            },
            &mut why,
        );
        budget_views.push(views);
    }
    let explain = Explainer {
        why: &why,
        rules: &rule_wants,
        budget_views: &budget_views,
        rack_scopes: &rack_scopes,
        site_scope: &site_scope,
        policy,
    };

    let mut decisions = Vec::new();
    let caps = settle(gpus, &prior_caps, &enforce, policy, now);
    if let Some(prepared) = &prepared {
        let draws = budget::remember_uncapped(&index, prepared, jobs, &prior_caps, &caps, now);
        next.uncapped_draws = to_map(site, table, gpus, draws);
    }
    cap_decisions(
        gpus,
        &prior_caps,
        &caps,
        &explain,
        false,
        now,
        &mut decisions,
    );
    next.caps = to_map(site, table, gpus, caps);
    let prior_observed = by_index(&index, table, &prior.observed_caps);
    // with no observed cap wanted or in force there are none after
    if !observe.is_empty() || prior_observed.iter().any(Option::is_some) {
        let observed = settle(
            gpus,
            &prior_observed,
            observed(&mut observe, n),
            policy,
            now,
        );
        cap_decisions(
            gpus,
            &prior_observed,
            &observed,
            &explain,
            true,
            now,
            &mut decisions,
        );
        next.observed_caps = to_map(site, table, gpus, observed);
    }

    clocks(&index, prior, &rule_wants, now, &mut next, &mut decisions);
    observed_rule_holds(prior, &rule_wants, now, &mut next, &mut decisions);
    preempt(jobs, prior, &rule_wants, now, &mut next, &mut decisions);

    if let Some((values, starts)) = price_out {
        planned_starts = starts;
        let observe_only = policy.price.observe;
        let (prior_holds, holds) = if observe_only {
            (&prior.observed_holds, &mut next.observed_holds)
        } else {
            (&prior.holds, &mut next.holds)
        };
        hold_decisions(
            &index,
            prior_holds,
            verdicts,
            &values,
            observe_only,
            now,
            holds,
            &mut decisions,
        );
    } else {
        hold_decisions(
            &index,
            &prior.holds,
            verdicts,
            &BTreeMap::new(),
            false,
            now,
            &mut next.holds,
            &mut decisions,
        );
    }
    // planned starts of jobs the plan holds (observe mode holds nothing)
    if policy.price.observe {
        planned_starts.clear();
    }
    planned_starts.retain(|job: &String, _| next.holds.contains_key(job));
    Plan {
        state: next,
        decisions,
        planned_starts,
        predictions,
    }
}

/// Offers the budget rule's wanted caps (to `target`: the enforced or the observed
/// caps) and records what each scope looked like.
/// `views` are the budget evaluation's scopes with the evaluation's number (see
/// [`Explain::Budget`]).
#[allow(clippy::too_many_arguments)]
fn budget_wants<'r, 'k>(
    policy: &'r Policy,
    wanted: Vec<Option<budget::BudgetCap>>,
    (set, views): (usize, &[ScopeView]),
    rack_scopes: &'k [String],
    target: &mut [Option<Want<'r>>],
    why: &mut Why<'k>,
) {
    for (i, w) in wanted.into_iter().enumerate() {
        if let Some(w) = w {
            offer(target, i, w.watts, w.rule, policy.budget.lease_s);
        }
    }
    // the racks each rule grouped by rack has explained in this call, a bit per rule: a
    // rack under many scopes of a kind (its branches, say) keeps the first one's, so
    // the others need no search of `why`
    let mut seen = vec![0u8; rack_scopes.len()];
    // (key, explanation, whether it replaces one already there)
    let mut made = Vec::new();
    for (k, v) in views.iter().enumerate() {
        let (rule, bit) = match v.scope.kind {
            telemetry::EntityKind::Site => ("budget.facility", 0),
            telemetry::EntityKind::Rack => ("budget.rack", 0),
            telemetry::EntityKind::Branch => ("budget.branch", 1),
            telemetry::EntityKind::Pdu => ("budget.pdu", 2),
            telemetry::EntityKind::Row => ("budget.row", 4),
            telemetry::EntityKind::Room => ("budget.room", 8),
            _ => ("budget.feed", 16),
        };
        if rule == "budget.facility" || rule == "budget.rack" {
            // a rack's scope name is made once per evaluation
            let name = match v.racks[..] {
                [r] if rule == "budget.rack"
                    && rack_scopes[r].strip_prefix("rack/") == Some(v.scope.name.as_str()) =>
                {
                    Cow::Borrowed(rack_scopes[r].as_str())
                }
                _ => Cow::Owned(v.scope.to_string()),
            };
            made.push(((rule, name), Explain::Budget(set, k), true));
        } else {
            // cap decisions are grouped by rack: explain each rack by its scope
            for &r in &v.racks {
                if seen[r] & bit != 0 {
                    continue;
                }
                seen[r] |= bit;
                made.push((
                    (rule, Cow::Borrowed(rack_scopes[r].as_str())),
                    Explain::Budget(set, k),
                    false,
                ));
            }
        }
    }
    if why.is_empty() {
        // made in one go (a key made twice keeps the last, as `insert` does; those that
        // do not replace are made once each)
        *why = made.into_iter().map(|(key, e, _)| (key, e)).collect();
    } else {
        for (key, e, replace) in made {
            if replace {
                why.insert(key, e);
            } else {
                why.entry(key).or_insert(e);
            }
        }
    }
}

/// Makes the explanation of a cap decision from what the evaluation recorded.
struct Explainer<'a, 'k> {
    why: &'a Why<'k>,
    /// The SRE rules' wants, as run ([`Explain::Rule`] points into them).
    rules: &'a [(&'a Rule, rules_eval::Wants)],
    budget_views: &'a [Vec<ScopeView>],
    rack_scopes: &'a [String],
    site_scope: &'a str,
    policy: &'a Policy,
}

impl Explainer<'_, '_> {
    /// Why `rule` caps in rack `rack` (for the facility budget: at the site).
    fn get(&self, rule: &str, rack: usize) -> Option<Explained> {
        let scope = if rule == "budget.facility" {
            self.site_scope
        } else {
            self.rack_scopes[rack].as_str()
        };
        Some(match self.why.get(&(rule, Cow::Borrowed(scope)))? {
            Explain::Made(e) => e.clone(),
            Explain::Rule(r, k) => {
                let w = &self.rules[*r].1.why[*k];
                (
                    w.values(),
                    format!("{}: {}", w.target, w.reason),
                    w.release.to_string(),
                )
            }
            Explain::Budget(set, k) => {
                let v = &self.budget_views[*set][*k];
                (
                    v.values(),
                    budget_reason(v),
                    budget_release(v, &self.policy.budget),
                )
            }
        })
    }
}

/// What a busy GPU of this site may draw, for pacing releases: its default limit plus
/// its share of its node's base power (the worst case, so releases never overshoot).
fn typical_gpu_w(gpus: &[GpuRef<'_>]) -> f64 {
    gpus.iter()
        .map(|g| g.model.default_w + g.node.base_w / f64::from(g.node.gpus.max(1)))
        .sum::<f64>()
        / gpus.len().max(1) as f64
}

/// The wanted caps of the rules in observe mode, made for `n` GPUs on first use.
fn observed<'a, 'r>(v: &'a mut Vec<Option<Want<'r>>>, n: usize) -> &'a mut [Option<Want<'r>>] {
    if v.len() != n {
        v.resize(n, None);
    }
    v
}

fn offer<'r>(map: &mut [Option<Want<'r>>], gpu: usize, watts: f64, rule: &'r str, lease_s: f64) {
    let slot = &mut map[gpu];
    match slot {
        Some(w) if w.watts <= watts => {}
        _ => {
            *slot = Some(Want {
                watts,
                rule,
                lease_s,
            })
        }
    }
}

fn budget_reason(v: &ScopeView) -> String {
    let what = if v.scope.kind == telemetry::EntityKind::Site {
        "facility".to_string()
    } else {
        v.scope.to_string()
    };
    let mut s = format!(
        "{what} demand {:.1} kW against budget {:.1} kW",
        v.demand_kw, v.budget_kw
    );
    if !v.feasible {
        s.push_str(" (not reachable even with every GPU at its minimum)");
    }
    if v.stale_inputs > 0 {
        s.push_str(&format!(
            " ({} stale GPU readings counted as their maximum)",
            v.stale_inputs
        ));
    }
    s
}

/// Turns wanted caps into caps in force: clamped, rate limited, with leases.
fn settle(
    gpus: &[GpuRef<'_>],
    prior: &[Option<&Cap>],
    wants: &[Option<Want<'_>>],
    policy: &Policy,
    now: Timestamp,
) -> Vec<Option<Cap>> {
    let b = &policy.budget;
    let mut out = Vec::with_capacity(gpus.len());
    let mut names = Names::default();
    for ((g, want), old) in gpus.iter().zip(wants).zip(prior) {
        let model = g.model;
        let old = *old;
        let want = want.as_ref();
        let current = old.map_or(model.default_w, |c| c.watts);
        let target = model.clamp_limit(want.map_or(model.default_w, |w| w.watts));
        let lease_s = want.map_or(b.lease_s, |w| w.lease_s);
        let rule: &str = want
            .map(|w| w.rule)
            .or_else(|| old.map(|c| &*c.rule))
            .unwrap_or_default();
        // the rule's name, shared: the old cap's where it is the same rule's
        let mut name = || match old {
            Some(c) if *c.rule == *rule => c.rule.clone(),
            _ => names.get(rule),
        };
        let keep = |c: &Cap, rule: Arc<str>| Cap {
            watts: c.watts,
            rule,
            since: c.since,
            lease_until: now + lease_s,
        };
        // a cap falls whenever a rule wants it lower (a budget must not be exceeded by
        // a deadband); only rises smaller than the deadband are skipped
        let cap = if target < current - 0.5 {
            Some(Cap {
                watts: target,
                rule: name(),
                since: now,
                lease_until: now + lease_s,
            })
        } else if target <= current {
            old.map(|c| keep(c, name()))
        } else {
            // rising: no faster than the rate limit allows since the last change
            let since = old.map_or(now, |c| c.since);
            let allowed = current + b.raise_w_per_min * now.secs_since(since).max(0.0) / 60.0;
            let new = target.min(allowed);
            if new >= model.default_w - 0.5 {
                None
            } else if new - current < b.deadband_w {
                old.map(|c| keep(c, name()))
            } else {
                Some(Cap {
                    watts: model.clamp_limit(new),
                    rule: name(),
                    since: now,
                    lease_until: now + lease_s,
                })
            }
        };
        out.push(cap);
    }
    out
}

/// Rule names made once per tick and shared by the caps of each rule.
#[derive(Default)]
struct Names(Vec<Arc<str>>);

impl Names {
    fn get(&mut self, name: &str) -> Arc<str> {
        match self.0.iter().find(|n| ***n == *name) {
            Some(n) => n.clone(),
            None => {
                let n: Arc<str> = Arc::from(name);
                self.0.push(n.clone());
                n
            }
        }
    }
}

fn cap_decisions(
    all: &[GpuRef<'_>],
    prior: &[Option<&Cap>],
    next: &[Option<Cap>],
    why: &Explainer<'_, '_>,
    observe_only: bool,
    now: Timestamp,
    out: &mut Vec<Decision>,
) {
    if prior.iter().all(Option::is_none) && next.iter().all(Option::is_none) {
        return;
    }
    // group changed GPUs by rack, rule and new value, in site order
    let mut groups: Groups = Vec::new();
    let mut at: std::collections::HashMap<(&str, &str, Option<i64>), usize> =
        std::collections::HashMap::new();
    // the group of the GPU before (a rack's GPUs come together and mostly share one)
    let mut last: Option<usize> = None;
    for ((g, old), new) in all.iter().zip(prior).zip(next) {
        let (old, new) = (*old, new.as_ref());
        let changed = match (old, new) {
            (None, None) => false,
            (Some(a), Some(b)) => (a.watts - b.watts).abs() >= 0.5,
            _ => true,
        };
        if !changed {
            continue;
        }
        let rule = new.or(old).map_or("", |c| &*c.rule);
        let key = (
            g.rack.id.as_str(),
            rule,
            new.map(|c| (c.watts * 10.0).round() as i64),
        );
        // the same rack (by index: no id compared), rule and value as the GPU before
        let same = |&i: &usize| {
            let ((_, r, w), rack, _) = &groups[i];
            *rack == g.rack_index && *r == rule && *w == key.2
        };
        if let Some(i) = last.filter(same) {
            groups[i].2.push(EntityId::clone(&g.id));
            continue;
        }
        let i = match at.get(&key) {
            Some(&i) => {
                groups[i].2.push(EntityId::clone(&g.id));
                i
            }
            None => {
                at.insert(key, groups.len());
                groups.push((key, g.rack_index, vec![EntityId::clone(&g.id)]));
                groups.len() - 1
            }
        };
        last = Some(i);
    }
    for ((rack, rule, watts), rack_index, gpus) in groups {
        let (values, reason, release_text) = why
            .get(rule, rack_index)
            .unwrap_or_else(|| (BTreeMap::new(), String::new(), String::new()));
        let (action, reason) = match watts {
            Some(w) => (
                Action::Cap {
                    watts: w as f64 / 10.0,
                },
                reason,
            ),
            None => (
                Action::Uncap,
                if reason.is_empty() {
                    "no rule wants a cap any more".to_string()
                } else {
                    reason
                },
            ),
        };
        out.push(Decision {
            time: now,
            rule: rule.to_string(),
            target: Target::Gpus {
                entity: EntityId::rack(rack),
                gpus,
            },
            release: if matches!(action, Action::Uncap) {
                String::new()
            } else {
                release_text
            },
            action,
            values,
            reason,
            observe_only,
        });
    }
}

#[allow(clippy::too_many_arguments)]
fn hold_decisions(
    index: &rules_eval::Index<'_>,
    prior: &BTreeMap<String, Hold>,
    verdicts: BTreeMap<String, Verdict>,
    values: &BTreeMap<String, f64>,
    observe_only: bool,
    now: Timestamp,
    holds: &mut BTreeMap<String, Hold>,
    out: &mut Vec<Decision>,
) {
    // the verdicts and the prior holds are both in job id order: walked side by side
    let mut prior_iter = prior.iter().peekable();
    let mut prior_hold = |job: &str| {
        while prior_iter.next_if(|(k, _)| k.as_str() < job).is_some() {}
        prior_iter
            .peek()
            .filter(|(k, _)| k.as_str() == job)
            .map(|&(_, h)| h)
    };
    // the holds kept, in id order (the map is made from them without a search per job)
    let mut kept: Vec<(String, Hold)> = Vec::new();
    for (job, v) in verdicts {
        let was = prior_hold(&job);
        match v {
            Verdict::Hold(h) => {
                if was.is_none() {
                    out.push(Decision {
                        time: now,
                        rule: h.rule.clone(),
                        target: Target::Job { job: job.clone() },
                        action: Action::Hold {
                            until: h.lease_until,
                        },
                        values: values.clone(),
                        reason: h.reason.clone(),
                        observe_only,
                        release: format!(
                            "when {} no longer wants it held; never past the job's latest start (deadline − estimated duration − margin)",
                            h.rule
                        ),
                    });
                }
                kept.push((job, h));
            }
            Verdict::Release { reason } => {
                let mut d = release(&job, &reason, values, observe_only, now);
                if let Some(h) = was {
                    d.rule = h.rule.clone();
                }
                out.push(d)
            }
        }
    }
    let mut kept: BTreeMap<String, Hold> = kept.into_iter().collect();
    holds.append(&mut kept);
    // prior holds of jobs no longer listed (each held id found in the jobs' table)
    for job in prior.keys() {
        if index.job_position(job).is_none() {
            out.push(release(
                job,
                "job is no longer known",
                values,
                observe_only,
                now,
            ));
        }
    }
}

fn release(
    job: &str,
    reason: &str,
    values: &BTreeMap<String, f64>,
    observe_only: bool,
    now: Timestamp,
) -> Decision {
    Decision {
        time: now,
        rule: "price.defer".into(),
        target: Target::Job {
            job: job.to_string(),
        },
        action: Action::Release,
        values: values.clone(),
        reason: reason.to_string(),
        observe_only,
        release: String::new(),
    }
}

#[cfg(test)]
mod tests;

/// What would lift a budget cap.
fn budget_release(v: &ScopeView, rule: &crate::policy::BudgetRule) -> String {
    format!(
        "demand under {:.1} kW ({}% of the budget)",
        v.budget_kw * rule.release_ratio,
        (rule.release_ratio * 100.0).round()
    )
}

/// Holds and releases wanted by rules, merged into the price rule's verdicts: a hold by
/// any rule keeps a job held; a `release` rule wins over every hold (it protects
/// something the SREs chose: a deadline, a class); holds placed by a rule that no
/// longer wants them are released.
fn merge_rule_holds(
    verdicts: &mut BTreeMap<String, Verdict>,
    index: &rules_eval::Index<'_>,
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
) {
    use telemetry::fasthash::FnvMap;
    let prior_holds = &prior.holds;
    // each job's first holding and first releasing rule (every job is merged on its
    // own: the order the jobs are visited in makes no difference)
    let mut held: FnvMap<&str, (&Rule, Timestamp)> = FnvMap::default();
    let mut exempt: FnvMap<&str, &Rule> = FnvMap::default();
    for (rule, w) in rules.iter().filter(|(r, _)| !r.observe) {
        for (job, until) in &w.holds {
            held.entry(job.as_str()).or_insert((rule, *until));
        }
        for job in &w.releases {
            exempt.entry(job.as_str()).or_insert(rule);
        }
    }
    // the rules' reasons, made when a rule's hold is the one kept
    let mut reasons: Option<FnvMap<(&str, &str), &str>> = None;
    for (job, (rule, until)) in held {
        if exempt.contains_key(job) {
            continue;
        }
        if let Some(Verdict::Hold(_)) = verdicts.get(job) {
            continue;
        }
        let since = prior_holds.get(job).map_or(now, |h| h.since);
        let reasons = reasons.get_or_insert_with(|| {
            rules
                .iter()
                .flat_map(|(r, w)| {
                    w.why.iter().filter_map(move |x| {
                        x.target
                            .strip_prefix("job/")
                            .map(|j| ((r.name.as_str(), j), &*x.reason))
                    })
                })
                .collect()
        });
        let reason = reasons
            .get(&(rule.name.as_str(), job))
            .map_or_else(|| rule.id(), |r| r.to_string());
        verdicts.insert(
            job.to_string(),
            Verdict::Hold(Hold {
                rule: rule.id(),
                since,
                lease_until: until,
                reason,
            }),
        );
    }
    for (job, rule) in exempt {
        let was_held = prior_holds.contains_key(job);
        match verdicts.get(job) {
            Some(Verdict::Hold(_)) | None if was_held => {
                verdicts.insert(
                    job.to_string(),
                    Verdict::Release {
                        reason: format!("released by rule {}", rule.name),
                    },
                );
            }
            Some(Verdict::Hold(_)) => {
                verdicts.remove(job);
            }
            _ => {}
        }
    }
    // holds of rules that no longer want them
    for (job, h) in prior_holds {
        if h.rule.starts_with("rules.") && !verdicts.contains_key(job) {
            let still = index.job_position(job).is_some();
            verdicts.insert(
                job.clone(),
                Verdict::Release {
                    reason: if still {
                        format!("{} no longer holds it", h.rule)
                    } else {
                        "job is no longer known".into()
                    },
                },
            );
        }
    }
}

/// Clock locks wanted by rules: the lowest clock wins, each with the rule's lease;
/// decisions per rack for what changed.
fn clocks(
    index: &rules_eval::Index<'_>,
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    let mut want: BTreeMap<usize, (f64, &Rule)> = BTreeMap::new();
    for (rule, w) in rules.iter().filter(|(r, _)| !r.observe) {
        for &(g, mhz) in &w.clocks {
            match want.get(&g) {
                Some((m, _)) if *m <= mhz => {}
                _ => {
                    want.insert(g, (mhz, rule));
                }
            }
        }
    }
    for (g, (mhz, rule)) in &want {
        let id = EntityId::clone(&index.gpus[*g].id);
        let since = prior
            .clocks
            .get(&id)
            .filter(|c| c.mhz == *mhz)
            .map_or(now, |c| c.since);
        next.clocks.insert(
            id,
            ClockLock {
                mhz: *mhz,
                rule: rule.id(),
                since,
                lease_until: now + rule.lease_s,
            },
        );
    }
    if prior.clocks.is_empty() && next.clocks.is_empty() {
        return;
    }
    // decisions grouped by rack and new value
    let mut groups: BTreeMap<(usize, String, Option<i64>), Vec<EntityId>> = BTreeMap::new();
    for g in &index.gpus {
        let (old, new) = (prior.clocks.get(&g.id), next.clocks.get(&g.id));
        let changed = match (old, new) {
            (None, None) => false,
            (Some(a), Some(b)) => a.mhz != b.mhz,
            _ => true,
        };
        if changed {
            let rule = new.or(old).map(|c| c.rule.clone()).unwrap_or_default();
            groups
                .entry((g.rack_index, rule, new.map(|c| c.mhz.round() as i64)))
                .or_default()
                .push(EntityId::clone(&g.id));
        }
    }
    for ((rack, rule, mhz), gpus) in groups {
        let w = rules
            .iter()
            .find(|(r, _)| r.id() == rule)
            .and_then(|(_, w)| w.why.iter().find(|x| x.racks.contains(&rack)));
        out.push(Decision {
            time: now,
            rule,
            target: Target::Gpus {
                entity: EntityId::rack(&index.site.racks[rack].id),
                gpus,
            },
            action: match mhz {
                Some(m) => Action::LockClocks { mhz: m as f64 },
                None => Action::UnlockClocks,
            },
            values: w.map(|w| w.values()).unwrap_or_default(),
            reason: w.map_or_else(
                || "no rule wants the clocks locked any more".to_string(),
                |w| w.reason.to_string(),
            ),
            release: w.map(|w| w.release.to_string()).unwrap_or_default(),
            observe_only: false,
        });
    }
}

/// Requeues and suspensions of preemptible jobs wanted by rules; a suspension ends when
/// no rule wants it (resume) or, for an agentless controller, when its lease runs out.
fn preempt(
    jobs: &[Job],
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    let why = |rule: &Rule, w: &rules_eval::Wants, job: &str| {
        w.why
            .iter()
            .find(|x| x.target.strip_prefix("job/") == Some(job))
            .map_or_else(
                || (BTreeMap::new(), rule.id(), String::new()),
                |x| (x.values(), x.reason.to_string(), x.release.to_string()),
            )
    };
    for (rule, w) in rules {
        for job in &w.requeues {
            let (values, reason, _) = why(rule, w, job);
            out.push(Decision {
                time: now,
                rule: rule.id(),
                target: Target::Job { job: job.clone() },
                action: Action::Requeue,
                values,
                reason,
                release: String::new(),
                observe_only: rule.observe,
            });
        }
        if rule.observe {
            continue;
        }
        for (job, until) in &w.suspends {
            if next.suspended.contains_key(job) {
                continue;
            }
            let (values, reason, release) = why(rule, w, job);
            let since = prior.suspended.get(job).map_or(now, |h| h.since);
            if !prior.suspended.contains_key(job) {
                out.push(Decision {
                    time: now,
                    rule: rule.id(),
                    target: Target::Job { job: job.clone() },
                    action: Action::Suspend { until: *until },
                    values,
                    reason: reason.clone(),
                    release,
                    observe_only: false,
                });
            }
            next.suspended.insert(
                job.clone(),
                Hold {
                    rule: rule.id(),
                    since,
                    lease_until: *until,
                    reason,
                },
            );
        }
    }
    // the jobs not done, listed once if a suspension ends
    let mut live: Option<telemetry::fasthash::FnvSet<&str>> = None;
    for (job, h) in &prior.suspended {
        if next.suspended.contains_key(job) {
            continue;
        }
        let known = live
            .get_or_insert_with(|| {
                jobs.iter()
                    .filter(|j| !j.state.is_done())
                    .map(|j| j.id.as_str())
                    .collect()
            })
            .contains(job.as_str());
        out.push(Decision {
            time: now,
            rule: h.rule.clone(),
            target: Target::Job { job: job.clone() },
            action: Action::Resume,
            values: BTreeMap::new(),
            reason: if known {
                format!("{} no longer wants it suspended", h.rule)
            } else {
                "job is no longer known".into()
            },
            release: String::new(),
            observe_only: false,
        });
    }
}
#[cfg(test)]
mod rules_tests;

/// What job rules in observe mode would hold: kept in `observed_holds` (never acted
/// on) with observe-only decisions when they start and end.
fn observed_rule_holds(
    prior: &State,
    rules: &[(&Rule, rules_eval::Wants)],
    now: Timestamp,
    next: &mut State,
    out: &mut Vec<Decision>,
) {
    for (rule, w) in rules.iter().filter(|(r, _)| r.observe) {
        for (job, until) in &w.holds {
            if next.observed_holds.contains_key(job) {
                continue;
            }
            let why = w
                .why
                .iter()
                .find(|x| x.target.strip_prefix("job/") == Some(job));
            let reason = why.map_or_else(|| rule.id(), |x| x.reason.to_string());
            let since = match prior.observed_holds.get(job) {
                Some(h) => h.since,
                None => {
                    out.push(Decision {
                        time: now,
                        rule: rule.id(),
                        target: Target::Job { job: job.clone() },
                        action: Action::Hold { until: *until },
                        values: why.map(|x| x.values()).unwrap_or_default(),
                        reason: reason.clone(),
                        release: why.map(|x| x.release.to_string()).unwrap_or_default(),
                        observe_only: true,
                    });
                    now
                }
            };
            next.observed_holds.insert(
                job.clone(),
                Hold {
                    rule: rule.id(),
                    since,
                    lease_until: *until,
                    reason,
                },
            );
        }
    }
    for (job, h) in &prior.observed_holds {
        if h.rule.starts_with("rules.") && !next.observed_holds.contains_key(job) {
            out.push(Decision {
                time: now,
                rule: h.rule.clone(),
                target: Target::Job { job: job.clone() },
                action: Action::Release,
                values: BTreeMap::new(),
                reason: format!("{} no longer holds it", h.rule),
                release: String::new(),
                observe_only: true,
            });
        }
    }
}

/// A per-GPU map as a list by the index of the evaluation's GPUs: read in place where
/// the map is laid out by the same GPUs (`table`), else each id found in the site.
fn by_index<'c, T>(
    index: &rules_eval::Index<'_>,
    table: Option<&std::sync::Arc<telemetry::site::GpuIds>>,
    map: &'c GpuMap<T>,
) -> Vec<Option<&'c T>> {
    let n = index.gpus.len();
    let same = matches!((table, map.table()), (Some(a), Some(b)) if std::sync::Arc::ptr_eq(a, b));
    let mut v: Vec<Option<&T>> = if same {
        map.by_gpu().iter().map(Option::as_ref).collect()
    } else {
        vec![None; n]
    };
    let by_id: Box<dyn Iterator<Item = (&EntityId, &T)>> = if same {
        Box::new(map.others().iter())
    } else {
        Box::new(map.iter())
    };
    for (id, c) in by_id {
        if let Some(i) = index.gpu_index(id) {
            v[i] = Some(c);
        }
    }
    v
}

/// The site's GPU id table, where the evaluation's GPUs are the ones it names (in
/// order): per-GPU state is then laid out by it.
fn gpu_table<'s>(
    site: &'s Site,
    gpus: &[GpuRef<'_>],
) -> Option<&'s std::sync::Arc<telemetry::site::GpuIds>> {
    site.gpu_table().filter(|t| {
        t.len() == gpus.len()
            && t.ids()
                .iter()
                .zip(gpus)
                .all(|(a, g)| std::ptr::eq(a, &*g.id) || *a == *g.id)
    })
}

/// A list by GPU index as a map by GPU id: laid out by the site's GPU table where
/// there is one, else keyed by id.
fn to_map<T>(
    site: &Site,
    table: Option<&std::sync::Arc<telemetry::site::GpuIds>>,
    gpus: &[GpuRef<'_>],
    mut caps: Vec<Option<T>>,
) -> GpuMap<T> {
    if let Some(t) = table.filter(|_| caps.len() == gpus.len()) {
        // an empty map holds no list
        if caps.iter().all(Option::is_none) {
            return GpuMap::new();
        }
        return GpuMap::by_index(t.clone(), caps);
    }
    let n = gpus.len().min(caps.len());
    let same = caps.len() == gpus.len();
    let mut entry = |i: usize| caps[i].take().map(|c| (EntityId::clone(&gpus[i].id), c));
    // in id order, the map is built without sorting
    let map: BTreeMap<EntityId, T> = match site.gpus_by_id() {
        order if order.len() == gpus.len() && same => {
            order.iter().filter_map(|&i| entry(i as usize)).collect()
        }
        _ => (0..n).filter_map(entry).collect(),
    };
    map.into()
}
