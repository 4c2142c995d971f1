//! Jobs that arrive over time: sizes, durations, classes and deadlines drawn from a
//! seeded generator.

use serde::Deserialize;
use telemetry::{Job, JobState, Timestamp};

use super::rng::Rng;

/// A class of jobs in the mix.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassMix {
    pub class: String,
    /// Relative share of arrivals.
    pub share: f64,
    pub priority: i32,
    pub deferrable: bool,
    pub preemptible: bool,
    /// Deadline after submission, drawn uniformly in this range (hours); none if absent.
    pub deadline_h: Option<(f64, f64)>,
    pub projects: Vec<String>,
}

/// The arrival process.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workload {
    pub arrivals_per_hour: f64,
    /// GPU counts and their weights.
    pub sizes: Vec<(u32, f64)>,
    /// Median run time at full power, minutes.
    pub median_minutes: f64,
    /// Spread of the log-normal run time.
    pub sigma: f64,
    pub min_minutes: f64,
    pub max_minutes: f64,
    /// Users overestimate: actual run time is the estimate times a factor in this range.
    pub actual_over_estimate: (f64, f64),
    /// Share of the GPUs busy when the run starts.
    pub initial_fill: f64,
    pub classes: Vec<ClassMix>,
}

impl Default for Workload {
    fn default() -> Self {
        let projects = |p: &[&str]| p.iter().map(|s| s.to_string()).collect();
        Workload {
            arrivals_per_hour: 60.0,
            sizes: vec![(1, 30.0), (2, 25.0), (4, 20.0), (8, 15.0), (16, 10.0)],
            median_minutes: 45.0,
            sigma: 0.8,
            min_minutes: 5.0,
            max_minutes: 8.0 * 60.0,
            actual_over_estimate: (0.6, 1.0),
            initial_fill: 0.9,
            classes: vec![
                ClassMix {
                    class: "inference".into(),
                    share: 20.0,
                    priority: 10,
                    deferrable: false,
                    preemptible: false,
                    deadline_h: None,
                    projects: projects(&["search", "assistant"]),
                },
                ClassMix {
                    class: "training".into(),
                    share: 50.0,
                    priority: 5,
                    deferrable: true,
                    preemptible: false,
                    deadline_h: Some((3.0, 12.0)),
                    projects: projects(&["llm-pretrain", "vision", "speech"]),
                },
                ClassMix {
                    class: "batch".into(),
                    share: 30.0,
                    priority: 1,
                    deferrable: true,
                    preemptible: true,
                    deadline_h: Some((2.0, 24.0)),
                    projects: projects(&["eval", "data-prep"]),
                },
            ],
        }
    }
}

/// A generated job and what only the simulator knows about it.
#[derive(Debug, Clone)]
pub struct Generated {
    pub job: Job,
    /// Run time at full power, seconds (the estimate is what the job says).
    pub work_s: f64,
    /// Index of its power/speed curve.
    pub curve: usize,
}

pub struct Generator {
    rng: Rng,
    workload: Workload,
    curves: usize,
    seq: u64,
}

impl Generator {
    pub fn new(seed: u64, workload: Workload, curves: usize) -> Self {
        Generator {
            rng: Rng::new(seed),
            workload,
            curves: curves.max(1),
            seq: 0,
        }
    }

    /// Seconds to the next arrival.
    pub fn next_gap_s(&mut self) -> f64 {
        self.rng
            .exp(3600.0 / self.workload.arrivals_per_hour.max(1e-6))
    }

    pub fn initial_fill(&self) -> f64 {
        self.workload.initial_fill
    }

    pub fn uniform(&mut self) -> f64 {
        self.rng.f64()
    }

    /// A new job submitted at `now`.
    pub fn job(&mut self, now: Timestamp) -> Generated {
        let w = &self.workload;
        let size_w: Vec<f64> = w.sizes.iter().map(|s| s.1).collect();
        let gpus = w.sizes[self.rng.weighted(&size_w)].0;
        let class_w: Vec<f64> = w.classes.iter().map(|c| c.share).collect();
        let class = w.classes[self.rng.weighted(&class_w)].clone();
        let minutes = (w.median_minutes * (w.sigma * self.rng.normal()).exp())
            .clamp(w.min_minutes, w.max_minutes);
        let est_s = (minutes * 60.0).round();
        let work_s = est_s
            * self
                .rng
                .range(w.actual_over_estimate.0, w.actual_over_estimate.1);
        let deadline = class
            .deadline_h
            .map(|(lo, hi)| now + (est_s + self.rng.range(lo, hi) * 3600.0).round());
        let project = class.projects
            [(self.rng.f64() * class.projects.len() as f64) as usize % class.projects.len().max(1)]
        .clone();
        let user = format!("user{:02}", (self.rng.f64() * 24.0) as u32 + 1);
        let curve = (self.rng.f64() * self.curves as f64) as usize % self.curves;
        self.seq += 1;
        let id = format!("sim:{}", self.seq);
        Generated {
            job: Job {
                id: id.clone(),
                scheduler: "sim".into(),
                name: format!("{}-{}", class.class, self.seq),
                user,
                project,
                class: class.class,
                priority: class.priority,
                gpus,
                allocated: Vec::new(),
                state: JobState::Pending,
                submit_time: now,
                start_time: None,
                end_time: None,
                deadline,
                est_duration_s: est_s,
                deferrable: class.deferrable,
                preemptible: class.preemptible,
                gpu_power_limit: None,
            },
            work_s,
            curve,
        }
    }
}
