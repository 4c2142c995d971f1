//! Demand response in `powerplane serve`, end to end: two `powerplane agent`s (sim
//! GPUs) on the shared Mosquitto, jobs from inbound scheduler events, and a load target
//! an admin posts (`POST /api/v1/grid/targets`). The flexible class is capped through
//! the agents, the protected class never, the deferrable job held; the event survives a
//! restart with its baseline; cancelling it starts the rebound limit. `/metrics` passes
//! promtool with the `powerplane_dr_*` series.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, metric_value, mqtt_port, promtool_check};

const VIEWER: &str = "viewer-token-0123456789abcdef";
const ADMIN: &str = "admin-token-0123456789abcdef0";

struct Kill(std::process::Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port()
}

fn wait_for<T>(what: &str, within: Duration, f: &mut dyn FnMut() -> Option<T>) -> T {
    let end = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < end, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn json(port: u16, path: &str) -> Option<serde_json::Value> {
    let (code, _, body) = http(port, "GET", path, Some(VIEWER), b"");
    (code == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

const SITE: &str = "version = 1\n[site]\nname = \"dr\"\n[[feeds]]\nid = \"f\"\nrating_kw = 100\n[[cooling]]\nid = \"c\"\ncapacity_kw = 100\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 50\nnodes = 2\ngpus_per_node = 4\ngpu_model = \"A40\"\nnode_base_w = 300\n";

#[test]
fn a_posted_shed_caps_the_flexible_class_holds_deferrable_work_and_survives_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let site = telemetry::Site::parse("site.toml", SITE).expect("site");
    let mut nodes: Vec<String> = site.nodes.iter().map(|n| n.id.clone()).collect();
    nodes.dedup();
    assert_eq!(nodes.len(), 2);
    let gpus_of = |node: &str| -> Vec<String> {
        site.gpus()
            .into_iter()
            .filter(|g| g.node.id == node)
            .map(|g| g.id.to_string())
            .collect()
    };
    std::fs::write(d.join("site.toml"), SITE).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n[price]\nenabled = false\n[grid]\nprotect = [\"inference\"]\nfloor_fraction = 0.34\nrebound_s = 600\n",
    )
    .expect("policy");
    std::fs::write(d.join("site.key"), "7c".repeat(32)).expect("key");
    std::fs::write(d.join("webhook.key"), "5a".repeat(32)).expect("key");
    for f in ["site.key", "webhook.key"] {
        let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
        std::fs::set_permissions(d.join(f), private).expect("chmod");
    }
    let mqtt = mqtt_port();
    let prefix = format!("pptest-grid-{}/v1", std::process::id());
    let (port, dead) = (free_port(), free_port());
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 1\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[agents]\nkey_file = \"site.key\"\nlease_s = 60\nrenew_s = 20\nretry_s = 1\ntopic_prefix = \"{prefix}\"\n[agents.mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt}\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[[http.tokens]]\nname = \"facility\"\nrole = \"admin\"\ntoken = \"{ADMIN}\"\n\n[schedulers.webhook]\nkey_file = \"webhook.key\"\nurl = \"http://127.0.0.1:{dead}/hook\"\nbackoff_s = 0.5\nmax_backoff_s = 2\n\n[demand_response]\nposted_file = \"grid-targets.json\"\n"
        ),
    )
    .expect("config");
    let mut agents = Vec::new();
    for (k, node) in nodes.iter().enumerate() {
        let cfg = d.join(format!("agent-{k}.toml"));
        std::fs::write(
            &cfg,
            format!(
                "node = \"{node}\"\nkey_file = \"site.key\"\ninterval_s = 0.5\ntopic_prefix = \"{prefix}\"\n[backend]\nkind = \"sim\"\ngpus = 4\nmodel = \"A40\"\nseed = {}\n[mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt}\"\n",
                k + 7
            ),
        )
        .expect("agent config");
        agents.push(Kill(
            powerplane()
                .args(["agent", "--config"])
                .arg(&cfg)
                .stderr(Stdio::null())
                .spawn()
                .expect("agent"),
        ));
    }
    let config = d.join("powerplane.toml");
    let serve = common::serve(&config, 120);
    let up = wait_for("serve answering", Duration::from_secs(20), &mut || {
        json(port, "/api/v1/status")
    });
    assert_eq!(up["site"], "dr");

    // the jobs: inference (protected) on the first node, training on the second, and
    // a deferrable batch job waiting
    let event = |body: String| {
        let (code, _, answer) = http(port, "POST", "/api/v1/events", Some(ADMIN), body.as_bytes());
        assert_eq!(code, 202, "{body}: {answer}");
    };
    let list = |v: &[String]| serde_json::to_string(v).expect("json");
    event(format!(
        r#"{{"event":"started","scheduler":"lsf","job":"serve","class":"inference","gpus":4,"allocated":{}}}"#,
        list(&gpus_of(&nodes[0]))
    ));
    event(format!(
        r#"{{"event":"started","scheduler":"lsf","job":"train","class":"training","gpus":4,"allocated":{}}}"#,
        list(&gpus_of(&nodes[1]))
    ));
    event(r#"{"event":"submitted","scheduler":"lsf","job":"batch","class":"batch","gpus":4,"deferrable":true,"est_duration_s":3600}"#.to_string());
    // every GPU reported by its agent
    wait_for("the agents' readings", Duration::from_secs(20), &mut || {
        let g = json(port, "/api/v1/gpus")?;
        let n = g["gpus"]
            .as_array()?
            .iter()
            .filter(|x| x["power_w"].is_number())
            .count();
        (n == 8).then_some(())
    });

    // refused: a viewer may not post a target, a target must say one shed
    let body = br#"{"duration_min": 30, "shed_pct": 20}"#;
    assert_eq!(
        http(port, "POST", "/api/v1/grid/targets", Some(VIEWER), body).0,
        403
    );
    let (code, _, why) = http(
        port,
        "POST",
        "/api/v1/grid/targets",
        Some(ADMIN),
        br#"{"duration_min": 30}"#,
    );
    assert_eq!(code, 400, "{why}");
    assert!(why.contains("exactly one of"), "{why}");

    let posted = Instant::now();
    let (code, _, answer) = http(
        port,
        "POST",
        "/api/v1/grid/targets",
        Some(ADMIN),
        br#"{"id": "peak", "duration_min": 30, "shed_pct": 20, "reason": "utility peak"}"#,
    );
    assert_eq!(code, 201, "{answer}");
    // the training GPUs capped by the event; the inference GPUs never
    let gpus = wait_for(
        "grid caps on the training GPUs",
        Duration::from_secs(10),
        &mut || {
            let g = json(port, "/api/v1/gpus")?;
            let capped = g["gpus"]
                .as_array()?
                .iter()
                .filter(|x| x["cap"]["rule"] == "grid.shed")
                .count();
            (capped > 0).then_some(g)
        },
    );
    let took = posted.elapsed();
    assert!(took < Duration::from_secs(3), "caps took {took:?}");
    for g in gpus["gpus"].as_array().expect("gpus") {
        let id = g["id"].as_str().unwrap_or_default().to_string();
        if gpus_of(&nodes[0]).contains(&id) {
            assert!(
                g["cap"].is_null() || g["cap"]["rule"] != "grid.shed",
                "inference capped: {g}"
            );
        }
    }
    let grid = json(port, "/api/v1/grid").expect("grid");
    let m = &grid["in_force"];
    let (baseline, target) = (
        m["baseline_w"].as_f64().expect("baseline"),
        m["target_w"].as_f64().expect("target"),
    );
    assert!((target - 0.8 * baseline).abs() < 1e-6 * baseline, "{grid}");
    assert!(
        grid["events"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["id"] == "peak" && e["status"] == "active")),
        "{grid}"
    );
    let holds = json(port, "/api/v1/holds").expect("holds");
    assert_eq!(holds["holds"]["lsf:batch"]["rule"], "grid.shed", "{holds}");
    // the agents enforce the caps: the meter falls under the baseline
    let delivered = wait_for(
        "the meter under the baseline",
        Duration::from_secs(10),
        &mut || {
            let (_, _, text) = http(port, "GET", "/metrics", Some(VIEWER), b"");
            let d = metric_value(&text, "powerplane_dr_delivered_watts")?;
            (d > 0.0).then_some((d, text))
        },
    );
    let text = delivered.1;
    assert_eq!(metric_value(&text, "powerplane_dr_event_active"), Some(1.0));
    assert_eq!(
        metric_value(&text, "powerplane_dr_target_watts"),
        Some(target)
    );
    assert_eq!(
        metric_value(
            &text,
            "powerplane_dr_events{source=\"api\",status=\"active\"}"
        ),
        Some(1.0)
    );
    promtool_check(&text);

    // a restart keeps the event and its baseline (the state and the posted file)
    drop(serve);
    let serve = common::serve(&config, 120);
    let again = wait_for(
        "the event after a restart",
        Duration::from_secs(20),
        &mut || {
            let g = json(port, "/api/v1/grid")?;
            g["in_force"]["baseline_w"].as_f64().map(|b| (b, g))
        },
    );
    assert!(
        (again.0 - baseline).abs() < 1e-6,
        "baseline {baseline} became {}: {}",
        again.0,
        again.1
    );

    // cancelled: the rebound limit holds the pre-event baseline
    let (code, _, answer) = http(
        port,
        "DELETE",
        "/api/v1/grid/targets/peak",
        Some(ADMIN),
        b"",
    );
    assert_eq!(code, 200, "{answer}");
    wait_for("the rebound", Duration::from_secs(10), &mut || {
        let (_, _, text) = http(port, "GET", "/metrics", Some(VIEWER), b"");
        (metric_value(&text, "powerplane_dr_rebound_active") == Some(1.0)
            && metric_value(&text, "powerplane_dr_event_active") == Some(0.0))
        .then_some(())
    });
    let grid = json(port, "/api/v1/grid").expect("grid");
    assert!(
        grid["events"].as_array().is_some_and(|e| e
            .iter()
            .any(|e| e["id"] == "peak" && e["status"] == "cancelled")),
        "{grid}"
    );
    assert!(
        (grid["in_force"]["target_w"].as_f64().unwrap_or(0.0) - baseline).abs() < 1e-6,
        "{grid}"
    );
    drop(serve);
    drop(agents);
    // the report names the event; seconds of ledger settle on no 15-minute baseline,
    // and it says why rather than guess
    let hour = chrono::Duration::hours(1);
    let (from, to) = (
        (chrono::Utc::now() - hour).to_rfc3339(),
        (chrono::Utc::now() + hour).to_rfc3339(),
    );
    let out = powerplane()
        .args([
            "report", "--format", "json", "--from", &from, "--to", &to, "--config",
        ])
        .arg(&config)
        .output()
        .expect("report");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("report json");
    let dr = &r["demand_response"][0];
    assert_eq!(dr["id"], "peak", "{r}");
    assert_eq!(dr["asked"], "shed 20%", "{r}");
    assert!(
        dr["not_settled"].as_array().is_some_and(|n| n.len() == 3),
        "{dr}"
    );
}
