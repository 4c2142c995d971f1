//! `deploy/kubernetes/`: every manifest read into the Kubernetes API's own types
//! (k8s-openapi, the oldest release served: 1.33) and written back, so that a field the
//! API does not know (a typo) fails here instead of being dropped by `kubectl apply`;
//! the custom resources (cert-manager, the Prometheus Operator, kustomize, the
//! scheduler's configuration) checked by hand; and what an admin would check before
//! applying them: selectors that select, probes on `/healthz` and `/readyz`, an
//! unprivileged controller, references that resolve, RBAC that grants exactly what
//! powerplane uses, a kustomization that lists every file, and configuration files
//! that powerplane's own parsers take.
//!
//! Each test names the file, the object and the field of every problem it finds, and
//! lists all of them at once.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{
    ConfigMap, Container, KeyToPath, Namespace, PodSpec, PodTemplateSpec, Secret, Service,
    ServiceAccount, Volume,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

/// The one image every pod runs (the kustomization's `images:` overrides it).
const IMAGE: &str = "powerplane:0.1.0";

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One YAML document of a manifest file, as JSON.
#[derive(Debug, Clone)]
struct Doc {
    file: String,
    json: Value,
}

impl Doc {
    fn str_at(&self, pointer: &str) -> &str {
        self.json
            .pointer(pointer)
            .and_then(Value::as_str)
            .unwrap_or("")
    }
    fn api_version(&self) -> &str {
        self.str_at("/apiVersion")
    }
    fn kind(&self) -> &str {
        self.str_at("/kind")
    }
    fn name(&self) -> &str {
        self.str_at("/metadata/name")
    }
    fn namespace(&self) -> Option<&str> {
        self.json
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
    }
    /// `file: Kind namespace/name`, for messages.
    fn at(&self) -> String {
        match self.namespace() {
            Some(ns) => format!("{}: {} {ns}/{}", self.file, self.kind(), self.name()),
            None => format!("{}: {} {}", self.file, self.kind(), self.name()),
        }
    }
}

/// A typed object with where it came from.
#[derive(Debug, Clone)]
struct At<T> {
    doc: Doc,
    obj: T,
}

/// Everything under deploy/kubernetes, read and typed.
#[derive(Debug, Default)]
struct Manifests {
    /// The `*.yaml` files, by name.
    files: Vec<String>,
    docs: Vec<Doc>,
    /// What did not read, or read with a field lost.
    problems: Vec<String>,
    namespaces: Vec<At<Namespace>>,
    deployments: Vec<At<Deployment>>,
    daemon_sets: Vec<At<DaemonSet>>,
    services: Vec<At<Service>>,
    service_accounts: Vec<At<ServiceAccount>>,
    config_maps: Vec<At<ConfigMap>>,
    secrets: Vec<At<Secret>>,
    cluster_roles: Vec<At<ClusterRole>>,
    cluster_role_bindings: Vec<At<ClusterRoleBinding>>,
    roles: Vec<At<Role>>,
    role_bindings: Vec<At<RoleBinding>>,
    webhooks: Vec<At<MutatingWebhookConfiguration>>,
    pdbs: Vec<At<PodDisruptionBudget>>,
    /// cert-manager's Issuers and Certificates, ServiceMonitors: checked by hand.
    issuers: Vec<Doc>,
    certificates: Vec<Doc>,
    service_monitors: Vec<Doc>,
    kustomizations: Vec<Doc>,
}

/// The kinds that live in a namespace.
const NAMESPACED: &[&str] = &[
    "Deployment",
    "DaemonSet",
    "Service",
    "ServiceAccount",
    "ConfigMap",
    "Secret",
    "Role",
    "RoleBinding",
    "PodDisruptionBudget",
    "Issuer",
    "Certificate",
    "ServiceMonitor",
];

/// The kinds of no namespace (a Kustomization is no object of the API at all).
const CLUSTER_WIDE: &[&str] = &[
    "Namespace",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
    "Kustomization",
];

fn load() -> Manifests {
    let mut m = Manifests::default();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes is there")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    for path in files {
        let file = path
            .file_name()
            .expect("a file name")
            .to_string_lossy()
            .into_owned();
        m.files.push(file.clone());
        let text = std::fs::read_to_string(&path).expect("a manifest reads");
        m.problems.extend(leading_zeros(&file, &text));
        let docs: Vec<Value> = match serde_saphyr::from_multiple(&text) {
            Ok(d) => d,
            Err(e) => {
                m.problems.push(format!("{file}: not YAML: {e}"));
                continue;
            }
        };
        for json in docs {
            let doc = Doc {
                file: file.clone(),
                json,
            };
            if !doc.json.is_object() || doc.kind().is_empty() || doc.api_version().is_empty() {
                m.problems.push(format!(
                    "{file}: a document without apiVersion and kind: {}",
                    doc.json
                ));
                continue;
            }
            m.add(doc);
        }
    }
    m
}

/// Plain numbers with a leading zero (`defaultMode: 0440`): YAML 1.1, which kubectl
/// reads, takes them as octal, YAML 1.2 as decimal; spell them in decimal.
fn leading_zeros(file: &str, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let value = line
            .split_once(": ")
            .map(|(_, v)| v.split(" #").next().unwrap_or("").trim());
        if let Some(v) = value {
            if v.len() > 1 && v.starts_with('0') && v.bytes().all(|b| b.is_ascii_digit()) {
                out.push(format!(
                    "{file}:{}: {v} reads as octal to kubectl and as decimal to YAML 1.2: write it in decimal",
                    n + 1
                ));
            }
        }
    }
    out
}

impl Manifests {
    fn add(&mut self, doc: Doc) {
        if doc.kind() != "Kustomization" && doc.name().is_empty() {
            self.problems
                .push(format!("{}: no metadata.name", doc.at()));
        }
        let namespaced = NAMESPACED.contains(&doc.kind());
        let cluster_wide = CLUSTER_WIDE.contains(&doc.kind());
        match (namespaced, cluster_wide, doc.namespace()) {
            (true, _, None) => self
                .problems
                .push(format!("{}: no metadata.namespace", doc.at())),
            (_, true, Some(_)) => self.problems.push(format!(
                "{}: a cluster-wide kind with metadata.namespace",
                doc.at()
            )),
            _ => {}
        }
        self.docs.push(doc.clone());
        let p = &mut self.problems;
        match (doc.api_version(), doc.kind()) {
            ("v1", "Namespace") => push(&mut self.namespaces, doc, p),
            ("apps/v1", "Deployment") => push(&mut self.deployments, doc, p),
            ("apps/v1", "DaemonSet") => push(&mut self.daemon_sets, doc, p),
            ("v1", "Service") => push(&mut self.services, doc, p),
            ("v1", "ServiceAccount") => push(&mut self.service_accounts, doc, p),
            ("v1", "ConfigMap") => push(&mut self.config_maps, doc, p),
            ("v1", "Secret") => push(&mut self.secrets, doc, p),
            ("rbac.authorization.k8s.io/v1", "ClusterRole") => {
                push(&mut self.cluster_roles, doc, p)
            }
            ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding") => {
                push(&mut self.cluster_role_bindings, doc, p)
            }
            ("rbac.authorization.k8s.io/v1", "Role") => push(&mut self.roles, doc, p),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => {
                push(&mut self.role_bindings, doc, p)
            }
            ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration") => {
                push(&mut self.webhooks, doc, p)
            }
            ("policy/v1", "PodDisruptionBudget") => push(&mut self.pdbs, doc, p),
            ("cert-manager.io/v1", "Issuer") => {
                check_issuer(&doc, p);
                self.issuers.push(doc);
            }
            ("cert-manager.io/v1", "Certificate") => {
                check_certificate(&doc, p);
                self.certificates.push(doc);
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                check_service_monitor_fields(&doc, p);
                self.service_monitors.push(doc);
            }
            ("kustomize.config.k8s.io/v1beta1", "Kustomization") => {
                check_keys(
                    &doc,
                    "",
                    &doc.json,
                    &["apiVersion", "kind", "resources", "images"],
                    p,
                );
                self.kustomizations.push(doc);
            }
            (api, kind) => p.push(format!(
                "{}: {api} {kind} is a kind this test does not know: add it, typed or with checks of its own",
                doc.at()
            )),
        }
    }

    /// The objects a pod template lives in: (where, template).
    fn workloads(&self) -> Vec<(String, &Doc, &PodTemplateSpec)> {
        let mut out: Vec<(String, &Doc, &PodTemplateSpec)> = Vec::new();
        for d in &self.deployments {
            if let Some(spec) = &d.obj.spec {
                out.push((d.doc.at(), &d.doc, &spec.template));
            }
        }
        for d in &self.daemon_sets {
            if let Some(spec) = &d.obj.spec {
                out.push((d.doc.at(), &d.doc, &spec.template));
            }
        }
        out
    }

    fn controller(&self) -> &At<Deployment> {
        let found: Vec<_> = self
            .deployments
            .iter()
            .filter(|d| d.doc.name() == "powerplane")
            .collect();
        assert_eq!(found.len(), 1, "one Deployment powerplane (the controller)");
        found[0]
    }

    fn agent(&self) -> &At<DaemonSet> {
        let found: Vec<_> = self
            .daemon_sets
            .iter()
            .filter(|d| d.doc.name() == "powerplane-agent")
            .collect();
        assert_eq!(found.len(), 1, "one DaemonSet powerplane-agent (the agent)");
        found[0]
    }

    fn config_map(&self, ns: &str, name: &str) -> Option<&At<ConfigMap>> {
        self.config_maps
            .iter()
            .find(|c| c.doc.namespace() == Some(ns) && c.doc.name() == name)
    }

    /// A file of a ConfigMap's data.
    fn config_file(&self, name: &str, key: &str) -> String {
        self.config_map("powerplane", name)
            .and_then(|c| c.obj.data.as_ref())
            .and_then(|d| d.get(key))
            .unwrap_or_else(|| panic!("ConfigMap powerplane/{name} holds {key}"))
            .clone()
    }

    /// powerplane.toml of the controller's ConfigMap.
    fn powerplane_toml(&self) -> toml::Table {
        let text = self.config_file("powerplane-config", "powerplane.toml");
        toml::from_str(&text).expect("powerplane.toml is TOML")
    }

    /// The Service the controller is reached by.
    fn service(&self) -> &At<Service> {
        let found: Vec<_> = self
            .services
            .iter()
            .filter(|s| s.doc.name() == "powerplane")
            .collect();
        assert_eq!(found.len(), 1, "one Service powerplane");
        found[0]
    }

    /// The names the Service answers to inside the cluster.
    fn service_hosts(&self) -> Vec<String> {
        let s = self.service();
        let ns = s.doc.namespace().unwrap_or("");
        let n = s.doc.name();
        vec![
            format!("{n}.{ns}.svc"),
            format!("{n}.{ns}.svc.cluster.local"),
        ]
    }

    /// The Certificate a Secret is made from, if one is.
    fn certificate_of_secret(&self, ns: &str, secret: &str) -> Option<&Doc> {
        self.certificates
            .iter()
            .find(|c| c.namespace() == Some(ns) && c.str_at("/spec/secretName") == secret)
    }
}

