//! `powerplane policy test|explain|diff` as an SRE runs them, and `serve` picking up
//! edits of its policy file (a valid edit swapped in, a broken one kept out and shown
//! in the API and in `/metrics`, checked by the real `promtool`).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{http, promtool_check};
use sha2::{Digest, Sha256};

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).to_string()
}

fn run(args: &[&str]) -> Output {
    powerplane()
        .args(args)
        .current_dir(root())
        .output()
        .expect("run powerplane")
}

const SITE: &str = "examples/demo/site.toml";
/// The demo policy with the reactive thermal rule: the explain and diff cases below pin
/// its 10% steps (the predictive rule's explanation has a case of its own).
const POLICY: &str = "examples/demo/policy-reactive.toml";
const SNAPSHOT: &str = "examples/policies/inputs/snapshot.toml";
const JOBS: &str = "examples/policies/inputs/jobs.toml";

#[test]
fn the_shipped_policy_tests_pass_one_line_per_case() {
    let out = run(&["policy", "test", "examples/policies/tests"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    // one PASS line for every [[case]] of every file in the folder
    let mut cases = 0;
    for e in std::fs::read_dir(root().join("examples/policies/tests")).expect("dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "toml") {
            let src = std::fs::read_to_string(&p).expect("read");
            cases += src.lines().filter(|l| l.trim() == "[[case]]").count();
        }
    }
    assert!(cases >= 5, "the examples hold {cases} cases");
    // every shipped example policy has tests
    let tests: String = std::fs::read_dir(root().join("examples/policies/tests"))
        .expect("dir")
        .filter_map(|e| std::fs::read_to_string(e.expect("entry").path()).ok())
        .collect();
    for e in std::fs::read_dir(root().join("examples/policies")).expect("dir") {
        let p = e.expect("entry").path();
        if p.extension().is_some_and(|x| x == "toml") {
            let name = p.file_name().expect("name").to_string_lossy().to_string();
            assert!(
                tests.contains(&format!("policy = \"../{name}\"")),
                "no test file names examples/policies/{name}"
            );
        }
    }
    let passed = stdout
        .lines()
        .filter(|l| l.trim_start().starts_with("PASS "))
        .count();
    assert_eq!(passed, cases, "{stdout}");
    assert!(
        stdout.contains(&format!("{cases} cases: {cases} passed, 0 failed")),
        "{stdout}"
    );
}

/// A test file next to copies of the demo site and policy.
fn fixture(dir: &Path, tests: &str) -> PathBuf {
    for f in ["site.toml", "policy.toml"] {
        std::fs::copy(root().join("examples/demo").join(f), dir.join(f)).expect("copy");
    }
    let p = dir.join("cases.toml");
    std::fs::write(&p, tests).expect("write");
    p
}

#[test]
fn a_failing_case_is_reported_with_its_first_difference_and_exit_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = fixture(
        dir.path(),
        r#"site = "site.toml"
policy = "policy.toml"

[[case]]
name = "hot rack b02 is capped one step"
[[case.tick]]
at = "+0s"
readings = [
  { entity = "gpu/*", metric = "power_w", value = 120 },
  { entity = "rack/*", metric = "inlet_temp_c", value = 27 },
  { entity = "rack/b02", metric = "inlet_temp_c", value = 33 },
]
expect.caps = [{ rack = "b02", watts = 270 }]

[[case]]
name = "wrongly expects two steps at once"
[[case.tick]]
at = "+0s"
readings = [
  { entity = "gpu/*", metric = "power_w", value = 120 },
  { entity = "rack/b02", metric = "inlet_temp_c", value = 33 },
]
expect.caps = [{ rack = "b02", watts = 270 }]
[[case.tick]]
at = "+30s"
expect.caps = [{ rack = "b02", max_watts = 240 }]
"#,
    );
    let out = powerplane()
        .args(["policy", "test"])
        .arg(&p)
        .output()
        .expect("run");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("PASS hot rack b02 is capped one step"),
        "{stdout}"
    );
    let fail = stdout
        .lines()
        .position(|l| l.contains("FAIL wrongly expects two steps at once"))
        .unwrap_or_else(|| panic!("no FAIL line:\n{stdout}"));
    let why = stdout.lines().nth(fail + 1).expect("the difference");
    // where, what was expected, what came
    assert!(why.contains("tick 2 (+30s"), "{why}");
    assert!(why.contains("expected capped at most 240 W"), "{why}");
    assert!(why.contains("got 270 W (thermal.inlet)"), "{why}");
    assert!(stdout.contains("2 cases: 1 passed, 1 failed"), "{stdout}");
}

