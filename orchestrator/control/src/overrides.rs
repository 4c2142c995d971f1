//! Manual overrides an operator sets through the API, each with an expiry: pin a
//! rack's GPUs at a cap, or exempt a job from holds. They act on what is actuated, not
//! on the engine's memory, so the policy's own state never learns them and nothing
//! flaps when they end. The most protective cap still wins: a pin never raises a cap
//! the policy set lower, and it is clamped into each GPU's constraints.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use policies::plan::{Action, Cap, Target};
use policies::{Decision, State};
use serde::{Deserialize, Serialize};
use telemetry::{EntityId, EntityKind, Site, Timestamp};

/// What an override does.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum What {
    /// Cap every GPU of the rack at `watts_per_gpu` (or lower, if the policy says so).
    PinRackCap { rack: String, watts_per_gpu: f64 },
    /// Never hold this job.
    ExemptJob { job: String },
}

/// One override in force.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Override {
    pub id: String,
    #[serde(flatten)]
    pub what: What,
    pub until: Timestamp,
    pub set_at: Timestamp,
    /// The name of the token that set it.
    pub by: String,
    #[serde(default)]
    pub reason: String,
}

/// A request to set one.
#[derive(Debug, Clone, Deserialize)]
pub struct Request {
    #[serde(flatten)]
    pub what: What,
    /// How long it lasts (at most 7 days).
    pub for_s: f64,
    #[serde(default)]
    pub reason: String,
}

pub const MAX_FOR_S: f64 = 7.0 * 86_400.0;

/// Why a request body is not a request.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("{0}")]
    Json(#[source] serde_json::Error),
    #[error("unknown field `{field}` (known: {known})")]
    UnknownField { field: String, known: String },
}

/// Why a request does not fit the site.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refused {
    #[error("for_s must be within 0 < for_s <= {MAX_FOR_S} (7 days), got {0}")]
    Duration(f64),
    #[error("no rack {0:?} in the site")]
    NoRack(String),
    #[error("watts_per_gpu must be above 0, got {0}")]
    Watts(f64),
    #[error("job must name a job (e.g. slurm:1234)")]
    NoJob,
}

/// Why the overrides file cannot be read or written.
pub use crate::json_list::ListFileError as BookError;

impl Request {
    /// Parses a request body; a member it does not know is an error (a typo must not
    /// silently set something else).
    pub fn parse(body: &[u8]) -> Result<Request, RequestError> {
        let v: serde_json::Value = serde_json::from_slice(body).map_err(RequestError::Json)?;
        let known = ["kind", "rack", "watts_per_gpu", "job", "for_s", "reason"];
        if let Some(bad) = v
            .as_object()
            .and_then(|o| o.keys().find(|k| !known.contains(&k.as_str())))
        {
            return Err(RequestError::UnknownField {
                field: bad.clone(),
                known: known.join(", "),
            });
        }
        serde_json::from_value(v).map_err(RequestError::Json)
    }
}

impl Request {
    /// Checks a request against the site; the override it makes.
    pub fn accept(
        self,
        site: &Site,
        now: Timestamp,
        by: &str,
        id: String,
    ) -> Result<Override, Refused> {
        if !(self.for_s.is_finite() && self.for_s > 0.0 && self.for_s <= MAX_FOR_S) {
            return Err(Refused::Duration(self.for_s));
        }
        match &self.what {
            What::PinRackCap {
                rack,
                watts_per_gpu,
            } => {
                if site.rack(rack).is_none() {
                    return Err(Refused::NoRack(rack.clone()));
                }
                if !(watts_per_gpu.is_finite() && *watts_per_gpu > 0.0) {
                    return Err(Refused::Watts(*watts_per_gpu));
                }
            }
            What::ExemptJob { job } => {
                if job.trim().is_empty() {
                    return Err(Refused::NoJob);
                }
            }
        }
        Ok(Override {
            id,
            what: self.what,
            until: now.plus_secs(self.for_s),
            set_at: now,
            by: by.to_string(),
            reason: self.reason,
        })
    }
}

