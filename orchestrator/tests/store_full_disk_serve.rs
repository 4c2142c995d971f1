//! The embedded store on a disk that fills up and frees again (a small filesystem of
//! the test's own): while it is full the commits fail with their cause named ("No
//! space left on device") and `/readyz` names the store; once space is back the store
//! reopens by itself, what waited in memory is committed, `/readyz` is ready again,
//! and at SIGTERM serve exits 0 with every ledger entry of the outage in the file.
//! With `[store] journal` on another filesystem, the outage waits in the journal, not
//! in memory, and is replayed once space is back.
//! (A shutdown the store refuses says what it could not keep: `tests/tests/control.rs`.)
//!
//! Needs root, a loop device, `mkfs.ext4` and util-linux (see `common/disk.rs`), and
//! the shared Mosquitto for the readings that the ledger charges.

mod common;

#[path = "common/disk.rs"]
mod disk;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{http, metric_value, serve_log};
use disk::Disk;

fn wait(what: &str, within: Duration, ok: &dyn Fn() -> bool, log: &dyn Fn() -> String) {
    let end = Instant::now() + within;
    while !ok() {
        assert!(
            Instant::now() < end,
            "{what}: not within {within:?}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn readyz_failing(port: u16) -> Vec<String> {
    let (_, _, body) = http(port, "GET", "/readyz", None, b"");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["failing"]
        .as_array()
        .map(|f| {
            f.iter()
                .filter_map(|x| x.as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_else(|| vec!["no answer".into()])
}

/// The energy the ledger charged, by the board (every closed interval, committed or
/// not): the sum of `powerplane_ledger_energy_joules_total` over its series.
fn charged_j(port: u16) -> f64 {
    let (_, _, m) = http(port, "GET", "/metrics", None, b"");
    m.lines()
        .filter(|l| l.starts_with("powerplane_ledger_energy_joules_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A `powerplane serve` whose embedded store is on a 16 MB filesystem of its own, fed
/// rack power and inlet over the shared Mosquitto.
struct Rig {
    _dir: tempfile::TempDir,
    disk: Disk,
    config: std::path::PathBuf,
    store: std::path::PathBuf,
    port: u16,
    serve: std::process::Child,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    publisher: Option<std::thread::JoinHandle<()>>,
}

impl Rig {
    /// `journal`: a journal on the test's own folder (another filesystem than the
    /// store's).
    fn start(journal: bool) -> Rig {
        let dir = tempfile::tempdir().expect("tmp");
        let d = dir.path();
        let disk = Disk::mount(&d.join("disk.img"), &d.join("disk"), "16M");
        let hot = common::write_hot_rack(d, "fulldisk");
        // rack power too, so that the ledger charges energy every interval
        let mapping = std::fs::read_to_string(d.join("mapping.toml")).expect("mapping");
        std::fs::write(
            d.join("mapping.toml"),
            format!(
                "{mapping}[[json]]\ntopic = \"{}/{{rack}}/power\"\nentity = \"rack/{{rack}}\"\nmetric = \"power_w\"\nvalue = \"/w\"\n",
                hot.topic
            ),
        )
        .expect("mapping");
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .expect("port")
            .local_addr()
            .expect("addr")
            .port();
        let store = disk.dir.join("state.redb");
        let config = d.join("powerplane.toml");
        let journal = if journal {
            format!("journal = \"{}\"\n", d.join("journal.redb").display())
        } else {
            String::new()
        };
        std::fs::write(
            &config,
            format!(
                "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\nledger_interval_s = 1\n[store]\nkind = \"embedded\"\npath = \"{}\"\n{journal}[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\nmapping = \"mapping.toml\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{}\"\n",
                store.display(),
                common::mqtt_port(),
                common::VIEWER,
            ),
        )
        .expect("config");
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(config.with_extension("log"))
            .expect("log");
        let serve = Command::new(env!("CARGO_BIN_EXE_powerplane"))
            .args(["serve", "--run-for-s", "180", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log_file)
            .spawn()
            .expect("serve");
        let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop = done.clone();
        let topic = hot.topic.clone();
        let publisher = std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                common::publish(&format!("{topic}/a01/power"), "{\"w\": 9000}");
                common::publish(&format!("{topic}/b01/inlet"), "{\"c\": 24.0}");
                std::thread::sleep(Duration::from_millis(400));
            }
        });
        let rig = Rig {
            _dir: dir,
            disk,
            config,
            store,
            port,
            serve,
            done,
            publisher: Some(publisher),
        };
        wait(
            "ready, the ledger charging",
            Duration::from_secs(30),
            &|| readyz_failing(port).is_empty() && charged_j(port) > 0.0,
            &|| rig.log(),
        );
        rig
    }

    fn log(&self) -> String {
        serve_log(&self.config)
    }

    fn metric(&self, name: &str) -> Option<f64> {
        let (_, _, m) = http(self.port, "GET", "/metrics", None, b"");
        metric_value(&m, name)
    }

    /// SIGTERM, and serve's exit within 60 s (killed and failed past that).
    fn stop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.serve.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(s) = self.serve.try_wait().expect("serve") {
                break s;
            }
            if Instant::now() > end {
                let _ = self.serve.kill();
                panic!("serve did not exit within 60 s of SIGTERM:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(status.success(), "serve exited {status}:\n{}", self.log());
    }

    /// SIGTERM (the last interval closed and committed, exit 0), then every joule the
    /// ledger had charged, outage included, found in the file.
    fn stop_keeping(&mut self, charged: f64) {
        self.stop();
        let kept_j = self.kept_j();
        assert!(
            kept_j >= charged * (1.0 - 1e-9),
            "the file keeps {kept_j} J of the {charged} J charged:\n{}",
            self.log()
        );
    }

    /// The energy the file's ledger holds, J.
    fn kept_j(&self) -> f64 {
        let backend =
            orchestrator::embedded::EmbeddedBackend::open(&self.store).expect("store opens");
        let mut st = integrations::store::Store::new(Box::new(backend));
        let n = st.ledger_len().expect("ledger length");
        st.ledger(1, n as usize)
            .expect("ledger")
            .iter()
            .map(|(_, e)| e.energy_kwh * 3.6e6)
            .sum()
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        let _ = self.serve.kill();
        let _ = self.serve.wait();
        self.done.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(p) = self.publisher.take() {
            let _ = p.join();
        }
    }
}

#[test]
fn a_full_disk_names_its_cause_and_once_freed_the_store_reopens_and_keeps_every_write() {
    let mut rig = Rig::start(false);
    let port = rig.port;
    let log = || rig.log();

    // the disk fills: commits fail, with their cause, and /readyz names the store
    let filler = rig.disk.fill();
    wait(
        "/readyz failing with store",
        Duration::from_secs(30),
        &|| readyz_failing(port).contains(&"store".to_string()),
        &log,
    );
    wait(
        "the cause in the log",
        Duration::from_secs(10),
        &|| log().contains("No space left on device"),
        &log,
    );
    let at_full = charged_j(port);
    // a few intervals' entries wait in memory
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        rig.metric("powerplane_store_errors_total")
            .is_some_and(|n| n >= 2.0),
        "{}",
        log()
    );
    assert!(
        rig.metric("powerplane_store_waiting_writes")
            .is_some_and(|n| n > 0.0),
        "writes wait in memory"
    );
    assert!(charged_j(port) > at_full, "the ledger goes on charging");

    // space is back: the store reopens by itself and takes what waited
    std::fs::remove_file(&filler).expect("free the disk");
    wait(
        "ready again",
        Duration::from_secs(30),
        &|| readyz_failing(port).is_empty(),
        &log,
    );
    assert!(
        log().contains("embedded store reopened after an I/O error"),
        "{}",
        log()
    );
    std::thread::sleep(Duration::from_secs(2));
    let charged = charged_j(port);

    rig.stop_keeping(charged);
}

#[test]
fn with_a_journal_on_another_disk_a_full_disk_waits_in_the_journal_not_in_memory() {
    let mut rig = Rig::start(true);
    let port = rig.port;
    let log = || rig.log();

    let filler = rig.disk.fill();
    wait(
        "/readyz failing with store",
        Duration::from_secs(30),
        &|| readyz_failing(port).contains(&"store".to_string()),
        &log,
    );
    wait(
        "batches in the journal",
        Duration::from_secs(30),
        &|| {
            rig.metric("powerplane_store_journal_depth")
                .is_some_and(|n| n >= 2.0)
        },
        &log,
    );
    assert_eq!(
        rig.metric("powerplane_store_waiting_writes"),
        Some(0.0),
        "nothing waits in memory"
    );
    assert_eq!(
        rig.metric("powerplane_store_errors_total"),
        Some(0.0),
        "the journal took every batch"
    );

    std::fs::remove_file(&filler).expect("free the disk");
    wait(
        "the journal replayed and ready again",
        Duration::from_secs(30),
        &|| {
            readyz_failing(port).is_empty()
                && rig.metric("powerplane_store_journal_depth") == Some(0.0)
        },
        &log,
    );
    assert!(
        rig.metric("powerplane_store_replayed_total")
            .is_some_and(|n| n >= 2.0),
        "{}",
        log()
    );
    std::thread::sleep(Duration::from_secs(2));
    let charged = charged_j(port);
    rig.stop_keeping(charged);
}