fn push<T: DeserializeOwned + Serialize>(list: &mut Vec<At<T>>, doc: Doc, p: &mut Vec<String>) {
    if let Some(obj) = typed::<T>(&doc, p) {
        list.push(At { doc, obj });
    }
}

/// Reads a document into its API type and writes it back: whatever the type does not
/// keep (a misspelt field, a field at the wrong level, a value of the wrong shape) is
/// a problem, named by its path.
fn typed<T: DeserializeOwned + Serialize>(doc: &Doc, problems: &mut Vec<String>) -> Option<T> {
    match serde_json::from_value::<T>(doc.json.clone()) {
        Err(e) => {
            problems.push(format!(
                "{}: does not read as {}: {e}",
                doc.at(),
                doc.kind()
            ));
            None
        }
        Ok(obj) => {
            let back = serde_json::to_value(&obj).expect("a typed object writes as JSON");
            let mut diffs = Vec::new();
            diff(&doc.json, &back, "", &mut diffs);
            for d in diffs {
                problems.push(format!("{}: {d}", doc.at()));
            }
            Some(obj)
        }
    }
}

/// Where the manifest (`a`) and its typed copy (`b`) differ.
fn diff(a: &Value, b: &Value, path: &str, out: &mut Vec<String>) {
    let field = |k: &str| {
        if path.is_empty() {
            k.to_string()
        } else {
            format!("{path}.{k}")
        }
    };
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, v) in x {
                match y.get(k) {
                    None => out.push(format!(
                        "field `{}` is not in the API's type: dropped (a typo, or the wrong level?)",
                        field(k)
                    )),
                    Some(w) => diff(v, w, &field(k), out),
                }
            }
            for k in y.keys() {
                if !x.contains_key(k) {
                    out.push(format!(
                        "field `{}` is missing: the type fills it in (a required field?)",
                        field(k)
                    ));
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (v, w)) in x.iter().zip(y).enumerate() {
                diff(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ if a == b => {}
        _ => out.push(format!("field `{path}`: {a} reads back as {b}")),
    }
}

/// The keys of a custom resource's object that are not among the known ones.
fn check_keys(doc: &Doc, path: &str, v: &Value, known: &[&str], p: &mut Vec<String>) {
    match v.as_object() {
        None => p.push(format!("{}: `{path}` is not a mapping", doc.at())),
        Some(o) => {
            for k in o.keys() {
                if !known.contains(&k.as_str()) {
                    let field = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    p.push(format!(
                        "{}: field `{field}` is not one this kind has (known: {})",
                        doc.at(),
                        known.join(", ")
                    ));
                }
            }
        }
    }
}

const META: &[&str] = &["name", "namespace", "labels", "annotations"];

fn check_issuer(doc: &Doc, p: &mut Vec<String>) {
    check_keys(
        doc,
        "",
        &doc.json,
        &["apiVersion", "kind", "metadata", "spec"],
        p,
    );
    check_keys(doc, "metadata", &doc.json["metadata"], META, p);
    let spec = &doc.json["spec"];
    check_keys(
        doc,
        "spec",
        spec,
        &["selfSigned", "ca", "acme", "vault", "venafi"],
        p,
    );
    let kinds = spec.as_object().map(|o| o.len()).unwrap_or(0);
    if kinds != 1 {
        p.push(format!(
            "{}: spec must name exactly one kind of issuer",
            doc.at()
        ));
    }
    if let Some(ca) = spec.get("ca") {
        check_keys(
            doc,
            "spec.ca",
            ca,
            &["secretName", "crlDistributionPoints"],
            p,
        );
        if doc.str_at("/spec/ca/secretName").is_empty() {
            p.push(format!("{}: spec.ca.secretName is required", doc.at()));
        }
    }
}

fn check_certificate(doc: &Doc, p: &mut Vec<String>) {
    check_keys(
        doc,
        "",
        &doc.json,
        &["apiVersion", "kind", "metadata", "spec"],
        p,
    );
    check_keys(doc, "metadata", &doc.json["metadata"], META, p);
    let spec = &doc.json["spec"];
    check_keys(
        doc,
        "spec",
        spec,
        &[
            "secretName",
            "secretTemplate",
            "commonName",
            "dnsNames",
            "ipAddresses",
            "uris",
            "emailAddresses",
            "subject",
            "duration",
            "renewBefore",
            "usages",
            "privateKey",
            "issuerRef",
            "isCA",
            "keystores",
            "revisionHistoryLimit",
            "additionalOutputFormats",
            "encodeUsagesInRequest",
        ],
        p,
    );
    for required in ["/spec/secretName", "/spec/issuerRef/name"] {
        if doc.str_at(required).is_empty() {
            p.push(format!("{}: {required} is required", doc.at()));
        }
    }
    if spec.get("commonName").is_none() && spec.get("dnsNames").is_none() {
        p.push(format!("{}: neither commonName nor dnsNames", doc.at()));
    }
    if let Some(k) = spec.get("privateKey") {
        check_keys(
            doc,
            "spec.privateKey",
            k,
            &["algorithm", "size", "encoding", "rotationPolicy"],
            p,
        );
    }
    if let Some(r) = spec.get("issuerRef") {
        check_keys(doc, "spec.issuerRef", r, &["name", "kind", "group"], p);
    }
    if let Some(usages) = spec.get("usages").and_then(Value::as_array) {
        let known = [
            "server auth",
            "client auth",
            "digital signature",
            "key encipherment",
            "cert sign",
            "crl sign",
            "signing",
        ];
        for u in usages {
            if !u.as_str().is_some_and(|u| known.contains(&u)) {
                p.push(format!("{}: spec.usages: unknown usage {u}", doc.at()));
            }
        }
    }
}

fn check_service_monitor_fields(doc: &Doc, p: &mut Vec<String>) {
    check_keys(
        doc,
        "",
        &doc.json,
        &["apiVersion", "kind", "metadata", "spec"],
        p,
    );
    check_keys(doc, "metadata", &doc.json["metadata"], META, p);
    let spec = &doc.json["spec"];
    check_keys(
        doc,
        "spec",
        spec,
        &[
            "selector",
            "namespaceSelector",
            "endpoints",
            "jobLabel",
            "targetLabels",
            "podTargetLabels",
            "sampleLimit",
        ],
        p,
    );
    for (i, e) in spec["endpoints"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .enumerate()
    {
        let path = format!("spec.endpoints[{i}]");
        check_keys(
            doc,
            &path,
            e,
            &[
                "port",
                "targetPort",
                "path",
                "scheme",
                "params",
                "interval",
                "scrapeTimeout",
                "tlsConfig",
                "authorization",
                "bearerTokenSecret",
                "honorLabels",
                "honorTimestamps",
                "metricRelabelings",
                "relabelings",
                "followRedirects",
                "enableHttp2",
                "filterRunning",
            ],
            p,
        );
        if let Some(t) = e.get("tlsConfig") {
            check_keys(
                doc,
                &format!("{path}.tlsConfig"),
                t,
                &[
                    "ca",
                    "cert",
                    "keySecret",
                    "serverName",
                    "insecureSkipVerify",
                ],
                p,
            );
        }
    }
}

// --- helpers on the typed objects

fn labels_of(t: &PodTemplateSpec) -> BTreeMap<String, String> {
    t.metadata
        .as_ref()
        .and_then(|m| m.labels.clone())
        .unwrap_or_default()
}

fn pod_spec(t: &PodTemplateSpec) -> &PodSpec {
    t.spec.as_ref().expect("a pod template has a spec")
}

/// Whether a label selector selects these labels (an empty selector selects nothing
/// here: every selector in these manifests must say what it selects).
fn selects(sel: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let ml = sel.match_labels.clone().unwrap_or_default();
    let me = sel.match_expressions.clone().unwrap_or_default();
    if ml.is_empty() && me.is_empty() {
        return false;
    }
    ml.iter().all(|(k, v)| labels.get(k) == Some(v))
        && me.iter().all(|e| {
            let values = e.values.clone().unwrap_or_default();
            match e.operator.as_str() {
                "In" => labels.get(&e.key).is_some_and(|v| values.contains(v)),
                "NotIn" => labels.get(&e.key).is_none_or(|v| !values.contains(v)),
                "Exists" => labels.contains_key(&e.key),
                "DoesNotExist" => !labels.contains_key(&e.key),
                _ => false,
            }
        })
}

fn map_selects(sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !sel.is_empty() && sel.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn containers(spec: &PodSpec) -> Vec<&Container> {
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .collect()
}

/// The container port a probe's or a Service's port names (by number or name).
fn container_port(c: &Container, port: &IntOrString) -> Option<i32> {
    c.ports.iter().flatten().find_map(|p| match port {
        IntOrString::Int(n) if p.container_port == *n => Some(*n),
        IntOrString::String(s) if p.name.as_deref() == Some(s) => Some(p.container_port),
        _ => None,
    })
}

/// `--config PATH` of a container's command line.
fn config_arg(c: &Container) -> Option<String> {
    let words: Vec<&String> = c.command.iter().chain(c.args.iter()).flatten().collect();
    words
        .windows(2)
        .find(|w| w[0] == "--config")
        .map(|w| w[1].clone())
}

/// What a container sees in its file system from its pod's volumes.
#[derive(Debug, Default)]
struct Files {
    /// Files from ConfigMaps and Secrets: path → (kind, object, key, mode).
    files: BTreeMap<String, (String, String, String, Option<i32>)>,
    /// Mounted directories: path → (volume kind, writable).
    dirs: BTreeMap<String, (String, bool)>,
}

impl Files {
    fn of(spec: &PodSpec, c: &Container, m: &Manifests, ns: &str) -> Files {
        let mut out = Files::default();
        let volumes: BTreeMap<&str, &Volume> = spec
            .volumes
            .iter()
            .flatten()
            .map(|v| (v.name.as_str(), v))
            .collect();
        for mount in c.volume_mounts.iter().flatten() {
            let Some(v) = volumes.get(mount.name.as_str()) else {
                continue;
            };
            let base = mount.mount_path.trim_end_matches('/').to_string();
            let writable = !mount.read_only.unwrap_or(false);
            let mut add = |kind: &str, name: &str, items: &Option<Vec<KeyToPath>>, mode| {
                add_items(&mut out.files, m, ns, &base, (kind, name), items, mode)
            };
            let dir_kind = if let Some(cm) = &v.config_map {
                add("ConfigMap", &cm.name, &cm.items, cm.default_mode);
                "configMap"
            } else if let Some(s) = &v.secret {
                let name = s.secret_name.clone().unwrap_or_default();
                add("Secret", &name, &s.items, s.default_mode);
                "secret"
            } else if let Some(pr) = &v.projected {
                for src in pr.sources.iter().flatten() {
                    if let Some(cm) = &src.config_map {
                        add("ConfigMap", &cm.name, &cm.items, pr.default_mode);
                    }
                    if let Some(s) = &src.secret {
                        add("Secret", &s.name, &s.items, pr.default_mode);
                    }
                }
                "projected"
            } else if v.empty_dir.is_some() {
                "emptyDir"
            } else if v.host_path.is_some() {
                "hostPath"
            } else {
                "other"
            };
            // ConfigMaps, Secrets and projections are read-only whatever the mount says
            let writable = writable && matches!(dir_kind, "emptyDir" | "hostPath");
            out.dirs.insert(base, (dir_kind.to_string(), writable));
        }
        out
    }

    /// The writable mount a path lies in, if any.
    fn writable(&self, path: &str) -> bool {
        self.dirs
            .iter()
            .any(|(d, (_, w))| *w && path.starts_with(&format!("{d}/")))
    }
}

/// The files of a ConfigMap's or Secret's items (every key of a ConfigMap defined
/// here when there are no items) under `base`.
fn add_items(
    files: &mut BTreeMap<String, (String, String, String, Option<i32>)>,
    m: &Manifests,
    ns: &str,
    base: &str,
    (kind, name): (&str, &str),
    items: &Option<Vec<KeyToPath>>,
    mode: Option<i32>,
) {
    match items {
        Some(items) => {
            for i in items {
                files.insert(
                    format!("{base}/{}", i.path),
                    (kind.into(), name.into(), i.key.clone(), i.mode.or(mode)),
                );
            }
        }
        None if kind == "ConfigMap" => {
            if let Some(cm) = m.config_map(ns, name) {
                for k in cm.obj.data.iter().flatten().map(|(k, _)| k) {
                    files.insert(
                        format!("{base}/{k}"),
                        (kind.into(), name.into(), k.clone(), mode),
                    );
                }
            }
        }
        None => {}
    }
}

/// A path of a config file, resolved against the config file's folder.
fn resolve(base: &str, p: &str) -> String {
    if p.starts_with('/') {
        p.to_string()
    } else {
        format!("{base}/{p}")
    }
}

fn str_at<'a>(t: &'a toml::Table, path: &[&str]) -> Option<&'a str> {
    let mut v = t.get(path[0])?;
    for k in &path[1..] {
        v = v.get(k)?;
    }
    v.as_str()
}

fn fail_with(what: &str, problems: &[String]) {
    assert!(
        problems.is_empty(),
        "{what}: {} problem(s):\n  {}",
        problems.len(),
        problems.join("\n  ")
    );
}

// --- the tests

#[test]
fn every_manifest_reads_into_its_api_type_and_back_with_nothing_dropped() {
    let m = load();
    let mut problems = m.problems.clone();
    assert!(
        m.docs.len() >= 20,
        "deploy/kubernetes holds the manifests (found {} documents)",
        m.docs.len()
    );
    let mut seen = BTreeSet::new();
    for d in &m.docs {
        let key = (
            d.api_version().to_string(),
            d.kind().to_string(),
            d.namespace().unwrap_or("").to_string(),
            d.name().to_string(),
        );
        if !seen.insert(key) {
            problems.push(format!("{}: defined twice", d.at()));
        }
        if let Some(ns) = d.namespace() {
            if !m.namespaces.iter().any(|n| n.doc.name() == ns) {
                problems.push(format!(
                    "{}: its namespace {ns} is not defined here",
                    d.at()
                ));
            }
        }
    }
    fail_with("reading deploy/kubernetes", &problems);
}

#[test]
fn the_kustomization_lists_every_manifest_and_one_image() {
    let m = load();
    let mut problems = Vec::new();
    assert_eq!(m.kustomizations.len(), 1, "one kustomization.yaml");
    let k = &m.kustomizations[0];
    assert_eq!(k.file, "kustomization.yaml");
    let listed: Vec<String> = k.json["resources"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|r| r.as_str().unwrap_or("").to_string())
        .collect();
    let listed_set: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    if listed_set.len() != listed.len() {
        problems.push("kustomization.yaml: a resource is listed twice".to_string());
    }
    let files: BTreeSet<&str> = m
        .files
        .iter()
        .map(String::as_str)
        .filter(|f| *f != "kustomization.yaml")
        .collect();
    for f in files.difference(&listed_set) {
        problems.push(format!(
            "{f} is in deploy/kubernetes but not among the kustomization's resources"
        ));
    }
    for f in listed_set.difference(&files) {
        problems.push(format!(
            "kustomization.yaml lists {f}, which is not a manifest in deploy/kubernetes"
        ));
    }
    let images = k.json["images"].as_array().cloned().unwrap_or_default();
    let (name, tag) = IMAGE.split_once(':').expect("name:tag");
    if images.len() != 1
        || images[0]["name"] != name
        || images[0]["newName"] != name
        || images[0]["newTag"] != tag
    {
        problems.push(format!(
            "kustomization.yaml: images must be one entry, name {name}, newName {name}, newTag {tag}: {:?}",
            images
        ));
    }
    for (at, _, t) in m.workloads() {
        for c in containers(pod_spec(t)) {
            if c.image.as_deref() != Some(IMAGE) {
                problems.push(format!(
                    "{at}: container {} runs {:?}, not {IMAGE}",
                    c.name, c.image
                ));
            }
        }
    }
    fail_with("the kustomization", &problems);
}

#[test]
fn workload_selectors_select_their_own_pods_and_no_other() {
    let m = load();
    let mut problems = Vec::new();
    let templates: Vec<(String, BTreeMap<String, String>)> = m
        .workloads()
        .into_iter()
        .map(|(at, _, t)| (at, labels_of(t)))
        .collect();
    let mut selectors: Vec<(String, LabelSelector)> = Vec::new();
    for d in &m.deployments {
        if let Some(s) = &d.obj.spec {
            selectors.push((d.doc.at(), s.selector.clone()));
        }
    }
    for d in &m.daemon_sets {
        if let Some(s) = &d.obj.spec {
            selectors.push((d.doc.at(), s.selector.clone()));
        }
    }
    for (i, (at, sel)) in selectors.iter().enumerate() {
        for (j, (other, labels)) in templates.iter().enumerate() {
            match (i == j, selects(sel, labels)) {
                (true, false) => problems.push(format!(
                    "{at}: spec.selector does not select its own template's labels {labels:?}"
                )),
                (false, true) => problems.push(format!(
                    "{at}: spec.selector also selects the pods of {other}"
                )),
                _ => {}
            }
        }
    }
    for p in &m.pdbs {
        let spec = p.obj.spec.clone().unwrap_or_default();
        let sel = spec.selector.clone().unwrap_or_default();
        let hits: Vec<&String> = templates
            .iter()
            .filter(|(_, l)| selects(&sel, l))
            .map(|(at, _)| at)
            .collect();
        if hits.len() != 1 || !hits[0].contains("Deployment powerplane/powerplane") {
            problems.push(format!(
                "{}: selects {hits:?}, not the controller alone",
                p.doc.at()
            ));
        }
        let replicas = m
            .controller()
            .obj
            .spec
            .as_ref()
            .and_then(|s| s.replicas)
            .unwrap_or(1);
        match spec.min_available {
            Some(IntOrString::Int(n)) if n >= 1 && n < replicas => {}
            other => problems.push(format!(
                "{}: minAvailable {other:?} must leave a replica of {replicas} to evict",
                p.doc.at()
            )),
        }
    }
    fail_with("selectors", &problems);
}

#[test]
fn the_service_selects_the_controller_and_targets_its_https_port() {
    let m = load();
    let mut problems = Vec::new();
    let controller = m.controller();
    let template = &controller.obj.spec.as_ref().expect("a spec").template;
    let cfg = m.powerplane_toml();
    let listen_port: i32 = str_at(&cfg, &["http", "listen"])
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .expect("[http] listen is host:port");
    for s in &m.services {
        let spec = s.obj.spec.clone().unwrap_or_default();
        let sel = spec.selector.clone().unwrap_or_default();
        let hits: Vec<String> = m
            .workloads()
            .into_iter()
            .filter(|(_, _, t)| map_selects(&sel, &labels_of(t)))
            .map(|(at, _, _)| at)
            .collect();
        if hits != [controller.doc.at()] {
            problems.push(format!(
                "{}: spec.selector {sel:?} selects {hits:?}, not the controller's pods alone",
                s.doc.at()
            ));
            continue;
        }
        let ports = spec.ports.clone().unwrap_or_default();
        if ports.is_empty() {
            problems.push(format!("{}: no ports", s.doc.at()));
        }
        for port in ports {
            let target = port
                .target_port
                .clone()
                .unwrap_or(IntOrString::Int(port.port));
            let found = pod_spec(template)
                .containers
                .iter()
                .find_map(|c| container_port(c, &target));
            match found {
                None => problems.push(format!(
                    "{}: port {:?} targets {target:?}, which no container of the controller has",
                    s.doc.at(),
                    port.name
                )),
                Some(n) if n != listen_port => problems.push(format!(
                    "{}: port {:?} reaches container port {n}, but powerplane listens on {listen_port}",
                    s.doc.at(),
                    port.name
                )),
                Some(_) => {}
            }
            if port.name.as_deref() != Some("https") || port.port != listen_port {
                problems.push(format!(
                    "{}: the port is to be https on {listen_port}: {:?} {}",
                    s.doc.at(),
                    port.name,
                    port.port
                ));
            }
        }
    }
    fail_with("the Service", &problems);
}

#[test]
fn the_controller_probes_healthz_and_readyz_over_https_on_its_listener() {
    let m = load();
    let mut problems = Vec::new();
    let d = m.controller();
    let spec = pod_spec(&d.obj.spec.as_ref().expect("a spec").template);
    let cfg = m.powerplane_toml();
    let listen_port: i32 = str_at(&cfg, &["http", "listen"])
        .and_then(|l| l.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .expect("[http] listen is host:port");
    let tls = str_at(&cfg, &["http", "tls_cert_file"]).is_some()
        && str_at(&cfg, &["http", "tls_key_file"]).is_some();
    assert!(
        tls,
        "[http] serves TLS (the API server calls webhooks over HTTPS only)"
    );
    for c in &spec.containers {
        let probes = [
            ("livenessProbe", &c.liveness_probe, "/healthz"),
            ("readinessProbe", &c.readiness_probe, "/readyz"),
            ("startupProbe", &c.startup_probe, "/healthz"),
        ];
        for (what, probe, path) in probes {
            let Some(probe) = probe else {
                if what != "startupProbe" {
                    problems.push(format!("{}: container {}: no {what}", d.doc.at(), c.name));
                }
                continue;
            };
            let Some(get) = &probe.http_get else {
                problems.push(format!(
                    "{}: container {}: {what} is not an httpGet",
                    d.doc.at(),
                    c.name
                ));
                continue;
            };
            if get.path.as_deref() != Some(path) {
                problems.push(format!(
                    "{}: container {}: {what} asks {:?}, not {path}",
                    d.doc.at(),
                    c.name,
                    get.path
                ));
            }
            if get.scheme.as_deref() != Some("HTTPS") {
                problems.push(format!(
                    "{}: container {}: {what} scheme {:?}: [http] serves TLS only, so HTTPS",
                    d.doc.at(),
                    c.name,
                    get.scheme
                ));
            }
            if container_port(c, &get.port) != Some(listen_port) {
                problems.push(format!(
                    "{}: container {}: {what} port {:?} is not the [http] listen port {listen_port}",
                    d.doc.at(),
                    c.name,
                    get.port
                ));
            }
        }
    }
    fail_with("the probes", &problems);
}

#[test]
fn the_controller_runs_unprivileged_on_a_read_only_root_on_two_nodes() {
    let m = load();
    let mut problems = Vec::new();
    let d = m.controller();
    let dspec = d.obj.spec.as_ref().expect("a spec");
    let labels = labels_of(&dspec.template);
    let spec = pod_spec(&dspec.template);
    let at = d.doc.at();
    if dspec.replicas != Some(2) {
        problems.push(format!("{at}: replicas {:?}, not 2", dspec.replicas));
    }
    let psc = spec.security_context.clone().unwrap_or_default();
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        problems.push(format!("{at}: shares a host namespace"));
    }
    for v in spec.volumes.iter().flatten() {
        if v.host_path.is_some() {
            problems.push(format!("{at}: volume {} is a hostPath", v.name));
        }
    }
    for c in containers(spec) {
        let sc = c.security_context.clone().unwrap_or_default();
        let who = format!("{at}: container {}", c.name);
        if sc.run_as_non_root.or(psc.run_as_non_root) != Some(true) {
            problems.push(format!("{who}: runAsNonRoot is not true"));
        }
        match sc.run_as_user.or(psc.run_as_user) {
            Some(u) if u > 0 => {}
            u => problems.push(format!(
                "{who}: runAsUser {u:?}, not a user other than root"
            )),
        }
        match sc.run_as_group.or(psc.run_as_group) {
            Some(g) if g > 0 => {}
            g => problems.push(format!(
                "{who}: runAsGroup {g:?}, not a group other than root"
            )),
        }
        if sc.allow_privilege_escalation != Some(false) {
            problems.push(format!("{who}: allowPrivilegeEscalation is not false"));
        }
        if sc.read_only_root_filesystem != Some(true) {
            problems.push(format!("{who}: readOnlyRootFilesystem is not true"));
        }
        if sc.privileged == Some(true) {
            problems.push(format!("{who}: privileged"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if caps.drop.unwrap_or_default() != ["ALL"] {
            problems.push(format!("{who}: capabilities.drop is not [ALL]"));
        }
        if !caps.add.unwrap_or_default().is_empty() {
            problems.push(format!("{who}: adds capabilities"));
        }
        let seccomp = sc
            .seccomp_profile
            .or(psc.seccomp_profile.clone())
            .map(|s| s.type_);
        if seccomp.as_deref() != Some("RuntimeDefault") {
            problems.push(format!(
                "{who}: seccompProfile {seccomp:?}, not RuntimeDefault"
            ));
        }
    }
    // the two replicas on two nodes
    let on_hosts = spec
        .affinity
        .as_ref()
        .and_then(|a| a.pod_anti_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
        .into_iter()
        .flatten()
        .any(|t| {
            t.topology_key == "kubernetes.io/hostname"
                && t.label_selector
                    .as_ref()
                    .is_some_and(|s| selects(s, &labels))
        })
        || spec.topology_spread_constraints.iter().flatten().any(|t| {
            t.topology_key == "kubernetes.io/hostname"
                && t.when_unsatisfiable == "DoNotSchedule"
                && t.max_skew == 1
                && t.label_selector
                    .as_ref()
                    .is_some_and(|s| selects(s, &labels))
        });
    if !on_hosts {
        problems.push(format!(
            "{at}: nothing keeps the replicas on different nodes (required anti-affinity on kubernetes.io/hostname, or a DoNotSchedule spread)"
        ));
    }
    // every path powerplane writes lies in a writable volume; nothing else is writable
    let cfg = m.powerplane_toml();
    let c = &spec.containers[0];
    let files = Files::of(spec, c, &m, "powerplane");
    let config = config_arg(c).expect("serve --config PATH");
    let base = config.rsplit_once('/').map(|(b, _)| b).unwrap_or(".");
    for path in [
        &["store", "journal"][..],
        &["store", "path"],
        &["http", "overrides_file"],
        &["agents", "status_file"],
    ] {
        if let Some(p) = str_at(&cfg, path) {
            let p = resolve(base, p);
            if !files.writable(&p) {
                problems.push(format!(
                    "{at}: powerplane writes {} = {p}, which is in no writable volume",
                    path.join(".")
                ));
            }
        }
    }
    fail_with("the controller's pods", &problems);
}

#[test]
fn the_agent_gets_the_gpus_and_the_capability_nvml_needs_and_nothing_more() {
    let m = load();
    let mut problems = Vec::new();
    let d = m.agent();
    let at = d.doc.at();
    let spec = pod_spec(&d.obj.spec.as_ref().expect("a spec").template);
    let selector = spec.node_selector.clone().unwrap_or_default();
    if selector.get("nvidia.com/gpu.present").map(String::as_str) != Some("true") {
        problems.push(format!(
            "{at}: nodeSelector {selector:?} is not the GPU Operator's nvidia.com/gpu.present=true"
        ));
    }
    if !spec.tolerations.iter().flatten().any(|t| {
        t.key.as_deref() == Some("nvidia.com/gpu")
            && t.operator.as_deref() == Some("Exists")
            && t.effect.is_none()
    }) {
        problems.push(format!(
            "{at}: no toleration of the nvidia.com/gpu taints (key nvidia.com/gpu, Exists, every effect)"
        ));
    }
    if spec.runtime_class_name.as_deref() != Some("nvidia") {
        problems.push(format!("{at}: runtimeClassName is not nvidia"));
    }
    if spec.host_network == Some(true) || spec.host_pid == Some(true) || spec.host_ipc == Some(true)
    {
        problems.push(format!("{at}: shares a host namespace"));
    }
    // its ServiceAccount: no token, no binding
    let sa = spec.service_account_name.clone().unwrap_or_default();
    if spec.automount_service_account_token != Some(false) {
        problems.push(format!("{at}: automountServiceAccountToken is not false"));
    }
    match m
        .service_accounts
        .iter()
        .find(|s| s.doc.name() == sa && s.doc.namespace() == d.doc.namespace())
    {
        Some(s) if s.obj.automount_service_account_token == Some(false) => {}
        _ => problems.push(format!(
            "{at}: ServiceAccount {sa:?} is not one of its own with automountServiceAccountToken false"
        )),
    }
    let bound: Vec<String> = m
        .role_bindings
        .iter()
        .map(|b| (b.doc.at(), b.obj.subjects.clone()))
        .chain(
            m.cluster_role_bindings
                .iter()
                .map(|b| (b.doc.at(), b.obj.subjects.clone())),
        )
        .filter(|(_, subjects)| subjects.iter().flatten().any(|s| s.name == sa))
        .map(|(at, _)| at)
        .collect();
    if !bound.is_empty() {
        problems.push(format!(
            "{at}: its ServiceAccount {sa} is bound by {bound:?}: it needs no API"
        ));
    }
    // the capability docs/agent.md names for NVML's setters, and only that
    let docs = std::fs::read_to_string(repo().join("docs/agent.md")).expect("docs/agent.md");
    let privileges = docs
        .split("### Privileges")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("docs/agent.md has a section Privileges");
    for c in containers(spec) {
        let who = format!("{at}: container {}", c.name);
        let sc = c.security_context.clone().unwrap_or_default();
        if sc.privileged == Some(true) {
            problems.push(format!(
                "{who}: privileged (docs/agent.md asks for one capability)"
            ));
        }
        if sc.read_only_root_filesystem != Some(true) {
            problems.push(format!("{who}: readOnlyRootFilesystem is not true"));
        }
        let caps = sc.capabilities.clone().unwrap_or_default();
        if caps.drop.unwrap_or_default() != ["ALL"] {
            problems.push(format!("{who}: capabilities.drop is not [ALL]"));
        }
        let add = caps.add.unwrap_or_default();
        for cap in &add {
            let full = format!("CAP_{}", cap.trim_start_matches("CAP_"));
            if !privileges.contains(&full) {
                problems.push(format!(
                    "{who}: adds {cap}, which docs/agent.md (Privileges) does not name"
                ));
            }
        }
        let is_agent = c.command.iter().flatten().any(|w| w == "powerplane-agent");
        if is_agent && add != ["SYS_ADMIN"] {
            problems.push(format!(
                "{who}: adds {add:?}: NVML's setters need CAP_SYS_ADMIN (docs/agent.md), nothing else"
            ));
        }
        if !is_agent && !add.is_empty() {
            problems.push(format!("{who}: adds {add:?} but does not run the agent"));
        }
        if is_agent {
            let env: BTreeMap<String, String> = c
                .env
                .iter()
                .flatten()
                .map(|e| (e.name.clone(), e.value.clone().unwrap_or_default()))
                .collect();
            for (k, v) in [
                ("NVIDIA_VISIBLE_DEVICES", "all"),
                ("NVIDIA_DRIVER_CAPABILITIES", "utility"),
            ] {
                if env.get(k).map(String::as_str) != Some(v) {
                    problems.push(format!("{who}: env {k} is not {v}"));
                }
            }
            let gpus = c
                .resources
                .as_ref()
                .into_iter()
                .flat_map(|r| r.limits.iter().chain(r.requests.iter()).flatten())
                .any(|(k, _)| k == "nvidia.com/gpu");
            if gpus {
                problems.push(format!("{who}: requests GPUs, which the workloads need"));
            }
        }
    }
    // host paths: read-only, but for the agent's state; the kubelet's pod-resources
    let agent = spec
        .containers
        .iter()
        .find(|c| c.command.iter().flatten().any(|w| w == "powerplane-agent"))
        .expect("a container runs powerplane-agent");
    let host_paths: BTreeMap<&str, &str> = spec
        .volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            v.host_path
                .as_ref()
                .map(|h| (v.name.as_str(), h.path.as_str()))
        })
        .collect();
    let text = m.config_file("powerplane-agent-config", "agent.toml");
    let agent_cfg: toml::Table = toml::from_str(&text).expect("agent.toml is TOML");
    let state_dir = str_at(&agent_cfg, &["state_file"])
        .and_then(|p| p.rsplit_once('/'))
        .map(|(d, _)| d.to_string())
        .unwrap_or_default();
    let mut pod_resources = false;
    for mount in agent.volume_mounts.iter().flatten() {
        let Some(host) = host_paths.get(mount.name.as_str()) else {
            continue;
        };
        let ro = mount.read_only == Some(true);
        if *host == "/var/lib/kubelet/pod-resources" {
            pod_resources = ro;
        }
        if !ro && mount.mount_path != state_dir {
            problems.push(format!(
                "{at}: host path {host} is mounted writable at {}, and is not the agent's state ({state_dir})",
                mount.mount_path
            ));
        }
    }
    if !pod_resources {
        problems.push(format!(
            "{at}: the kubelet's /var/lib/kubelet/pod-resources is not mounted read-only"
        ));
    }
    fail_with("the agent's pods", &problems);
}

#[test]
fn no_container_claims_no_privilege_escalation_with_cap_sys_admin() {
    // the API refuses allowPrivilegeEscalation false beside CAP_SYS_ADMIN (it holds no
    // meaning there); spelling the capability SYS_ADMIN slips past that check, not
    // past its meaning
    let m = load();
    let mut problems = Vec::new();
    for (at, _, t) in m.workloads() {
        for c in containers(pod_spec(t)) {
            let sc = c.security_context.clone().unwrap_or_default();
            let admin = sc
                .capabilities
                .and_then(|c| c.add)
                .unwrap_or_default()
                .iter()
                .any(|c| c.trim_start_matches("CAP_") == "SYS_ADMIN");
            if (admin || sc.privileged == Some(true))
                && sc.allow_privilege_escalation == Some(false)
            {
                problems.push(format!(
                    "{at}: container {}: allowPrivilegeEscalation false with CAP_SYS_ADMIN or privileged",
                    c.name
                ));
            }
        }
    }
    fail_with("privilege escalation", &problems);
}

#[test]
fn every_container_has_resources() {
    let m = load();
    let mut problems = Vec::new();
    for (at, _, t) in m.workloads() {
        for c in containers(pod_spec(t)) {
            let r = c.resources.clone().unwrap_or_default();
            for what in ["cpu", "memory"] {
                if !r.requests.iter().flatten().any(|(k, _)| k == what) {
                    problems.push(format!("{at}: container {}: no {what} request", c.name));
                }
                if !r.limits.iter().flatten().any(|(k, _)| k == what) {
                    problems.push(format!("{at}: container {}: no {what} limit", c.name));
                }
            }
        }
    }
    fail_with("resources", &problems);
}

/// The Secrets the admin makes with `kubectl create secret generic`, as README.md says:
/// name → the keys it gets.
fn admin_secrets() -> BTreeMap<String, BTreeSet<String>> {
    let readme =
        std::fs::read_to_string(dir().join("README.md")).expect("deploy/kubernetes/README.md");
    let mut out = BTreeMap::new();
    for chunk in readme.split("create secret generic ").skip(1) {
        let chunk = chunk.split("```").next().unwrap_or("");
        let chunk = chunk.split("kubectl").next().unwrap_or("");
        let name = chunk
            .split_whitespace()
            .next()
            .unwrap_or("")
            .trim_end_matches('\\')
            .to_string();
        let mut keys = BTreeSet::new();
        for flag in ["--from-literal=", "--from-file="] {
            for rest in chunk.split(flag).skip(1) {
                if let Some((k, _)) = rest.split_once('=') {
                    keys.insert(k.to_string());
                }
            }
        }
        out.insert(name, keys);
    }
    out
}

#[test]
fn every_config_map_secret_and_service_account_a_pod_uses_exists() {
    let m = load();
    let mut problems = Vec::new();
    let made_by_admin = admin_secrets();
    // a Secret's keys: in the manifests, from a Certificate, or as README.md makes it
    let secret_keys = |ns: &str, name: &str| -> Option<BTreeSet<String>> {
        if let Some(s) = m
            .secrets
            .iter()
            .find(|s| s.doc.namespace() == Some(ns) && s.doc.name() == name)
        {
            let mut keys: BTreeSet<String> = s
                .obj
                .data
                .iter()
                .flatten()
                .map(|(k, _)| k.clone())
                .collect();
            keys.extend(s.obj.string_data.iter().flatten().map(|(k, _)| k.clone()));
            return Some(keys);
        }
        if m.certificate_of_secret(ns, name).is_some() {
            return Some(["tls.crt", "tls.key", "ca.crt"].map(String::from).into());
        }
        made_by_admin.get(name).cloned()
    };
    let config_keys = |ns: &str, name: &str| -> Option<BTreeSet<String>> {
        m.config_map(ns, name).map(|c| {
            c.obj
                .data
                .iter()
                .flatten()
                .map(|(k, _)| k.clone())
                .collect()
        })
    };
    for (at, doc, t) in m.workloads() {
        let ns = doc.namespace().unwrap_or("");
        let spec = pod_spec(t);
        let sa = spec.service_account_name.clone().unwrap_or_default();
        if sa.is_empty() {
            problems.push(format!(
                "{at}: no serviceAccountName (the default one is no one's)"
            ));
        } else if !m
            .service_accounts
            .iter()
            .any(|s| s.doc.name() == sa && s.doc.namespace() == Some(ns))
        {
            problems.push(format!(
                "{at}: ServiceAccount {ns}/{sa} is not defined here"
            ));
        }
        let mut refs: Vec<(&str, String, Vec<String>)> = Vec::new();
        for v in spec.volumes.iter().flatten() {
            let keys = |items: &Option<Vec<KeyToPath>>| {
                items
                    .iter()
                    .flatten()
                    .map(|i| i.key.clone())
                    .collect::<Vec<_>>()
            };
            if let Some(cm) = &v.config_map {
                refs.push(("ConfigMap", cm.name.clone(), keys(&cm.items)));
            }
            if let Some(s) = &v.secret {
                refs.push((
                    "Secret",
                    s.secret_name.clone().unwrap_or_default(),
                    keys(&s.items),
                ));
            }
            for src in v.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(cm) = &src.config_map {
                    refs.push(("ConfigMap", cm.name.clone(), keys(&cm.items)));
                }
                if let Some(s) = &src.secret {
                    refs.push(("Secret", s.name.clone(), keys(&s.items)));
                }
            }
        }
        for c in containers(spec) {
            for e in c.env.iter().flatten() {
                let from = e.value_from.as_ref();
                if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                    refs.push(("ConfigMap", r.name.clone(), vec![r.key.clone()]));
                }
                if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                    refs.push(("Secret", r.name.clone(), vec![r.key.clone()]));
                }
            }
            for e in c.env_from.iter().flatten() {
                if let Some(r) = &e.config_map_ref {
                    refs.push(("ConfigMap", r.name.clone(), vec![]));
                }
                if let Some(r) = &e.secret_ref {
                    refs.push(("Secret", r.name.clone(), vec![]));
                }
            }
        }
        for (kind, name, keys) in refs {
            let have = if kind == "ConfigMap" {
                config_keys(ns, &name)
            } else {
                secret_keys(ns, &name)
            };
            match have {
                None => problems.push(format!(
                    "{at}: {kind} {ns}/{name} is neither defined here{}",
                    if kind == "Secret" {
                        ", made by a Certificate, nor made by README.md's `kubectl create secret generic`"
                    } else {
                        ""
                    }
                )),
                Some(have) => {
                    for k in keys {
                        if !have.contains(&k) {
                            problems.push(format!(
                                "{at}: {kind} {ns}/{name} has no key {k} (it has {have:?})"
                            ));
                        }
                    }
                }
            }
        }
        // Secrets' files are for their user and group only
        for c in containers(spec) {
            let files = Files::of(spec, c, &m, ns);
            for (path, (kind, name, _, mode)) in &files.files {
                if kind == "Secret" && mode.unwrap_or(0o644) & 0o007 != 0 {
                    problems.push(format!(
                        "{at}: container {}: {path} from Secret {name} is readable by others (mode {:o})",
                        c.name,
                        mode.unwrap_or(0o644)
                    ));
                }
            }
        }
    }
    fail_with("references", &problems);
}

