//! The operators' books through the API: overrides (`/api/v1/overrides`) and posted
//! grid targets (`/api/v1/grid/targets`). A change is saved to its file and, with
//! `[ha]`, answered only once the store's server holds it; else it is undone and
//! answered 503, so that the sender resends it (see `control::acks`).

use std::fmt::Display;
use std::sync::{Mutex, MutexGuard};

use serde_json::json;
use tracing::{info, warn};

use control::acks::Acks;
use control::grid::targets::{self, TargetSpec};

use crate::{error, json_reply, Api, Reply, Role};

/// A book an operator changes through the API.
trait Kept {
    /// What the warning names when the book's file cannot be written.
    const WHAT: &'static str;
    fn acks(&self) -> Acks;
    fn acks_mut(&mut self) -> &mut Acks;
    fn write(&self) -> Result<(), Box<dyn Display>>;

    fn save_logged(&self) {
        if let Err(e) = self.write() {
            warn!(error = %e, "cannot save the {}; they hold until a restart", Self::WHAT);
        }
    }
}

impl Kept for control::overrides::Book {
    const WHAT: &'static str = "overrides";
    fn acks(&self) -> Acks {
        self.acks
    }
    fn acks_mut(&mut self) -> &mut Acks {
        &mut self.acks
    }
    fn write(&self) -> Result<(), Box<dyn Display>> {
        self.save().map_err(|e| Box::new(e) as Box<dyn Display>)
    }
}

impl Kept for targets::Book {
    const WHAT: &'static str = "grid targets";
    fn acks(&self) -> Acks {
        self.acks
    }
    fn acks_mut(&mut self) -> &mut Acks {
        &mut self.acks
    }
    fn write(&self) -> Result<(), Box<dyn Display>> {
        self.save().map_err(|e| Box::new(e) as Box<dyn Display>)
    }
}

fn lock<B>(book: &Mutex<B>) -> MutexGuard<'_, B> {
    book.lock().unwrap_or_else(|p| p.into_inner())
}

/// Saves the change just made under `held`, counts it and waits until the store holds
/// it (at once without `[ha]`). When it does not in time, `undo` runs on the book (and
/// what it changed is saved and counted in turn) and the answer is false.
fn stored<B: Kept>(
    book: &Mutex<B>,
    held: MutexGuard<'_, B>,
    undo: impl FnOnce(&mut B) -> bool,
) -> bool {
    let mut held = held;
    held.save_logged();
    let mine = held.acks_mut().changed();
    drop(held);
    if control::acks::wait_stored(book, B::acks, mine) {
        return true;
    }
    let mut held = lock(book);
    if undo(&mut held) {
        held.acks_mut().changed();
        held.save_logged();
    }
    false
}

impl Api {
    /// The caller's name for a change (`min` for anything but a read), or the refusal;
    /// a follower refuses changes.
    fn who(&self, method: &str, authorization: Option<&str>, min: Role) -> Result<String, Reply> {
        let min = if method == "GET" {
            Role::Viewer
        } else {
            if let Some(r) = self.not_on_a_follower() {
                return Err(r);
            }
            min
        };
        self.authorize(authorization, min).map(str::to_string)
    }

