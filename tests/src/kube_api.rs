//! A fake Kubernetes API server over HTTPS, for testing powerplane's Kubernetes client
//! (kube-rs) where no kube-apiserver can be had.
//!
//! It speaks the protocol as a real API server does, for the few resources powerplane
//! uses: pods (core v1), events (`events.k8s.io/v1` and core v1) and leases
//! (`coordination.k8s.io/v1`).
//!
//! - **TLS like a cluster**: a CA of its own (made with the `openssl` command) signs the
//!   server certificate for `127.0.0.1` and `localhost`. It writes a kubeconfig and a
//!   service-account directory (`token`, `ca.crt`, `namespace`) for the clients.
//! - **Client certificates** the cluster's CA signed are accepted as a user, as a
//!   token is (`kubeconfig_certificate`); a certificate of another CA fails the handshake.
//! - **Bearer tokens**: anything else is `401` with a `Status`; the accepted tokens can
//!   be rotated at run time ([`FakeKubeApi::set_tokens`]).
//! - **One global resourceVersion**, as etcd's revision: every write bumps it, every
//!   object carries the version of its last write, and a bounded history of changes
//!   serves watches and consistent list pages. A write that changes nothing is not a
//!   write (no new version, no event), as on the real server.
//! - **Lists** with label and field selectors, `limit` and `continue` (a snapshot at the
//!   first page's version, `410 Expired` once that version is compacted away),
//!   `resourceVersion` and `resourceVersionMatch`.
//! - **Watches** as chunked newline-delimited JSON: `ADDED`/`MODIFIED`/`DELETED` after
//!   the given version (an object that stops matching a selector is `DELETED`, one that
//!   starts matching is `ADDED`), `BOOKMARK`s, `timeoutSeconds`, streaming lists
//!   (`sendInitialEvents`), and the `ERROR` event with a `410 Expired` `Status` when the
//!   version asked for is older than the history kept.
//! - **Writes** with the server's optimistic concurrency (`409 Conflict`,
//!   `409 AlreadyExists`), JSON patch (RFC 6902), merge patch (RFC 7386; strategic
//!   merge patch is taken as a merge patch, so lists are replaced, not merged by key),
//!   and the pod rule that scheduling gates may only be removed.
//! - **Faults** switched from the test thread: stalled watches, hanging requests, the
//!   next n requests failing, every watch expired, the server stopped and restarted on
//!   the same port with its objects kept.
//! - **A log** of every request, for assertions.
//!
//! It runs on a tokio runtime on a thread of its own, so plain `#[test]`s can use it.

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Body, Bytes, Frame, Incoming};
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Map, Value};

/// Changes kept for watches and list pages unless [`Options::history`] says otherwise.
const DEFAULT_HISTORY: usize = 1000;

/// How the fake starts; [`Options::default`] is what [`FakeKubeApi::start`] uses.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace of the kubeconfig's context and of the service account.
    pub namespace: String,
    /// The one token accepted at start, in the kubeconfig and the service account's
    /// `token` file.
    pub token: String,
    /// How often a watch that asked for bookmarks gets one.
    pub bookmark_every: Duration,
    /// How many changes are kept; a watch or a list page at a version older than the
    /// oldest kept change is `410 Expired`.
    pub history: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            namespace: "default".to_string(),
            token: "fake-kube-token-1".to_string(),
            bookmark_every: Duration::from_secs(1),
            history: DEFAULT_HISTORY,
        }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestRecord {
    pub method: String,
    pub path: String,
    /// The raw query string (still percent-encoded), empty when none.
    pub query: String,
    /// Whether its bearer token was one of those accepted.
    pub authorized: bool,
    /// Whether it asked to watch (`watch=true` or `watch=1`).
    pub watch: bool,
}

/// The resources served.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Res {
    Pods,
    /// `events.k8s.io/v1`
    Events,
    /// core v1 events
    CoreEvents,
    Leases,
}

impl Res {
    fn kind(self) -> &'static str {
        match self {
            Res::Pods => "Pod",
            Res::Events | Res::CoreEvents => "Event",
            Res::Leases => "Lease",
        }
    }

    fn api_version(self) -> &'static str {
        match self {
            Res::Pods | Res::CoreEvents => "v1",
            Res::Events => "events.k8s.io/v1",
            Res::Leases => "coordination.k8s.io/v1",
        }
    }

    fn group(self) -> &'static str {
        match self {
            Res::Pods | Res::CoreEvents => "",
            Res::Events => "events.k8s.io",
            Res::Leases => "coordination.k8s.io",
        }
    }

    fn plural(self) -> &'static str {
        match self {
            Res::Pods => "pods",
            Res::Events | Res::CoreEvents => "events",
            Res::Leases => "leases",
        }
    }

    /// As the server names it in messages: `pods`, `leases.coordination.k8s.io`.
    fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_string(),
            g => format!("{}.{g}", self.plural()),
        }
    }

    /// Leases refuse an update without `metadata.resourceVersion`; pods and events
    /// take it unconditionally.
    fn allows_unconditional_update(self) -> bool {
        self != Res::Leases
    }

    /// A PUT of a lease that does not exist creates it; of anything else, 404.
    fn allows_create_on_update(self) -> bool {
        self == Res::Leases
    }
}

/// A failure answered as a `Status` object.
#[derive(Debug, Clone)]
struct Failure {
    code: u16,
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

impl Failure {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Failure {
        Failure {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, res: Res, name: &str) -> Failure {
        let mut d = json!({"name": name, "kind": res.plural()});
        if !res.group().is_empty() {
            d["group"] = json!(res.group());
        }
        self.details = Some(d);
        self
    }

    fn bad_request(message: impl Into<String>) -> Failure {
        Failure::new(400, "BadRequest", message)
    }

    fn invalid(message: impl Into<String>) -> Failure {
        Failure::new(422, "Invalid", message)
    }

    fn not_found(res: Res, name: &str) -> Failure {
        Failure::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified()),
        )
        .about(res, name)
    }

    fn expired(message: impl Into<String>) -> Failure {
        Failure::new(410, "Expired", message)
    }

    fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// The reason the server gives with a status code.
fn reason_of(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        410 => "Expired",
        415 => "UnsupportedMediaType",
        422 => "Invalid",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// One write, as etcd keeps it: the object before and after (`None`: absent).
#[derive(Debug, Clone)]
struct Change {
    rv: u64,
    res: Res,
    ns: String,
    name: String,
    old: Option<Value>,
    new: Option<Value>,
}

type Key = (Res, String, String);

/// Everything the server knows; one lock, never held across an await.
struct Store {
    rv: u64,
    uid_seq: u64,
    objects: BTreeMap<Key, Value>,
    history: VecDeque<Change>,
    history_cap: usize,
    /// A watch or list snapshot needs every change after its version: one older than
    /// this is gone.
    compacted: u64,
    /// Bumped by `expire_watches`: every watch started before it ends with 410.
    expire_epoch: u64,
    tokens: Vec<String>,
    stalled: bool,
    /// Bumped each time watches are stalled: a watch open then is silent for good.
    stall_epoch: u64,
    hang: bool,
    fail: Option<(usize, u16)>,
    bookmark_every: Duration,
    requests: Vec<RequestRecord>,
}

fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = json!({});
    }
    let o = obj.as_object_mut().expect("an object");
    let m = o.entry("metadata").or_insert_with(|| json!({}));
    if !m.is_object() {
        *m = json!({});
    }
    m.as_object_mut().expect("an object")
}

