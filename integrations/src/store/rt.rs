//! Where a server-backed store's futures run: the runtime `serve` owns, or a small one
//! of the backend's own (tools and tests). The sync [`super::Backend`] calls drive them
//! with `block_on`, from a thread outside that runtime's workers.

use std::future::Future;

use tokio::runtime::Handle;

pub(crate) enum Rt {
    Shared(Handle),
    Owned(tokio::runtime::Runtime),
}

impl Rt {
    /// A runtime of its own: one worker thread named `name`.
    pub(crate) fn owned(name: &str) -> std::io::Result<Rt> {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(name)
            .enable_all()
            .build()
            .map(Rt::Owned)
    }

    pub(crate) fn block_on<F: Future>(&self, fut: F) -> F::Output {
        match self {
            Rt::Shared(h) => h.block_on(fut),
            Rt::Owned(rt) => rt.block_on(fut),
        }
    }

    pub(crate) fn handle(&self) -> Handle {
        match self {
            Rt::Shared(h) => h.clone(),
            Rt::Owned(rt) => rt.handle().clone(),
        }
    }
}
