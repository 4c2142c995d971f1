//! Helpers shared by the CLI tests.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

/// One HTTP/1.1 request: (status, headers, body).
pub fn http(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String, String) {
    // status 0: nothing listens (yet)
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), String::new());
    };
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).expect("write");
    let _ = s.write_all(body);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).to_string();
    let (h, b) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, h.to_string(), b.to_string())
}

/// Fails the test unless `promtool check metrics` accepts the text.
pub fn promtool_check(metrics: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("this test needs promtool (Debian package prometheus)");
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("pipe");
    let out = promtool.wait_with_output().expect("promtool");
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The RGB(A) pixels of a PNG; fails the test when fewer than 1% are not white.
pub fn png_pixels(path: &std::path::Path) -> Vec<Vec<u8>> {
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(path).expect("png"),
    ));
    let mut reader = decoder.read_info().expect("png header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("png frame");
    let px = info.color_type.samples();
    let pixels: Vec<Vec<u8>> = buf[..info.buffer_size()]
        .chunks(px)
        .map(<[u8]>::to_vec)
        .collect();
    let inked = pixels
        .iter()
        .filter(|p| p[0] < 235 || p[1] < 235 || p[2] < 235)
        .count();
    assert!(
        inked * 100 > pixels.len(),
        "{}: only {inked} of {} pixels are not white",
        path.display(),
        pixels.len()
    );
    pixels
}

/// Headless Chromium: a screenshot of `url` into `png` and the rendered DOM.
pub fn chromium(url: &str, png: &std::path::Path) -> String {
    let run = |arg: String| {
        Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                "--window-size=1200,1800",
            ])
            .arg(arg)
            .arg(url)
            .output()
            .expect("this test needs Debian's chromium")
    };
    let shot = run(format!("--screenshot={}", png.display()));
    assert!(
        png.exists(),
        "no screenshot: {}",
        String::from_utf8_lossy(&shot.stderr)
    );
    String::from_utf8_lossy(&run("--dump-dom".into()).stdout).to_string()
}

/// The viewer token the scheduler tests configure.
pub const VIEWER: &str = "viewer-token-0123456789abcdef";