impl Store {
    fn new(opts: &Options) -> Store {
        Store {
            rv: 1,
            uid_seq: 0,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            history_cap: opts.history.max(1),
            compacted: 1,
            expire_epoch: 0,
            tokens: vec![opts.token.clone()],
            stalled: false,
            stall_epoch: 0,
            hang: false,
            fail: None,
            bookmark_every: opts.bookmark_every,
            requests: Vec::new(),
        }
    }

    fn next_uid(&mut self) -> String {
        self.uid_seq += 1;
        format!(
            "{:08x}-fa4e-4b0b-8000-{:012x}",
            std::process::id(),
            self.uid_seq
        )
    }

    /// Stores (or, with `None`, removes) an object at the next version, keeps the
    /// change, and answers what was stored.
    fn write(&mut self, res: Res, ns: &str, name: &str, new: Option<Value>) -> Option<Value> {
        self.rv += 1;
        let rv = self.rv;
        let key = (res, ns.to_string(), name.to_string());
        let new = new.map(|mut v| {
            meta_mut(&mut v).insert("resourceVersion".into(), json!(rv.to_string()));
            v
        });
        let old = match &new {
            Some(v) => self.objects.insert(key, v.clone()),
            None => self.objects.remove(&key),
        };
        self.history.push_back(Change {
            rv,
            res,
            ns: ns.to_string(),
            name: name.to_string(),
            old,
            new: new.clone(),
        });
        while self.history.len() > self.history_cap {
            if let Some(c) = self.history.pop_front() {
                self.compacted = c.rv;
            }
        }
        new
    }

    /// Drops the history: a watch or a list page at an older version is 410 Expired.
    fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// The objects of a resource as they were at version `at`, rebuilt from the
    /// current ones by undoing the later changes.
    fn snapshot(&self, res: Res, at: u64) -> Result<BTreeMap<(String, String), Value>, Failure> {
        if at < self.compacted {
            return Err(Failure::expired(format!(
                "too old resource version: {at} ({})",
                self.compacted
            )));
        }
        let mut objs: BTreeMap<(String, String), Value> = self
            .objects
            .iter()
            .filter(|((r, _, _), _)| *r == res)
            .map(|((_, ns, name), v)| ((ns.clone(), name.clone()), v.clone()))
            .collect();
        for c in self.history.iter().rev() {
            if c.rv <= at {
                break;
            }
            if c.res != res {
                continue;
            }
            let k = (c.ns.clone(), c.name.clone());
            match &c.old {
                Some(v) => objs.insert(k, v.clone()),
                None => objs.remove(&k),
            };
        }
        Ok(objs)
    }

    /// Fills in what the server sets on every object it stores: kind, apiVersion,
    /// namespace. A kind or apiVersion of another resource is refused.
    fn typed(res: Res, ns: &str, mut obj: Value) -> Result<Value, Failure> {
        if !obj.is_object() {
            return Err(Failure::bad_request("the body is not a JSON object"));
        }
        for (field, want) in [("kind", res.kind()), ("apiVersion", res.api_version())] {
            match obj.get(field).and_then(Value::as_str) {
                None | Some("") => obj[field] = json!(want),
                Some(have) if have == want => {}
                Some(have) => {
                    return Err(Failure::bad_request(format!(
                        "the API version in the data ({have}) does not match the expected API version ({})",
                        res.api_version()
                    )))
                }
            }
        }
        match meta_str(&obj, "namespace") {
            None | Some("") => {
                meta_mut(&mut obj).insert("namespace".into(), json!(ns));
            }
            Some(have) if have == ns => {}
            Some(_) => {
                return Err(Failure::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ))
            }
        }
        Ok(obj)
    }

    fn create(&mut self, res: Res, ns: &str, obj: Value) -> Result<Value, Failure> {
        let mut obj = Store::typed(res, ns, obj)?;
        let name = match meta_str(&obj, "name") {
            Some(n) if !n.is_empty() => n.to_string(),
            _ => match meta_str(&obj, "generateName") {
                Some(g) if !g.is_empty() => {
                    let n = format!("{g}{:05x}", (self.uid_seq * 7919 + 31) & 0xfffff);
                    meta_mut(&mut obj).insert("name".into(), json!(n));
                    n
                }
                _ => {
                    return Err(Failure::invalid(format!(
                        "{} \"\" is invalid: metadata.name: Required value: name or generateName is required",
                        res.kind()
                    )))
                }
            },
        };
        if self
            .objects
            .contains_key(&(res, ns.to_string(), name.clone()))
        {
            return Err(Failure::new(
                409,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", res.qualified()),
            )
            .about(res, &name));
        }
        if meta_str(&obj, "resourceVersion").is_some_and(|v| !v.is_empty()) {
            return Err(Failure::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let uid = self.next_uid();
        let m = meta_mut(&mut obj);
        m.insert("uid".into(), json!(uid));
        m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        if res == Res::Pods && obj.get("status").is_none() {
            obj["status"] = json!({"phase": "Pending"});
        }
        Ok(self.write(res, ns, &name, Some(obj)).expect("stored"))
    }

    /// An update of a stored object to `new`, checked as the server checks it.
    fn update(
        &mut self,
        res: Res,
        ns: &str,
        name: &str,
        new: Value,
        manager: &str,
        conditional_only: bool,
    ) -> Result<Value, Failure> {
        let key = (res, ns.to_string(), name.to_string());
        let Some(stored) = self.objects.get(&key).cloned() else {
            return Err(Failure::not_found(res, name));
        };
        let mut new = Store::typed(res, ns, new)?;
        if meta_str(&new, "name") != Some(name) {
            return Err(Failure::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({name})",
                meta_str(&new, "name").unwrap_or("")
            )));
        }
        let stored_rv = meta_str(&stored, "resourceVersion")
            .unwrap_or("")
            .to_string();
        match meta_str(&new, "resourceVersion") {
            Some(v) if !v.is_empty() && v != stored_rv => {
                return Err(Failure::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                        res.qualified()
                    ),
                )
                .about(res, name));
            }
            Some(v) if !v.is_empty() => {}
            _ if conditional_only => {
                return Err(Failure::invalid(format!(
                    "{} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0x0: must be specified for an update",
                    res.kind()
                ))
                .about(res, name));
            }
            _ => {}
        }
        let stored_uid = meta_str(&stored, "uid").unwrap_or("").to_string();
        if let Some(uid) = meta_str(&new, "uid") {
            if !uid.is_empty() && uid != stored_uid {
                return Err(Failure::new(
                    409,
                    "Conflict",
                    format!(
                        "Operation cannot be fulfilled on {} \"{name}\": Precondition failed: UID in precondition: {uid}, UID in object meta: {stored_uid}",
                        res.qualified()
                    ),
                )
                .about(res, name));
            }
        }
        if res == Res::Pods {
            check_scheduling_gates(name, &stored, &new)?;
        }
        {
            let m = meta_mut(&mut new);
            m.insert("uid".into(), json!(stored_uid));
            m.insert("resourceVersion".into(), json!(stored_rv));
            for field in ["creationTimestamp", "managedFields"] {
                match stored.get("metadata").and_then(|s| s.get(field)) {
                    Some(v) => m.insert(field.into(), v.clone()),
                    None => m.remove(field),
                };
            }
        }
        if new == stored {
            // nothing changed: no write, no new version, no event
            return Ok(stored);
        }
        record_manager(&mut new, manager, res);
        Ok(self.write(res, ns, name, Some(new)).expect("stored"))
    }
}