#[test]
fn the_files_powerplane_reads_are_where_its_configuration_says() {
    let m = load();
    let mut problems = Vec::new();
    // the controller: every file powerplane.toml names is in the pod
    let d = m.controller();
    let spec = pod_spec(&d.obj.spec.as_ref().expect("a spec").template);
    let c = &spec.containers[0];
    let files = Files::of(spec, c, &m, "powerplane");
    let config = config_arg(c).expect("serve --config PATH");
    if !files.files.contains_key(&config) {
        problems.push(format!(
            "{}: --config {config} is no mounted file",
            d.doc.at()
        ));
    }
    let base = config.rsplit_once('/').map(|(b, _)| b).unwrap_or(".");
    let cfg = m.powerplane_toml();
    let mut named: Vec<(String, String)> = Vec::new();
    for path in [
        &["controller", "site"][..],
        &["controller", "policy"],
        &["mqtt", "mapping"],
        &["store", "url_file"],
        &["http", "tls_cert_file"],
        &["http", "tls_key_file"],
        &["agents", "key_file"],
        &["prices", "file"],
    ] {
        if let Some(p) = str_at(&cfg, path) {
            named.push((path.join("."), resolve(base, p)));
        }
    }
    for t in cfg
        .get("http")
        .and_then(|h| h.get("tokens"))
        .and_then(|t| t.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(p) = t.get("token_file").and_then(|p| p.as_str()) {
            named.push(("http.tokens.token_file".into(), resolve(base, p)));
        }
    }
    for (key, path) in &named {
        if !files.files.contains_key(path) {
            problems.push(format!(
                "{}: powerplane.toml {key} = {path}, which no volume of the pod provides",
                d.doc.at()
            ));
        }
    }
    // the serving certificate comes from cert-manager's Secret, with its own keys
    for (key, want) in [("tls_cert_file", "tls.crt"), ("tls_key_file", "tls.key")] {
        let path = resolve(base, str_at(&cfg, &["http", key]).unwrap_or(""));
        match files.files.get(&path) {
            Some((kind, name, k, _))
                if kind == "Secret"
                    && k == want
                    && m.certificate_of_secret("powerplane", name).is_some() => {}
            other => problems.push(format!(
                "{}: [http] {key} = {path} is not {want} of a Certificate's Secret: {other:?}",
                d.doc.at()
            )),
        }
    }
    // the agent: its config, key, state and /proc
    let a = m.agent();
    let aspec = pod_spec(&a.obj.spec.as_ref().expect("a spec").template);
    let agent = aspec
        .containers
        .iter()
        .find(|c| c.command.iter().flatten().any(|w| w == "powerplane-agent"))
        .expect("a container runs powerplane-agent");
    let afiles = Files::of(aspec, agent, &m, "powerplane");
    let aconfig = config_arg(agent).expect("powerplane-agent --config PATH");
    let adir = aconfig.rsplit_once('/').map(|(b, _)| b).unwrap_or(".");
    // written by an init container into a volume the agent mounts
    let written_by_init = aspec.init_containers.iter().flatten().any(|init| {
        Files::of(aspec, init, &m, "powerplane").writable(&aconfig)
            && afiles.dirs.contains_key(adir)
    });
    if !afiles.files.contains_key(&aconfig) && !written_by_init {
        problems.push(format!(
            "{}: --config {aconfig} is neither mounted nor written by an init container into a volume the agent mounts",
            a.doc.at()
        ));
    }
    let text = m.config_file("powerplane-agent-config", "agent.toml");
    let acfg: toml::Table = toml::from_str(&text).expect("agent.toml is TOML");
    if acfg.contains_key("node") {
        problems.push(
            "agent.toml sets node: the same file runs on every node (the init container names the node)"
                .into(),
        );
    }
    if let Some(k) = str_at(&acfg, &["key_file"]) {
        if !afiles.files.contains_key(&resolve(adir, k)) {
            problems.push(format!(
                "agent.toml key_file {k} is not mounted in the agent"
            ));
        }
    }
    match str_at(&acfg, &["state_file"]) {
        Some(s) if afiles.writable(&resolve(adir, s)) => {}
        s => problems.push(format!(
            "agent.toml state_file {s:?} is in no writable volume of the agent"
        )),
    }
    // the kubelet's pod-resources socket: its folder is mounted from the node
    if let Some(sock) = str_at(&acfg, &["kubernetes", "pod_resources_socket"]) {
        let folder = std::path::Path::new(sock)
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        if !afiles.dirs.contains_key(folder.as_str()) {
            problems.push(format!(
                "agent.toml pod_resources_socket {sock}: its folder {folder} is not mounted in the agent"
            ));
        }
    }
    if let Some(p) = str_at(&acfg, &["proc_root"]) {
        if !afiles.dirs.contains_key(p) {
            problems.push(format!(
                "agent.toml proc_root {p} is not mounted in the agent"
            ));
        }
    }
    fail_with("the configuration's files", &problems);
}

