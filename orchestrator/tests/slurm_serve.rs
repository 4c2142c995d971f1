//! `powerplane serve` steering a real Slurm (`scripts/slurm up`): a deferrable job
//! submitted while electricity is expensive is held and released when the price
//! falls; a job whose deadline is near is never held; serve killed and restarted in
//! the middle loses no hold and places none twice.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{http, schedulers, serve, VIEWER};

fn socket() -> String {
    std::env::var("PP_SLURMRESTD")
        .unwrap_or_else(|_| "/var/lib/powerplane-slurm/slurmrestd.sock".to_string())
}

fn sbatch(args: &[&str]) -> u64 {
    let out = Command::new("sbatch")
        .args(["--parsable", "--output=/dev/null", "--job-name=pp-e2e"])
        .args(args)
        .output()
        .expect("this test needs sbatch and a running Slurm (scripts/slurm up)");
    assert!(
        out.status.success(),
        "sbatch: {} (is Slurm up? scripts/slurm up)",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .split(';')
        .next()
        .and_then(|s| s.parse().ok())
        .expect("job id")
}

/// `squeue`'s (state, reason) for a job.
fn squeue(id: u64) -> (String, String) {
    let out = Command::new("squeue")
        .args(["-h", "-j", &id.to_string(), "-o", "%T %r"])
        .output()
        .expect("squeue");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let (s, r) = text.split_once(' ').unwrap_or((&text, ""));
    (s.to_string(), r.to_string())
}

fn is_held(id: u64) -> bool {
    let (s, r) = squeue(id);
    s == "PENDING" && (r == "JobHeldAdmin" || r == "JobHeldUser")
}

struct Cancel(Vec<u64>);
impl Drop for Cancel {
    fn drop(&mut self) {
        for id in &self.0 {
            let _ = Command::new("scancel").arg(id.to_string()).output();
        }
    }
}

/// Waits for `ok`, checking `always` on every look; a failure shows serve's log.
fn wait(what: &str, within: Duration, always: &dyn Fn(), ok: &dyn Fn() -> bool, log: &Path) {
    let end = Instant::now() + within;
    loop {
        always();
        if ok() {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what}: not within {within:?}; serve's log:\n{}",
            common::serve_log(log)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn serve_holds_while_expensive_releases_when_cheap_and_a_restart_keeps_every_hold() {
    let ping = Command::new("curl")
        .args([
            "-sf",
            "--unix-socket",
            &socket(),
            "http://x/slurm/v0.0.38/ping",
        ])
        .output();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    let now = chrono::Utc::now();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[schedulers.slurm]\nendpoint = \"unix:{}\"\npoll_s = 0\nhold_with = \"hold\"\n",
            socket()
        ),
    )
    .expect("config");
    assert!(
        ping.is_ok_and(|o| o.status.success()),
        "this test needs slurmrestd on {} (scripts/slurm up)",
        socket()
    );

    // a job on all four GPUs keeps the queue waiting, as on a busy cluster
    let blocker = sbatch(&["--gres=gpu:4", "-t", "10", "--wrap", "sleep 600"]);
    let mut cancel = Cancel(vec![blocker]);
    let end = Instant::now() + Duration::from_secs(30);
    while squeue(blocker).0 != "RUNNING" {
        assert!(
            Instant::now() < end,
            "the blocker never ran: {:?}",
            squeue(blocker)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let far = (now + chrono::Duration::hours(6)).to_rfc3339();
    let near = (now + chrono::Duration::minutes(5)).to_rfc3339();
    let deferrable = sbatch(&[
        "--gres=gpu:1",
        "-t",
        "10",
        "--comment",
        &format!("class=batch est=600 deadline={far}"),
        "--wrap",
        "sleep 5",
    ]);
    let urgent = sbatch(&[
        "--gres=gpu:1",
        "-t",
        "10",
        "--comment",
        &format!("class=batch est=600 deadline={near}"),
        "--wrap",
        "sleep 5",
    ]);
    cancel.0.extend([deferrable, urgent]);
    let never_held = || assert!(!is_held(urgent), "the job with a near deadline was held");
    // expensive from now (once the queue is set up, however long Slurm took to start the
    // blocker), cheap from 40 s on
    let cheap_at = common::write_price_step(d, 40);

    let config = d.join("powerplane.toml");
    let first = serve(&config, 120);
    let key = format!("slurm:{deferrable}");
    // the reconciler holds the job off the tick; the API shows it from the next tick on
    let shown = |what: &str| schedulers(port).is_some_and(|s| s["lifecycle"][&key] == what);
    wait(
        "the deferrable job held in Slurm",
        Duration::from_secs(20),
        &never_held,
        &|| is_held(deferrable) && shown("held"),
        &config,
    );
    let st = schedulers(port).expect("schedulers");
    assert!(st["slurm"]["holds"][&key].is_object(), "{st}");
    assert_eq!(st["slurm"]["counters"]["holds"], 1, "{st}");
    assert_eq!(st["lifecycle"][&key], "held", "{st}");
    // the reconciler's ack of the hold, as the loop took it
    assert!(
        st["applied"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["job"] == key.as_str()
                && x["action"] == "hold"
                && x["scheduler"] == "slurm")),
        "{st}"
    );
    assert_eq!(
        st["lifecycle"][&format!("slurm:{urgent}")],
        "pending",
        "{st}"
    );

    // killed without a chance to clean up, then restarted on the same store
    drop(first);
    assert!(is_held(deferrable), "a hold must outlive the controller");
    let _second = serve(&config, 120);
    wait(
        "the restarted serve answering",
        Duration::from_secs(20),
        &never_held,
        &|| schedulers(port).is_some_and(|s| s["slurm"]["counters"]["polls"].as_u64() >= Some(3)),
        &config,
    );
    let st = schedulers(port).expect("schedulers");
    assert!(
        st["slurm"]["holds"][&key].is_object(),
        "the hold is still ours: {st}"
    );
    assert_eq!(
        st["slurm"]["counters"]["holds"], 0,
        "nothing held twice: {st}"
    );
    assert_eq!(st["lifecycle"][&key], "held", "{st}");
    assert!(is_held(deferrable));
    assert!(
        chrono::Utc::now() < cheap_at,
        "the restart took too long for this test's price window"
    );

    // the price falls: released by powerplane, and it runs once GPUs are free
    wait(
        "the deferrable job released when the price fell",
        Duration::from_secs(60),
        &never_held,
        &|| !is_held(deferrable) && !shown("held"),
        &config,
    );
    assert!(
        chrono::Utc::now() >= cheap_at,
        "released before the price fell"
    );
    let st = schedulers(port).expect("schedulers");
    assert_eq!(st["slurm"]["counters"]["releases"], 1, "{st}");
    assert!(
        st["slurm"]["holds"]
            .as_object()
            .is_some_and(|h| h.is_empty()),
        "{st}"
    );
    let _ = Command::new("scancel").arg(blocker.to_string()).output();
    wait(
        "the released job running",
        Duration::from_secs(30),
        &|| {},
        &|| {
            let (s, _) = squeue(deferrable);
            s == "RUNNING" || s.is_empty()
        },
        &config,
    );
    wait(
        "its lifecycle through held, released and running",
        Duration::from_secs(10),
        &|| {},
        &|| {
            schedulers(port).is_some_and(|s| {
                let path: Vec<String> = s["transitions"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|t| t["job"] == key.as_str())
                    .filter_map(|t| t["to"].as_str().map(str::to_string))
                    .collect();
                path.ends_with(&["released".to_string(), "running".to_string()])
                    || path.ends_with(&["released".into(), "running".into(), "finished".into()])
            })
        },
        &config,
    );
    let (_, _, metrics) = http(port, "GET", "/metrics", None, b"");
    assert!(
        metrics.contains("powerplane_slurm_releases_total 1\n"),
        "{metrics}"
    );
    common::promtool_check(&metrics);
}