/// Records who updated the object in `metadata.managedFields`, as the server does.
fn record_manager(obj: &mut Value, manager: &str, res: Res) {
    let entry = json!({
        "manager": manager,
        "operation": "Update",
        "apiVersion": res.api_version(),
        "time": now_rfc3339(),
        "fieldsType": "FieldsV1",
        "fieldsV1": {},
    });
    let m = meta_mut(obj);
    let list = m.entry("managedFields").or_insert_with(|| json!([]));
    if !list.is_array() {
        *list = json!([]);
    }
    let list = list.as_array_mut().expect("an array");
    list.retain(|e| e.get("manager").and_then(Value::as_str) != Some(manager));
    list.push(entry);
}

/// After creation, `spec.schedulingGates` may only shrink: a gate removed cannot come
/// back, and none can be added.
fn check_scheduling_gates(name: &str, old: &Value, new: &Value) -> Result<(), Failure> {
    let gates = |v: &Value| -> Vec<String> {
        v.pointer("/spec/schedulingGates")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|g| g.get("name").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let before = gates(old);
    for g in gates(new) {
        if !before.contains(&g) {
            return Err(Failure::invalid(format!(
                "Pod \"{name}\" is invalid: spec.schedulingGates: Forbidden: only deletion is allowed, but found new scheduling gate '{g}'"
            ))
            .about(Res::Pods, name));
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// patches

/// RFC 6901: the reference tokens of a JSON pointer.
fn pointer_tokens(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let Some(rest) = p.strip_prefix('/') else {
        return Err(format!(
            "JSON pointer must be empty or start with a \"/\": {p}"
        ));
    };
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(token: &str, len: usize, allow_end: bool) -> Result<usize, String> {
    if allow_end && token == "-" {
        return Ok(len);
    }
    let digits = !token.is_empty()
        && token.bytes().all(|b| b.is_ascii_digit())
        && (token == "0" || !token.starts_with('0'));
    let parsed: Option<usize> = if digits { token.parse().ok() } else { None };
    let i = parsed.ok_or_else(|| format!("invalid array index: {token}"))?;
    let max = if allow_end {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > max || (!allow_end && len == 0) {
        return Err(format!("array index out of bounds: {token}"));
    }
    Ok(i)
}

fn resolve_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(m) => m
                .get_mut(t)
                .ok_or_else(|| format!("missing value at \"{t}\""))?,
            Value::Array(a) => {
                let i = array_index(t, a.len(), false)?;
                &mut a[i]
            }
            _ => return Err(format!("cannot descend into a scalar at \"{t}\"")),
        };
    }
    Ok(cur)
}

fn patch_add(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    match resolve_mut(doc, parent)? {
        Value::Object(m) => {
            m.insert(last.clone(), value);
        }
        Value::Array(a) => {
            let i = array_index(last, a.len(), true)?;
            a.insert(i, value);
        }
        _ => return Err(format!("cannot add to a scalar at {path}")),
    }
    Ok(())
}

fn patch_remove(doc: &mut Value, path: &str) -> Result<Value, String> {
    let tokens = pointer_tokens(path)?;
    let Some((last, parent)) = tokens.split_last() else {
        return Err("cannot remove the whole document".to_string());
    };
    match resolve_mut(doc, parent)? {
        Value::Object(m) => m
            .remove(last)
            .ok_or_else(|| format!("unable to remove nonexistent key: {last}: missing value")),
        Value::Array(a) => {
            let i = array_index(last, a.len(), false)?;
            Ok(a.remove(i))
        }
        _ => Err(format!("cannot remove from a scalar at {path}")),
    }
}

fn patch_replace(doc: &mut Value, path: &str, value: Value) -> Result<(), String> {
    let tokens = pointer_tokens(path)?;
    let target = resolve_mut(doc, &tokens).map_err(|e| {
        format!("replace operation does not apply: doc is missing key: {path}: {e}")
    })?;
    *target = value;
    Ok(())
}

/// RFC 6902, all or nothing: the document patched, or why not.
fn json_patch(doc: &Value, patch: &Value) -> Result<Value, Failure> {
    let Some(ops) = patch.as_array() else {
        return Err(Failure::bad_request(
            "json: cannot unmarshal object into Go value of type jsonpatch.Patch",
        ));
    };
    let mut out = doc.clone();
    for op in ops {
        let s = |f: &str| op.get(f).and_then(Value::as_str);
        let path = s("path");
        let value = op.get("value").cloned();
        let result = match (s("op"), path) {
            (None, _) => Err("missing 'op' field".to_string()),
            (Some(_), None) => Err("missing 'path' field".to_string()),
            (Some("add"), Some(p)) => value
                .ok_or_else(|| "missing 'value' field".to_string())
                .and_then(|v| patch_add(&mut out, p, v)),
            (Some("remove"), Some(p)) => patch_remove(&mut out, p).map(|_| ()),
            (Some("replace"), Some(p)) => value
                .ok_or_else(|| "missing 'value' field".to_string())
                .and_then(|v| patch_replace(&mut out, p, v)),
            (Some("test"), Some(p)) => {
                let have =
                    pointer_tokens(p).and_then(|t| resolve_mut(&mut out, &t).map(|v| v.clone()));
                match (have, value) {
                    (_, None) => Err("missing 'value' field".to_string()),
                    (Ok(have), Some(want)) if have == want => Ok(()),
                    _ => Err(format!("testing value {p} failed: test failed")),
                }
            }
            (Some(kind @ ("move" | "copy")), Some(p)) => match s("from") {
                None => Err("missing 'from' field".to_string()),
                Some(from) if kind == "move" && p.starts_with(&format!("{from}/")) => {
                    Err(format!("cannot move {from} into its own child {p}"))
                }
                Some(from) => {
                    let v = if kind == "move" {
                        patch_remove(&mut out, from)
                    } else {
                        pointer_tokens(from)
                            .and_then(|t| resolve_mut(&mut out, &t).map(|v| v.clone()))
                    };
                    v.and_then(|v| patch_add(&mut out, p, v))
                }
            },
            (Some(other), Some(_)) => Err(format!("Unexpected kind: {other}")),
        };
        result.map_err(Failure::invalid)?;
    }
    Ok(out)
}

/// RFC 7386.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Value::Object(p) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let t = target.as_object_mut().expect("an object");
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

// ---------------------------------------------------------------------------------
// selectors

#[derive(Debug, Clone)]
enum LabelReq {
    Exists(String),
    NotExists(String),
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

fn valid_label_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '/'))
}

/// The terms of a selector: split at the commas outside parentheses.
fn selector_terms(s: &str) -> Vec<String> {
    let (mut out, mut cur, mut depth) = (Vec::new(), String::new(), 0i32);
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    out.push(cur);
    out.into_iter()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect()
}

fn parse_label_selector(s: &str) -> Result<Vec<LabelReq>, Failure> {
    let bad = |t: &str| {
        Failure::bad_request(format!(
            "unable to parse requirement: found '{t}', expected: key, key=value, key!=value, !key, key in (values) or key notin (values)"
        ))
    };
    let mut out = Vec::new();
    for t in selector_terms(s) {
        let req = if let Some(k) = t.strip_prefix('!') {
            LabelReq::NotExists(k.trim().to_string())
        } else if let Some((k, v)) = t.split_once("!=") {
            LabelReq::Ne(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            LabelReq::Eq(k.trim().to_string(), v.trim().to_string())
        } else if let Some((k, rest)) = t.split_once(' ') {
            let rest = rest.trim();
            let (notin, list) = if let Some(l) = rest.strip_prefix("notin") {
                (true, l)
            } else if let Some(l) = rest.strip_prefix("in") {
                (false, l)
            } else {
                return Err(bad(&t));
            };
            let list = list.trim();
            let Some(inner) = list.strip_prefix('(').and_then(|l| l.strip_suffix(')')) else {
                return Err(bad(&t));
            };
            let values = inner.split(',').map(|v| v.trim().to_string()).collect();
            if notin {
                LabelReq::NotIn(k.to_string(), values)
            } else {
                LabelReq::In(k.to_string(), values)
            }
        } else {
            LabelReq::Exists(t.clone())
        };
        let key = match &req {
            LabelReq::Exists(k)
            | LabelReq::NotExists(k)
            | LabelReq::Eq(k, _)
            | LabelReq::Ne(k, _)
            | LabelReq::In(k, _)
            | LabelReq::NotIn(k, _) => k,
        };
        if !valid_label_key(key) {
            return Err(bad(&t));
        }
        out.push(req);
    }
    Ok(out)
}

fn labels_match(reqs: &[LabelReq], obj: &Value) -> bool {
    let label = |k: &str| {
        obj.pointer("/metadata/labels")
            .and_then(|l| l.get(k))
            .and_then(Value::as_str)
    };
    reqs.iter().all(|r| match r {
        LabelReq::Exists(k) => label(k).is_some(),
        LabelReq::NotExists(k) => label(k).is_none(),
        LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
        LabelReq::Ne(k, v) => label(k) != Some(v.as_str()),
        LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
        LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| !vs.iter().any(|v| v == l)),
    })
}

#[derive(Debug, Clone)]
struct FieldReq {
    field: String,
    value: String,
    equal: bool,
}

/// The fields each resource can be selected by, as the server allows.
fn selectable(res: Res, field: &str) -> bool {
    matches!(field, "metadata.name" | "metadata.namespace")
        || (res == Res::Pods
            && matches!(
                field,
                "spec.nodeName"
                    | "spec.restartPolicy"
                    | "spec.schedulerName"
                    | "spec.serviceAccountName"
                    | "spec.hostNetwork"
                    | "status.phase"
                    | "status.podIP"
                    | "status.nominatedNodeName"
            ))
        || (matches!(res, Res::Events | Res::CoreEvents)
            && (field.starts_with("involvedObject.")
                || field.starts_with("regarding.")
                || matches!(
                    field,
                    "reason" | "reportingController" | "type" | "source" | "reportingComponent"
                )))
}

fn parse_field_selector(res: Res, s: &str) -> Result<Vec<FieldReq>, Failure> {
    let mut out = Vec::new();
    for t in selector_terms(s) {
        let (field, value, equal) = if let Some((f, v)) = t.split_once("!=") {
            (f, v, false)
        } else if let Some((f, v)) = t.split_once("==").or_else(|| t.split_once('=')) {
            (f, v, true)
        } else {
            return Err(Failure::bad_request(format!(
                "invalid selector: '{s}'; can't understand '{t}'"
            )));
        };
        let field = field.trim();
        if !selectable(res, field) {
            return Err(Failure::bad_request(format!(
                "field label not supported: {field}"
            )));
        }
        out.push(FieldReq {
            field: field.to_string(),
            value: value.trim().to_string(),
            equal,
        });
    }
    Ok(out)
}

fn fields_match(reqs: &[FieldReq], obj: &Value) -> bool {
    reqs.iter().all(|r| {
        let pointer = format!("/{}", r.field.replace('.', "/"));
        let have = match obj.pointer(&pointer) {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Bool(b)) => b.to_string(),
            Some(Value::Number(n)) => n.to_string(),
            _ => String::new(),
        };
        (have == r.value) == r.equal
    })
}