#[test]
fn the_configuration_files_are_what_powerplane_reads() {
    let m = load();
    let mut problems = Vec::new();
    // powerplane.toml: TOML, one leader on the Lease RBAC grants, in-cluster API
    let cfg = m.powerplane_toml();
    let ha = cfg.get("ha").and_then(|h| h.as_table()).expect("[ha]");
    if ha.get("enabled").and_then(|v| v.as_bool()) != Some(true) {
        problems.push("powerplane.toml: [ha] enabled is not true (two replicas)".into());
    }
    if str_at(&cfg, &["ha", "backend"]) != Some("kubernetes") {
        problems.push("powerplane.toml: [ha] backend is not \"kubernetes\"".into());
    }
    if ha.contains_key("instance") {
        problems.push(
            "powerplane.toml: [ha] instance is set, but both replicas read this file: leave it to the host name (the pod's)".into(),
        );
    }
    let lease_ns = str_at(&cfg, &["ha", "namespace"]).unwrap_or("");
    let lease = str_at(&cfg, &["ha", "lease_name"]).unwrap_or("");
    if lease_ns != "powerplane" || lease != "powerplane-leader" {
        problems.push(format!(
            "powerplane.toml: [ha] namespace {lease_ns:?} and lease_name {lease:?}, not powerplane/powerplane-leader"
        ));
    }
    let lease_rules: Vec<&PolicyRule> = m
        .roles
        .iter()
        .filter(|r| r.doc.namespace() == Some(lease_ns))
        .flat_map(|r| r.obj.rules.iter().flatten())
        .filter(|r| r.resources.iter().flatten().any(|x| x == "leases"))
        .collect();
    for r in &lease_rules {
        if let Some(names) = &r.resource_names {
            if !names.iter().any(|n| n == lease) {
                problems.push(format!(
                    "rbac: the lease Role names {names:?}, not [ha] lease_name {lease}"
                ));
            }
        }
    }
    if lease_rules.is_empty() {
        problems.push(format!("rbac: no Role in {lease_ns} for leases"));
    }
    if matches!(str_at(&cfg, &["store", "kind"]), None | Some("embedded")) {
        problems.push(
            "powerplane.toml: [store] is the embedded store, which two replicas cannot share"
                .into(),
        );
    }
    let k8s = cfg
        .get("schedulers")
        .and_then(|s| s.get("kubernetes"))
        .and_then(|k| k.as_table());
    match k8s {
        None => problems.push("powerplane.toml: no [schedulers.kubernetes]".into()),
        Some(k) if k.contains_key("api") || k.contains_key("token_file") => problems.push(
            "powerplane.toml: [schedulers.kubernetes] names an api or token_file: in the cluster it takes the in-cluster config".into(),
        ),
        Some(_) => {}
    }
    if !str_at(&cfg, &["http", "listen"]).is_some_and(|l| l.starts_with("0.0.0.0:")) {
        problems.push("powerplane.toml: [http] listen is not on every address of the pod".into());
    }
    // site, policy, mapping and the agent's file through powerplane's own parsers
    let site_text = m.config_file("powerplane-config", "site.toml");
    let site = match telemetry::Site::parse("site.toml", &site_text) {
        Ok(s) => Some(s),
        Err(e) => {
            problems.push(format!("config.yaml site.toml:\n{e}"));
            None
        }
    };
    let policy_text = m.config_file("powerplane-policy", "policy.toml");
    match policies::Policy::parse("policy.toml", &policy_text) {
        Err(e) => problems.push(format!("policy.yaml policy.toml:\n{e}")),
        Ok(p) => {
            if let Some(site) = &site {
                if let Err(e) = p.check_site("policy.toml", &policy_text, site) {
                    problems.push(format!("policy.yaml policy.toml against site.toml:\n{e}"));
                }
            }
        }
    }
    let mapping_text = m.config_file("powerplane-config", "mapping.toml");
    if let Err(e) = telemetry::mapping::Mapping::parse("mapping.toml", &mapping_text) {
        problems.push(format!("config.yaml mapping.toml:\n{e}"));
    }
    let agent_text = m.config_file("powerplane-agent-config", "agent.toml");
    if let Err(e) = telemetry::diag::parse_all::<agent::run::AgentConfig>("agent.toml", &agent_text)
    {
        problems.push(format!("agent.yaml agent.toml:\n{e}"));
    }
    fail_with("the configuration files", &problems);
}

