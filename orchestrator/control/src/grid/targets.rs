//! Load targets that do not come from a VTN: an operator's (`POST /api/v1/grid/targets`,
//! kept in a file so that a restart keeps them), and a file of scheduled targets an
//! operator edits (`[demand_response] targets_file`, reread when it changes). Both are
//! [`GridEvent`]s like a VTN's; [`publish`] says what the tick gives the engine of the
//! events in force.
//!
//! A target names its start (RFC 3339; an operator's defaults to now), its length and
//! exactly one of `shed_pct` (of the baseline), `shed_kw`, `cap_kw` (at the meter) or
//! `level` (a SIMPLE level, 1 to 3, shed as `[demand_response] levels` says).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use telemetry::grid::{self, EventStatus, GridEvent, GridInterval, GridTarget};
use telemetry::metric::names::{GRID_CAP_W, GRID_EVENT_ACTIVE, GRID_SHED_FRACTION, GRID_SHED_W};
use telemetry::{Sample, Site, Timestamp};

/// The longest target accepted: 7 days.
pub const MAX_DURATION_MIN: f64 = 7.0 * 24.0 * 60.0;

/// One target as an operator writes it (a request body, an entry of the file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TargetSpec {
    #[serde(default)]
    pub id: Option<String>,
    /// RFC 3339; an operator's target without one starts now.
    #[serde(default)]
    pub start: Option<String>,
    pub duration_min: f64,
    #[serde(default)]
    pub shed_pct: Option<f64>,
    #[serde(default)]
    pub shed_kw: Option<f64>,
    #[serde(default)]
    pub cap_kw: Option<f64>,
    #[serde(default)]
    pub level: Option<u8>,
    /// The programme or reason, shown with the event.
    #[serde(default)]
    pub reason: String,
}

/// Why a target is refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TargetError {
    #[error("give exactly one of shed_pct, shed_kw, cap_kw or level (got {0})")]
    Target(usize),
    #[error("shed_pct must be within 0 < shed_pct <= 100, got {0}")]
    ShedPct(f64),
    #[error("{key} must be above 0, got {value}")]
    Kw { key: &'static str, value: f64 },
    #[error("level must be 1, 2 or 3, got {0}")]
    Level(u8),
    #[error(
        "duration_min must be within 0 < duration_min <= {MAX_DURATION_MIN} (7 days), got {0}"
    )]
    Duration(f64),
    #[error("start {0:?} is not an RFC 3339 time (e.g. 2026-07-01T14:00:00Z)")]
    Start(String),
    #[error("start is required in a file of scheduled targets")]
    NoStart,
    #[error("id {0:?} must be 1 to 64 letters, digits, `-`, `_` or `.`")]
    Id(String),
}

impl TargetSpec {
    /// The event it makes: `source` (`api`, `file`), `id` where the spec names none,
    /// `now` the start where it gives none and `start_required` is false.
    pub fn event(
        &self,
        source: &str,
        id: String,
        now: Timestamp,
        start_required: bool,
    ) -> Result<GridEvent, TargetError> {
        let target = self.target()?;
        let d = self.duration_min;
        if !(d.is_finite() && d > 0.0 && d <= MAX_DURATION_MIN) {
            return Err(TargetError::Duration(d));
        }
        let start = match &self.start {
            Some(s) => Timestamp::parse_rfc3339(s).map_err(|_| TargetError::Start(s.clone()))?,
            None if start_required => return Err(TargetError::NoStart),
            None => now,
        };
        let id = self.id_or(id)?;
        Ok(GridEvent {
            id,
            source: source.into(),
            modification: 0,
            status: if start <= now {
                EventStatus::Active
            } else {
                EventStatus::Pending
            },
            intervals: vec![GridInterval {
                start,
                duration_s: d * 60.0,
                target,
            }],
            program: self.reason.clone(),
        })
    }

