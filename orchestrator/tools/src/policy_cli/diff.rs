//! `powerplane policy diff OLD NEW`: both policies on the same inputs; what would
//! change in the file (rules added, removed, changed) and in the plan (GPUs whose cap
//! differs, by rack; jobs held by one and not the other).

use std::collections::BTreeMap;
use std::fmt::Write;

use policies::{Cap, Hold, Plan, Policy};
use serde_json::Value;

use super::{cap_text, units, World};

/// What differs between two policies' files and plans.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diff {
    /// `added NAME`, `removed NAME`, `changed NAME: field OLD → NEW, ...`.
    pub rules: Vec<String>,
    /// Per rack: (GPUs, old cap, new cap).
    pub caps: Vec<(String, usize, String, String)>,
    /// Same for caps of rules in observe mode.
    pub observed_caps: Vec<(String, usize, String, String)>,
    /// (job, old, new): who holds it.
    pub holds: Vec<(String, String, String)>,
    pub observed_holds: Vec<(String, String, String)>,
    /// Per rack: (GPUs, old clock lock, new clock lock).
    pub clocks: Vec<(String, usize, String, String)>,
    /// (job, old, new): who suspends it.
    pub suspended: Vec<(String, String, String)>,
}

impl Diff {
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
            && self.caps.is_empty()
            && self.observed_caps.is_empty()
            && self.holds.is_empty()
            && self.observed_holds.is_empty()
            && self.clocks.is_empty()
            && self.suspended.is_empty()
    }
}

/// Compares two policies and their plans on the same world.
/// `old` and `new` are the policies with their texts.
pub fn diff(old: (&Policy, &str), new: (&Policy, &str), w: &World, a: &Plan, b: &Plan) -> Diff {
    let mut r = rules(old.0, new.0);
    r.extend(rule_tables(old, new));
    Diff {
        rules: r,
        caps: caps(w, &a.state.caps, &b.state.caps),
        observed_caps: caps(w, &a.state.observed_caps, &b.state.observed_caps),
        holds: holds(&a.state.holds, &b.state.holds, "held"),
        observed_holds: holds(&a.state.observed_holds, &b.state.observed_holds, "held"),
        clocks: by_rack(
            w,
            |id| a.state.clocks.get(id),
            |id| b.state.clocks.get(id),
            "unlocked",
            |c| (format!("{:.0} MHz ({})", c.mhz, c.rule), c.mhz),
        ),
        suspended: holds(&a.state.suspended, &b.state.suspended, "suspended"),
    }
}