/// What is actuated: the plan's state with the overrides in force at `now` applied.
pub fn apply(plan: &State, overrides: &[Override], site: &Site, now: Timestamp) -> State {
    let mut out = plan.clone();
    for o in overrides.iter().filter(|o| o.until > now) {
        match &o.what {
            What::PinRackCap {
                rack,
                watts_per_gpu,
            } => {
                for g in site.gpus().into_iter().filter(|g| &g.rack.id == rack) {
                    let w = g.model.clamp_limit(*watts_per_gpu);
                    let lower = out.caps.get(&g.id).is_none_or(|c| c.watts > w);
                    if lower {
                        out.caps.insert(
                            EntityId::clone(&g.id),
                            Cap {
                                watts: w,
                                rule: format!("override.{}", o.id).into(),
                                since: o.set_at,
                                lease_until: o.until,
                            },
                        );
                    }
                }
            }
            What::ExemptJob { job } => {
                out.holds.remove(job);
            }
        }
    }
    out
}

/// GPUs whose override cap started, per (rule, watts as bits).
type Started = BTreeMap<(Arc<str>, u64), Vec<EntityId>>;
/// GPUs whose override cap ended, per rule.
type Ended = BTreeMap<Arc<str>, Vec<EntityId>>;

/// Audit records for the override caps and exemptions that start or end between two
/// actuated states.
pub fn decisions(
    before: &State,
    after: &State,
    overrides: &[Override],
    now: Timestamp,
) -> Vec<Decision> {
    let (started, ended) = changed_caps(before, after);
    let mut out = Vec::new();
    for ((rule, bits), gpus) in started {
        out.push(cap_started(overrides, rule, bits, gpus, now));
    }
    for (rule, gpus) in ended {
        out.push(cap_ended(overrides, rule, gpus, now));
    }
    for job in before.holds.keys().filter(|j| {
        !after.holds.contains_key(*j)
            && overrides
                .iter()
                .any(|o| matches!(&o.what, What::ExemptJob { job: x } if x == *j))
    }) {
        out.push(exempted(job, now));
    }
    out
}

/// The override caps (rule, watts as bits) of a GPU's cap, if an override set it.
fn override_cap(c: Option<&Cap>) -> Option<(Arc<str>, u64)> {
    c.filter(|c| c.rule.starts_with("override."))
        .map(|c| (c.rule.clone(), c.watts.to_bits()))
}

/// The GPUs whose override cap started, and those whose override cap ended.
fn changed_caps(before: &State, after: &State) -> (Started, Ended) {
    let mut started = Started::new();
    let mut ended = Ended::new();
    for (g, c) in &after.caps {
        if let Some(k) = override_cap(Some(c)) {
            if override_cap(before.caps.get(g)) != Some(k.clone()) {
                started.entry(k).or_default().push(g.clone());
            }
        }
    }
    for (g, c) in &before.caps {
        if let Some((rule, _)) = override_cap(Some(c)) {
            if override_cap(after.caps.get(g)).is_none_or(|(r, _)| r != rule) {
                ended.entry(rule).or_default().push(g.clone());
            }
        }
    }
    (started, ended)
}

/// The override a cap's rule names.
fn find<'a>(overrides: &'a [Override], rule: &str) -> Option<&'a Override> {
    overrides
        .iter()
        .find(|o| format!("override.{}", o.id) == rule)
}

/// The entity an override's decisions are about: its rack, else the site.
fn entity(o: Option<&Override>) -> EntityId {
    match o.map(|o| &o.what) {
        Some(What::PinRackCap { rack, .. }) => EntityId::new(EntityKind::Rack, rack.clone()),
        _ => EntityId::new(EntityKind::Site, "override"),
    }
}

