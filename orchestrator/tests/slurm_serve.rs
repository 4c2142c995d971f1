//! `powerplane serve` steering a real Slurm (`scripts/slurm up`): a deferrable job
//! submitted while electricity is expensive is held and released when the price
//! falls; a job whose deadline is near is never held; serve killed and restarted in
//! the middle loses no hold and places none twice.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{http, schedulers, serve, VIEWER};

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

/// The real Slurm the test steers: 22.05 (`scripts/slurm up`, v0.0.38, local auth),
/// or 24.11 (`scripts/slurm up 24.11`, v0.0.42) with local auth or JWT over TCP.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Slurm {
    V2205,
    V2411,
    V2411Jwt,
}

impl Slurm {
    /// The 24.11 chroot, where its commands run.
    fn root(self) -> Option<String> {
        (self != Slurm::V2205).then(|| var("PP_SLURM24_ROOT", "/var/lib/powerplane-slurm24/root"))
    }

    fn socket(self) -> String {
        match self {
            Slurm::V2205 => var("PP_SLURMRESTD", "/var/lib/powerplane-slurm/slurmrestd.sock"),
            _ => var(
                "PP_SLURM24_RESTD",
                "/var/lib/powerplane-slurm24/root/var/lib/pp/rest/slurmrestd.sock",
            ),
        }
    }