/// Rules added, removed and changed, compared as parsed (defaults filled in), so a
/// comment or a default written out is no change.
pub fn rules(old: &Policy, new: &Policy) -> Vec<String> {
    let a: BTreeMap<String, Value> = units(&serde_json::to_value(old).unwrap_or(Value::Null))
        .into_iter()
        .collect();
    let b: BTreeMap<String, Value> = units(&serde_json::to_value(new).unwrap_or(Value::Null))
        .into_iter()
        .collect();
    let mut out = Vec::new();
    for (name, va) in &a {
        match b.get(name) {
            None => out.push(format!("removed {name}")),
            Some(vb) if vb != va => {
                let (mut fa, mut fb) = (BTreeMap::new(), BTreeMap::new());
                flatten("", va, &mut fa);
                flatten("", vb, &mut fb);
                let mut fields = Vec::new();
                let keys: std::collections::BTreeSet<&String> =
                    fa.keys().chain(fb.keys()).collect();
                for k in keys {
                    let (x, y) = (fa.get(k), fb.get(k));
                    if x != y {
                        let show =
                            |v: Option<&Value>| v.map_or("(none)".to_string(), |v| v.to_string());
                        let field = if k.is_empty() {
                            name.clone()
                        } else {
                            k.clone()
                        };
                        fields.push(format!("{field} {} → {}", show(x), show(y)));
                    }
                }
                out.push(format!("changed {name}: {}", fields.join(", ")));
            }
            Some(_) => {}
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        out.push(format!("added {name}"));
    }
    out
}

/// The `[[rules]]` added, removed and changed, by name: changed as the engine sees them
/// (positions in the file aside), described by the keys of their tables as written.
pub fn rule_tables(old: (&Policy, &str), new: (&Policy, &str)) -> Vec<String> {
    let compiled = |p: &Policy| -> BTreeMap<String, policies::rules::Rule> {
        p.rules
            .iter()
            .map(|r| {
                let mut r = r.clone();
                (r.at, r.select_at, r.action_at) = (0, 0, 0);
                (r.name.clone(), r)
            })
            .collect()
    };
    let written = |src: &str| -> BTreeMap<String, Value> {
        let t: toml::Table = toml::from_str(src).unwrap_or_default();
        let mut out = BTreeMap::new();
        if let Some(toml::Value::Array(rules)) = t.get("rules") {
            for r in rules {
                let v = serde_json::to_value(r).unwrap_or(Value::Null);
                if let Some(name) = v.get("name").and_then(Value::as_str) {
                    out.insert(name.to_string(), v.clone());
                }
            }
        }
        out
    };
    let (a, b) = (compiled(old.0), compiled(new.0));
    let (wa, wb) = (written(old.1), written(new.1));
    let mut out = Vec::new();
    for (name, ra) in &a {
        match b.get(name) {
            None => out.push(format!("removed rules.{name}")),
            Some(rb) if rb != ra => {
                let (mut fa, mut fb) = (BTreeMap::new(), BTreeMap::new());
                flatten("", wa.get(name).unwrap_or(&Value::Null), &mut fa);
                flatten("", wb.get(name).unwrap_or(&Value::Null), &mut fb);
                let keys: std::collections::BTreeSet<&String> =
                    fa.keys().chain(fb.keys()).collect();
                let fields: Vec<String> = keys
                    .into_iter()
                    .filter(|k| fa.get(*k) != fb.get(*k))
                    .map(|k| {
                        let show = |v: Option<&Value>| {
                            v.map_or("(default)".to_string(), |v| v.to_string())
                        };
                        format!("{k} {} → {}", show(fa.get(k)), show(fb.get(k)))
                    })
                    .collect();
                out.push(format!("changed rules.{name}: {}", fields.join(", ")));
            }
            Some(_) => {}
        }
    }
    for name in b.keys().filter(|n| !a.contains_key(*n)) {
        out.push(format!("added rules.{name}"));
    }
    out
}

fn flatten(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&p, x, out);
            }
        }
        _ => {
            out.insert(prefix.to_string(), v.clone());
        }
    }
}

fn caps(
    w: &World,
    a: &policies::GpuMap<Cap>,
    b: &policies::GpuMap<Cap>,
) -> Vec<(String, usize, String, String)> {
    by_rack(
        w,
        |id| a.get(id),
        |id| b.get(id),
        "uncapped",
        |c| (cap_text(Some(c)), c.watts),
    )
}

/// GPUs whose entry differs, grouped by rack and by old and new text; `show` gives an
/// entry's text and value (the same text within 0.5 of the value is no change), `none`
/// the text for no entry.
fn by_rack<'m, T: 'm>(
    w: &World,
    a: impl Fn(&telemetry::EntityId) -> Option<&'m T>,
    b: impl Fn(&telemetry::EntityId) -> Option<&'m T>,
    none: &str,
    show: impl Fn(&T) -> (String, f64),
) -> Vec<(String, usize, String, String)> {
    let mut out: Vec<(String, usize, String, String)> = Vec::new();
    for g in w.site.gpus() {
        let (x, y) = (a(&g.id).map(&show), b(&g.id).map(&show));
        let same = match (&x, &y) {
            (None, None) => true,
            (Some(x), Some(y)) => (x.1 - y.1).abs() < 0.5 && x.0 == y.0,
            _ => false,
        };
        if same {
            continue;
        }
        let text = |v: Option<(String, f64)>| v.map_or(none.to_string(), |v| v.0);
        let (tx, ty) = (text(x), text(y));
        match out
            .iter_mut()
            .find(|e| e.0 == g.rack.id && e.2 == tx && e.3 == ty)
        {
            Some(e) => e.1 += 1,
            None => out.push((g.rack.id.clone(), 1, tx, ty)),
        }
    }
    out
}