    /// The one target the spec gives (a shed in % or kW, a cap in kW, or a level).
    fn target(&self) -> Result<GridTarget, TargetError> {
        let given = [
            self.shed_pct.is_some(),
            self.shed_kw.is_some(),
            self.cap_kw.is_some(),
            self.level.is_some(),
        ]
        .iter()
        .filter(|b| **b)
        .count();
        if given != 1 {
            return Err(TargetError::Target(given));
        }
        let positive = |key: &'static str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(v)
            } else {
                Err(TargetError::Kw { key, value: v })
            }
        };
        Ok(if let Some(p) = self.shed_pct {
            if !(p.is_finite() && p > 0.0 && p <= 100.0) {
                return Err(TargetError::ShedPct(p));
            }
            GridTarget::ShedFraction(p / 100.0)
        } else if let Some(k) = self.shed_kw {
            GridTarget::ShedW(positive("shed_kw", k)? * 1000.0)
        } else if let Some(k) = self.cap_kw {
            GridTarget::CapW(positive("cap_kw", k)? * 1000.0)
        } else {
            let l = self.level.unwrap_or(0);
            if !(1..=3).contains(&l) {
                return Err(TargetError::Level(l));
            }
            GridTarget::Level(l)
        })
    }

    /// The spec's id, checked, or `id` where it names none.
    fn id_or(&self, id: String) -> Result<String, TargetError> {
        let Some(i) = &self.id else {
            return Ok(id);
        };
        let ok = !i.is_empty()
            && i.len() <= 64
            && i.chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !ok {
            return Err(TargetError::Id(i.clone()));
        }
        Ok(i.clone())
    }
}

/// Why a file of targets cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    List(#[from] crate::json_list::ListFileError),
    #[error("{}: {source}", path.display())]
    Toml {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    #[error("{}: target {index} ({id}): {source}", path.display())]
    Target {
        path: PathBuf,
        index: usize,
        id: String,
        #[source]
        source: TargetError,
    },
    #[error("{}: two targets have the id {id:?}", path.display())]
    Duplicate { id: String, path: PathBuf },
}

/// The file of scheduled targets: `[[targets]]` tables of [`TargetSpec`], each with a
/// start. Every problem names its entry; one bad entry refuses the file (the last good
/// schedule is kept by the caller).
pub fn read_schedule(path: &Path, now: Timestamp) -> Result<Vec<GridEvent>, FileError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        targets: Vec<TargetSpec>,
    }
    let text = std::fs::read_to_string(path).map_err(|source| FileError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let file: File = toml::from_str(&text).map_err(|source| FileError::Toml {
        path: path.to_path_buf(),
        source,
    })?;
    let mut out: Vec<GridEvent> = Vec::with_capacity(file.targets.len());
    for (k, spec) in file.targets.iter().enumerate() {
        let id = spec.id.clone().unwrap_or_else(|| format!("s{}", k + 1));
        let e = spec
            .event("file", id.clone(), now, true)
            .map_err(|source| FileError::Target {
                path: path.to_path_buf(),
                index: k + 1,
                id: id.clone(),
                source,
            })?;
        if out.iter().any(|o| o.id == e.id) {
            return Err(FileError::Duplicate {
                id: e.id,
                path: path.to_path_buf(),
            });
        }
        out.push(e);
    }
    Ok(out)
}

/// The `source` of the targets operators post through the API.
pub const POSTED: &str = "api";

/// The store's collection of the posted targets (with `[ha]`): one record, the whole
/// list (see [`crate::acks::write_list`]); every grid event is also recorded in
/// [`super::EVENTS`], for the reports.
pub const COLLECTION: &str = "grid_posted";

/// The operators' targets, kept in a JSON file (missing: none) so that a restart keeps
/// the ones still to come; with `[ha]`, in the store as well (see [`crate::acks`]).
#[derive(Debug, Default)]
pub struct Book {
    path: Option<PathBuf>,
    pub list: Vec<GridEvent>,
    next: u64,
    /// The changes posted through the API, and how many the store holds.
    pub acks: crate::acks::Acks,
}

impl Book {
    pub fn open(path: Option<&Path>) -> Result<Book, FileError> {
        let list: Vec<GridEvent> = crate::json_list::read(path)?;
        let next = crate::json_list::highest_id(list.iter().map(|e| e.id.as_str()), "t");
        Ok(Book {
            path: path.map(Path::to_path_buf),
            list,
            next,
            acks: Default::default(),
        })
    }

    pub fn next_id(&mut self) -> String {
        self.next += 1;
        format!("t{}", self.next)
    }

    /// Takes the posted targets the store holds (a new leader, a follower mirroring
    /// it); ids go on above every id seen. True when it changed.
    pub fn replace(&mut self, list: &[GridEvent]) -> bool {
        if self.list == list {
            return false;
        }
        self.list = list.to_vec();
        let top = crate::json_list::highest_id(list.iter().map(|e| e.id.as_str()), "t");
        self.next = self.next.max(top);
        true
    }

    /// Adds a target; one with the id of another replaces it as its next modification.
    pub fn post(&mut self, mut e: GridEvent) -> GridEvent {
        if let Some(old) = self.list.iter_mut().find(|o| o.id == e.id) {
            e.modification = old.modification + 1;
            *old = e.clone();
        } else {
            self.list.push(e.clone());
        }
        e
    }