#[test]
fn a_broken_test_file_names_file_line_and_column() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = fixture(
        dir.path(),
        "site = \"site.toml\"\npolicy = \"policy.toml\"\n\n[[case]]\nname = \"typo\"\n[[case.tick]]\nat = \"+0s\"\nreadings = [{ entity = \"rack/z99\", metric = \"inlet_temp_c\", value = 30 }]\n",
    );
    let out = powerplane()
        .args(["policy", "test"])
        .arg(&p)
        .output()
        .expect("run");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let name = p.display().to_string();
    assert!(
        stdout.contains(&format!(
            "{name}:6:1: tick 1 (+0s): rack/z99 is not an entity"
        )),
        "{stdout}"
    );
    // and one that is not TOML at all
    std::fs::write(&p, "site = \"site.toml\"\npolicy = \n").expect("write");
    let out = powerplane()
        .args(["policy", "test"])
        .arg(&p)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stdout).contains(&format!("ERROR {name}:2:")),
        "{}",
        text(&out.stdout)
    );
    // usage errors exit 2
    assert_eq!(run(&["policy", "test"]).status.code(), Some(2));
}

#[test]
fn explain_names_each_decision_its_values_and_what_is_in_force() {
    let out = run(&[
        "policy",
        "explain",
        "--policy",
        POLICY,
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--jobs",
        JOBS,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for want in [
        "thermal.inlet    cap at 270 W on 32 GPUs of rack/b02",
        "inlet_temp_c = 33.4, limit_c = 32",
        "price.defer      hold until",
        "price 0.310 above 0.220 per kWh",
        "CAPS IN FORCE AFTER THE TICK",
        "OBSERVE MODE",
    ] {
        assert!(stdout.contains(want), "explain lacks {want:?}:\n{stdout}");
    }

    // JSON for tools; its state explains the next tick (+2 min: one more step)
    let out = run(&[
        "policy",
        "explain",
        "--policy",
        POLICY,
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--jobs",
        JOBS,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let d = v["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .find(|d| d["rule"] == "thermal.inlet")
        .expect("thermal decision");
    assert_eq!(d["entity"], "rack/b02");
    assert_eq!(d["action"]["kind"], "cap");
    assert_eq!(d["values"]["inlet_temp_c"], 33.4);
    assert_eq!(v["caps_by_rack"][0]["rack"], "b02");
    assert_eq!(v["caps_by_rack"][0]["watts"], 270.0);
    assert!(v["holds"]["slurm:101"].is_object(), "{v}");

    let dir = tempfile::tempdir().expect("tempdir");
    let prior = dir.path().join("prior.json");
    std::fs::write(&prior, &out.stdout).expect("write");
    let out = run(&[
        "policy",
        "explain",
        "--policy",
        POLICY,
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--at",
        "+2m",
        "--format",
        "json",
        "--state",
        prior.to_str().expect("utf-8"),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let next: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(next["at"], "2026-01-05T18:02:00Z");
    assert_eq!(next["caps_by_rack"][0]["watts"], 240.0, "{next}");
}

#[test]
fn explain_shows_a_predictive_cap_with_its_prediction_and_model() {
    let out = run(&[
        "policy",
        "explain",
        "--policy",
        "examples/demo/policy.toml",
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--jobs",
        JOBS,
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for want in [
        "thermal.inlet    cap at",
        "predicted inlet",
        "against limit 32.0 °C − margin 0.5 °C",
        "predicted_peak_c = ",
        "predicted_peak_in_s = ",
        "model_rise_c = ",
        "model_fitted = 0",
        "margin_c = 0.5",
    ] {
        assert!(stdout.contains(want), "explain lacks {want:?}:\n{stdout}");
    }
}

#[test]
fn explain_reports_every_input_problem_with_its_position() {
    let dir = tempfile::tempdir().expect("tempdir");
    let snap = dir.path().join("snapshot.toml");
    std::fs::write(
        &snap,
        "at = \"2026-01-05T18:00:00Z\"\n\n[[readings]]\nentity = \"rack/a01\"\nmetric = \"inlet_temp\"\nvalue = 30\n\n[[readings]]\nentity = \"gpu/*\"\nmetric = \"power_w\"\nvalue = -50\n",
    )
    .expect("write");
    let jobs = dir.path().join("jobs.json");
    std::fs::write(&jobs, "[{\"id\": \"j1\", \"gpus\": \"four\"}]").expect("write");
    let out = powerplane()
        .args(["policy", "explain", "--policy", POLICY, "--site", SITE])
        .arg("--snapshot")
        .arg(&snap)
        .arg("--jobs")
        .arg(&jobs)
        .current_dir(root())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out.stderr);
    let (s, j) = (snap.display().to_string(), jobs.display().to_string());
    assert!(
        stderr.contains(&format!("{s}:3:1: unknown metric \"inlet_temp\"")),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{s}:8:1: gpu/")) && stderr.contains("outside the physical range"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("{j}: jobs[0]: invalid type: string \"four\"")),
        "{stderr}"
    );
    assert!(stdout_is_empty(&out), "nothing half-printed");
}

fn stdout_is_empty(o: &Output) -> bool {
    o.stdout.is_empty()
}

#[test]
fn diff_says_what_would_change_and_exits_like_diff() {
    let same = run(&[
        "policy",
        "diff",
        POLICY,
        POLICY,
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--jobs",
        JOBS,
    ]);
    assert_eq!(same.status.code(), Some(0), "{}", text(&same.stderr));
    assert!(text(&same.stdout).contains("no difference"));

    let dir = tempfile::tempdir().expect("tempdir");
    let new = dir.path().join("new.toml");
    let src = std::fs::read_to_string(root().join(POLICY)).expect("policy");
    let edited = src
        .replace("step_pct = 10 ", "step_pct = 20 ")
        .replace("defer_above = 0.22 ", "defer_above = 0.35 ");
    assert_ne!(src, edited, "the demo policy has the lines edited here");
    std::fs::write(&new, edited).expect("write");
    let out = powerplane()
        .args(["policy", "diff", POLICY])
        .arg(&new)
        .args(["--site", SITE, "--snapshot", SNAPSHOT, "--jobs", JOBS])
        .current_dir(root())
        .output()
        .expect("run");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("changed thermal: step_pct 10.0 → 20.0"),
        "{stdout}"
    );
    assert!(
        stdout.contains("changed price: defer_above 0.22 → 0.35"),
        "{stdout}"
    );
    let caps = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("b02"))
        .unwrap_or_else(|| panic!("no line for rack b02:\n{stdout}"));
    assert!(
        caps.contains("32")
            && caps.contains("270 W (thermal.inlet)")
            && caps.contains("240 W (thermal.inlet)"),
        "{caps}"
    );
    assert!(
        stdout.contains("slurm:101") && stdout.contains("held (price.defer)"),
        "{stdout}"
    );
    // a comment is no change
    std::fs::write(&new, format!("# reviewed\n{src}")).expect("write");
    let out = powerplane()
        .args(["policy", "diff", POLICY])
        .arg(&new)
        .args(["--site", SITE, "--snapshot", SNAPSHOT])
        .current_dir(root())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stdout));
    // a broken candidate is an error, not a difference
    std::fs::write(&new, "version = 1\n[thermal]\nstep_pct = 80\n").expect("write");
    let out = powerplane()
        .args(["policy", "diff", POLICY])
        .arg(&new)
        .args(["--site", SITE, "--snapshot", SNAPSHOT])
        .current_dir(root())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out.stderr).contains(&format!("{}:3:1: thermal: step_pct", new.display())),
        "{}",
        text(&out.stderr)
    );
}