/// Which objects a list or watch is about.
#[derive(Debug, Clone)]
struct Filter {
    res: Res,
    ns: Option<String>,
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    fn matches(&self, ns: &str, obj: &Value) -> bool {
        self.ns.as_deref().is_none_or(|n| n == ns)
            && labels_match(&self.labels, obj)
            && fields_match(&self.fields, obj)
    }
}

// ---------------------------------------------------------------------------------
// the server's shared state and its thread

struct Shared {
    store: Mutex<Store>,
    /// Bumped on every write and every fault switched, to wake the watches.
    wake: tokio::sync::watch::Sender<u64>,
    open_watches: AtomicUsize,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wake(&self) {
        self.wake.send_modify(|g| *g = g.wrapping_add(1));
    }
}

struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

/// The fake API server. Dropping it stops it.
pub struct FakeKubeApi {
    shared: Arc<Shared>,
    port: u16,
    namespace: String,
    ca_file: PathBuf,
    kubeconfig: PathBuf,
    sa_dir: PathBuf,
    tls: Arc<rustls::ServerConfig>,
    running: Option<Running>,
}

/// Runs `openssl` with these arguments, failing the test loudly when it cannot.
fn openssl(args: &[&str], dir: &Path) {
    let out = std::process::Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("this test needs the openssl command");
    assert!(
        out.status.success(),
        "openssl {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate it signs for 127.0.0.1 and localhost, in `dir`:
/// `ca.crt`, `ca.key`, `server.crt`, `server.key`.
fn make_certificates(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"];
    let mut ca = vec!["req", "-x509", "-nodes", "-days", "2"];
    ca.extend(ec);
    ca.extend([
        "-subj",
        "/CN=fake-kubernetes-ca",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
    ]);
    openssl(&ca, dir);
    let mut csr = vec!["req", "-new", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/CN=kube-apiserver",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    openssl(&csr, dir);
    std::fs::write(
        dir.join("server.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .expect("write server.ext");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "2",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
        dir,
    );
    // a client certificate the CA signs (a user the API server knows by it)
    let mut csr = vec!["req", "-new", "-nodes"];
    csr.extend(ec);
    csr.extend([
        "-subj",
        "/O=powerplane/CN=powerplane-controller",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
    ]);
    openssl(&csr, dir);
    std::fs::write(
        dir.join("client.ext"),
        "basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
    )
    .expect("write client.ext");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-set_serial",
            "3",
            "-days",
            "2",
            "-extfile",
            "client.ext",
            "-out",
            "client.crt",
        ],
        dir,
    );
}

fn tls_config(cert: &Path, key: &Path, ca: &Path) -> Arc<rustls::ServerConfig> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .expect("server certificate")
        .collect::<Result<_, _>>()
        .expect("certificates");
    let key = PrivateKeyDer::from_pem_file(key).expect("server key");
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // client certificates of the cluster's CA are a way in, as a token is; a client
    // without one may still bring a token
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).expect("ca") {
        roots.add(c.expect("ca certificate")).expect("ca root");
    }
    let clients = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        provider.clone(),
    )
    .allow_unauthenticated()
    .build()
    .expect("client verifier");
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocols")
        .with_client_cert_verifier(clients)
        .with_single_cert(certs, key)
        .expect("server config");
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

impl FakeKubeApi {
    /// Starts with [`Options::default`], writing its certificates, kubeconfig and
    /// service-account directory under `dir`.
    ///
    /// # Panics
    /// When the `openssl` command is missing or fails, or no port can be bound.
    pub fn start(dir: &Path) -> FakeKubeApi {
        FakeKubeApi::start_with(dir, Options::default())
    }