    /// Cancels a target; false when there is none of that id.
    pub fn cancel(&mut self, id: &str) -> bool {
        match self.list.iter_mut().find(|e| e.id == id) {
            Some(e) => {
                e.status = EventStatus::Cancelled;
                e.modification += 1;
                true
            }
            None => false,
        }
    }

    /// Drops the targets over (ended or cancelled, an hour after their end); true when
    /// something changed.
    pub fn expire(&mut self, now: Timestamp) -> bool {
        let n = self.list.len();
        self.list
            .retain(|e| e.end().is_some_and(|end| end.plus_secs(3600.0) > now));
        n != self.list.len()
    }

    pub fn save(&self) -> Result<(), FileError> {
        Ok(crate::json_list::write(self.path.as_deref(), &self.list)?)
    }
}

/// Each event's status as it stands at `now` (pending until its start, active until
/// its end, then completed; a cancelled one stays cancelled).
pub fn with_status(mut e: GridEvent, now: Timestamp) -> GridEvent {
    if e.status != EventStatus::Cancelled {
        e.status = match (e.start(), e.end()) {
            (Some(s), _) if now < s => EventStatus::Pending,
            (_, Some(end)) if now >= end => EventStatus::Completed,
            _ => EventStatus::Active,
        };
    }
    e
}

