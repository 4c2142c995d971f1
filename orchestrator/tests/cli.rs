//! The `powerplane` binary as an operator runs it.

use std::path::Path;
use std::process::Command;

fn powerplane() -> Command {
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
}

/// The DMTF rack-PDU mockup served by the real `sushy-static` on a free port.
fn pdu_mockup() -> (std::process::Child, u16) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let sushy = std::env::var("POWERPLANE_SUSHY_STATIC")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| root.join(".venv/bin/sushy-static"));
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let child = Command::new(&sushy)
        .args(["-i", "127.0.0.1", "-p", &port.to_string(), "-m"])
        .arg(root.join("tests/fixtures/redfish/public-pdu"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "this test needs sushy-static at {} (scripts/test installs it): {e}",
                sushy.display()
            )
        });
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, port)
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

#[test]
fn the_demo_writes_its_reports_and_an_audit_log_with_reasons() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = powerplane()
        .args(["demo", "--minutes", "240", "--out"])
        .arg(dir.path())
        .output()
        .expect("run demo");
    assert!(
        out.status.success(),
        "demo failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "energy",
        "cost",
        "peak IT power",
        "hottest inlet",
        "caps",
        "deferred jobs",
    ] {
        assert!(
            stdout.contains(heading),
            "summary lacks {heading:?}:\n{stdout}"
        );
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("[ 240/240 min]"),
        "progress ends at 240/240:\n{stderr}"
    );

    let audit = read(&dir.path().join("audit.jsonl"));
    let records: Vec<serde_json::Value> = audit
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let kind = |r: &serde_json::Value| r["action"]["kind"].as_str().unwrap_or_default().to_string();
    let caps: Vec<_> = records.iter().filter(|r| kind(r) == "cap").collect();
    let holds: Vec<_> = records.iter().filter(|r| kind(r) == "hold").collect();
    assert!(
        !caps.is_empty() && !holds.is_empty(),
        "{} caps, {} holds",
        caps.len(),
        holds.len()
    );
    for r in &records {
        for field in ["time", "rule", "action", "values", "reason"] {
            assert!(!r[field].is_null(), "{field} missing in {r}");
        }
        assert!(
            r.get("entity").is_some() || r.get("job").is_some(),
            "names an entity or a job: {r}"
        );
    }
    let thermal = caps
        .iter()
        .find(|r| r["rule"] == "thermal.inlet")
        .expect("a thermal cap");
    // predictive (the default): the cap comes before the limit is crossed, because the
    // inlet predicted at the level in force would pass limit − margin
    let v = |k: &str| {
        thermal["values"][k]
            .as_f64()
            .unwrap_or_else(|| panic!("{k} in {thermal}"))
    };
    assert!(v("inlet_temp_c") <= v("limit_c"), "{thermal}");
    assert!(
        v("predicted_peak_unchanged_c") > v("limit_c") - v("margin_c"),
        "{thermal}"
    );
    assert!(
        v("predicted_peak_c") <= v("limit_c") - v("margin_c"),
        "{thermal}"
    );
    for k in [
        "predicted_peak_in_s",
        "model_tau_s",
        "model_rise_c",
        "model_fitted",
    ] {
        v(k);
    }
    let budget = caps
        .iter()
        .find(|r| r["rule"].as_str().is_some_and(|s| s.starts_with("budget.")))
        .expect("a budget cap");
    assert!(
        budget["values"]["demand_kw"].as_f64()
            > budget["values"]["budget_kw"].as_f64().map(|b| b * 0.97)
    );
    let hold = holds[0];
    assert!(
        hold["values"]["price_per_kwh"].as_f64() > hold["values"]["defer_above"].as_f64(),
        "{hold}"
    );
    assert!(
        records.iter().any(|r| kind(r) == "release"),
        "deferred jobs are released"
    );

    let csv = read(&dir.path().join("report.csv"));
    assert!(csv.starts_with("time,it_kw,cooling_kw,budget_kw,price_per_kwh"));
    assert_eq!(
        csv.lines().count(),
        1 + 240 * 4 + 1,
        "a header and one row per 15 s tick, both ends included"
    );
    let html = read(&dir.path().join("report.html"));
    assert!(html.contains("<h1>powerplane demo report</h1>") && html.contains("<svg"));
    // the predictive rule's forecasts against what the inlets did, a chart per rack
    assert!(html.contains("<h2>Predicted against measured inlet</h2>"));
    for rack in ["a01", "a02", "a03", "b01", "b02", "b03"] {
        let title = format!("aria-label=\"Rack {rack}: inlet measured and predicted\"");
        let at = html
            .find(&title)
            .unwrap_or_else(|| panic!("no chart for {rack}"));
        let chart = &html[at..at + html[at..].find("</svg>").expect("chart ends")];
        assert!(
            chart.contains("predicted (at the time predicted for)") && chart.contains("measured"),
            "{rack}: both lines named"
        );
        // the error line under the chart: every tick's prediction whose time came
        let line = format!("<p class=\"muted\">Rack {rack}: ");
        let at = html
            .find(&line)
            .unwrap_or_else(|| panic!("no error line for {rack}"));
        let text = &html[at..at + html[at..].find("</p>").expect("line ends")];
        let n: usize = text[line.len()..]
            .split(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!(n > 800, "{rack}: predictions of 960 ticks came due: {text}");
        let mean: f64 = text
            .split("mean error ")
            .nth(1)
            .and_then(|t| t.split(' ').next())
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("{text}"));
        assert!(
            (0.0..2.0).contains(&mean),
            "{rack}: the model tracks the inlet: {text}"
        );
    }
    assert!(
        !html.contains("http://")
            || html
                .matches("http://")
                .all(|_| html.contains("xmlns=\"http://www.w3.org/2000/svg\"")),
        "no external fetches"
    );
    assert!(
        !html.contains("<script") && !html.contains("src=\"http"),
        "self-contained"
    );
}