#[test]
fn rbac_grants_exactly_pods_events_and_the_lease() {
    let m = load();
    let mut problems = Vec::new();
    // (kind of role, api group, resource) → verbs
    let mut granted: BTreeMap<(String, String, String), BTreeSet<String>> = BTreeMap::new();
    let roles = m
        .cluster_roles
        .iter()
        .map(|r| ("ClusterRole", &r.doc, r.obj.rules.clone()))
        .chain(
            m.roles
                .iter()
                .map(|r| ("Role", &r.doc, r.obj.rules.clone())),
        );
    for (kind, doc, rules) in roles {
        for rule in rules.unwrap_or_default() {
            if rule.non_resource_urls.is_some() {
                problems.push(format!("{}: grants non-resource URLs", doc.at()));
            }
            let groups = rule.api_groups.clone().unwrap_or_default();
            let resources = rule.resources.clone().unwrap_or_default();
            for word in groups.iter().chain(&resources).chain(&rule.verbs) {
                if word.contains('*') {
                    problems.push(format!("{}: a wildcard: {word}", doc.at()));
                }
            }
            for g in &groups {
                for r in &resources {
                    if r == "secrets" || r.contains('/') {
                        problems.push(format!("{}: grants {r}", doc.at()));
                    }
                    granted
                        .entry((kind.to_string(), g.clone(), r.clone()))
                        .or_default()
                        .extend(rule.verbs.iter().cloned());
                }
            }
        }
    }
    let want: BTreeMap<(String, String, String), BTreeSet<String>> = [
        (
            "ClusterRole",
            "",
            "pods",
            &["get", "list", "watch", "patch"][..],
        ),
        ("ClusterRole", "", "events", &["create", "patch"]),
        (
            "ClusterRole",
            "events.k8s.io",
            "events",
            &["create", "patch"],
        ),
        (
            "Role",
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        ),
    ]
    .into_iter()
    .map(|(k, g, r, v)| {
        (
            (k.to_string(), g.to_string(), r.to_string()),
            v.iter().map(|s| s.to_string()).collect(),
        )
    })
    .collect();
    if granted != want {
        problems.push(format!(
            "RBAC grants\n    {granted:?}\n  and should grant exactly\n    {want:?}"
        ));
    }
    // bindings: to roles defined here, for the controller's ServiceAccount only
    let bindings = m
        .cluster_role_bindings
        .iter()
        .map(|b| (&b.doc, b.obj.role_ref.clone(), b.obj.subjects.clone()))
        .chain(
            m.role_bindings
                .iter()
                .map(|b| (&b.doc, b.obj.role_ref.clone(), b.obj.subjects.clone())),
        );
    let mut bound_roles = BTreeSet::new();
    for (doc, role_ref, subjects) in bindings {
        let exists = match role_ref.kind.as_str() {
            "ClusterRole" => m
                .cluster_roles
                .iter()
                .any(|r| r.doc.name() == role_ref.name),
            "Role" => m
                .roles
                .iter()
                .any(|r| r.doc.name() == role_ref.name && r.doc.namespace() == doc.namespace()),
            _ => false,
        };
        if !exists || role_ref.api_group != "rbac.authorization.k8s.io" {
            problems.push(format!(
                "{}: roleRef {} {} is not a role defined here",
                doc.at(),
                role_ref.kind,
                role_ref.name
            ));
        }
        bound_roles.insert((role_ref.kind.clone(), role_ref.name.clone()));
        let subjects = subjects.unwrap_or_default();
        if subjects.is_empty() {
            problems.push(format!("{}: no subjects", doc.at()));
        }
        for s in subjects {
            let ok = s.kind == "ServiceAccount"
                && s.name == "powerplane"
                && s.namespace.as_deref() == Some("powerplane");
            if !ok {
                problems.push(format!(
                    "{}: binds {} {}/{}, not the controller's ServiceAccount powerplane/powerplane",
                    doc.at(),
                    s.kind,
                    s.namespace.unwrap_or_default(),
                    s.name
                ));
            }
        }
    }
    for r in &m.cluster_roles {
        if !bound_roles.contains(&("ClusterRole".to_string(), r.doc.name().to_string())) {
            problems.push(format!("{}: bound by nothing", r.doc.at()));
        }
    }
    for r in &m.roles {
        if !bound_roles.contains(&("Role".to_string(), r.doc.name().to_string())) {
            problems.push(format!("{}: bound by nothing", r.doc.at()));
        }
    }
    // the controller runs as that ServiceAccount, with its token
    let spec = pod_spec(&m.controller().obj.spec.as_ref().expect("a spec").template);
    if spec.service_account_name.as_deref() != Some("powerplane") {
        problems.push("the controller does not run as ServiceAccount powerplane".into());
    }
    if spec.automount_service_account_token == Some(false) {
        problems.push("the controller mounts no token: it talks to the API server".into());
    }
    fail_with("RBAC", &problems);
}

