//! The leader lease as a Kubernetes `coordination.k8s.io/v1` Lease (`[ha] backend =
//! "kubernetes"`): the replicas of `serve` in a cluster elect their leader the way
//! Kubernetes controllers do, without a Redis for it.
//!
//! The fencing epoch lives in the Lease itself: the annotation `powerplane.io/epoch`
//! (and `spec.leaseTransitions`, kept equal) is raised by one in the same write that
//! takes the Lease, and every write is conditional on the `resourceVersion` read just
//! before (optimistic concurrency: a concurrent write gets `409 Conflict` and loses),
//! so two replicas never hold one term and every term's epoch is above the last.
//!
//! Whether a term has run out is judged on this replica's own monotonic clock, as
//! client-go's leader election does: a record that has not changed (same
//! `resourceVersion`) for its `leaseDurationSeconds` since this replica first saw it
//! is expired, whatever the clocks of the other replicas say. A released Lease (no
//! holder) is free at once.

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};

use super::{Kube, KubeError};
use crate::lease::{Holder, LeaseError, LeaseStore};

/// The annotation carrying the fencing epoch.
pub const EPOCH_ANNOTATION: &str = "powerplane.io/epoch";

/// A Lease object in one namespace.
pub struct KubeLease {
    kube: Kube,
    namespace: String,
    name: String,
    /// The record as last seen: its resourceVersion and when this replica saw it
    /// change.
    observed: Option<(String, Instant)>,
    /// The largest epoch this replica has seen: a Lease deleted and made anew starts
    /// above it, never at 1 again below what the agents have seen.
    seen: u64,
}

fn err(e: KubeError) -> LeaseError {
    LeaseError(e.to_string())
}

/// The epoch a Lease record carries.
fn epoch_of(l: &Lease) -> u64 {
    l.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(EPOCH_ANNOTATION))
        .and_then(|e| e.parse::<u64>().ok())
        .or_else(|| {
            l.spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .map(|t| t.max(0) as u64)
        })
        .unwrap_or(0)
}