#[test]
fn one_seed_gives_one_audit_log() {
    let run = |seed: &str| {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = powerplane()
            .args(["demo", "--minutes", "240", "--seed", seed, "--out"])
            .arg(dir.path())
            .output()
            .expect("run demo");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: String = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| !l.contains("wrote"))
            .collect();
        (
            read(&dir.path().join("audit.jsonl")),
            read(&dir.path().join("report.csv")),
            summary,
        )
    };
    let (a1, c1, s1) = run("7");
    let (a2, c2, s2) = run("7");
    assert!(a1 == a2 && c1 == c2, "same seed, same files");
    assert_eq!(s1, s2, "same summary");
    let (a3, _, _) = run("8");
    assert_ne!(a1, a3, "another seed, another run");
}

#[test]
fn the_demo_needs_no_network() {
    // a fresh network namespace has no interface but a downed loopback
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new("unshare")
        .args(["-rn", "--"])
        .arg(env!("CARGO_BIN_EXE_powerplane"))
        .args(["demo", "--minutes", "30", "--out"])
        .arg(dir.path())
        .output()
        .expect("unshare (util-linux) runs: this test needs it");
    assert!(
        out.status.success(),
        "demo without network failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(dir.path().join("report.html").exists() && dir.path().join("audit.jsonl").exists());
}

#[test]
fn a_broken_site_file_lists_every_problem_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("site.toml");
    std::fs::write(&bad, "version = 1\n[site]\nname = \"hall\"\ntimezone = \"Mars/Olympus\"\n[[feeds]]\nid = \"f\"\nrating_kw = 0\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"r\"\nroom = \"nowhere\"\n").expect("write");
    let out = powerplane()
        .args(["site", "check"])
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    let name = bad.display().to_string();
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(
        lines,
        vec![
            format!("{name}:4:12: unknown time zone \"Mars/Olympus\": use an IANA name such as \"Europe/Berlin\""),
            format!("{name}:7:13: feed \"f\": rating_kw must be within 0.001..=1000000, got 0"),
            format!("{name}:12:8: row \"r\" refers to unknown room \"nowhere\""),
        ]
    );
    let good = powerplane()
        .args([
            "site",
            "check",
            concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/demo/site.toml"),
        ])
        .output()
        .expect("run");
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    assert!(String::from_utf8_lossy(&good.stdout)
        .contains("6 racks, 24 nodes, 192 GPUs, 44.0 kW facility budget"));
}

