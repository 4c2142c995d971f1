//! GPU power limits of jobs: a running job's GPUs are capped at the limit it asks for
//! itself (a Kubernetes pod's `powerplane.io/gpu-power-limit`) or its class's
//! (`[limits] classes`), the lower of the two; merged with every other controller's
//! caps, the most protective winning. A limit below a GPU's minimum is raised to it.

pub(crate) mod controller;

/// The rule name of these caps.
pub const RULE: &str = "limits.job";

#[cfg(test)]
mod tests;