/// What the engine is given of the events in force at `now`: the site readings of the
/// strictest interval (its target against `baseline_w`, the meter the caller knows:
/// the engine's baseline during an event, else the meter now), and which event it is.
/// With none in force, `grid_event_active` 0. Levels shed as `levels` says (a level the
/// table does not name is skipped).
pub fn publish<'e>(
    site: &Site,
    events: &'e [GridEvent],
    levels: &[(u8, f64)],
    baseline_w: f64,
    now: Timestamp,
) -> (Vec<Sample>, Option<&'e GridEvent>) {
    let entity = site.site_entity();
    let sample = |m: &str, v: f64| Sample::new(entity.clone(), m, v, now, "grid");
    let in_force = grid::in_force(events, now);
    let Some((e, i, _)) = grid::strictest(&in_force, baseline_w.max(0.0), levels) else {
        return (vec![sample(GRID_EVENT_ACTIVE, 0.0)], None);
    };
    let mut out = vec![sample(GRID_EVENT_ACTIVE, 1.0)];
    match i.target {
        GridTarget::ShedFraction(f) => out.push(sample(GRID_SHED_FRACTION, f.clamp(0.0, 1.0))),
        GridTarget::ShedW(w) => out.push(sample(GRID_SHED_W, w.max(0.0))),
        GridTarget::CapW(w) => out.push(sample(GRID_CAP_W, w.max(0.0))),
        GridTarget::Level(l) => {
            if let Some((_, f)) = levels.iter().find(|(k, _)| *k == l) {
                out.push(sample(GRID_SHED_FRACTION, f.clamp(0.0, 1.0)));
            }
        }
    }
    (out, Some(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "version = 1\n[site]\nname = \"t\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n";

    fn t(s: f64) -> Timestamp {
        Timestamp::from_secs(1_790_000_000).plus_secs(s)
    }

    fn spec(json: &str) -> TargetSpec {
        serde_json::from_str(json).expect("spec")
    }

    #[test]
    fn a_target_names_one_shed_and_a_sane_length() {
        let e = spec(r#"{"duration_min": 60, "shed_pct": 25}"#)
            .event("api", "t1".into(), t(0.0), false)
            .expect("valid");
        assert_eq!(e.intervals[0].target, GridTarget::ShedFraction(0.25));
        assert_eq!(
            (e.intervals[0].start, e.intervals[0].duration_s),
            (t(0.0), 3600.0)
        );
        assert_eq!(e.status, EventStatus::Active);
        let bad = |j: &str| {
            spec(j)
                .event("api", "x".into(), t(0.0), false)
                .expect_err("refused")
        };
        assert_eq!(
            bad(r#"{"duration_min": 60, "shed_pct": 25, "cap_kw": 3}"#),
            TargetError::Target(2)
        );
        assert_eq!(bad(r#"{"duration_min": 60}"#), TargetError::Target(0));
        assert_eq!(
            bad(r#"{"duration_min": 60, "shed_pct": 120}"#),
            TargetError::ShedPct(120.0)
        );
        assert_eq!(
            bad(r#"{"duration_min": 0, "cap_kw": 3}"#),
            TargetError::Duration(0.0)
        );
        assert_eq!(
            bad(r#"{"duration_min": 5, "level": 4}"#),
            TargetError::Level(4)
        );
        assert!(matches!(
            bad(r#"{"duration_min": 5, "cap_kw": 3, "start": "tomorrow"}"#),
            TargetError::Start(_)
        ));
        assert!(matches!(
            bad(r#"{"duration_min": 5, "cap_kw": 3, "id": "a b"}"#),
            TargetError::Id(_)
        ));
        assert!(serde_json::from_str::<TargetSpec>(
            r#"{"duration_min": 5, "cap_kw": 3, "shed": 1}"#
        )
        .is_err());
    }

    #[test]
    fn the_schedule_file_names_its_bad_entry() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("targets.toml");
        std::fs::write(
            &p,
            "[[targets]]\nid = \"peak\"\nstart = \"2026-07-01T14:00:00Z\"\nduration_min = 180\nshed_pct = 25\n\n[[targets]]\nstart = \"2026-07-02T14:00:00Z\"\nduration_min = 60\ncap_kw = -1\n",
        )
        .expect("write");
        let e = read_schedule(&p, t(0.0)).expect_err("refused").to_string();
        assert!(e.contains("target 2 (s2): cap_kw must be above 0"), "{e}");
        std::fs::write(&p, "[[targets]]\nduration_min = 60\ncap_kw = 5\n").expect("write");
        let e = read_schedule(&p, t(0.0)).expect_err("refused").to_string();
        assert!(e.contains("start is required"), "{e}");
        std::fs::write(
            &p,
            "[[targets]]\nid = \"peak\"\nstart = \"2026-07-01T14:00:00Z\"\nduration_min = 180\nshed_pct = 25\n",
        )
        .expect("write");
        let ok = read_schedule(&p, t(0.0)).expect("valid");
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].source, "file");
        assert_eq!(
            ok[0].start(),
            Some(Timestamp::parse_rfc3339("2026-07-01T14:00:00Z").expect("time"))
        );
    }

    #[test]
    fn the_book_keeps_targets_across_a_restart_and_a_repost_is_a_modification() {
        let dir = tempfile::tempdir().expect("dir");
        let p = dir.path().join("grid-targets.json");
        let mut b = Book::open(Some(&p)).expect("open");
        let id = b.next_id();
        let e = spec(r#"{"duration_min": 60, "cap_kw": 8}"#)
            .event("api", id.clone(), t(0.0), false)
            .expect("valid");
        b.post(e.clone());
        let again = b.post(e);
        assert_eq!(again.modification, 1);
        b.save().expect("save");
        let mut b = Book::open(Some(&p)).expect("reopen");
        assert_eq!(b.list.len(), 1);
        assert_eq!(b.next_id(), "t2");
        assert!(b.cancel(&id));
        assert!(!b.cancel("nope"));
        assert_eq!(b.list[0].status, EventStatus::Cancelled);
        assert!(!b.expire(t(3600.0)));
        assert!(b.expire(t(7300.0)));
    }

    #[test]
    fn the_strictest_event_in_force_is_published_and_none_says_so() {
        let site = Site::parse("t.toml", SITE).expect("site");
        let a = spec(r#"{"duration_min": 60, "cap_kw": 8}"#)
            .event("api", "a".into(), t(0.0), false)
            .expect("valid");
        let b = spec(r#"{"duration_min": 30, "level": 2}"#)
            .event("api", "b".into(), t(0.0), false)
            .expect("valid");
        let levels = [(1, 0.1), (2, 0.25), (3, 0.5)];
        let events = [a, b];
        // against a 10 kW baseline: the cap (8 kW) against level 2 (7.5 kW)
        let (s, e) = publish(&site, &events, &levels, 10_000.0, t(60.0));
        assert_eq!(e.map(|e| e.id.as_str()), Some("b"));
        let v = |m: &str| s.iter().find(|x| x.metric.as_str() == m).map(|x| x.value);
        assert_eq!(v(GRID_EVENT_ACTIVE), Some(1.0));
        assert_eq!(v(GRID_SHED_FRACTION), Some(0.25));
        // after level 2's end, the cap
        let (s, e) = publish(&site, &events, &levels, 10_000.0, t(1900.0));
        assert_eq!(e.map(|e| e.id.as_str()), Some("a"));
        assert_eq!(
            s.iter()
                .find(|x| x.metric.as_str() == GRID_CAP_W)
                .map(|x| x.value),
            Some(8000.0)
        );
        let (s, e) = publish(&site, &events, &levels, 10_000.0, t(3700.0));
        assert!(e.is_none());
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].value, 0.0);
        assert_eq!(
            with_status(events[0].clone(), t(3700.0)).status,
            EventStatus::Completed
        );
    }
}