#[test]
fn a_broken_policy_file_lists_every_problem_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("policy.toml");
    std::fs::write(
        &bad,
        "version = 1\n[budget]\nrelease_ratio = 2\n[price]\nlease_s = 0\n",
    )
    .expect("write");
    let out = powerplane()
        .args(["policy", "check"])
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(":3:1: budget: release_ratio must be within 0.5..=1, got 2"),
        "{err}"
    );
    assert!(
        err.contains(":5:1: price: lease_s must be at least 10, got 0"),
        "{err}"
    );
    let missing = powerplane()
        .args(["policy", "check", "/nonexistent/policy.toml"])
        .output()
        .expect("run");
    assert_eq!(missing.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/policy.toml: cannot read")
    );
}

#[test]
fn the_example_policies_pass_check_against_the_demo_site() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files: Vec<_> = std::fs::read_dir(root.join("examples/policies"))
        .expect("examples/policies")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
    files.push(root.join("examples/demo/policy.toml"));
    let out = powerplane()
        .args(["policy", "check", "--site"])
        .arg(root.join("examples/demo/site.toml"))
        .args(&files)
        .output()
        .expect("run");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        text.matches("checked against the site").count(),
        files.len(),
        "{text}"
    );
}

#[test]
fn policy_check_against_a_site_finds_what_the_file_alone_cannot() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("policy.toml");
    std::fs::write(
        &p,
        "version = 1\n[budget]\nlimits = [{ scope = \"row\", name = \"row-z\", limit_kw = 50 }]\n\n[[rules]]\nname = \"c-racks\"\nscope = \"rack\"\nselect = { name = \"c*\" }\naction = { cap_pct = 90 }\n\n[[rules]]\nname = \"floor\"\nscope = \"gpu\"\naction = { cap_w = 60 }\n",
    )
    .expect("write");
    // the file alone is valid
    let alone = powerplane()
        .args(["policy", "check"])
        .arg(&p)
        .output()
        .expect("run");
    assert!(alone.status.success());
    let out = powerplane()
        .args(["policy", "check", "--site"])
        .arg(root.join("examples/demo/site.toml"))
        .arg(&p)
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        ":3:35: budget.limits: site demo-hall has no row `row-z`",
        ":8:10: rule `c-racks`: selects no rack of site demo-hall",
        ":14:10: rule `floor`: cap below the GPUs' minimum (A40 accepts no less than 100 W)",
    ] {
        assert!(err.contains(want), "missing {want:?} in {err}");
    }
}

#[test]
fn telemetry_probe_prints_what_a_redfish_pdu_reports() {
    let (mut server, port) = pdu_mockup();
    let url = format!("http://127.0.0.1:{port}");
    let out = powerplane()
        .args([
            "telemetry",
            "probe",
            "--redfish",
            &url,
            "--seconds",
            "1",
            "--json",
        ])
        .output()
        .expect("run probe");
    let table = powerplane()
        .args(["telemetry", "probe", "--redfish", &url, "--seconds", "1"])
        .output()
        .expect("run probe");
    let _ = server.kill();
    let _ = server.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON sample per line"))
        .collect();
    let a1 = lines
        .iter()
        .find(|s| s["entity"] == "outlet/bmc1.1.A1" && s["metric"] == "power_w")
        .expect("outlet A1 power");
    assert_eq!(a1["value"], 197.4);
    assert_eq!(a1["unit"], "W");
    assert_eq!(a1["quality"], "good");
    for key in [
        "entity", "metric", "value", "unit", "ts", "source", "quality",
    ] {
        assert!(!a1[key].is_null(), "{key} in {a1}");
    }
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.starts_with("ENTITY") && text.contains("outlet/bmc1.1.A1") && text.contains("197.400"),
        "{text}"
    );
}