    /// # Panics
    /// When the `openssl` command is missing or fails, or no port can be bound.
    pub fn start_with(dir: &Path, opts: Options) -> FakeKubeApi {
        let pki = dir.join("pki");
        std::fs::create_dir_all(&pki).expect("pki dir");
        make_certificates(&pki);
        let tls = tls_config(
            &pki.join("server.crt"),
            &pki.join("server.key"),
            &pki.join("ca.crt"),
        );
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let ca_file = pki.join("ca.crt");

        let sa_dir = dir.join("serviceaccount");
        std::fs::create_dir_all(&sa_dir).expect("service-account dir");
        std::fs::copy(&ca_file, sa_dir.join("ca.crt")).expect("ca.crt");
        std::fs::write(sa_dir.join("namespace"), &opts.namespace).expect("namespace");
        std::fs::write(sa_dir.join("token"), &opts.token).expect("token");

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\nusers:\n- name: tester\n  user:\n    token: {token}\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: tester\n    namespace: {ns}\ncurrent-context: fake\n",
                ca = ca_file.display(),
                token = opts.token,
                ns = opts.namespace,
            ),
        )
        .expect("kubeconfig");
        std::fs::write(
            dir.join("kubeconfig-certificate"),
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority: {ca}\nusers:\n- name: controller\n  user:\n    client-certificate: {crt}\n    client-key: {key}\ncontexts:\n- name: by-certificate\n  context:\n    cluster: fake\n    user: controller\n    namespace: {ns}\ncurrent-context: by-certificate\n",
                ca = ca_file.display(),
                crt = pki.join("client.crt").display(),
                key = pki.join("client.key").display(),
                ns = opts.namespace,
            ),
        )
        .expect("kubeconfig with a client certificate");

        let (wake, _) = tokio::sync::watch::channel(0u64);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(&opts)),
            wake,
            open_watches: AtomicUsize::new(0),
        });
        let mut api = FakeKubeApi {
            shared,
            port,
            namespace: opts.namespace,
            ca_file,
            kubeconfig,
            sa_dir,
            tls,
            running: None,
        };
        api.serve(listener);
        api
    }

    fn serve(&mut self, listener: std::net::TcpListener) {
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let (shared, tls) = (self.shared.clone(), self.tls.clone());
        let thread = std::thread::Builder::new()
            .name("fake-kube-api".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                    let mut stopped = stopped;
                    loop {
                        tokio::select! {
                            _ = &mut stopped => break,
                            accepted = listener.accept() => {
                                if let Ok((tcp, _)) = accepted {
                                    tokio::spawn(connection(tcp, acceptor.clone(), shared.clone()));
                                }
                            }
                        }
                    }
                });
                // dropping the runtime drops every connection and every watch with it
                drop(rt);
            })
            .expect("server thread");
        self.running = Some(Running { stop, thread });
    }

    /// `https://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The CA that signed the server's certificate (PEM).
    pub fn ca_file(&self) -> &Path {
        &self.ca_file
    }

    /// A kubeconfig: this server, its CA, a user with the first token, a context with
    /// the namespace, and it as the current context.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// A kubeconfig whose user is a client certificate the cluster's CA signed (no
    /// token), beside [`FakeKubeApi::kubeconfig`].
    pub fn kubeconfig_certificate(&self) -> PathBuf {
        self.kubeconfig.with_file_name("kubeconfig-certificate")
    }

    /// As mounted at `/var/run/secrets/kubernetes.io/serviceaccount`: `token`,
    /// `ca.crt`, `namespace`.
    pub fn service_account_dir(&self) -> &Path {
        &self.sa_dir
    }

    /// The namespace of the kubeconfig's context and of the service account.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The tokens accepted now.
    pub fn tokens(&self) -> Vec<String> {
        self.shared.lock().tokens.clone()
    }

    /// Accepts only these tokens from now on, and writes the first into the
    /// service-account `token` file (atomically, as the kubelet does).
    pub fn set_tokens(&self, tokens: &[&str]) {
        self.shared.lock().tokens = tokens.iter().map(|t| t.to_string()).collect();
        if let Some(first) = tokens.first() {
            let tmp = self.sa_dir.join(".token.new");
            std::fs::write(&tmp, first).expect("write token");
            std::fs::rename(&tmp, self.sa_dir.join("token")).expect("rotate token");
        }
    }

    /// The current resourceVersion (the last write's).
    pub fn resource_version(&self) -> u64 {
        self.shared.lock().rv
    }

    fn put(&self, res: Res, obj: Value) -> Value {
        let ns = meta_str(&obj, "namespace")
            .filter(|n| !n.is_empty())
            .unwrap_or(self.namespace.as_str())
            .to_string();
        let name = meta_str(&obj, "name")
            .filter(|n| !n.is_empty())
            .expect("the object needs metadata.name")
            .to_string();
        let mut obj = Store::typed(res, &ns, obj).expect("an object of this resource");
        let stored = {
            let mut st = self.shared.lock();
            let key = (res, ns.clone(), name.clone());
            let old = st.objects.get(&key).cloned();
            let m = meta_mut(&mut obj);
            match &old {
                Some(o) => {
                    for f in ["uid", "creationTimestamp"] {
                        if let Some(v) = o.get("metadata").and_then(|m| m.get(f)) {
                            m.insert(f.into(), v.clone());
                        }
                    }
                }
                None => {
                    m.insert("creationTimestamp".into(), json!(now_rfc3339()));
                }
            }
            if old.is_none() {
                let uid = st.next_uid();
                meta_mut(&mut obj).insert("uid".into(), json!(uid));
            }
            st.write(res, &ns, &name, Some(obj)).expect("stored")
        };
        self.shared.wake();
        stored
    }

    fn remove(&self, res: Res, ns: &str, name: &str) -> Option<Value> {
        let old = {
            let mut st = self.shared.lock();
            let old = st
                .objects
                .get(&(res, ns.to_string(), name.to_string()))
                .cloned();
            if old.is_some() {
                st.write(res, ns, name, None);
            }
            old
        };
        self.shared.wake();
        old
    }

    fn all(&self, res: Res) -> Vec<Value> {
        let st = self.shared.lock();
        st.objects
            .iter()
            .filter(|((r, _, _), _)| *r == res)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Creates or replaces a pod as another client would (no checks), emitting ADDED
    /// or MODIFIED; the namespace defaults to [`Self::namespace`]. Answers the stored pod.
    ///
    /// # Panics
    /// When the pod has no `metadata.name`.
    pub fn put_pod(&self, pod: Value) -> Value {
        self.put(Res::Pods, pod)
    }

    /// Deletes a pod, emitting DELETED; answers it as it was.
    pub fn delete_pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.remove(Res::Pods, ns, name)
    }

    pub fn pod(&self, ns: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&(Res::Pods, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Every pod, by namespace and name.
    pub fn pods(&self) -> Vec<Value> {
        self.all(Res::Pods)
    }

    /// Every event (`events.k8s.io/v1` and core v1), in the order they were created.
    pub fn events(&self) -> Vec<Value> {
        let mut e = self.all(Res::Events);
        e.extend(self.all(Res::CoreEvents));
        e.sort_by(|a, b| meta_str(a, "uid").cmp(&meta_str(b, "uid")));
        e
    }

    pub fn lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&(Res::Leases, ns.to_string(), name.to_string()))
            .cloned()
    }

    /// Creates or replaces a lease as another holder would (no version check), e.g.
    /// to make someone else take it. Answers the stored lease.
    ///
    /// # Panics
    /// When the lease has no `metadata.name`.
    pub fn set_lease(&self, lease: Value) -> Value {
        self.put(Res::Leases, lease)
    }

    pub fn delete_lease(&self, ns: &str, name: &str) -> Option<Value> {
        self.remove(Res::Leases, ns, name)
    }

    /// Drops the history of changes, as an etcd compaction: a watch or a list page at
    /// an older version than the current one is `410 Expired`. Open watches that are
    /// caught up go on.
    pub fn compact(&self) {
        self.shared.lock().compact();
        self.shared.wake();
    }

    /// Every open watch gets an `ERROR` event with a `410 Expired` Status and is
    /// closed, and the history is compacted: resuming at an older version is 410 too.
    pub fn expire_watches(&self) {
        {
            let mut st = self.shared.lock();
            st.compact();
            st.expire_epoch += 1;
        }
        self.shared.wake();
    }

    /// While on, a watch answers its headers and then nothing, its connection open: a
    /// connection silently lost. A watch stalled (open when this is switched on, or
    /// started while it is on) stays silent for good, even when this is switched off;
    /// the watches started after that are served again.
    pub fn stall_watches(&self, on: bool) {
        {
            let mut st = self.shared.lock();
            st.stalled = on;
            if on {
                st.stall_epoch += 1;
            }
        }
        self.shared.wake();
    }

    /// While on, every request is accepted and never answered (those already hung stay
    /// so until their connection closes).
    pub fn hang(&self, on: bool) {
        self.shared.lock().hang = on;
    }

    /// The next `n` requests are answered with this HTTP status and a `Status` body
    /// (before authentication, as a proxy or an overloaded server would).
    pub fn fail_next(&self, n: usize, status: u16) {
        self.shared.lock().fail = (n > 0).then_some((n, status));
    }

    /// How often watches that asked for bookmarks get one (those started from now on).
    pub fn set_bookmark_every(&self, every: Duration) {
        self.shared.lock().bookmark_every = every;
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.lock().requests.clone()
    }

    /// Lists of pods so far (GETs of a pod collection that are not watches).
    pub fn list_requests(&self) -> usize {
        self.count(false)
    }

    /// Watches of pods so far.
    pub fn watch_requests(&self) -> usize {
        self.count(true)
    }

    fn count(&self, watch: bool) -> usize {
        self.shared
            .lock()
            .requests
            .iter()
            .filter(|r| r.method == "GET" && r.path.ends_with("/pods") && r.watch == watch)
            .count()
    }

    /// Watches open now (stalled ones included).
    pub fn open_watches(&self) -> usize {
        self.shared.open_watches.load(Ordering::SeqCst)
    }

    /// Stops the server: the port refuses connections, every connection is closed. The
    /// objects are kept for [`Self::restart`].
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = r.stop.send(());
            let _ = r.thread.join();
        }
    }

    /// Stops the server if it runs and starts it again on the same port, with the same
    /// objects, versions and history: the API server restarting.
    ///
    /// # Panics
    /// When the port cannot be bound again.
    pub fn restart(&mut self) {
        self.stop();
        let mut last = None;
        for _ in 0..50 {
            match std::net::TcpListener::bind(("127.0.0.1", self.port)) {
                Ok(l) => {
                    self.serve(l);
                    return;
                }
                Err(e) => last = Some(e),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("could not bind port {} again: {last:?}", self.port);
    }
}

impl Drop for FakeKubeApi {
    fn drop(&mut self) {
        self.stop();
    }
}

// ---------------------------------------------------------------------------------
// HTTP

type ResBody = BoxBody<Bytes, Infallible>;

async fn connection(
    tcp: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    shared: Arc<Shared>,
) {
    let Ok(tls) = acceptor.accept(tcp).await else {
        return; // the client refused our certificate (or we its), or went away
    };
    // rustls verified it against the cluster's CA during the handshake
    let by_certificate = tls
        .get_ref()
        .1
        .peer_certificates()
        .is_some_and(|c| !c.is_empty());
    let service =
        hyper::service::service_fn(move |req| handle(shared.clone(), req, by_certificate));
    let _ = hyper::server::conn::http1::Builder::new()
        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
        .await;
}

fn respond(code: u16, body: &Value) -> Response<ResBody> {
    let bytes = serde_json::to_vec(body).expect("json");
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(Full::new(Bytes::from(bytes)).boxed())
        .expect("response")
}

fn fail(f: &Failure) -> Response<ResBody> {
    respond(f.code, &f.status())
}

/// Percent-decodes a query component (`+` is a space, as in forms).
fn decode(s: &str) -> String {
    let hex = |c: u8| (c as char).to_digit(16);
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'+', _, _) => out.push(b' '),
            (b'%', Some(hi), Some(lo)) => {
                out.push((hi * 16 + lo) as u8);
                i += 2;
            }
            (c, _, _) => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn query_pairs(q: &str) -> BTreeMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

fn truthy(v: Option<&String>) -> bool {
    matches!(v.map(String::as_str), Some("true" | "1"))
}

/// What a path names: a resource, maybe a namespace, maybe an object.
fn route(path: &str) -> Option<(Res, Option<String>, Option<String>)> {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (rest, group) = match segs.as_slice() {
        ["api", "v1", rest @ ..] => (rest, ""),
        ["apis", "events.k8s.io", "v1", rest @ ..] => (rest, "events.k8s.io"),
        ["apis", "coordination.k8s.io", "v1", rest @ ..] => (rest, "coordination.k8s.io"),
        _ => return None,
    };
    let res = |plural: &str| match (group, plural) {
        ("", "pods") => Some(Res::Pods),
        ("", "events") => Some(Res::CoreEvents),
        ("events.k8s.io", "events") => Some(Res::Events),
        ("coordination.k8s.io", "leases") => Some(Res::Leases),
        _ => None,
    };
    match rest {
        [plural] => Some((res(plural)?, None, None)),
        ["namespaces", ns, plural] => Some((res(plural)?, Some(ns.to_string()), None)),
        ["namespaces", ns, plural, name] if !name.is_empty() => {
            Some((res(plural)?, Some(ns.to_string()), Some(name.to_string())))
        }
        _ => None,
    }
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
    by_certificate: bool,
) -> Result<Response<ResBody>, Infallible> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let params = query_pairs(&query);
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let bearer = header("authorization")
        .strip_prefix("Bearer ")
        .map(|t| t.trim().to_string());
    let content_type = header("content-type");
    let user_agent = header("user-agent");
    let watch = truthy(params.get("watch"));

    let (hang, failure) = {
        let mut st = shared.lock();
        let authorized = by_certificate || bearer.as_ref().is_some_and(|t| st.tokens.contains(t));
        st.requests.push(RequestRecord {
            method: method.to_string(),
            path: path.clone(),
            query: query.clone(),
            authorized,
            watch,
        });
        let failure = match st.fail {
            Some((n, code)) => {
                st.fail = (n > 1).then_some((n - 1, code));
                Some(Failure::new(
                    code,
                    reason_of(code),
                    format!("injected failure ({code})"),
                ))
            }
            None if !authorized => Some(Failure::new(401, "Unauthorized", "Unauthorized")),
            None => None,
        };
        (st.hang, failure)
    };
    if hang {
        std::future::pending::<()>().await;
    }
    if let Some(f) = failure {
        return Ok(fail(&f));
    }
    if path == "/version" {
        return Ok(respond(
            200,
            &json!({"major": "1", "minor": "33", "gitVersion": "v1.33.0-fake", "platform": "linux/amd64"}),
        ));
    }
    let Some((res, ns, name)) = route(&path) else {
        return Ok(fail(&Failure::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )));
    };
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Ok(fail(&Failure::bad_request(
                "the request body could not be read",
            )))
        }
    };
    let manager = params.get("fieldManager").cloned().unwrap_or_else(|| {
        user_agent
            .split('/')
            .next()
            .unwrap_or("unknown")
            .to_string()
    });
    let manager = if manager.is_empty() {
        "unknown".to_string()
    } else {
        manager
    };

    let out = match (&method, ns, name) {
        (&Method::GET, ns, None) if watch => {
            return Ok(match start_watch(&shared, res, ns, &params) {
                Ok(r) => r,
                Err(f) => fail(&f),
            })
        }
        (&Method::GET, ns, None) => list(&shared.lock(), res, ns, &params).map(|v| (200, v)),
        (&Method::GET, Some(ns), Some(name)) => shared
            .lock()
            .objects
            .get(&(res, ns, name.clone()))
            .cloned()
            .map(|v| (200, v))
            .ok_or_else(|| Failure::not_found(res, &name)),
        (&Method::POST, Some(ns), None) => parse_body(&body)
            .and_then(|obj| shared.lock().create(res, &ns, obj))
            .map(|v| (201, v)),
        (&Method::PUT, Some(ns), Some(name)) => parse_body(&body).and_then(|obj| {
            let mut st = shared.lock();
            if res.allows_create_on_update()
                && !st.objects.contains_key(&(res, ns.clone(), name.clone()))
            {
                return put_create(&mut st, res, &ns, &name, obj).map(|v| (201, v));
            }
            st.update(
                res,
                &ns,
                &name,
                obj,
                &manager,
                !res.allows_unconditional_update(),
            )
            .map(|v| (200, v))
        }),
        (&Method::PATCH, Some(ns), Some(name)) => {
            patch(&shared, res, &ns, &name, &content_type, &body, &manager).map(|v| (200, v))
        }
        (&Method::DELETE, Some(ns), Some(name)) => {
            let mut st = shared.lock();
            match st.objects.get(&(res, ns.clone(), name.clone())).cloned() {
                Some(mut old) => {
                    st.write(res, &ns, &name, None);
                    let rv = st.rv.to_string();
                    meta_mut(&mut old).insert("resourceVersion".into(), json!(rv));
                    Ok((200, old))
                }
                None => Err(Failure::not_found(res, &name)),
            }
        }
        _ => Err(Failure::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )),
    };
    if matches!(
        method,
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        shared.wake();
    }
    Ok(match out {
        Ok((code, v)) => respond(code, &v),
        Err(f) => fail(&f),
    })
}