fn cap_started(
    overrides: &[Override],
    rule: Arc<str>,
    bits: u64,
    gpus: Vec<EntityId>,
    now: Timestamp,
) -> Decision {
    let o = find(overrides, &rule);
    Decision {
        time: now,
        rule: rule.to_string(),
        target: Target::Gpus {
            entity: entity(o),
            gpus,
        },
        action: Action::Cap {
            watts: f64::from_bits(bits),
        },
        values: BTreeMap::new(),
        reason: o.map_or("override".into(), |o| {
            format!("pinned by {} until {}: {}", o.by, o.until, o.reason)
        }),
        observe_only: false,
        release: String::new(),
    }
}

fn cap_ended(
    overrides: &[Override],
    rule: Arc<str>,
    gpus: Vec<EntityId>,
    now: Timestamp,
) -> Decision {
    Decision {
        time: now,
        rule: rule.to_string(),
        target: Target::Gpus {
            entity: entity(find(overrides, &rule)),
            gpus,
        },
        action: Action::Uncap,
        values: BTreeMap::new(),
        reason: "the override ended or was removed; the policy's caps apply".into(),
        observe_only: false,
        release: String::new(),
    }
}

fn exempted(job: &str, now: Timestamp) -> Decision {
    Decision {
        time: now,
        rule: "override.exempt".into(),
        target: Target::Job {
            job: job.to_string(),
        },
        action: Action::Release,
        values: BTreeMap::new(),
        reason: "exempted from holds by an operator".into(),
        observe_only: false,
        release: String::new(),
    }
}

/// The store's collection of the overrides (with `[ha]`): one record, the whole list
/// (see [`crate::acks::write_list`]).
pub const COLLECTION: &str = "overrides";

/// Overrides kept in a JSON file, so that a restart keeps them.
#[derive(Debug)]
pub struct Book {
    path: Option<PathBuf>,
    pub list: Vec<Override>,
    next: u64,
    /// The changes made through the API, and how many the store holds (with `[ha]`,
    /// a change is answered once it is stored).
    pub acks: crate::acks::Acks,
}

impl Book {
    /// Loads the file (missing: empty).
    pub fn open(path: Option<&Path>) -> Result<Book, BookError> {
        let list: Vec<Override> = crate::json_list::read(path)?;
        let next = crate::json_list::highest_id(list.iter().map(|o| o.id.as_str()), "o");
        Ok(Book {
            path: path.map(Path::to_path_buf),
            list,
            next,
            acks: Default::default(),
        })
    }

    pub fn next_id(&mut self) -> String {
        self.next += 1;
        format!("o{}", self.next)
    }

    /// Takes the list the store holds (a new leader, a follower mirroring it), saving
    /// it to the file; ids go on above every id seen. True when it changed.
    pub fn replace(&mut self, list: &[Override]) -> bool {
        if self.list == list {
            return false;
        }
        self.list = list.to_vec();
        let top = crate::json_list::highest_id(list.iter().map(|o| o.id.as_str()), "o");
        self.next = self.next.max(top);
        true
    }

    /// Drops the expired ones; true when something changed.
    pub fn expire(&mut self, now: Timestamp) -> bool {
        let n = self.list.len();
        self.list.retain(|o| o.until > now);
        n != self.list.len()
    }