#[test]
fn serve_ingests_mqtt_and_redfish_decides_and_restores_after_a_restart() {
    use integrations::store::Store;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(root.join("examples/demo/prices.csv"), d.join("prices.csv")).expect("prices");
    // no GPU agents yet: budgets off, so that the thermal rule's decision shows
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nstep_interval_s = 1\n",
    )
    .expect("policy");
    let topic = format!("pptest-serve-{}", std::process::id());
    std::fs::write(d.join("mapping.toml"), format!("version = 1\n[[json]]\ntopic = \"{topic}/{{rack}}/inlet\"\nentity = \"rack/{{rack}}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/c\"\n")).expect("mapping");
    let (mut bmc, port) = pdu_mockup();
    let mqtt_port: u16 = std::env::var("POWERPLANE_TEST_MQTT_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1883);
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt_port}\"\nmapping = \"mapping.toml\"\n\n[redfish]\ninterval_s = 1\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"http://127.0.0.1:{port}\"\nentities = {{ \"RackPDUs/1\" = \"pdu/pdu-a01\" }}\n\n[prices]\nfile = \"prices.csv\"\n"
        ),
    )
    .expect("config");
    let check = powerplane()
        .args(["serve", "--check", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("serve --check");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stderr)
    );

    let serve = powerplane()
        .args(["serve", "--run-for-s", "4", "--config"])
        .arg(d.join("powerplane.toml"))
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("serve");
    std::thread::sleep(std::time::Duration::from_millis(1200));
    for _ in 0..4 {
        let ok = Command::new("mosquitto_pub")
            .args([
                "-p",
                &mqtt_port.to_string(),
                "-t",
                &format!("{topic}/b01/inlet"),
                "-m",
                "{\"c\": 35.5}",
            ])
            .status()
            .expect("this test needs mosquitto_pub");
        assert!(ok.success());
        std::thread::sleep(std::time::Duration::from_millis(400));
    }
    let out = serve.wait_with_output().expect("serve ran");
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{log}");
    assert!(log.contains("stopped"), "{log}");

    let mut store = Store::new(Box::new(
        orchestrator::embedded::EmbeddedBackend::open(&d.join("state.redb")).expect("store"),
    ));
    let audit: Vec<_> = store
        .audit(1, 1000)
        .expect("audit")
        .into_iter()
        .map(|a| a.1)
        .collect();
    let thermal = audit
        .iter()
        .find(|a| a.rule == "thermal.inlet")
        .unwrap_or_else(|| panic!("a thermal decision in {audit:?}\n{log}"));
    assert_eq!(thermal.values.get("inlet_temp_c"), Some(&35.5));
    assert_eq!(thermal.target.to_string(), "32 GPUs of rack/b01");
    let caps = store.state().expect("state").caps;
    assert_eq!(caps.len(), 32, "b01's 32 GPUs capped, with leases");
    drop(store);

    // a restart restores the caps from the store before anything else
    let again = powerplane()
        .args(["serve", "--run-for-s", "0.3", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("serve again");
    let _ = bmc.kill();
    let _ = bmc.wait();
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        log.contains("restored from the store store=\"embedded\" caps=32"),
        "{log}"
    );
}

