//! What the adapters tell jobs of their GPU power limits: for each running job that
//! asks for one (its own, or its class's in the policy's `[limits]`), the limit and
//! what its GPUs run at now (the plan with the operators' overrides).

use std::collections::BTreeMap;

use integrations::scheduler::{JobLimit, LimitGpu};
use policies::{Policy, State};
use telemetry::{Job, JobState, Site};

/// The limits of `jobs` (the active ones) against `actuated` on `site`.
pub fn job_limits(
    jobs: &[Job],
    site: &Site,
    policy: &Policy,
    actuated: &State,
) -> BTreeMap<String, JobLimit> {
    let rule = &policy.limits;
    let mut out = BTreeMap::new();
    if !rule.enabled {
        return out;
    }
    for j in jobs {
        let own = j.gpu_power_limit.filter(|_| rule.jobs);
        let by_class = rule.classes.get(&j.class).copied();
        if j.state != JobState::Running || (own.is_none() && by_class.is_none()) {
            continue;
        }
        let mut gpus = Vec::new();
        let mut asked_w = None;
        let mut default_w = None;
        for g in &j.allocated {
            let Some(model) = g
                .name
                .rsplit_once(':')
                .and_then(|(node, _)| site.node_index(node))
                .and_then(|n| site.gpu_models.get(&site.nodes[n].gpu_model))
            else {
                continue;
            };
            let w = rule.limit_w(&j.class, j.gpu_power_limit, model.default_w);
            asked_w = asked_w.or(w);
            default_w = default_w.or(Some(model.default_w));
            let cap = actuated.caps.get(g).map(|c| (c.watts, c.rule.to_string()));
            gpus.push(LimitGpu {
                gpu: g.clone(),
                cap,
                min_w: model.min_w,
                default_w: model.default_w,
            });
        }
        let asked = match (own, by_class) {
            (Some(l), Some(c)) => {
                // the lower of the two on its GPUs, in the words it was given
                let d = default_w.unwrap_or(0.0);
                if l.watts(d) <= c.watts(d) {
                    l.to_string()
                } else {
                    format!("{c} (the class {}'s; the pod asks {l})", j.class)
                }
            }
            (Some(l), None) => l.to_string(),
            (None, Some(c)) => format!("{c} (the class {}'s)", j.class),
            (None, None) => continue,
        };
        out.insert(
            j.id.clone(),
            JobLimit {
                asked,
                asked_w: asked_w.unwrap_or(0.0),
                gpus,
            },
        );
    }
    out
}