#[test]
fn the_webhook_reaches_the_controller_over_tls_that_cert_manager_keeps() {
    let m = load();
    let mut problems = Vec::new();
    assert_eq!(m.webhooks.len(), 1, "one MutatingWebhookConfiguration");
    let cfg = m.powerplane_toml();
    let class_label = str_at(&cfg, &["schedulers", "kubernetes", "pods", "class_label"])
        .unwrap_or("powerplane.io/class");
    let hosts = m.service_hosts();
    for w in &m.webhooks {
        let at = w.doc.at();
        let inject = w
            .obj
            .metadata
            .annotations
            .clone()
            .unwrap_or_default()
            .get("cert-manager.io/inject-ca-from")
            .cloned()
            .unwrap_or_default();
        match inject.split_once('/') {
            Some((ns, name))
                if m
                    .certificates
                    .iter()
                    .any(|c| c.namespace() == Some(ns) && c.name() == name) =>
            {
                let cert = m
                    .certificates
                    .iter()
                    .find(|c| c.namespace() == Some(ns) && c.name() == name)
                    .expect("found above");
                let names: Vec<&str> = cert.json["spec"]["dnsNames"]
                    .as_array()
                    .map(Vec::as_slice)
                    .unwrap_or_default()
                    .iter()
                    .filter_map(Value::as_str)
                    .collect();
                // the API server calls NAME.NAMESPACE.svc
                if !names.contains(&hosts[0].as_str()) {
                    problems.push(format!(
                        "{}: dnsNames {names:?} lack {}, the name the API server calls",
                        cert.at(),
                        hosts[0]
                    ));
                }
            }
            _ => problems.push(format!(
                "{at}: annotation cert-manager.io/inject-ca-from {inject:?} names no Certificate here"
            )),
        }
        for hook in w.obj.webhooks.iter().flatten() {
            let who = format!("{at}: webhook {}", hook.name);
            let cc = &hook.client_config;
            if cc.url.is_some() || cc.ca_bundle.is_some() {
                problems.push(format!(
                    "{who}: clientConfig has a url or a caBundle (the Service, and cert-manager injects the CA)"
                ));
            }
            match &cc.service {
                None => problems.push(format!("{who}: clientConfig.service is missing")),
                Some(s) => {
                    let svc = m.services.iter().find(|x| {
                        x.doc.name() == s.name && x.doc.namespace() == Some(&s.namespace)
                    });
                    match svc {
                        None => problems.push(format!(
                            "{who}: Service {}/{} is not defined here",
                            s.namespace, s.name
                        )),
                        Some(svc) => {
                            let port = s.port.unwrap_or(443);
                            let ports = svc
                                .obj
                                .spec
                                .as_ref()
                                .and_then(|x| x.ports.clone())
                                .unwrap_or_default();
                            if !ports.iter().any(|p| p.port == port) {
                                problems.push(format!(
                                    "{who}: port {port} is not a port of Service {}/{}",
                                    s.namespace, s.name
                                ));
                            }
                        }
                    }
                    if s.path.as_deref() != Some("/api/v1/k8s/admission") {
                        problems.push(format!(
                            "{who}: path {:?}, not /api/v1/k8s/admission",
                            s.path
                        ));
                    }
                }
            }
            if hook.failure_policy.as_deref() != Some("Ignore") {
                problems.push(format!("{who}: failurePolicy is not Ignore"));
            }
            if hook.side_effects != "None" {
                problems.push(format!("{who}: sideEffects is not None"));
            }
            if !hook.timeout_seconds.is_some_and(|t| (1..=10).contains(&t)) {
                problems.push(format!(
                    "{who}: timeoutSeconds {:?}, not a small one (1..=10)",
                    hook.timeout_seconds
                ));
            }
            if !hook.admission_review_versions.iter().any(|v| v == "v1") {
                problems.push(format!("{who}: admissionReviewVersions lacks v1"));
            }
            let on_class = hook
                .object_selector
                .as_ref()
                .and_then(|s| s.match_expressions.as_ref())
                .into_iter()
                .flatten()
                .any(|e| e.key == class_label && e.operator == "Exists");
            if !on_class {
                problems.push(format!(
                    "{who}: objectSelector is not `{class_label} Exists` (the class label of powerplane.toml)"
                ));
            }
            let on_pod_creation = hook.rules.iter().flatten().any(|r| {
                r.api_groups.as_deref() == Some(&["".to_string()][..])
                    && r.resources.as_deref() == Some(&["pods".to_string()][..])
                    && r.operations.as_deref() == Some(&["CREATE".to_string()][..])
            });
            if !on_pod_creation || hook.rules.as_ref().map(Vec::len) != Some(1) {
                problems.push(format!("{who}: rules are not pods CREATE alone"));
            }
        }
    }
    // the chain of issuers ends at an issuer defined here
    for c in &m.certificates {
        let issuer = c.str_at("/spec/issuerRef/name");
        let kind = c.str_at("/spec/issuerRef/kind");
        if !matches!(kind, "" | "Issuer")
            || !m
                .issuers
                .iter()
                .any(|i| i.name() == issuer && i.namespace() == c.namespace())
        {
            problems.push(format!(
                "{}: issuerRef {kind} {issuer} is not an Issuer of its namespace",
                c.at()
            ));
        }
    }
    for i in &m.issuers {
        let ca = i.str_at("/spec/ca/secretName");
        if !ca.is_empty() {
            match m.certificate_of_secret(i.namespace().unwrap_or(""), ca) {
                Some(c) if c.json["spec"]["isCA"] == true => {}
                _ => problems.push(format!(
                    "{}: spec.ca.secretName {ca} is not the Secret of a CA Certificate here",
                    i.at()
                )),
            }
        }
    }
    fail_with("the admission webhook", &problems);
}