#[test]
fn serve_keeps_its_state_in_redis_across_a_restart() {
    use integrations::store::redis::RedisBackend;
    use integrations::store::Store;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::copy(
        root.join("examples/demo/policy.toml"),
        d.join("policy.toml"),
    )
    .expect("policy");
    let url = std::env::var("POWERPLANE_TEST_REDIS")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let prefix = format!("powerplane-test:{}:serve", std::process::id());
    // no telemetry at all: the budget rule assumes the worst of every stale GPU and caps
    std::fs::write(d.join("powerplane.toml"), format!("[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n\n[store]\nkind = \"redis\"\nurl = \"{url}\"\nprefix = \"{prefix}\"\n")).expect("config");
    let mut clean = RedisBackend::connect(&url, &prefix)
        .unwrap_or_else(|e| panic!("this test needs a real Redis at {url}: {e}"));
    clean.clear().expect("clear");

    let first = powerplane()
        .args(["serve", "--run-for-s", "1.2", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("serve");
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    let mut store = Store::new(Box::new(
        RedisBackend::connect(&url, &prefix).expect("redis"),
    ));
    let caps = store.state().expect("state").caps;
    assert_eq!(caps.len(), 192, "every GPU capped, with a lease, in Redis");
    assert!(store.audit_len().expect("audit") > 0);
    let again = powerplane()
        .args(["serve", "--run-for-s", "0.3", "--config"])
        .arg(d.join("powerplane.toml"))
        .output()
        .expect("serve again");
    let log = String::from_utf8_lossy(&again.stderr);
    assert!(
        log.contains("restored from the store store=\"redis\" caps=192"),
        "{log}"
    );
    clean.clear().expect("clear");
}

#[test]
fn agent_once_reads_simulated_gpus_and_says_clearly_when_nvml_is_missing() {
    let out = powerplane()
        .args([
            "agent",
            "--once",
            "--json",
            "--backend",
            "sim",
            "--gpus",
            "8",
            "--node",
            "n1",
        ])
        .output()
        .expect("agent");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(v["node"], "n1");
    assert_eq!(v["backend"], "sim");
    let gpus = v["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 8);
    for g in gpus {
        let (p, lo, hi) = (
            g["power_w"].as_f64().expect("power"),
            g["min_limit_w"].as_f64().expect("min"),
            g["max_limit_w"].as_f64().expect("max"),
        );
        assert!(
            p >= 0.0 && p <= g["power_limit_w"].as_f64().expect("limit") && lo < hi,
            "{g}"
        );
        for key in [
            "energy_j",
            "temp_c",
            "sm_clock_mhz",
            "utilization_pct",
            "default_limit_w",
            "throttle_reasons",
        ] {
            assert!(!g[key].is_null(), "{key} in {g}");
        }
    }
    // on a machine with NVIDIA's driver this reads the real GPUs; elsewhere it must say why not
    let nvml = powerplane()
        .args(["agent", "--once", "--json", "--backend", "nvml"])
        .output()
        .expect("agent");
    if !nvml.status.success() {
        let err = String::from_utf8_lossy(&nvml.stderr);
        assert!(
            err.contains("NVML") && (err.contains("could not be loaded") || err.contains("driver")),
            "{err}"
        );
        assert_eq!(nvml.status.code(), Some(1));
    }
}

#[test]
fn telemetry_probe_ends_with_the_survey_and_fails_on_an_unreachable_endpoint() {
    let (mut server, port) = pdu_mockup();
    let url = format!("http://127.0.0.1:{port}");
    let ok = powerplane()
        .args(["telemetry", "probe", "--redfish", &url, "--seconds", "1"])
        .output()
        .expect("run probe");
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&ok.stdout);
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "{err}");
    assert!(
        text.contains("readings mapped in") && text.contains("/redfish/v1/Chassis/PDU/Sensors/"),
        "{text}"
    );
    assert!(
        err.contains("readings mapped, 0 resources not understood"),
        "{err}"
    );
    // nothing listens there any more
    let down = powerplane()
        .args(["telemetry", "probe", "--redfish", &url, "--seconds", "1"])
        .output()
        .expect("run probe");
    let err = String::from_utf8_lossy(&down.stderr);
    assert!(
        !down.status.success(),
        "exit 0 with the endpoint down: {err}"
    );
    assert!(err.contains("probe: unreachable: redfish"), "{err}");
    let with_path = powerplane()
        .args([
            "telemetry",
            "probe",
            "--redfish",
            &format!("{url}/redfish/v1/Chassis"),
            "--seconds",
            "1",
        ])
        .output()
        .expect("run probe");
    let err = String::from_utf8_lossy(&with_path.stderr);
    assert!(!with_path.status.success(), "{err}");
    assert!(err.contains("give the base url without a path"), "{err}");
}

#[test]
fn choices_are_enumerations_and_secrets_never_flags() {
    // (arguments, what the error must say)
    let cases: [(&[&str], &str); 5] = [
        (
            &["report", "--format", "pdf"],
            "[possible values: table, csv, json, html]",
        ),
        (
            &["report", "--group-by", "planet"],
            "[possible values: job, project, user, rack, day]",
        ),
        (
            &["telemetry", "probe", "--mqtt-protocol", "4"],
            "[possible values: 3.1.1, 5]",
        ),
        (&["telemetry", "probe", "--qos", "3"], "3 is not in 0..=2"),
        (
            &["agent", "--once", "--backend", "cuda"],
            "[possible values: nvml, sim]",
        ),
    ];
    for (args, says) in cases {
        let out = powerplane().args(args).output().expect("powerplane");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.code() == Some(2) && err.contains(says),
            "{args:?}: {err}"
        );
    }
    // a password on the command line is refused: `ps` and shell history would keep it
    for flag in ["--password", "--redfish-password"] {
        let out = powerplane()
            .args(["telemetry", "probe", flag, "secret"])
            .output()
            .expect("powerplane");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("unexpected argument"),
            "{flag}: {err}"
        );
    }
    // a password file that cannot be read is named
    let out = powerplane()
        .args([
            "telemetry",
            "probe",
            "--mqtt",
            "mqtt://127.0.0.1:1",
            "--password-file",
            "/nonexistent/mqtt.password",
            "--seconds",
            "1",
        ])
        .output()
        .expect("powerplane");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("/nonexistent/mqtt.password"),
        "{err}"
    );
}