fn holder_of(l: &Lease) -> Option<&str> {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// A term lasting `lease_ms` (rounded up to whole seconds, as a Lease counts).
fn term_s(lease_ms: u64) -> i32 {
    i32::try_from(lease_ms.div_ceil(1000).max(1)).unwrap_or(i32::MAX)
}

impl KubeLease {
    /// The Lease `name` in `namespace` (the client's namespace when `None`).
    pub fn new(kube: Kube, namespace: Option<&str>, name: &str) -> KubeLease {
        let namespace = namespace.map_or_else(|| kube.namespace.clone(), str::to_string);
        KubeLease {
            kube,
            namespace,
            name: name.to_string(),
            observed: None,
            seen: 0,
        }
    }

    fn api(&self) -> Api<Lease> {
        Api::namespaced(self.kube.client.clone(), &self.namespace)
    }

    /// The record now (`None`: there is none), noting when it changed.
    fn read(&mut self) -> Result<Option<Lease>, LeaseError> {
        let (api, name) = (self.api(), self.name.clone());
        let got = self
            .kube
            .call(
                "read the leader Lease",
                async move { api.get_opt(&name).await },
            )
            .map_err(err)?;
        if let Some(l) = &got {
            self.seen = self.seen.max(epoch_of(l));
            let rv = l.metadata.resource_version.clone().unwrap_or_default();
            if self.observed.as_ref().is_none_or(|(seen, _)| *seen != rv) {
                self.observed = Some((rv, Instant::now()));
            }
        } else {
            self.observed = None;
        }
        Ok(got)
    }

    /// The record's holder is gone: released, or unchanged for its whole term on
    /// this replica's clock.
    fn expired(&self, l: &Lease) -> bool {
        if holder_of(l).is_none() {
            return true;
        }
        let term = l
            .spec
            .as_ref()
            .and_then(|s| s.lease_duration_seconds)
            .unwrap_or(0)
            .max(0);
        self.observed.as_ref().is_some_and(|(_, since)| {
            since.elapsed() >= Duration::from_secs(u64::try_from(term).unwrap_or(0))
        })
    }

    fn stamp() -> MicroTime {
        MicroTime(k8s_openapi::jiff::Timestamp::now())
    }

    /// Writes `l` over the record read (its resourceVersion): `false` when another
    /// write came first (409).
    fn replace(&mut self, what: &str, l: Lease) -> Result<bool, LeaseError> {
        let (api, name) = (self.api(), self.name.clone());
        let out = self.kube.call(what, async move {
            api.replace(&name, &PostParams::default(), &l).await
        });
        match out {
            Ok(l) => {
                self.observed = Some((
                    l.metadata.resource_version.clone().unwrap_or_default(),
                    Instant::now(),
                ));
                Ok(true)
            }
            Err(e) if e.status() == Some(409) => Ok(false),
            Err(e) => Err(err(e)),
        }
    }

    /// A term of `instance` under `epoch` from now.
    fn term(mut l: Lease, instance: &str, epoch: u64, lease_ms: u64, taking: bool) -> Lease {
        let now = Self::stamp();
        l.metadata
            .annotations
            .get_or_insert_with(Default::default)
            .insert(EPOCH_ANNOTATION.into(), epoch.to_string());
        let spec = l.spec.get_or_insert_with(LeaseSpec::default);
        spec.holder_identity = Some(instance.to_string());
        spec.lease_duration_seconds = Some(term_s(lease_ms));
        spec.renew_time = Some(now.clone());
        if taking {
            spec.acquire_time = Some(now);
            spec.lease_transitions = Some(i32::try_from(epoch).unwrap_or(i32::MAX));
        }
        l
    }
}

impl LeaseStore for KubeLease {
    fn acquire(&mut self, instance: &str, lease_ms: u64) -> Result<Option<u64>, LeaseError> {
        match self.read()? {
            None => {
                let fresh = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        namespace: Some(self.namespace.clone()),
                        ..Default::default()
                    },
                    spec: None,
                };
                let epoch = self.seen + 1;
                let l = Self::term(fresh, instance, epoch, lease_ms, true);
                let api = self.api();
                let out = self.kube.call("create the leader Lease", async move {
                    api.create(&PostParams::default(), &l).await
                });
                match out {
                    Ok(l) => {
                        self.observed = Some((
                            l.metadata.resource_version.clone().unwrap_or_default(),
                            Instant::now(),
                        ));
                        self.seen = epoch;
                        Ok(Some(epoch))
                    }
                    // another replica created it first
                    Err(e) if e.status() == Some(409) => Ok(None),
                    Err(e) => Err(err(e)),
                }
            }
            Some(l) if self.expired(&l) => {
                let epoch = epoch_of(&l).max(self.seen) + 1;
                let l = Self::term(l, instance, epoch, lease_ms, true);
                let taken = self.replace("take the leader Lease", l)?;
                if taken {
                    self.seen = epoch;
                }
                Ok(taken.then_some(epoch))
            }
            Some(_) => Ok(None),
        }
    }

    fn renew(&mut self, instance: &str, epoch: u64, lease_ms: u64) -> Result<bool, LeaseError> {
        match self.read()? {
            Some(l) if holder_of(&l) == Some(instance) && epoch_of(&l) == epoch => {
                let l = Self::term(l, instance, epoch, lease_ms, false);
                self.replace("renew the leader Lease", l)
            }
            _ => Ok(false),
        }
    }

    fn release(&mut self, instance: &str, epoch: u64) -> Result<(), LeaseError> {
        if let Some(mut l) = self.read()? {
            if holder_of(&l) == Some(instance) && epoch_of(&l) == epoch {
                let spec = l.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = None;
                spec.renew_time = Some(Self::stamp());
                self.replace("release the leader Lease", l)?;
            }
        }
        Ok(())
    }

    fn holder(&mut self) -> Result<Option<Holder>, LeaseError> {
        Ok(self.read()?.and_then(|l| {
            let instance = holder_of(&l)?.to_string();
            (!self.expired(&l)).then(|| Holder {
                instance,
                epoch: epoch_of(&l),
            })
        }))
    }

    fn epoch(&mut self) -> Result<u64, LeaseError> {
        Ok(self.read()?.as_ref().map_or(0, epoch_of))
    }

    fn at_least(&mut self, epoch: u64) {
        self.seen = self.seen.max(epoch);
    }
}