    fn version(self) -> &'static str {
        match self {
            Slurm::V2205 => "v0.0.38",
            _ => "v0.0.42",
        }
    }

    /// `prog` on this Slurm (in the chroot, as the REST user, for 24.11's sbatch).
    fn cmd(self, prog: &str) -> Command {
        match self.root() {
            None => Command::new(prog),
            Some(root) => {
                let mut c = Command::new("chroot");
                if prog == "sbatch" {
                    let user = var("PP_SLURM24_USER", "slurmrest");
                    c.arg(format!("--userspec={user}:{user}"));
                }
                c.arg(root).arg(prog);
                if prog == "sbatch" {
                    c.arg("--chdir=/tmp");
                }
                c
            }
        }
    }

    /// The `[schedulers.slurm]` lines that reach it (`dir`: where a token file goes).
    fn config(self, dir: &Path) -> String {
        let Some(root) = self.root() else {
            return format!("endpoint = \"unix:{}\"\n", self.socket());
        };
        let scontrol = format!("scontrol = [\"chroot\", \"{root}\", \"scontrol\"]\n");
        if self == Slurm::V2411 {
            return format!("endpoint = \"unix:{}\"\n{scontrol}", self.socket());
        }
        let user = var("PP_SLURM24_USER", "slurmrest");
        let out = self
            .cmd("scontrol")
            .args(["token", &format!("username={user}"), "lifespan=3600"])
            .output()
            .expect("scontrol token in the 24.11 chroot (scripts/slurm up 24.11)");
        assert!(
            out.status.success(),
            "scontrol token: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(dir.join("slurm.jwt"), &out.stdout).expect("token file");
        format!(
            "endpoint = \"http://{}\"\nuser = \"{user}\"\ntoken_file = \"slurm.jwt\"\n{scontrol}",
            var("PP_SLURM24_TCP", "127.0.0.1:6830")
        )
    }

    fn sbatch(self, args: &[&str]) -> u64 {
        let out = self
            .cmd("sbatch")
            .args(["--parsable", "--output=/dev/null", "--job-name=pp-e2e"])
            .args(args)
            .output()
            .expect("this test needs sbatch and a running Slurm (scripts/slurm up [24.11])");
        assert!(
            out.status.success(),
            "sbatch: {} (is Slurm up? scripts/slurm up [24.11])",
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
    fn squeue(self, id: u64) -> (String, String) {
        let out = self
            .cmd("squeue")
            .args(["-h", "-j", &id.to_string(), "-o", "%T %r"])
            .output()
            .expect("squeue");
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let (s, r) = text.split_once(' ').unwrap_or((&text, ""));
        (s.to_string(), r.to_string())
    }

    fn is_held(self, id: u64) -> bool {
        let (s, r) = self.squeue(id);
        s == "PENDING" && (r == "JobHeldAdmin" || r == "JobHeldUser")
    }

    fn scancel(self, id: u64) {
        let _ = self.cmd("scancel").arg(id.to_string()).output();
    }
}

static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

struct Cancel(Slurm, Vec<u64>);
impl Drop for Cancel {
    fn drop(&mut self) {
        for id in &self.1 {
            self.0.scancel(*id);
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
fn on_slurm_22_05() {
    serve_holds_while_expensive_releases_when_cheap_and_a_restart_keeps_every_hold(Slurm::V2205);
}

#[test]
fn on_slurm_24_11() {
    serve_holds_while_expensive_releases_when_cheap_and_a_restart_keeps_every_hold(Slurm::V2411);
}

#[test]
fn on_slurm_24_11_with_jwt() {
    serve_holds_while_expensive_releases_when_cheap_and_a_restart_keeps_every_hold(Slurm::V2411Jwt);
}

fn serve_holds_while_expensive_releases_when_cheap_and_a_restart_keeps_every_hold(slurm: Slurm) {
    // one at a time: the two 24.11 cases share one Slurm (and its four GPUs)
    let _one = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let ping = Command::new("curl")
        .args([
            "-sf",
            "--unix-socket",
            &slurm.socket(),
            &format!("http://x/slurm/{}/ping", slurm.version()),
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
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n[schedulers.slurm]\n{}poll_s = 0\nhold_with = \"hold\"\n",
            slurm.config(d)
        ),
    )
    .expect("config");
    assert!(
        ping.is_ok_and(|o| o.status.success()),
        "this test needs slurmrestd on {} (scripts/slurm up [24.11])",
        slurm.socket()
    );

    // a job on all four GPUs keeps the queue waiting, as on a busy cluster
    let blocker = slurm.sbatch(&["--gres=gpu:4", "-t", "10", "--wrap", "sleep 600"]);
    let mut cancel = Cancel(slurm, vec![blocker]);
    let end = Instant::now() + Duration::from_secs(30);
    while slurm.squeue(blocker).0 != "RUNNING" {
        assert!(
            Instant::now() < end,
            "the blocker never ran: {:?}",
            slurm.squeue(blocker)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let far = (now + chrono::Duration::hours(6)).to_rfc3339();
    let near = (now + chrono::Duration::minutes(5)).to_rfc3339();
    let deferrable = slurm.sbatch(&[
        "--gres=gpu:1",
        "-t",
        "10",
        "--comment",
        &format!("class=batch est=600 deadline={far}"),
        "--wrap",
        "sleep 5",
    ]);
    let urgent = slurm.sbatch(&[
        "--gres=gpu:1",
        "-t",
        "10",
        "--comment",
        &format!("class=batch est=600 deadline={near}"),
        "--wrap",
        "sleep 5",
    ]);
    cancel.1.extend([deferrable, urgent]);
    let never_held = || {
        assert!(
            !slurm.is_held(urgent),
            "the job with a near deadline was held"
        )
    };
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
        &|| slurm.is_held(deferrable) && shown("held"),
        &config,
    );
    let st = schedulers(port).expect("schedulers");
    assert!(st["slurm"]["holds"][&key].is_object(), "{st}");
    assert_eq!(st["slurm"]["counters"]["holds"], 1, "{st}");
    assert_eq!(st["slurm"]["api_version"], slurm.version(), "{st}");
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
    assert!(
        slurm.is_held(deferrable),
        "a hold must outlive the controller"
    );
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
    assert!(slurm.is_held(deferrable));
    assert!(
        chrono::Utc::now() < cheap_at,
        "the restart took too long for this test's price window"
    );

    // the price falls: released by powerplane, and it runs once GPUs are free
    wait(
        "the deferrable job released when the price fell",
        Duration::from_secs(60),
        &never_held,
        &|| !slurm.is_held(deferrable) && !shown("held"),
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
    slurm.scancel(blocker);
    wait(
        "the released job running",
        Duration::from_secs(30),
        &|| {},
        &|| {
            let (s, _) = slurm.squeue(deferrable);
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
    for clean in ["malformed", "oversized", "unauthorized", "timeouts"] {
        assert!(
            metrics.contains(&format!("powerplane_slurm_{clean}_total 0\n")),
            "{clean}: {metrics}"
        );
    }
    common::promtool_check(&metrics);
}
