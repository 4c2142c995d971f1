//! Node power through Slurm's power saving, on the real Slurm 22.05 and 24.11 of
//! `scripts/slurm up [24.11]`: their second node (`PP_SLURM_POWERSAVE_NODE`, pp-save1,
//! alone in partition `powersave`) has the SuspendProgram / ResumeProgram that
//! scripts/slurm writes, which log their calls (`PP_SLURM_POWER_LOG`,
//! `PP_SLURM24_POWER_LOG`) and stop and start the node's slurmd.
//!
//! - the actuator: `SlurmPower` powers the node down (`sinfo` shows `idle~`, the
//!   SuspendProgram ran) and up (`idle` again, the ResumeProgram ran);
//! - `serve` with `[node_power] backend = "slurm"`: taking over, it powers up the node
//!   a dead controller left off; the idle node is powered down by the policy; a job for it that is held leaves it off, released it brings it back
//!   (Slurm resumes a powered-down node a job needs) and runs; idle again it is powered
//!   down again, and SIGTERM of serve powers it back up (the lease ends).
//!
//! No cluster, no pass: every Slurm command that fails fails the test with its error.

mod common;

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{http, metric_value as value, promtool_check, serve, serve_log, VIEWER};
use orchestrator::node_power::{PowerState, SlurmPower};

