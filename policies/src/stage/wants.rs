//! What the controllers want, as they leave it for the merge: cap wants in the order
//! they were made, job verdicts, the rules' wants, and what explains each of them.

use std::borrow::Cow;
use std::collections::BTreeMap;

use telemetry::Timestamp;

use crate::budget::{self, BudgetCap, ScopeView};
use crate::plan::{RackPrediction, State};
use crate::price::{self, Verdict};
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
}

/// What the controllers want and what explains it, filled in registration order.
pub(crate) struct Wants<'c> {
    pub caps: Vec<CapWants>,
    pub why: Why<'c>,
    /// The budget's scopes, prepared once for both of its evaluations.
    pub budget: Option<budget::Prepared<'c>>,
    /// Each budget evaluation's scope views (explanations point into them).
    pub budget_views: Vec<Vec<ScopeView>>,
    /// How fast the price rule may release holds (from the budget's headroom).
    pub pacing: Option<price::Pacing>,
    /// The SREs' rules, with what each wants.
    pub rules: Vec<(&'c Rule, rules_eval::Wants)>,
    /// The price rule's verdicts on jobs (or releases of its holds when it is off).
    pub verdicts: BTreeMap<String, Verdict>,
    /// The price rule's values and planned starts, when it ran.
    pub price: Option<(BTreeMap<String, f64>, BTreeMap<String, Timestamp>)>,
    /// The state the controllers keep for themselves (fits, levels, rule memories).
    pub next: State,
    pub predictions: BTreeMap<String, RackPrediction>,
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
        }
    }
}