    /// `GET` and `POST /api/v1/overrides` (viewer, operator), `DELETE
    /// /api/v1/overrides/{id}` (operator).
    pub(crate) fn overrides(
        &self,
        method: &str,
        route: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Reply {
        let who = match self.who(method, authorization, Role::Operator) {
            Ok(who) => who,
            Err(r) => return r,
        };
        let now = common::wall_clock();
        match (method, route.strip_prefix("overrides").unwrap_or("")) {
            ("GET", "") => {
                let book = lock(&self.overrides);
                json_reply(
                    200,
                    &json!({ "overrides": book.list.iter().filter(|o| o.until > now).collect::<Vec<_>>() }),
                )
            }
            ("POST", "") => self.set_override(&who, body, now),
            ("DELETE", id) if id.starts_with('/') => self.remove_override(&who, &id[1..]),
            _ => error(
                405,
                "GET or POST /api/v1/overrides, DELETE /api/v1/overrides/{id}",
            ),
        }
    }

    fn set_override(&self, who: &str, body: &[u8], now: telemetry::Timestamp) -> Reply {
        let req = match control::overrides::Request::parse(body) {
            Ok(r) => r,
            Err(e) => return error(400, &format!("bad override: {e}")),
        };
        let site = self
            .board
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .site
            .clone();
        let mut book = lock(&self.overrides);
        let id = book.next_id();
        let o = match req.accept(&site, now, who, id) {
            Ok(o) => o,
            Err(e) => return error(400, &e.to_string()),
        };
        info!(id = %o.id, by = %who, what = ?o.what, until = %o.until, reason = %o.reason, "override set");
        book.list.push(o.clone());
        // not where the next leader reads it: withdrawn, the sender resends
        if !stored(&self.overrides, book, |b| {
            b.list.retain(|x| x.id != o.id);
            true
        }) {
            warn!(id = %o.id, "override withdrawn: the store did not take it in time");
            return error(
                503,
                "the override could not be stored (the store may be down): nothing was set; resend it",
            );
        }
        json_reply(201, &serde_json::to_value(o).unwrap_or_default())
    }

    fn remove_override(&self, who: &str, id: &str) -> Reply {
        let mut book = lock(&self.overrides);
        let Some(at) = book.list.iter().position(|o| o.id == id) else {
            return error(404, &format!("no override {id:?}"));
        };
        let gone = book.list.remove(at);
        info!(id, by = %who, "override removed");
        // the next leader would still apply it: put back, the sender resends
        if !stored(&self.overrides, book, |b| {
            if !b.list.iter().any(|o| o.id == gone.id) {
                b.list.push(gone);
            }
            true
        }) {
            return error(
                503,
                "the removal could not be stored (the store may be down): nothing was removed; resend it",
            );
        }
        json_reply(200, &json!({ "removed": id }))
    }

    /// `GET /api/v1/grid` (the events known and the one in force, viewer),
    /// `GET /api/v1/grid/targets` (viewer), `POST /api/v1/grid/targets` and
    /// `DELETE /api/v1/grid/targets/{id}` (admin: a load target commits the site).
    pub(crate) fn grid(
        &self,
        method: &str,
        route: &str,
        authorization: Option<&str>,
        body: &[u8],
    ) -> Reply {
        let who = match self.who(method, authorization, Role::Admin) {
            Ok(who) => who,
            Err(r) => return r,
        };
        let now = common::wall_clock();
        if (method, route) == ("GET", "grid") {
            let board = self.board.read().unwrap_or_else(|p| p.into_inner());
            return json_reply(
                200,
                &json!({ "events": board.grid_events, "in_force": board.state.grid }),
            );
        }
        match (method, route.strip_prefix("grid/targets")) {
            ("GET", Some("")) => {
                let list: Vec<_> = lock(&self.grid)
                    .list
                    .iter()
                    .cloned()
                    .map(|e| targets::with_status(e, now))
                    .collect();
                json_reply(200, &json!({ "targets": list }))
            }
            ("POST", Some("")) => self.post_target(&who, body, now),
            ("DELETE", Some(id)) if id.starts_with('/') => self.cancel_target(&who, &id[1..]),
            _ => error(
                405,
                "GET /api/v1/grid, GET or POST /api/v1/grid/targets, DELETE /api/v1/grid/targets/{id}",
            ),
        }
    }

    fn post_target(&self, who: &str, body: &[u8], now: telemetry::Timestamp) -> Reply {
        let spec: TargetSpec = match serde_json::from_slice(body) {
            Ok(s) => s,
            Err(e) => return error(400, &format!("bad grid target: {e}")),
        };
        let mut book = lock(&self.grid);
        let id = book.next_id();
        let e = match spec.event(targets::POSTED, id, now, false) {
            Ok(e) => book.post(e),
            Err(e) => return error(400, &format!("bad grid target: {e}")),
        };
        info!(event = %e.id, by = %who, modification = e.modification, target = ?e.intervals.first().map(|i| i.target), start = ?e.start(), "grid target posted");
        // cancelled, not removed: if the batch that carried it lands later, the
        // cancellation follows it
        if !stored(&self.grid, book, |b| {
            b.cancel(&e.id);
            true
        }) {
            warn!(event = %e.id, "grid target withdrawn (cancelled): the store did not take it in time");
            return error(
                503,
                "the target could not be stored (the store may be down): it was withdrawn; resend it",
            );
        }
        json_reply(201, &serde_json::to_value(e).unwrap_or_default())
    }

    fn cancel_target(&self, who: &str, id: &str) -> Reply {
        let mut book = lock(&self.grid);
        if !book.cancel(id) {
            return error(404, &format!("no grid target {id:?}"));
        }
        info!(event = id, by = %who, "grid target cancelled");
        // cancelled here; a resend cancels it wherever it is still in force
        if !stored(&self.grid, book, |_| false) {
            return error(
                503,
                "cancelled here, but not yet stored (the store may be down): resend it",
            );
        }
        json_reply(200, &json!({ "cancelled": id }))
    }
}