/// A PUT of an object that does not exist, where the resource allows it (leases):
/// a create, unless the body names a version, which cannot match.
fn put_create(
    st: &mut Store,
    res: Res,
    ns: &str,
    name: &str,
    obj: Value,
) -> Result<Value, Failure> {
    if meta_str(&obj, "name") != Some(name) {
        return Err(Failure::bad_request(format!(
            "the name of the object ({}) does not match the name on the URL ({name})",
            meta_str(&obj, "name").unwrap_or("")
        )));
    }
    if meta_str(&obj, "resourceVersion").is_some_and(|v| !v.is_empty()) {
        return Err(Failure::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                res.qualified()
            ),
        )
        .about(res, name));
    }
    st.create(res, ns, obj)
}

fn parse_body(body: &[u8]) -> Result<Value, Failure> {
    serde_json::from_slice(body)
        .map_err(|e| Failure::bad_request(format!("the request body is not JSON: {e}")))
}

fn patch(
    shared: &Shared,
    res: Res,
    ns: &str,
    name: &str,
    content_type: &str,
    body: &[u8],
    manager: &str,
) -> Result<Value, Failure> {
    let kind = content_type.split(';').next().unwrap_or("").trim();
    let doc = parse_body(body)?;
    let mut st = shared.lock();
    let Some(stored) = st
        .objects
        .get(&(res, ns.to_string(), name.to_string()))
        .cloned()
    else {
        return Err(Failure::not_found(res, name));
    };
    let patched = match kind {
        "application/json-patch+json" => json_patch(&stored, &doc)?,
        "application/merge-patch+json" | "application/strategic-merge-patch+json" => {
            if !doc.is_object() {
                return Err(Failure::bad_request("a merge patch must be a JSON object"));
            }
            let mut v = stored.clone();
            merge_patch(&mut v, &doc);
            v
        }
        other => {
            return Err(Failure::new(
                415,
                "UnsupportedMediaType",
                format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {other:?})"),
            ))
        }
    };
    st.update(res, ns, name, patched, manager, false)
}