fn var(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Slurm {
    V2205,
    V2411,
}

/// One test at a time on a cluster's one powersave node (the two clusters in parallel).
static ONE_AT_A_TIME: [Mutex<()>; 2] = [Mutex::new(()), Mutex::new(())];

impl Slurm {
    fn root(self) -> Option<String> {
        (self == Slurm::V2411).then(|| var("PP_SLURM24_ROOT", "/var/lib/powerplane-slurm24/root"))
    }

    fn node(self) -> String {
        var("PP_SLURM_POWERSAVE_NODE", "pp-save1")
    }

    fn calls_log(self) -> String {
        match self {
            Slurm::V2205 => var(
                "PP_SLURM_POWER_LOG",
                "/var/lib/powerplane-slurm/power/calls.log",
            ),
            Slurm::V2411 => var(
                "PP_SLURM24_POWER_LOG",
                "/var/lib/powerplane-slurm24/root/var/lib/pp/power/calls.log",
            ),
        }
    }

    /// The lines the power programs logged so far.
    fn calls(self) -> Vec<String> {
        let path = self.calls_log();
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| {
                panic!("{path}: {e} (the power programs' log; scripts/slurm up [24.11])")
            })
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// `scontrol`, as powerplane's config names it.
    fn scontrol(self) -> Vec<String> {
        match self.root() {
            None => vec!["scontrol".into()],
            Some(root) => vec!["chroot".into(), root, "scontrol".into()],
        }
    }

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

    fn run(self, prog: &str, args: &[&str]) -> String {
        let out = self.cmd(prog).args(args).output().unwrap_or_else(|e| {
            panic!("{prog} {args:?}: {e} (this test needs Slurm: scripts/slurm up [24.11])")
        });
        assert!(
            out.status.success(),
            "{prog} {args:?} on {self:?}: {} (is Slurm up? scripts/slurm up [24.11])",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// `sinfo`'s state of the powersave node (`idle`, `idle~`, `idle#`, `idle%`, ...).
    fn sinfo(self) -> String {
        self.run("sinfo", &["-h", "-N", "-n", &self.node(), "-o", "%T"])
    }

    fn wait_sinfo(self, want: &[&str], within: Duration, log: &dyn Fn() -> String) {
        let end = Instant::now() + within;
        loop {
            let now = self.sinfo();
            if want.contains(&now.as_str()) {
                return;
            }
            assert!(
                Instant::now() < end,
                "{self:?}: {} still '{now}' after {within:?}, not {want:?}\n{}",
                self.node(),
                log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The node up and idle before a test starts (a run before may have left it off).
    fn ensure_up(self) {
        let p = SlurmPower::new(self.scontrol(), Duration::from_secs(10)).expect("power");
        let state = p.power_state(&self.node()).unwrap_or_else(|e| {
            panic!(
                "{self:?}: no powersave node {}: {e:#} (scripts/slurm up [24.11])",
                self.node()
            )
        });
        if matches!(state, PowerState::Off | PowerState::PoweringOff) {
            // a power-down under way ends first
            self.wait_sinfo(&["idle~", "down~"], Duration::from_secs(60), &String::new);
            if self.sinfo() == "down~" {
                self.run(
                    "scontrol",
                    &[
                        "update",
                        &format!("nodename={}", self.node()),
                        "state=resume",
                    ],
                );
            }
            p.power_up(&self.node()).expect("power up");
        }
        self.wait_sinfo(&["idle"], Duration::from_secs(90), &String::new);
    }
}

fn actuator_powers_the_node_down_and_up(slurm: Slurm) {
    let _one = ONE_AT_A_TIME[slurm as usize]
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    slurm.ensure_up();
    let node = slurm.node();
    let p = SlurmPower::new(slurm.scontrol(), Duration::from_secs(10)).expect("power");
    assert_eq!(p.power_state(&node).expect("state"), PowerState::On);
    let before = slurm.calls().len();
    p.power_down(&node).expect("power down");
    // Slurm runs the SuspendProgram, then counts SuspendTimeout before `~`
    slurm.wait_sinfo(&["idle~"], Duration::from_secs(60), &String::new);
    assert_eq!(p.power_state(&node).expect("state"), PowerState::Off);
    let calls = slurm.calls()[before..].join("\n");
    assert!(
        calls.contains(&format!("suspend {node}")) && calls.contains(&format!("switch off {node}")),
        "the SuspendProgram did not run:\n{calls}"
    );
    // the node's slurmd is gone: it is off, not just marked
    let up = slurm.run("scontrol", &["-o", "show", "node", &node]);
    assert!(up.contains("POWERED_DOWN"), "{up}");

    let before = slurm.calls().len();
    p.power_up(&node).expect("power up");
    let end = Instant::now() + Duration::from_secs(60);
    let mut seen = Vec::new();
    loop {
        let s = p.power_state(&node).expect("state");
        if seen.last() != Some(&s) {
            seen.push(s);
        }
        if s == PowerState::On {
            break;
        }
        assert!(Instant::now() < end, "not back on: {seen:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(slurm.sinfo(), "idle");
    let calls = slurm.calls()[before..].join("\n");
    assert!(
        calls.contains(&format!("resume {node}")) && calls.contains(&format!("switch on {node}")),
        "the ResumeProgram did not run:\n{calls}"
    );
    // between the two, Slurm showed the node off or powering up, never on
    assert!(
        seen[..seen.len() - 1]
            .iter()
            .all(|s| matches!(s, PowerState::Off | PowerState::PoweringOn)),
        "{seen:?}"
    );
    // a node Slurm does not know is an error, not a state
    let e = p
        .power_state("pp-no-such-node")
        .expect_err("an unknown node");
    assert!(format!("{e:#}").contains("pp-no-such-node"), "{e:#}");
}

#[test]
fn slurm_22_05_node_powered_down_and_up() {
    actuator_powers_the_node_down_and_up(Slurm::V2205);
}

#[test]
fn slurm_24_11_node_powered_down_and_up() {
    actuator_powers_the_node_down_and_up(Slurm::V2411);
}

fn serve_powers_the_idle_node_down_a_released_job_brings_it_back_and_sigterm_powers_it_up(
    slurm: Slurm,
) {
    let _one = ONE_AT_A_TIME[slurm as usize]
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    slurm.ensure_up();
    let node = slurm.node();
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    common::write_site_and_deferral_policy(d);
    // no work the controller knows of: a01-n01 (Slurm's pp-save1) is idle; no reserve
    let mut policy = std::fs::read_to_string(d.join("policy.toml")).expect("policy");
    policy.push_str(
        "[node_power]\nenabled = true\nreserve_gpus = 0\nreserve_share = 0.0\nidle_s = 10\nmin_off_s = 3600\nboot_s = 60\nshutdown_s = 30\n",
    );
    std::fs::write(d.join("policy.toml"), policy).expect("policy");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("port")
        .local_addr()
        .expect("addr")
        .port();
    let scontrol = slurm
        .scontrol()
        .iter()
        .map(|s| format!("\"{s}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let config = d.join("powerplane.toml");
    std::fs::write(
        &config,
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 0.5\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[node_power]\nbackend = \"slurm\"\nscontrol = [{scontrol}]\ntimeout_s = 10\npoll_s = 1\nnodes = {{ \"a01-n01\" = \"{node}\" }}\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"v\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n",
        ),
    )
    .expect("config");
    // serve --check reads the section and its binding to the site
    let bin = env!("CARGO_BIN_EXE_powerplane");
    let check = Command::new(bin)
        .args(["serve", "--check", "--config"])
        .arg(&config)
        .output()
        .expect("serve --check");
    assert!(
        check.status.success(),
        "serve --check: {}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    // a controller that died left the node powered down
    let p = SlurmPower::new(slurm.scontrol(), Duration::from_secs(10)).expect("power");
    p.power_down(&node).expect("power down");
    slurm.wait_sinfo(&["idle~"], Duration::from_secs(60), &String::new);
    let before = slurm.calls().len();
    let mut serve = serve(&config, 300);
    let log = || serve_log(&config);
    // take-over: what was left off comes back
    slurm.wait_sinfo(&["idle"], Duration::from_secs(90), &log);
    let calls = slurm.calls()[before..].join("\n");
    assert!(calls.contains(&format!("resume {node}")), "{calls}");
    assert!(log().contains("taking over"), "{}", log());
    let before = slurm.calls().len();
    // idle for idle_s with nothing due: powered down through Slurm
    slurm.wait_sinfo(&["idle~"], Duration::from_secs(120), &log);
    let calls = slurm.calls()[before..].join("\n");
    assert!(calls.contains(&format!("suspend {node}")), "{calls}");
    let started = Instant::now();
    let metrics = loop {
        let (code, _, body) = http(port, "GET", "/metrics", None, b"");
        // (nodes_off counts a node shutting down too: the GPUs read 0 W once serve
        // reads the node back powered down)
        let gpu_read = body
            .lines()
            .any(|l| l.starts_with("powerplane_power_watts{") && l.contains("a01-n01:0"));
        if code == 200 && value(&body, "powerplane_nodes_off") == Some(1.0) && gpu_read {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the node is off but not on /metrics ({code}):\n{body}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    };
    assert_eq!(
        value(&metrics, "powerplane_node_power_downs_total"),
        Some(1.0)
    );
    assert_eq!(
        value(&metrics, "powerplane_node_power_errors_total"),
        Some(0.0)
    );
    assert_eq!(value(&metrics, "powerplane_nodes_failed"), Some(0.0));
    // the off node's GPUs read 0 W, fresh: off, not stale
    let gpu = metrics
        .lines()
        .find(|l| l.starts_with("powerplane_power_watts{") && l.contains("a01-n01:0"))
        .unwrap_or_else(|| panic!("no reading of a01-n01:0:\n{metrics}"));
    assert!(gpu.trim_end().ends_with(" 0"), "{gpu}");
    promtool_check(&metrics);

    // a held job for the node leaves it off; released, Slurm resumes the node for it
    let out = slurm.run(
        "sbatch",
        &[
            "--parsable",
            "--output=/dev/null",
            "-H",
            "-p",
            "powersave",
            "--gres=gpu:1",
            "--wrap",
            "sleep 2",
        ],
    );
    let job: u64 = out
        .split(';')
        .next()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("sbatch answered {out:?}"));
    struct Cancel(Slurm, u64);
    impl Drop for Cancel {
        fn drop(&mut self) {
            let _ = self.0.cmd("scancel").arg(self.1.to_string()).output();
        }
    }
    let _cancel = Cancel(slurm, job);
    std::thread::sleep(Duration::from_secs(5));
    assert_eq!(slurm.sinfo(), "idle~", "a held job woke the node");
    let before = slurm.calls().len();
    slurm.run("scontrol", &["release", &job.to_string()]);
    let end = Instant::now() + Duration::from_secs(120);
    loop {
        let q = slurm.run("squeue", &["-h", "-j", &job.to_string(), "-o", "%T"]);
        // done: it ran (MinJobAge keeps it listed a while, or it is gone)
        if q.is_empty() || q == "COMPLETED" || q == "COMPLETING" {
            break;
        }
        assert!(
            Instant::now() < end,
            "job {job} still '{q}', node '{}'\n{}",
            slurm.sinfo(),
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    let calls = slurm.calls()[before..].join("\n");
    assert!(calls.contains(&format!("resume {node}")), "{calls}");
    // idle again (serve knows no job here): powered down again by the policy
    slurm.wait_sinfo(&["idle~"], Duration::from_secs(120), &log);
    let started = Instant::now();
    loop {
        let (code, _, body) = http(port, "GET", "/metrics", None, b"");
        if code == 200 && value(&body, "powerplane_node_power_downs_total") == Some(2.0) {
            // Slurm resumed the node for the job, not serve
            assert_eq!(
                value(&body, "powerplane_node_power_ups_total"),
                Some(0.0),
                "{body}"
            );
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no second power-down on /metrics ({code}):\n{body}\n{}",
            log()
        );
        std::thread::sleep(Duration::from_millis(300));
    }

    // shutdown ends the lease: the node this controller powered down comes back
    let pid = serve.0.id().to_string();
    let killed = Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .expect("kill");
    assert!(killed.success());
    let status = serve.0.wait().expect("serve exits");
    assert!(status.success(), "{status:?}\n{}", log());
    assert!(
        log().contains("shutting down, powering the node up"),
        "{}",
        log()
    );
    slurm.wait_sinfo(&["idle"], Duration::from_secs(90), &log);
}

#[test]
fn serve_on_slurm_22_05() {
    serve_powers_the_idle_node_down_a_released_job_brings_it_back_and_sigterm_powers_it_up(
        Slurm::V2205,
    );
}

#[test]
fn serve_on_slurm_24_11() {
    serve_powers_the_idle_node_down_a_released_job_brings_it_back_and_sigterm_powers_it_up(
        Slurm::V2411,
    );
}