/// A running `powerplane serve`, killed when dropped.
pub struct Serve(pub std::process::Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `powerplane serve --config CONFIG` for at most `run_for_s` seconds; its log
/// goes to [`serve_log`] (appended, so a restarted serve adds to it).
pub fn serve(config: &std::path::Path, run_for_s: u32) -> Serve {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(config.with_extension("log"))
        .expect("serve log");
    Serve(
        Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .args(["serve", "--run-for-s", &run_for_s.to_string(), "--config"])
            .arg(config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("serve"),
    )
}

/// What the serve processes started with `config` logged, for a failing test to show.
#[allow(dead_code)]
pub fn serve_log(config: &std::path::Path) -> String {
    std::fs::read_to_string(config.with_extension("log")).unwrap_or_default()
}

/// `GET /api/v1/schedulers` as the viewer, once serve answers.
pub fn schedulers(port: u16) -> Option<serde_json::Value> {
    let (code, _, body) = http(port, "GET", "/api/v1/schedulers", Some(VIEWER), b"");
    (code == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// Writes the demo site and a policy that defers `batch` jobs while the price is above
/// 0.20 per kWh (at most an hour, released a minute before their latest start) into `d`.
#[allow(dead_code)]
pub fn write_site_and_deferral_policy(d: &std::path::Path) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n[price]\ndefer_above = 0.20\nclasses = [\"batch\"]\nmargin_s = 60\nmax_defer_s = 3600\non_stale = \"ignore\"\nlease_s = 120\n",
    )
    .expect("policy");
}

/// Writes `d/prices.csv`: 0.35 per kWh from a minute ago, 0.08 from `cheap_in_s` seconds
/// on; returns the moment the price falls.
#[allow(dead_code)]
pub fn write_price_step(d: &std::path::Path, cheap_in_s: i64) -> chrono::DateTime<chrono::Utc> {
    let now = chrono::Utc::now();
    let cheap_at = now + chrono::Duration::seconds(cheap_in_s);
    std::fs::write(
        d.join("prices.csv"),
        format!(
            "start,price_per_kwh\n{},0.35\n{},0.08\n{},0.08\n",
            (now - chrono::Duration::seconds(60)).to_rfc3339(),
            cheap_at.to_rfc3339(),
            (now + chrono::Duration::hours(2)).to_rfc3339()
        ),
    )
    .expect("prices");
    cheap_at
}

/// The port of the Mosquitto the tests use (`POWERPLANE_TEST_MQTT_PORT`, else 1883).
pub fn mqtt_port() -> u16 {
    std::env::var("POWERPLANE_TEST_MQTT_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(1883)
}

/// Publishes one message with `mosquitto_pub`.
pub fn publish(topic: &str, payload: &str) {
    let ok = Command::new("mosquitto_pub")
        .args(["-p", &mqtt_port().to_string(), "-t", topic, "-m", payload])
        .status()
        .expect("this test needs mosquitto_pub (mosquitto-clients)");
    assert!(ok.success(), "mosquitto_pub to port {} failed", mqtt_port());
}

/// A controller and one simulated agent on the shared Mosquitto, under topics of the
/// test's own: the demo site, a policy with only the thermal controller (1 s steps),
/// rack inlets mapped from `{topic}/{rack}/inlet` (`{"c": 31.0}`), the site key, and
/// the agent's config (`agent.toml`) for a node of rack b01.
pub struct HotRack {
    /// The agent's node (in rack b01).
    pub node: String,
    /// Where inlet readings are published: `{topic}/{rack}/inlet`.
    pub topic: String,
    /// The agents' topic prefix.
    pub prefix: String,
}

/// Writes the files of a [`HotRack`] into `d`; `tag` keeps the topics the test's own.
pub fn write_hot_rack(d: &std::path::Path, tag: &str) -> HotRack {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let pid = std::process::id();
    let site_text = std::fs::read_to_string(root.join("examples/demo/site.toml")).expect("site");
    std::fs::write(d.join("site.toml"), &site_text).expect("site");
    let site = telemetry::Site::parse("site.toml", &site_text).expect("site");
    let node = site
        .gpus()
        .into_iter()
        .find(|g| g.rack.id == "b01")
        .expect("a GPU in b01")
        .node
        .id
        .clone();
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nstep_interval_s = 1\n",
    )
    .expect("policy");
    let topic = format!("pptest-{tag}-{pid}");
    let prefix = format!("pptest-{tag}-{pid}/v1");
    std::fs::write(d.join("mapping.toml"), format!("version = 1\n[[json]]\ntopic = \"{topic}/{{rack}}/inlet\"\nentity = \"rack/{{rack}}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/c\"\n")).expect("mapping");
    std::fs::write(d.join("site.key"), "9e".repeat(32)).expect("key");
    let private = std::os::unix::fs::PermissionsExt::from_mode(0o600);
    std::fs::set_permissions(d.join("site.key"), private).expect("chmod");
    std::fs::write(
        d.join("agent.toml"),
        format!(
            "node = \"{node}\"\nkey_file = \"site.key\"\ninterval_s = 0.5\ntopic_prefix = \"{prefix}\"\n[backend]\nkind = \"sim\"\ngpus = 8\n[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\n",
            mqtt_port()
        ),
    )
    .expect("agent config");
    HotRack {
        node,
        topic,
        prefix,
    }
}

/// The value of the first line of `metrics` that starts with `series` (a name, or a name
/// with its labels).
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Calls `f` every 100 ms until it gives a value, failing the test after `within`.
pub fn wait_until<T>(
    what: &str,
    within: std::time::Duration,
    f: &mut dyn FnMut() -> Option<T>,
) -> T {
    let end = std::time::Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < end,
            "{what}: not within {within:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// The viewer token of [`write_grid_config`]'s `[http]`.
pub const GRID_VIEWER: &str = "viewer-token-0123456789abcdef";

/// A serve of the demo hall with only the grid controller on (no budget, thermal or
/// price policy), a 1 s tick, an embedded store, the API on `port` with
/// [`GRID_VIEWER`], and `demand_response` (a `[demand_response]` section's body) in
/// `d`; returns the config's path.
pub fn write_grid_config(
    d: &std::path::Path,
    port: u16,
    demand_response: &str,
) -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .to_path_buf();
    std::fs::copy(root.join("examples/demo/site.toml"), d.join("site.toml")).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n[price]\nenabled = false\n",
    )
    .expect("policy");
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 1\n\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"grafana\"\nrole = \"viewer\"\ntoken = \"{GRID_VIEWER}\"\n\n[demand_response]\n{demand_response}"
        ),
    )
    .expect("config");
    config
}

/// `GET /api/v1/grid` as the viewer, when it answers 200.
pub fn grid_status(port: u16) -> Option<serde_json::Value> {
    let (code, _, body) = http(port, "GET", "/api/v1/grid", Some(GRID_VIEWER), b"");
    (code == 200)
        .then(|| serde_json::from_str(&body).ok())
        .flatten()
}