const VIEWER: &str = "viewer-token-0123456789abcdef";

fn sha256_hex(s: &str) -> String {
    Sha256::digest(s.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Replaces a file the way editors save: a new file renamed over the old one.
fn save(p: &Path, text: &str) {
    let tmp = p.with_extension("tmp");
    std::fs::write(&tmp, text).expect("write");
    std::fs::rename(&tmp, p).expect("rename");
}

fn get_json(port: u16, path: &str) -> serde_json::Value {
    let (code, _, body) = http(port, "GET", path, Some(VIEWER), b"");
    if code != 200 {
        return serde_json::Value::Null;
    }
    serde_json::from_str(&body).unwrap_or(serde_json::Value::Null)
}

/// Polls until `ok` holds for the JSON at `path`; returns it.
fn wait_for(
    port: u16,
    path: &str,
    what: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let v = get_json(port, path);
        if ok(&v) {
            return v;
        }
        assert!(Instant::now() < end, "{what}: {path} says {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn metric(text: &str, name_and_labels: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name_and_labels) && l[name_and_labels.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn serve_swaps_in_a_valid_edit_and_keeps_running_through_a_broken_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root().join(SITE), d.join("site.toml")).expect("site");
    // no telemetry: the budget rule counts every silent GPU at its maximum and caps;
    // caps may rise at once when a rule lets go
    let policy = "version = 1\n[budget]\nraise_w_per_min = 100000\n";
    save(&d.join("policy.toml"), policy);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.3\npolicy_reload_s = 0.2\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    let log_file = d.join("serve.log");
    let mut serve = powerplane()
        .args(["serve", "--run-for-s", "60", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::from(std::fs::File::create(&log_file).expect("log")))
        .spawn()
        .expect("serve");

    let first = wait_for(port, "/api/v1/status", "caps in force", |v| {
        v["caps_in_force"].as_u64().unwrap_or(0) > 0
    });
    assert_eq!(first["policy_reload_error"], serde_json::Value::Null);
    let p = get_json(port, "/api/v1/policy");
    assert_eq!(p["sha256"], sha256_hex(policy));
    assert_eq!(p["valid"], true);
    let loaded_at = p["loaded_at"].clone();

    // a valid edit: the budget rule off; its caps go
    let off = "version = 1\n[budget]\nenabled = false\nraise_w_per_min = 100000\n";
    save(&d.join("policy.toml"), off);
    let p = wait_for(port, "/api/v1/policy", "the new hash", |v| {
        v["sha256"] == sha256_hex(off)
    });
    assert_ne!(p["loaded_at"], loaded_at);
    assert!(p["text"]
        .as_str()
        .is_some_and(|t| t.contains("enabled = false")));
    wait_for(
        port,
        "/api/v1/status",
        "caps lifted by the new policy",
        |v| v["caps_in_force"] == 0,
    );
    let audit = get_json(port, "/api/v1/decisions?rule=policy.reload");
    assert!(
        audit.to_string().contains(&sha256_hex(off)[..12]),
        "the reload is in the audit: {audit}"
    );

    // a broken edit: the old policy keeps running, the error shows
    let broken = "version = 1\n[budget]\nmargin = 0.9\nenabled = true\n";
    save(&d.join("policy.toml"), broken);
    let p = wait_for(port, "/api/v1/policy", "the reload error", |v| {
        v["last_error"].is_string()
    });
    let err = p["last_error"].as_str().expect("error");
    assert!(
        err.contains("policy.toml:3:1: budget: margin must be within 0..0.5, got 0.9"),
        "{err}"
    );
    assert_eq!(p["valid"], false);
    assert_eq!(
        p["sha256"],
        sha256_hex(off),
        "the policy in force is unchanged"
    );
    std::thread::sleep(Duration::from_millis(1000));
    assert_eq!(
        get_json(port, "/api/v1/status")["caps_in_force"],
        0,
        "the broken file's budget rule never ran"
    );
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    promtool_check(&m);
    assert_eq!(metric(&m, "powerplane_policy_valid"), Some(0.0), "{m}");
    assert_eq!(
        metric(&m, "powerplane_policy_reloads_total{result=\"error\"}"),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(&m, "powerplane_policy_reloads_total{result=\"ok\"}"),
        Some(1.0),
        "{m}"
    );
    assert!(
        m.contains(&format!(
            "powerplane_policy_loaded_timestamp_seconds{{sha256=\"{}\"}}",
            sha256_hex(off)
        )),
        "{m}"
    );

    // fixed: the budget rule is back and caps again
    let fixed = "version = 1\n[budget]\nmargin = 0.05\nraise_w_per_min = 100000\n";
    save(&d.join("policy.toml"), fixed);
    let p = wait_for(port, "/api/v1/policy", "recovery", |v| {
        v["sha256"] == sha256_hex(fixed)
    });
    assert_eq!(p["valid"], true);
    assert_eq!(p["last_error"], serde_json::Value::Null);
    wait_for(port, "/api/v1/status", "caps again", |v| {
        v["caps_in_force"].as_u64().unwrap_or(0) > 0
    });
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    promtool_check(&m);
    assert_eq!(metric(&m, "powerplane_policy_valid"), Some(1.0), "{m}");
    assert_eq!(
        metric(&m, "powerplane_policy_reloads_total{result=\"ok\"}"),
        Some(2.0)
    );

    let _ = serve.kill();
    let _ = serve.wait();
    let log = std::fs::read_to_string(&log_file).expect("log");
    assert_eq!(
        log.matches("policy file rejected").count(),
        1,
        "one warning for one error:\n{log}"
    );
    assert!(log.contains("policy reloaded"), "{log}");
}

#[test]
fn with_polling_off_serve_rereads_its_policy_on_sighup_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root().join(SITE), d.join("site.toml")).expect("site");
    let policy = "version = 1\n";
    save(&d.join("policy.toml"), policy);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.2\npolicy_reload_s = 0\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    let mut serve = powerplane()
        .args(["serve", "--run-for-s", "30", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    wait_for(port, "/api/v1/policy", "serve up", |v| {
        v["sha256"] == sha256_hex(policy)
    });
    let edited = "version = 1\n[thermal]\nstep_pct = 20\n";
    save(&d.join("policy.toml"), edited);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(
        get_json(port, "/api/v1/policy")["sha256"],
        sha256_hex(policy),
        "no polling: the edit waits for SIGHUP"
    );
    let hup = Command::new("kill")
        .args(["-HUP", &serve.id().to_string()])
        .status()
        .expect("kill");
    assert!(hup.success());
    let p = wait_for(port, "/api/v1/policy", "reloaded on SIGHUP", |v| {
        v["sha256"] == sha256_hex(edited)
    });
    assert_eq!(p["reloads"]["ok"], 1);
    let _ = serve.kill();
    let _ = serve.wait();
}

#[test]
fn diff_and_explain_follow_rules_by_name() {
    const RULES: &str = "examples/policies/row-b-rules.toml";
    let src = std::fs::read_to_string(root().join(RULES)).expect("rules policy");
    let dir = tempfile::tempdir().expect("tempdir");
    let new = dir.path().join("new.toml");
    let edited = src.replace("action = { cap_pct = 80 }", "action = { cap_pct = 70 }")
        + "\n[[rules]]\nname = \"night-cap\"\nscope = \"rack\"\nwhen = \"hour >= 23\"\naction = { cap_w = 250 }\n";
    let edited = edited.replacen("name = \"carbon-batch\"", "name = \"carbon-jobs\"", 1);
    std::fs::write(&new, &edited).expect("write");
    let out = powerplane()
        .args(["policy", "diff", RULES])
        .arg(&new)
        .args(["--site", SITE, "--snapshot", SNAPSHOT, "--format", "json"])
        .current_dir(root())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let rules: Vec<&str> = v["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r.as_str())
        .collect();
    assert!(
        rules.contains(&"changed rules.hot-aisle-b: action.cap_pct 80 → 70"),
        "{rules:?}"
    );
    assert!(rules.contains(&"added rules.night-cap"), "{rules:?}");
    assert!(rules.contains(&"added rules.carbon-jobs"), "{rules:?}");
    assert!(rules.contains(&"removed rules.carbon-batch"), "{rules:?}");
    assert_eq!(v["same"], false);

    let out = run(&[
        "policy",
        "explain",
        "--policy",
        RULES,
        "--site",
        SITE,
        "--snapshot",
        SNAPSHOT,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(
        v["observe_mode"],
        serde_json::json!(["rules.row-a-expensive-hours"])
    );
    assert_eq!(v["disabled"], serde_json::json!(["thermal"]));
    // the snapshot's price (0.31) is over the trial rule's 0.25: row A capped, observed only
    assert_eq!(v["caps_by_rack"], serde_json::json!([]));
    let observed: Vec<&str> = v["observed_caps_by_rack"]
        .as_array()
        .expect("observed")
        .iter()
        .filter_map(|c| c["rack"].as_str())
        .collect();
    assert_eq!(observed, ["a01", "a02", "a03"]);
}

#[test]
fn explain_chained_by_state_shows_a_rule_with_a_duration_and_diff_its_clock_change() {
    const EMERGENCY: &str = "examples/policies/emergency.toml";
    let dir = tempfile::tempdir().expect("tempdir");
    let snap = dir.path().join("snapshot.toml");
    std::fs::write(
        &snap,
        "at = \"2026-01-05T12:00:00Z\"\nreadings = [\n  { entity = \"gpu/*\", metric = \"power_w\", value = 120 },\n  { entity = \"rack/*\", metric = \"inlet_temp_c\", value = 25 },\n  { entity = \"rack/b02\", metric = \"inlet_temp_c\", value = 34 },\n  { entity = \"site/demo-hall\", metric = \"power_w\", value = 20000 },\n]\n",
    )
    .expect("write");
    let explain = |extra: &[&str]| {
        let out = powerplane()
            .args(["policy", "explain", "--policy", EMERGENCY, "--site", SITE])
            .arg("--snapshot")
            .arg(&snap)
            .args(extra)
            .current_dir(root())
            .output()
            .expect("run");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    // cooling-overload needs a minute over 33 °C: nothing locked on the first tick
    let t0 = explain(&["--format", "json"]);
    let v: serde_json::Value = serde_json::from_str(&t0).expect("json");
    assert!(v["state"]["clocks"].is_null(), "{}", v["state"]);
    let prior = dir.path().join("t0.json");
    std::fs::write(&prior, &t0).expect("write");
    let p = prior.to_str().expect("utf-8");
    let t1 = explain(&["--state", p, "--at", "+1m"]);
    assert!(
        t1.contains("rules.cooling-overload lock clocks at 1200 MHz on 32 GPUs of rack/b02"),
        "{t1}"
    );
    assert!(t1.contains("release: inlet_temp_c < 30 for 5m"), "{t1}");
    assert!(t1.contains("CLOCKS LOCKED AFTER THE TICK"), "{t1}");

    let new = dir.path().join("new.toml");
    let src = std::fs::read_to_string(root().join(EMERGENCY)).expect("policy");
    std::fs::write(
        &new,
        src.replace("lock_clocks_mhz = 1200", "lock_clocks_mhz = 1000"),
    )
    .expect("write");
    let out = powerplane()
        .args(["policy", "diff", EMERGENCY])
        .arg(&new)
        .args(["--site", SITE, "--snapshot"])
        .arg(&snap)
        .args(["--state", p, "--at", "+1m"])
        .current_dir(root())
        .output()
        .expect("run");
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    let line = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("b02"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        line.contains("1200 MHz (rules.cooling-overload)")
            && line.contains("1000 MHz (rules.cooling-overload)"),
        "{line}"
    );
}

#[test]
fn explain_shows_the_automatic_peak_target_and_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let site = dir.path().join("site.toml");
    let demo = std::fs::read_to_string(root().join(SITE)).expect("demo site");
    save(
        &site,
        &format!("{demo}\n[tariff]\ndefault_per_kwh = 0.2\ndemand_charge_per_kw = 10\n"),
    );
    let snapshot = |price: f64| {
        format!(
            "at = \"2026-01-05T18:00:00Z\"\n[[readings]]\nentity = \"gpu/*\"\nmetric = \"power_w\"\nvalue = 120\n[[readings]]\nentity = \"site/demo-hall\"\nmetric = \"price_per_kwh\"\nvalue = {price}\n[[readings]]\nentity = \"site/demo-hall\"\nmetric = \"period_peak_w\"\nvalue = 5000\n[[readings]]\nentity = \"site/demo-hall\"\nmetric = \"day_peak_w\"\nvalue = 4000\n"
        )
    };
    let jobs = dir.path().join("jobs.toml");
    save(
        &jobs,
        "[[jobs]]\nid = \"slurm:201\"\nclass = \"batch\"\ngpus = 8\ndeadline = \"+12h\"\nest_duration_s = 3600\n",
    );
    let path = |p: &Path| p.to_str().expect("utf-8").to_string();
    let explain = |snap: &Path, extra: &[&str]| {
        let mut args = vec![
            "policy".to_string(),
            "explain".into(),
            "--policy".into(),
            POLICY.into(),
            "--site".into(),
            path(&site),
            "--snapshot".into(),
            path(snap),
            "--jobs".into(),
            path(&jobs),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&args)
    };
    // expensive: the batch job is held
    let dear = dir.path().join("dear.toml");
    save(&dear, &snapshot(0.31));
    let out = explain(&dear, &["--format", "json"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let hold = v["decisions"]
        .as_array()
        .expect("decisions")
        .iter()
        .find(|d| d["rule"] == "price.defer")
        .expect("the hold");
    // the hold decision names the target in force and what it came from
    assert_eq!(hold["values"]["peak_target_kw"], 5.0, "{hold}");
    assert_eq!(hold["values"]["period_peak_kw"], 5.0);
    assert_eq!(hold["values"]["day_peak_kw"], 4.0);
    let prior = dir.path().join("prior.json");
    std::fs::write(&prior, &out.stdout).expect("write");
    // cheap a minute later: its release waits for room under the billing period's
    // peak so far (5 kW, under what the hall draws), and explain says so
    let cheap = dir.path().join("cheap.toml");
    save(&cheap, &snapshot(0.10));
    let out = explain(&cheap, &["--state", &path(&prior), "--at", "+1m"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("slurm:201") && stdout.contains(
            "price 0.100 at or below 0.220 per kWh; waiting for room under the peak target 5.0 kW (automatic: the billing period's peak so far 5.0 kW)"
        ),
        "{stdout}"
    );
}
