//! Grid (demand-response) events as every edge that brings them speaks of them: an
//! OpenADR VEN, an operator's `POST /api/v1/grid/targets`, a file of scheduled targets,
//! a backtest scenario. An event is a list of intervals, each with what the grid asks
//! of the facility's meter (IT plus cooling: the utility meters the whole facility).
//!
//! The edge that holds the events publishes the one in force as site readings each
//! tick (`grid_event_active`, `grid_shed_fraction` / `grid_shed_w` / `grid_cap_w`, and
//! `grid_baseline_w` where it has a baseline, see [`crate::metric::names`]); the
//! engine's grid controller meets it. [`in_force`] says which interval that is.

use serde::{Deserialize, Serialize};

use crate::Timestamp;

/// What one interval of an event asks of the meter.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GridTarget {
    /// Shed this fraction of the baseline (0.25: draw 75% of it).
    ShedFraction(f64),
    /// Shed this many W below the baseline.
    ShedW(f64),
    /// Draw at most this many W.
    CapW(f64),
    /// A SIMPLE level (1, 2, 3): the site's `levels` table says what it sheds; 0 is
    /// normal operation (nothing asked).
    Level(u8),
}

impl GridTarget {
    /// Whether it asks nothing (level 0, a zero shed).
    pub fn is_normal(&self) -> bool {
        match *self {
            GridTarget::Level(l) => l == 0,
            GridTarget::ShedFraction(f) => f <= 0.0,
            GridTarget::ShedW(w) => w <= 0.0,
            GridTarget::CapW(_) => false,
        }
    }
}

/// Where an event stands, as the VTN (or operator) says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventStatus {
    /// Announced; not started (OpenADR `far`, `near`).
    Pending,
    /// In force now (OpenADR `active`).
    Active,
    Completed,
    Cancelled,
}

/// One interval of an event.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GridInterval {
    pub start: Timestamp,
    pub duration_s: f64,
    pub target: GridTarget,
}

impl GridInterval {
    pub fn end(&self) -> Timestamp {
        self.start.plus_secs(self.duration_s)
    }
}

/// A grid event: its id (unique per source), who sent it, its modification number
/// (OpenADR's: a higher one replaces the event), its status and its intervals in time
/// order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GridEvent {
    pub id: String,
    /// `openadr2b`, `openadr3`, `api`, `file`, `backtest`.
    pub source: String,
    pub modification: u32,
    pub status: EventStatus,
    pub intervals: Vec<GridInterval>,
    /// The program (OpenADR market context, program name), where one is named.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub program: String,
}

impl GridEvent {
    pub fn start(&self) -> Option<Timestamp> {
        self.intervals.first().map(|i| i.start)
    }

    pub fn end(&self) -> Option<Timestamp> {
        self.intervals.iter().map(GridInterval::end).max()
    }

    /// The interval in force at `now`, unless the event is cancelled or completed.
    pub fn interval_at(&self, now: Timestamp) -> Option<&GridInterval> {
        if matches!(self.status, EventStatus::Cancelled | EventStatus::Completed) {
            return None;
        }
        self.intervals
            .iter()
            .find(|i| i.start <= now && now < i.end())
    }
}

/// The intervals in force at `now`, each with its event; those that ask nothing (level
/// 0) are left out. Of several, [`strictest`] keeps the one that asks the most.
pub fn in_force(events: &[GridEvent], now: Timestamp) -> Vec<(&GridEvent, &GridInterval)> {
    events
        .iter()
        .filter_map(|e| e.interval_at(now).map(|i| (e, i)))
        .filter(|(_, i)| !i.target.is_normal())
        .collect()
}

/// What each SIMPLE level sheds, as a fraction of the baseline, where the site's
/// `[demand_response] levels` says nothing else.
pub const DEFAULT_LEVELS: [(u8, f64); 3] = [(1, 0.10), (2, 0.25), (3, 0.50)];

/// The meter target (W) an interval asks for, given the baseline (W) and what each
/// SIMPLE level sheds (as a fraction of the baseline); `None` for a level the table
/// does not name.
pub fn target_w(target: &GridTarget, baseline_w: f64, levels: &[(u8, f64)]) -> Option<f64> {
    Some(match *target {
        GridTarget::ShedFraction(f) => baseline_w * (1.0 - f.clamp(0.0, 1.0)),
        GridTarget::ShedW(w) => (baseline_w - w).max(0.0),
        GridTarget::CapW(w) => w.max(0.0),
        GridTarget::Level(0) => return None,
        GridTarget::Level(l) => {
            let f = levels.iter().find(|(k, _)| *k == l)?.1;
            baseline_w * (1.0 - f.clamp(0.0, 1.0))
        }
    })
}

/// Of the intervals in force, the one whose meter target is the lowest.
pub fn strictest<'a>(
    now_in_force: &[(&'a GridEvent, &'a GridInterval)],
    baseline_w: f64,
    levels: &[(u8, f64)],
) -> Option<(&'a GridEvent, &'a GridInterval, f64)> {
    now_in_force
        .iter()
        .filter_map(|&(e, i)| target_w(&i.target, baseline_w, levels).map(|t| (e, i, t)))
        .min_by(|a, b| a.2.total_cmp(&b.2))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, start_s: i64, dur: f64, target: GridTarget) -> GridEvent {
        GridEvent {
            id: id.into(),
            source: "api".into(),
            modification: 0,
            status: EventStatus::Pending,
            intervals: vec![GridInterval {
                start: Timestamp::from_secs(start_s),
                duration_s: dur,
                target,
            }],
            program: String::new(),
        }
    }

    #[test]
    fn an_interval_is_in_force_from_its_start_to_before_its_end() {
        let e = event("a", 100, 60.0, GridTarget::ShedFraction(0.25));
        assert!(e.interval_at(Timestamp::from_secs(99)).is_none());
        assert!(e.interval_at(Timestamp::from_secs(100)).is_some());
        assert!(e.interval_at(Timestamp::from_secs(159)).is_some());
        assert!(e.interval_at(Timestamp::from_secs(160)).is_none());
        let mut c = e.clone();
        c.status = EventStatus::Cancelled;
        assert!(c.interval_at(Timestamp::from_secs(120)).is_none());
    }

    #[test]
    fn targets_are_taken_from_the_baseline_and_the_strictest_wins() {
        let levels = [(1, 0.1), (2, 0.25)];
        assert_eq!(
            target_w(&GridTarget::ShedFraction(0.25), 1000.0, &levels),
            Some(750.0)
        );
        assert_eq!(
            target_w(&GridTarget::ShedW(300.0), 1000.0, &levels),
            Some(700.0)
        );
        assert_eq!(
            target_w(&GridTarget::CapW(800.0), 1000.0, &levels),
            Some(800.0)
        );
        assert_eq!(
            target_w(&GridTarget::Level(2), 1000.0, &levels),
            Some(750.0)
        );
        assert_eq!(target_w(&GridTarget::Level(3), 1000.0, &levels), None);
        let a = event("a", 0, 600.0, GridTarget::CapW(800.0));
        let b = event("b", 0, 600.0, GridTarget::ShedW(300.0));
        let now = Timestamp::from_secs(10);
        let f = in_force(std::slice::from_ref(&a), now);
        assert_eq!(f.len(), 1);
        let both = [a, b];
        let f = in_force(&both, now);
        let (e, _, t) = strictest(&f, 1000.0, &levels).expect("one in force");
        assert_eq!((e.id.as_str(), t), ("b", 700.0));
    }
}