    pub fn save(&self) -> Result<(), BookError> {
        crate::json_list::write(self.path.as_deref(), &self.list)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use policies::plan::Hold;

    const SITE: &str = "version = 1\n[site]\nname = \"t\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\", \"r2\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n[[racks]]\nid = \"r2\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n";

    fn t(s: f64) -> Timestamp {
        Timestamp::from_secs(1_790_000_000).plus_secs(s)
    }

    #[test]
    fn a_pin_caps_the_rack_never_raises_a_lower_cap_and_ends_on_time() {
        let site = Site::parse("t.toml", SITE).expect("site");
        let g = site.gpus();
        let mut plan = State::default();
        plan.caps.insert(
            g[0].id.clone().into_owned(),
            Cap {
                watts: 150.0,
                rule: "budget.rack".into(),
                since: t(0.0),
                lease_until: t(60.0),
            },
        );
        let pin = Request {
            what: What::PinRackCap {
                rack: "r1".into(),
                watts_per_gpu: 200.0,
            },
            for_s: 600.0,
            reason: "PDU work".into(),
        }
        .accept(&site, t(0.0), "sre", "o1".into())
        .expect("valid");
        let s = apply(&plan, std::slice::from_ref(&pin), &site, t(10.0));
        assert_eq!(s.caps[&g[0].id].watts, 150.0, "the policy's lower cap wins");
        assert_eq!(s.caps[&g[1].id].watts, 200.0);
        assert_eq!(&*s.caps[&g[1].id].rule, "override.o1");
        assert!(!s.caps.contains_key(&g[2].id), "other racks untouched");
        assert_eq!(
            apply(&plan, std::slice::from_ref(&pin), &site, t(601.0)),
            plan,
            "expired: no effect"
        );
        // clamped into the GPU's constraints
        let low = Request {
            what: What::PinRackCap {
                rack: "r2".into(),
                watts_per_gpu: 10.0,
            },
            for_s: 60.0,
            reason: String::new(),
        }
        .accept(&site, t(0.0), "sre", "o2".into())
        .expect("valid");
        assert_eq!(
            apply(&plan, &[low], &site, t(1.0)).caps[&g[2].id].watts,
            100.0
        );
    }

    #[test]
    fn an_exempt_job_is_released_and_bad_requests_say_why() {
        let site = Site::parse("t.toml", SITE).expect("site");
        let mut plan = State::default();
        plan.holds.insert(
            "slurm:7".into(),
            Hold {
                rule: "price".into(),
                since: t(0.0),
                lease_until: t(600.0),
                reason: "expensive".into(),
            },
        );
        let ex = Request {
            what: What::ExemptJob {
                job: "slurm:7".into(),
            },
            for_s: 60.0,
            reason: String::new(),
        }
        .accept(&site, t(0.0), "sre", "o1".into())
        .expect("valid");
        assert!(apply(&plan, &[ex], &site, t(1.0)).holds.is_empty());
        for (r, says) in [
            (
                Request {
                    what: What::PinRackCap {
                        rack: "zz".into(),
                        watts_per_gpu: 200.0,
                    },
                    for_s: 60.0,
                    reason: String::new(),
                },
                "no rack",
            ),
            (
                Request {
                    what: What::PinRackCap {
                        rack: "r1".into(),
                        watts_per_gpu: -1.0,
                    },
                    for_s: 60.0,
                    reason: String::new(),
                },
                "above 0",
            ),
            (
                Request {
                    what: What::ExemptJob { job: "x".into() },
                    for_s: 1e9,
                    reason: String::new(),
                },
                "7 days",
            ),
        ] {
            let e = r
                .accept(&site, t(0.0), "sre", "o".into())
                .expect_err("refused");
            assert!(e.to_string().contains(says), "{e}");
        }
    }

    #[test]
    fn the_book_survives_a_restart_and_ids_keep_counting() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("overrides.json");
        let site = Site::parse("t.toml", SITE).expect("site");
        let mut b = Book::open(Some(&p)).expect("open");
        let id = b.next_id();
        b.list.push(
            Request {
                what: What::ExemptJob {
                    job: "slurm:1".into(),
                },
                for_s: 60.0,
                reason: String::new(),
            }
            .accept(&site, t(0.0), "sre", id)
            .expect("ok"),
        );
        b.save().expect("save");
        let mut again = Book::open(Some(&p)).expect("reopen");
        assert_eq!(again.list.len(), 1);
        assert_eq!(again.next_id(), "o2");
        assert!(again.expire(t(61.0)));
        assert!(again.list.is_empty());
    }
}