/// `/metrics` as the viewer.
pub fn grid_metrics(port: u16) -> String {
    http(port, "GET", "/metrics", Some(GRID_VIEWER), b"").2
}

/// Posts job `job`'s submission to whichever replica takes it, as a scheduler's hook
/// that resends on anything but an answer does: `Some(id)` once one answered 202,
/// `None` when none did within `within`.
pub fn send_until_accepted(
    ports: &[u16],
    operator: &str,
    job: &str,
    within: std::time::Duration,
) -> Option<String> {
    let far = (chrono::Utc::now() + chrono::Duration::hours(6)).to_rfc3339();
    let body = format!(
        r#"{{"event":"submitted","scheduler":"lsf","job":"{job}","class":"batch","project":"p","user":"u","gpus":2,"deadline":"{far}","est_duration_s":600}}"#
    );
    let t = std::time::Instant::now();
    for i in 0.. {
        if t.elapsed() > within {
            return None;
        }
        let port = ports[i % ports.len()];
        // a replica that stalls or drops the connection: resend elsewhere
        let answer = std::panic::catch_unwind(|| {
            http(
                port,
                "POST",
                "/api/v1/events",
                Some(operator),
                body.as_bytes(),
            )
        });
        if let Ok((202, _, b)) = answer {
            let v: serde_json::Value = serde_json::from_str(&b).expect("json answer");
            return v["accepted"].as_str().map(str::to_string);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    None
}

/// A port nothing listens on now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

/// With `[ha]`: (leads, epoch) as a replica's `/metrics` says.
pub fn role(port: u16) -> Option<(bool, u64)> {
    let (code, _, body) = http(port, "GET", "/metrics", None, b"");
    if code != 200 {
        return None;
    }
    let value = |name: &str| {
        body.lines()
            .find(|l| l.starts_with(name) && !l.starts_with('#'))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<f64>().ok())
    };
    Some((
        value("powerplane_leader{replica=\"")? == 1.0,
        value("powerplane_leader_epoch ")? as u64,
    ))
}

/// The logs of replicas `d/r0` .. `d/r{n-1}` (`serve.log`) without their decisions.
pub fn replica_logs(d: &std::path::Path, n: usize) -> String {
    (0..n)
        .map(|i| {
            std::fs::read_to_string(d.join(format!("r{i}/serve.log")))
                .unwrap_or_default()
                .lines()
                .filter(|l| !l.contains(" rule="))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// The replica that leads (index, epoch), once one does above `above` within `within`.
pub fn replica_leading(
    d: &std::path::Path,
    ports: &[u16],
    above: u64,
    within: Duration,
) -> (usize, u64) {
    let t0 = std::time::Instant::now();
    loop {
        for (i, p) in ports.iter().enumerate() {
            if let Some((true, epoch)) = role(*p) {
                if epoch > above {
                    return (i, epoch);
                }
            }
        }
        assert!(
            t0.elapsed() < within,
            "no leader above epoch {above} within {within:?}; the replicas' logs:\n{}",
            replica_logs(d, ports.len())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Replica `i` of `serve` with `[ha]` on the PostgreSQL at `url` (the demo's site and
/// policy, `[http]` on `port`, its config and `serve.log` in `d/r{i}`), `extra` TOML
/// appended (its tokens, its schedulers).
pub fn pg_replica(
    d: &std::path::Path,
    i: usize,
    url: &str,
    port: u16,
    timeout_s: f64,
    extra: &str,
) -> std::process::Child {
    let r = d.join(format!("r{i}"));
    std::fs::create_dir_all(&r).expect("dir");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace");
    let site = root.join("examples/demo/site.toml");
    let policy = root.join("examples/demo/policy.toml");
    std::fs::write(
        r.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"{}\"\npolicy = \"{}\"\ntick_s = 0.5\n\
             [store]\nkind = \"postgres\"\nurl = \"{url}\"\njournal = \"journal.redb\"\ntimeout_s = {timeout_s}\n\
             [ha]\nenabled = true\nlease_s = 3\nrenew_s = 0.5\ninstance = \"r{i}\"\n\
             [http]\nlisten = \"127.0.0.1:{port}\"\nmetrics_public = true\n{extra}",
            site.display(),
            policy.display(),
        ),
    )
    .expect("config");
    Command::new(env!("CARGO_BIN_EXE_powerplane"))
        .args(["serve", "--run-for-s", "300", "--config"])
        .arg(r.join("powerplane.toml"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(r.join("serve.log")).expect("log"))
        .spawn()
        .expect("serve")
}