#[test]
fn the_service_monitor_scrapes_metrics_over_https() {
    let m = load();
    let mut problems = Vec::new();
    assert_eq!(m.service_monitors.len(), 1, "one ServiceMonitor");
    let svc = m.service();
    let svc_labels = svc.obj.metadata.labels.clone().unwrap_or_default();
    let svc_ports: Vec<String> = svc
        .obj
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|p| p.name)
        .collect();
    let cfg = m.powerplane_toml();
    if cfg
        .get("http")
        .and_then(|h| h.get("metrics_public"))
        .and_then(|v| v.as_bool())
        == Some(false)
    {
        problems.push(
            "powerplane.toml: [http] metrics_public is false, but the ServiceMonitor sends no token"
                .into(),
        );
    }
    for sm in &m.service_monitors {
        let at = sm.at();
        let sel: LabelSelector =
            serde_json::from_value(sm.json["spec"]["selector"].clone()).unwrap_or_default();
        if !selects(&sel, &svc_labels) {
            problems.push(format!(
                "{at}: spec.selector does not select Service {} (labels {svc_labels:?})",
                svc.doc.name()
            ));
        }
        let in_ns = sm.json["spec"]["namespaceSelector"]["matchNames"]
            .as_array()
            .is_some_and(|n| {
                n.iter()
                    .any(|n| Some(n.as_str().unwrap_or("")) == svc.doc.namespace())
            })
            || (sm.json["spec"].get("namespaceSelector").is_none()
                && sm.namespace() == svc.doc.namespace());
        if !in_ns {
            problems.push(format!(
                "{at}: namespaceSelector leaves out the Service's namespace"
            ));
        }
        let endpoints = sm.json["spec"]["endpoints"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if endpoints.is_empty() {
            problems.push(format!("{at}: no endpoints"));
        }
        for (i, e) in endpoints.iter().enumerate() {
            let who = format!("{at}: spec.endpoints[{i}]");
            let port = e["port"].as_str().unwrap_or("");
            if !svc_ports.iter().any(|p| p == port) {
                problems.push(format!(
                    "{who}: port {port:?} is no port name of the Service"
                ));
            }
            if e["scheme"] != "https" {
                problems.push(format!("{who}: scheme is not https"));
            }
            if e["path"] != "/metrics" {
                problems.push(format!("{who}: path is not /metrics"));
            }
            let tls = &e["tlsConfig"];
            let server = tls["serverName"].as_str().unwrap_or("");
            let cert = m.certificate_of_secret(
                sm.namespace().unwrap_or(""),
                tls["ca"]["secret"]["name"].as_str().unwrap_or(""),
            );
            match cert {
                None => problems.push(format!(
                    "{who}: tlsConfig.ca.secret is not a Certificate's Secret here"
                )),
                Some(c) => {
                    if tls["ca"]["secret"]["key"] != "ca.crt" {
                        problems.push(format!("{who}: tlsConfig.ca.secret.key is not ca.crt"));
                    }
                    let names = c.json["spec"]["dnsNames"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    if !names.iter().any(|n| n == server) {
                        problems.push(format!(
                            "{who}: tlsConfig.serverName {server:?} is not a name of {}",
                            c.at()
                        ));
                    }
                }
            }
            if tls["insecureSkipVerify"] == true {
                problems.push(format!("{who}: insecureSkipVerify"));
            }
        }
    }
    fail_with("the ServiceMonitor", &problems);
}

#[test]
fn the_scheduler_configuration_points_the_extender_at_the_service() {
    let m = load();
    let mut problems = Vec::new();
    let held: Vec<(String, String)> = m
        .config_maps
        .iter()
        .flat_map(|c| {
            c.obj
                .data
                .iter()
                .flatten()
                .filter(|(_, v)| v.contains("kind: KubeSchedulerConfiguration"))
                .map(move |(k, v)| (format!("{} key {k}", c.doc.at()), v.clone()))
        })
        .collect();
    assert_eq!(
        held.len(),
        1,
        "one ConfigMap holds a KubeSchedulerConfiguration"
    );
    let (at, text) = &held[0];
    let doc: Value = serde_saphyr::from_str(text).expect("the scheduler configuration is YAML");
    let d = Doc {
        file: at.clone(),
        json: doc.clone(),
    };
    let p = &mut problems;
    if doc["apiVersion"] != "kubescheduler.config.k8s.io/v1"
        || doc["kind"] != "KubeSchedulerConfiguration"
    {
        p.push(format!(
            "{at}: not a kubescheduler.config.k8s.io/v1 KubeSchedulerConfiguration"
        ));
    }
    check_keys(
        &d,
        "",
        &doc,
        &[
            "apiVersion",
            "kind",
            "parallelism",
            "leaderElection",
            "clientConnection",
            "percentageOfNodesToScore",
            "podInitialBackoffSeconds",
            "podMaxBackoffSeconds",
            "enableProfiling",
            "enableContentionProfiling",
            "profiles",
            "extenders",
            "delayCacheUntilActive",
        ],
        p,
    );
    let extenders = doc["extenders"].as_array().cloned().unwrap_or_default();
    if extenders.len() != 1 {
        p.push(format!("{at}: {} extenders, not one", extenders.len()));
    }
    let svc = m.service();
    let svc_port = svc
        .obj
        .spec
        .as_ref()
        .and_then(|s| s.ports.clone())
        .unwrap_or_default()
        .first()
        .map(|p| p.port)
        .unwrap_or(0);
    let hosts = m.service_hosts();
    let cert_names: Vec<Value> = m
        .certificate_of_secret("powerplane", "powerplane-tls")
        .map(|c| {
            c.json["spec"]["dnsNames"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .unwrap_or_default();
    for (i, e) in extenders.iter().enumerate() {
        let path = format!("extenders[{i}]");
        check_keys(
            &d,
            &path,
            e,
            &[
                "urlPrefix",
                "filterVerb",
                "preemptVerb",
                "prioritizeVerb",
                "weight",
                "bindVerb",
                "enableHTTPS",
                "tlsConfig",
                "httpTimeout",
                "nodeCacheCapable",
                "managedResources",
                "ignorable",
            ],
            p,
        );
        let url = e["urlPrefix"].as_str().unwrap_or("");
        let want: Vec<String> = hosts
            .iter()
            .map(|h| format!("https://{h}:{svc_port}/api/v1/k8s"))
            .collect();
        if !want.iter().any(|w| w == url) {
            p.push(format!(
                "{at}: {path}.urlPrefix {url:?} is not one of {want:?}"
            ));
        }
        for (key, value) in [
            ("filterVerb", Value::from("filter")),
            ("prioritizeVerb", Value::from("prioritize")),
            ("nodeCacheCapable", Value::from(true)),
            ("ignorable", Value::from(true)),
            ("enableHTTPS", Value::from(true)),
        ] {
            if e[key] != value {
                p.push(format!("{at}: {path}.{key} is {}, not {value}", e[key]));
            }
        }
        if e["weight"].as_i64().is_none_or(|w| w < 1) {
            p.push(format!("{at}: {path}.weight is not a positive number"));
        }
        let tls = &e["tlsConfig"];
        check_keys(
            &d,
            &format!("{path}.tlsConfig"),
            tls,
            &[
                "insecure",
                "serverName",
                "certFile",
                "keyFile",
                "caFile",
                "certData",
                "keyData",
                "caData",
            ],
            p,
        );
        if tls["insecure"] == true {
            p.push(format!("{at}: {path}.tlsConfig.insecure"));
        }
        if !cert_names.iter().any(|n| *n == tls["serverName"]) {
            p.push(format!(
                "{at}: {path}.tlsConfig.serverName {} is not a name of the serving certificate",
                tls["serverName"]
            ));
        }
    }
    fail_with("the scheduler configuration", &problems);
}

/// The controller's files laid out as its pod sees them under `/etc/powerplane` (the
/// ConfigMaps, the admin's Secrets with stand-in values, a certificate for the TLS
/// Secret), loaded the way `powerplane serve --check` loads them.
#[test]
fn the_controller_configuration_loads_as_serve_check_loads_it() {
    let m = load();
    let dir = tempfile::tempdir().expect("tmp");
    let etc = dir.path();
    for f in ["powerplane.toml", "site.toml", "mapping.toml"] {
        std::fs::write(etc.join(f), m.config_file("powerplane-config", f)).expect("file");
    }
    std::fs::write(
        etc.join("policy.toml"),
        m.config_file("powerplane-policy", "policy.toml"),
    )
    .expect("policy");
    let secrets = etc.join("secrets");
    std::fs::create_dir_all(&secrets).expect("secrets");
    std::fs::write(secrets.join("site.key"), "7a".repeat(32)).expect("key");
    std::fs::write(
        secrets.join("admin-token"),
        "0123456789abcdef0123456789abcdef\n",
    )
    .expect("token");
    std::fs::write(secrets.join("redis.url"), "redis://127.0.0.1:6379\n").expect("url");
    for f in ["site.key", "admin-token", "redis.url"] {
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(secrets.join(f), private).expect("chmod");
    }
    let tls = etc.join("tls");
    std::fs::create_dir_all(&tls).expect("tls");
    let (cert, key, _) = powerplane_tests::self_signed(&tls);
    std::fs::rename(cert, tls.join("tls.crt")).expect("cert");
    std::fs::rename(key, tls.join("tls.key")).expect("key");
    let loaded = orchestrator::config::load(&etc.join("powerplane.toml"))
        .unwrap_or_else(|e| panic!("config.yaml powerplane.toml does not load:\n{e:#}"));
    let ha = loaded.config.ha.as_ref().expect("[ha]");
    assert_eq!(ha.backend, orchestrator::ha::HaBackend::Kubernetes);
    let k = loaded
        .config
        .schedulers
        .as_ref()
        .and_then(|s| s.kubernetes.as_ref())
        .expect("[schedulers.kubernetes]");
    assert!(
        matches!(
            k.access(etc).way(),
            Ok(integrations::kubernetes::Way::InCluster(_))
        ),
        "the controller takes the in-cluster configuration"
    );
}