fn strip_type(mut v: Value) -> Value {
    if let Some(o) = v.as_object_mut() {
        o.remove("kind");
        o.remove("apiVersion");
    }
    v
}

/// A start key in a continue token: after this namespace and name.
#[derive(Debug)]
struct Continue {
    rv: u64,
    after: (String, String),
}

fn encode_continue(rv: u64, ns: &str, name: &str) -> String {
    use base64::Engine as _;
    let token = json!({"v": "meta.k8s.io/v1", "rv": rv, "start": format!("{ns}/{name}\u{0}")});
    base64::engine::general_purpose::URL_SAFE.encode(token.to_string())
}

fn decode_continue(token: &str) -> Option<Continue> {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::URL_SAFE
        .decode(token)
        .ok()?;
    let v: Value = serde_json::from_slice(&raw).ok()?;
    if v.get("v")?.as_str()? != "meta.k8s.io/v1" {
        return None;
    }
    let rv = v.get("rv")?.as_u64()?;
    let start = v.get("start")?.as_str()?.strip_suffix('\u{0}')?;
    let (ns, name) = start.split_once('/')?;
    Some(Continue {
        rv,
        after: (ns.to_string(), name.to_string()),
    })
}

fn filter_from(
    res: Res,
    ns: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Filter, Failure> {
    Ok(Filter {
        res,
        ns,
        labels: parse_label_selector(params.get("labelSelector").map_or("", String::as_str))?,
        fields: parse_field_selector(res, params.get("fieldSelector").map_or("", String::as_str))?,
    })
}

fn parse_rv(s: &str) -> Result<u64, Failure> {
    s.parse()
        .map_err(|_| Failure::bad_request(format!("invalid resource version: {s:?}")))
}

fn list(
    st: &Store,
    res: Res,
    ns: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Value, Failure> {
    let filter = filter_from(res, ns, params)?;
    let rv = params.get("resourceVersion").filter(|v| !v.is_empty());
    let matching = params.get("resourceVersionMatch").filter(|v| !v.is_empty());
    let limit: Option<usize> = match params.get("limit").filter(|v| !v.is_empty()) {
        Some(l) => Some(
            l.parse()
                .map_err(|_| Failure::bad_request(format!("invalid limit: {l}")))?,
        ),
        None => None,
    }
    .filter(|l| *l > 0);
    let cont = params.get("continue").filter(|v| !v.is_empty());
    if matching.is_some() && rv.is_none() {
        return Err(Failure::bad_request(
            "resourceVersionMatch is forbidden unless resourceVersion is provided",
        ));
    }
    if cont.is_some() && rv.is_some() {
        return Err(Failure::bad_request(
            "specifying resource version is not allowed when using continue",
        ));
    }
    let (at, after) = if let Some(c) = cont {
        let c =
            decode_continue(c).ok_or_else(|| Failure::bad_request("continue key is not valid"))?;
        if c.rv < st.compacted {
            return Err(Failure::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        (c.rv, Some(c.after))
    } else {
        let at = match (rv.map(String::as_str), matching.map(String::as_str)) {
            (None | Some("0"), _) => st.rv,
            (Some(v), Some("Exact")) => parse_rv(v)?,
            (Some(v), None | Some("NotOlderThan")) => parse_rv(v)?.max(st.rv),
            (Some(_), Some(other)) => {
                return Err(Failure::bad_request(format!(
                    "resourceVersionMatch: Unsupported value: \"{other}\": supported values: \"Exact\", \"NotOlderThan\""
                )))
            }
        };
        if at > st.rv {
            return Err(Failure::new(
                504,
                "Timeout",
                format!("Too large resource version: {at}, current: {}", st.rv),
            ));
        }
        (at, None)
    };
    let objs = st.snapshot(res, at)?;
    let mut items: Vec<(&(String, String), &Value)> = objs
        .iter()
        .filter(|((ns, _), v)| filter.matches(ns, v))
        .filter(|(k, _)| after.as_ref().is_none_or(|a| *k > a))
        .collect();
    let total = items.len();
    let mut metadata = json!({"resourceVersion": at.to_string()});
    if let Some(l) = limit {
        if total > l {
            items.truncate(l);
            let (ns, name) = items
                .last()
                .map(|(k, _)| (*k).clone())
                .expect("a last item");
            metadata["continue"] = json!(encode_continue(at, &ns, &name));
            metadata["remainingItemCount"] = json!(total - l);
        }
    }
    Ok(json!({
        "kind": format!("{}List", res.kind()),
        "apiVersion": res.api_version(),
        "metadata": metadata,
        "items": items.into_iter().map(|(_, v)| strip_type(v.clone())).collect::<Vec<_>>(),
    }))
}

// ---------------------------------------------------------------------------------
// watches

/// A watch's response body: the lines its task sends.
struct WatchBody(tokio::sync::mpsc::UnboundedReceiver<Bytes>);

impl Body for WatchBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json");
    line.push(b'\n');
    Bytes::from(line)
}

fn bookmark(res: Res, rv: u64, initial_end: bool) -> Bytes {
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    event_line(
        "BOOKMARK",
        &json!({"kind": res.kind(), "apiVersion": res.api_version(), "metadata": meta}),
    )
}

struct Watch {
    filter: Filter,
    /// Every change up to this version has been dealt with.
    cursor: u64,
    bookmarks: bool,
    epoch: u64,
    stall_epoch: u64,
}

/// What a watch does next.
enum Step {
    Send(Vec<Bytes>),
    /// Send this (the 410 ERROR) and close.
    End(Bytes),
    /// Stalled: silent for good.
    Dead,
}

impl Watch {
    fn step(&mut self, st: &Store, bookmark_due: bool) -> Step {
        if st.stalled || st.stall_epoch != self.stall_epoch {
            return Step::Dead;
        }
        if st.expire_epoch != self.epoch || self.cursor < st.compacted {
            let f = Failure::expired(format!(
                "too old resource version: {} ({})",
                self.cursor, st.compacted
            ));
            return Step::End(event_line("ERROR", &f.status()));
        }
        let mut lines = Vec::new();
        for c in st.history.iter().filter(|c| c.rv > self.cursor) {
            if c.res != self.filter.res {
                continue;
            }
            let was = c.old.as_ref().filter(|o| self.filter.matches(&c.ns, o));
            let is = c.new.as_ref().filter(|n| self.filter.matches(&c.ns, n));
            match (was, is, &c.new) {
                (None, Some(n), _) => lines.push(event_line("ADDED", n)),
                (Some(_), Some(n), _) => lines.push(event_line("MODIFIED", n)),
                // stopped matching: gone from this watch's view, as it is now
                (Some(_), None, Some(n)) => lines.push(event_line("DELETED", n)),
                (Some(o), None, None) => {
                    let mut o = o.clone();
                    meta_mut(&mut o).insert("resourceVersion".into(), json!(c.rv.to_string()));
                    lines.push(event_line("DELETED", &o));
                }
                (None, None, _) => {}
            }
        }
        self.cursor = st.rv.max(self.cursor);
        if bookmark_due && self.bookmarks {
            lines.push(bookmark(self.filter.res, self.cursor, false));
        }
        Step::Send(lines)
    }
}

struct OpenWatch(Arc<Shared>);

impl Drop for OpenWatch {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

fn start_watch(
    shared: &Arc<Shared>,
    res: Res,
    ns: Option<String>,
    params: &BTreeMap<String, String>,
) -> Result<Response<ResBody>, Failure> {
    let filter = filter_from(res, ns, params)?;
    let bookmarks = truthy(params.get("allowWatchBookmarks"));
    let initial_events = truthy(params.get("sendInitialEvents"));
    let matching = params.get("resourceVersionMatch").filter(|v| !v.is_empty());
    if initial_events && (matching.map(String::as_str) != Some("NotOlderThan") || !bookmarks) {
        return Err(Failure::invalid(
            "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is allowed only with resourceVersionMatch=NotOlderThan and allowWatchBookmarks=true",
        ));
    }
    if !initial_events && matching.is_some() {
        return Err(Failure::invalid(
            "ListOptions.meta.k8s.io \"\" is invalid: resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
        ));
    }
    let timeout = match params.get("timeoutSeconds").filter(|v| !v.is_empty()) {
        Some(t) => Duration::from_secs(
            t.parse()
                .map_err(|_| Failure::bad_request(format!("invalid timeoutSeconds: {t}")))?,
        ),
        None => Duration::from_secs(1800),
    };
    let rv = params
        .get("resourceVersion")
        .filter(|v| !v.is_empty() && v.as_str() != "0")
        .map(|v| parse_rv(v))
        .transpose()?;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let (mut watch, every, initial) = {
        let st = shared.lock();
        let mut initial = Vec::new();
        let cursor = match rv {
            // "0" or none: the current state as ADDED, then the changes after it
            Some(v) if !initial_events => v,
            _ => {
                let objs = st.snapshot(res, st.rv).unwrap_or_default();
                for ((ns, _), v) in objs.iter() {
                    if filter.matches(ns, v) {
                        initial.push(event_line("ADDED", v));
                    }
                }
                if initial_events {
                    initial.push(bookmark(res, st.rv, true));
                }
                st.rv
            }
        };
        let w = Watch {
            filter,
            cursor,
            bookmarks,
            epoch: st.expire_epoch,
            stall_epoch: st.stall_epoch,
        };
        (w, st.bookmark_every, initial)
    };
    shared.open_watches.fetch_add(1, Ordering::SeqCst);
    let guard = OpenWatch(shared.clone());
    let shared = shared.clone();
    let mut wake = shared.wake.subscribe();
    tokio::spawn(async move {
        let _guard = guard;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending = Some(initial);
        let mut bookmark_due = false;
        loop {
            let step = watch.step(&shared.lock(), bookmark_due);
            bookmark_due = false;
            match step {
                Step::Dead => {
                    tx.closed().await;
                    return;
                }
                Step::End(line) => {
                    if let Some(first) = pending.take() {
                        for l in first {
                            let _ = tx.send(l);
                        }
                    }
                    let _ = tx.send(line);
                    return;
                }
                Step::Send(lines) => {
                    for l in pending.take().unwrap_or_default().into_iter().chain(lines) {
                        if tx.send(l).is_err() {
                            return;
                        }
                    }
                }
            }
            tokio::select! {
                _ = wake.changed() => {}
                _ = tick.tick() => bookmark_due = true,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tx.closed() => return,
            }
        }
    });
    Ok(Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(WatchBody(rx).boxed())
        .expect("response"))
}