/// Jobs held (or suspended: `verb`) by one and not the other, or by another rule.
fn holds(
    a: &BTreeMap<String, Hold>,
    b: &BTreeMap<String, Hold>,
    verb: &str,
) -> Vec<(String, String, String)> {
    let show =
        |h: Option<&Hold>| h.map_or(format!("not {verb}"), |h| format!("{verb} ({})", h.rule));
    let jobs: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    jobs.into_iter()
        .filter(|j| a.get(*j).map(|h| &h.rule) != b.get(*j).map(|h| &h.rule))
        .map(|j| ((*j).clone(), show(a.get(j)), show(b.get(j))))
        .collect()
}

/// The diff as text.
pub fn text(old_file: &str, new_file: &str, w: &World, d: &Diff) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "--- {old_file}\n+++ {new_file}\nat {} on site {}",
        w.now, w.site.name
    );
    if d.is_empty() {
        let _ = writeln!(s, "\nno difference: same rules, same plan");
        return s;
    }
    if !d.rules.is_empty() {
        let _ = writeln!(s, "\nRULES");
        for r in &d.rules {
            let _ = writeln!(s, "  {r}");
        }
    }
    let cap_block = |s: &mut String, title: &str, caps: &[(String, usize, String, String)]| {
        if caps.is_empty() {
            return;
        }
        let wide = caps
            .iter()
            .map(|c| c.2.chars().count())
            .max()
            .unwrap_or(0)
            .max(24);
        let _ = writeln!(s, "\n{title}");
        let _ = writeln!(s, "  {:<10} {:>5}  {:<wide$}  NEW", "RACK", "GPUS", "OLD");
        for (rack, n, a, b) in caps {
            let _ = writeln!(s, "  {rack:<10} {n:>5}  {a:<wide$}  {b}");
        }
    };
    cap_block(&mut s, "CAPS (GPUs whose cap differs)", &d.caps);
    cap_block(
        &mut s,
        "OBSERVED CAPS (rules in observe mode)",
        &d.observed_caps,
    );
    let hold_block = |s: &mut String, title: &str, holds: &[(String, String, String)]| {
        if holds.is_empty() {
            return;
        }
        let wide = holds
            .iter()
            .map(|h| h.1.chars().count())
            .max()
            .unwrap_or(0)
            .max(24);
        let _ = writeln!(s, "\n{title}");
        let _ = writeln!(s, "  {:<20} {:<wide$}  NEW", "JOB", "OLD");
        for (job, a, b) in holds {
            let _ = writeln!(s, "  {job:<20} {a:<wide$}  {b}");
        }
    };
    cap_block(&mut s, "CLOCKS (GPUs whose clock lock differs)", &d.clocks);
    hold_block(
        &mut s,
        "HOLDS (jobs held by one and not the other)",
        &d.holds,
    );
    hold_block(&mut s, "OBSERVED HOLDS", &d.observed_holds);
    hold_block(&mut s, "SUSPENDED JOBS", &d.suspended);
    if d.caps.is_empty() && d.holds.is_empty() && d.clocks.is_empty() && d.suspended.is_empty() {
        let _ = writeln!(s, "\nthe plan in force is the same on these inputs");
    }
    s
}

/// The diff as JSON.
pub fn json(old_file: &str, new_file: &str, w: &World, d: &Diff) -> Value {
    let caps = |c: &[(String, usize, String, String)]| {
        c.iter()
            .map(|(r, n, a, b)| serde_json::json!({"rack": r, "gpus": n, "old": a, "new": b}))
            .collect::<Vec<_>>()
    };
    let holds = |h: &[(String, String, String)]| {
        h.iter()
            .map(|(j, a, b)| serde_json::json!({"job": j, "old": a, "new": b}))
            .collect::<Vec<_>>()
    };
    serde_json::json!({
        "old": old_file,
        "new": new_file,
        "at": w.now,
        "same": d.is_empty(),
        "rules": d.rules,
        "caps": caps(&d.caps),
        "observed_caps": caps(&d.observed_caps),
        "holds": holds(&d.holds),
        "observed_holds": holds(&d.observed_holds),
        "clocks": caps(&d.clocks),
        "suspended": holds(&d.suspended),
    })
}
