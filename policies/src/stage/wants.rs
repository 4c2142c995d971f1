//! What the controllers want, as they leave it for the merge: cap wants in the order
//! they were made, job verdicts, the rules' wants, and what explains each of them.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use telemetry::{EntityId, Timestamp};

use super::Context;
use crate::plan::{round3, Cap, Hold, RackPrediction, State, UncappedDraw};
use crate::rules::Rule;
use crate::rules_eval;

/// The values a rule looked at, what it says about them and what would release it.
pub(crate) type Explained = (BTreeMap<String, f64>, String, String);

/// Per (rule, scope): what explains a cap of the rule there. Keys borrow the rule ids
/// and the racks' scope names made once per evaluation.
pub(crate) type Why<'k> = BTreeMap<(&'k str, Cow<'k, str>), Explain>;

/// An explanation, or where to make it from when a cap decision needs it.
#[derive(Debug)]
pub(crate) enum Explain {
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

/// One controller's wanted caps, kept as it made them (the merge offers them in order;
/// of equal caps the first offered wins).
#[derive(Debug)]
pub(crate) enum CapWants {
    /// A budget evaluation's caps, by GPU index.
    Budget {
        caps: Vec<Option<BudgetCap>>,
        observe: bool,
    },
    /// The thermal rule's fraction of the default limit, by rack index (`None`: no
    /// rack has a level).
    Thermal {
        fractions: Option<Vec<Option<f64>>>,
        observe: bool,
    },
    /// The caps of the rule at this place among the rules run.
    Rule(usize),
    /// The grid controller's caps, by GPU index.
    Grid { caps: Vec<Option<f64>> },
    /// The jobs' GPU power limits, by GPU index.
    Limits { caps: Vec<Option<f64>> },
}

/// What the controllers want and what explains it, filled in registration order.
pub(crate) struct Wants<'c> {
    pub caps: Vec<CapWants>,
    pub why: Why<'c>,
    /// The budget's scopes, prepared once for both of its evaluations.
    pub budget: Option<Box<dyn BudgetTick + 'c>>,
    /// Each budget evaluation's scope views (explanations point into them).
    pub budget_views: Vec<Vec<ScopeView>>,
    /// How fast the price rule may release holds (from the budget's headroom).
    pub pacing: Option<Pacing>,
    /// The SREs' rules, with what each wants.
    pub rules: Vec<(&'c Rule, rules_eval::Wants)>,
    /// The price rule's verdicts on jobs (or releases of its holds when it is off).
    pub verdicts: BTreeMap<String, Verdict>,
    /// The price rule's values and planned starts, when it ran.
    pub price: Option<(BTreeMap<String, f64>, BTreeMap<String, Timestamp>)>,
    /// The state the controllers keep for themselves (fits, levels, rule memories).
    pub next: State,
    pub predictions: BTreeMap<String, RackPrediction>,
    /// The preemptible jobs the grid controller suspends, with each suspension's lease.
    pub grid_suspends: Vec<(String, Timestamp)>,
}

impl Wants<'_> {
    pub fn new() -> Self {
        Wants {
            caps: Vec::new(),
            why: BTreeMap::new(),
            budget: None,
            budget_views: Vec::new(),
            pacing: None,
            rules: Vec::new(),
            verdicts: BTreeMap::new(),
            price: None,
            next: State::default(),
            predictions: BTreeMap::new(),
            grid_suspends: Vec::new(),
        }
    }
}

/// The budget rule's wanted cap for one GPU.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetCap {
    pub watts: f64,
    /// `budget.rack` or `budget.facility`.
    pub rule: &'static str,
}

/// What the budget rule saw for one scope (the facility or a rack).
#[derive(Debug, Clone, PartialEq)]
pub struct ScopeView {
    pub scope: EntityId,
    pub budget_kw: f64,
    pub measured_kw: Option<f64>,
    pub demand_kw: f64,
    pub feasible: bool,
    pub stale_inputs: usize,
    /// Of the demand, what the GPUs of the jobs about to start add (feed-forward).
    pub starting_kw: f64,
    /// Indexes of the racks the scope covers.
    pub racks: Vec<usize>,
}

impl ScopeView {
    pub fn values(&self) -> BTreeMap<String, f64> {
        let mut v = BTreeMap::new();
        v.insert("budget_kw".into(), round3(self.budget_kw));
        v.insert("demand_kw".into(), round3(self.demand_kw));
        if let Some(m) = self.measured_kw {
            v.insert("measured_kw".into(), round3(m));
        }
        if self.stale_inputs > 0 {
            v.insert("stale_inputs".into(), self.stale_inputs as f64);
        }
        if self.starting_kw > 0.0 {
            v.insert("starting_kw".into(), round3(self.starting_kw));
        }
        v
    }
}

/// What the budget's evaluations of one tick share (its scopes, prepared once), as the
/// budget's second evaluation and the settle stage use it.
pub(crate) trait BudgetTick {
    /// One budget evaluation, with the jobs of `starting` reserved: the caps wanted by
    /// GPU index, and what each scope looked like.
    fn evaluate(
        &self,
        cx: &Context<'_>,
        starting: &BTreeSet<String>,
    ) -> (Vec<Option<BudgetCap>>, Vec<ScopeView>);

    /// What each GPU capped by `caps` (the caps settled) drew before its cap, by GPU
    /// index.
    fn remember_uncapped(
        &self,
        cx: &Context<'_>,
        caps: &[Option<Cap>],
    ) -> Vec<Option<UncappedDraw>>;
}

/// A hold to place or renew, or a release, for one job.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Hold(Hold),
    Release { reason: String },
}

/// Power headroom for releasing held jobs: when the price falls, held jobs are released
/// most urgent first, only as many per tick as the facility budget has room for, so
/// that a backlog does not start at once and overshoot the budget. A job that never
/// fits is still released at its latest start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// Room left under the facility budget, in W (may be negative).
    pub headroom_w: f64,
    /// What one GPU of a released job is expected to draw, in W.
    pub watts_per_gpu: f64,
    /// What the facility draws now, in W (against the rule's `peak_target_kw`).
    pub demand_w: f64,
}
