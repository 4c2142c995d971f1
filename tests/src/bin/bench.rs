//! Benchmarks that need real servers, printing figures to record in
//! docs/performance.md:
//!
//! - `bench mqtt [--messages N]`: JSON telemetry published to a private Mosquitto as
//!   fast as one publisher can; powerplane's MQTT source (decode + snapshot) against
//!   `mosquitto_sub` draining the same stream, in the same run, each pinned to one core.
//! - `bench redfish [--bmcs N] [--delay-ms D] [--interval-s S]`: N Redfish endpoints (the DMTF
//!   rack PDU mockup, from a local keep-alive HTTP server) polled for three intervals.
//!
//! - `bench agent [--seconds S] [--gpus N]`: `powerplane agent` (the release binary)
//!   with N simulated GPUs reading and publishing at 1 Hz for S seconds, taking a
//!   signed command every 10 s as a controller's renewals; its CPU time and peak RSS
//!   from `/proc`.
//!
//! - `bench backtest [--jobs N,N,...]`: `powerplane backtest` of the first N jobs (by
//!   submission) of the Philly-derived trace in `../shared/data` with the 2024 DE-LU
//!   prices on the 2,048-GPU example site, pinned to one core: time against trace length.
//!
//! - `bench http [--rate R] [--seconds S] [--connections N] [--bin PATH] [--gpus G --rules K]`: the release
//!   `serve`'s (or PATH's) HTTP side driven at R req/s (`/metrics` and `/api/v1/status`) over N keep-alive
//!   connections; p50/p99/max latency and errors (see `bench/http.rs`).
//!
//! - `bench failover [--runs N] [--replicas R]`: `kill -9` of the `[ha]` leader among R
//!   release `serve` replicas on a Redis of its own, N times: the time until the next
//!   leader's first tick, median and max, and the ticks lost (see `bench/failover.rs`).
//!
//! - `bench engine [--gpus N,N,...] [--runs R] [--rules N] [--plans FILE] [--at MILLIS] [--stale]`: one
//!   policy evaluation on a synthetic site, ticks 10 s apart with every reading taken anew
//!   before each (outside the timing), then as many runs of a reference kernel on
//!   readings taken the same way (every GPU's readings by slot and a sort by cut order):
//!   `kernel_ms`, `ratio` (evaluation median ÷ kernel median) and the growth from the
//!   smallest size; `--stale` takes the readings once, before the first evaluation, so
//!   that from the fifth tick on every reading is stale (a telemetry outage: the rules
//!   assume the worst), the kernel timed at the evaluations' ticks (as this bench ran
//!   before readings were taken per tick);
//!   `--plans` writes each evaluation's plan as a JSON line to `FILE.GPUS` (outside the
//!   timing: `scripts/identity` compares them across builds); `--at` fixes the time (Unix
//!   milliseconds) in place of now.
//!
//! - `bench latency [--nodes N] [--steps S] [--shards K]`: the release `serve` with
//!   `tick_s = 15` on N nodes of 8 GPUs, N simulated agents (the real agent core, K
//!   MQTT connections); S rack inlet steps on MQTT, each timed from the publish to the
//!   agents' receipt of the cap command: p50, p99, max (see `bench/latency.rs`).
//!
//! - `bench metrics [--gpus N,N,...] [--gpu-series M]`: `/metrics` rendered for a
//!   synthetic site of N GPUs with six readings each (power, energy, limit,
//!   temperature, utilization, clock) and every rack's power and inlet: its size and
//!   render time (median of 5), with `[http] metrics_gpu_series` M (default: the
//!   product's default) and with every GPU one by one, in the same run.
//!
//! Run with `cargo run --release -p powerplane-tests --bin bench -- mqtt`.

#[path = "bench/failover.rs"]
mod failover;
#[path = "bench/http.rs"]
mod http;
#[path = "bench/latency.rs"]
mod latency;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use powerplane_tests::{workspace_root, Broker};
use sources::mqtt::{Event, MqttConfig, MqttSource};
use telemetry::mapping::Mapping;
use telemetry::{Snapshot, Timestamp};

#[path = "../bench/redfish.rs"]
mod redfish;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn peak_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn pin(core: usize) {
    let _ = Command::new("taskset")
        .args(["-pc", &core.to_string(), &std::process::id().to_string()])
        .stdout(Stdio::null())
        .status();
}

fn payloads(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            format!(
                "{{\"value\": {}, \"ts\": {}}}",
                70.0 + (i % 20) as f64 * 0.5,
                1_796_000_000 + i / 100
            )
        })
        .collect()
}

/// Publishes every line with `mosquitto_pub -l` (one message per line, QoS 0).
fn publish(port: u16, lines: &[String]) -> Duration {
    publish_to(port, "bench/r01/inlet", lines)
}

/// Publishes each of `lines` as one message on `topic` (QoS 0, `mosquitto_pub -l`);
/// returns how long it took.
pub(crate) fn publish_to(port: u16, topic: &str, lines: &[String]) -> Duration {
    let start = Instant::now();
    let mut child = Command::new("mosquitto_pub")
        .args(["-p", &port.to_string(), "-t", topic, "-l", "-q", "0"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("mosquitto_pub");
    {
        let mut stdin = child.stdin.take().expect("stdin");
        let mut all = String::with_capacity(lines.len() * 40);
        for l in lines {
            all.push_str(l);
            all.push('\n');
        }
        stdin.write_all(all.as_bytes()).expect("write");
    }
    child.wait().expect("publisher");
    start.elapsed()
}

fn bench_mqtt() {
    let n = arg("--messages", 200_000);
    let broker = Broker::start();
    let lines = payloads(n);
    let core = if std::thread::available_parallelism()
        .map(|p| p.get())
        .unwrap_or(1)
        > 1
    {
        1
    } else {
        0
    };

    // mosquitto_sub, pinned to one core, counting lines until it has them all or goes quiet
    let mut sub = Command::new("taskset")
        .args([
            "-c",
            &core.to_string(),
            "mosquitto_sub",
            "-p",
            &broker.port.to_string(),
            "-t",
            "bench/#",
            "-C",
            &n.to_string(),
            "-W",
            "60",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .expect("mosquitto_sub");
    std::thread::sleep(Duration::from_millis(500));
    let reader = std::thread::spawn({
        let out = sub.stdout.take().expect("stdout");
        move || {
            let mut first = None;
            let mut count = 0usize;
            for line in BufReader::new(out).lines() {
                if line.is_err() {
                    break;
                }
                first.get_or_insert_with(Instant::now);
                count += 1;
            }
            (count, first.map(|f| f.elapsed()).unwrap_or_default())
        }
    });
    let pub_a = publish(broker.port, &lines);
    let _ = sub.wait();
    let (sub_count, sub_time) = reader.join().expect("reader");

    // powerplane's source, this process pinned to one core
    pin(core);
    let mapping = Mapping::parse("bench.toml", "version = 1\n[[json]]\ntopic = \"bench/{rack}/inlet\"\nentity = \"rack/{rack}\"\nmetric = \"inlet_temp_c\"\nvalue = \"/value\"\nunit = \"degF\"\ntimestamp = \"/ts\"\n").expect("mapping");
    let mut cfg = MqttConfig::new(&format!("mqtt://127.0.0.1:{}", broker.port));
    cfg.client_id = Some("bench".into());
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let handle = std::thread::spawn(move || {
        let mut source = MqttSource::new(cfg, mapping).expect("source");
        let mut snap = Snapshot::new();
        let now = Timestamp::from_secs(1_796_000_000 + 3600);
        let (mut count, mut first, mut last) = (0usize, None, Instant::now());
        let keep = || !flag.load(Ordering::Relaxed);
        source.run(&keep, &|| now, &mut |e| {
            if let Event::Message { decoded, .. } = e {
                first.get_or_insert_with(Instant::now);
                for s in decoded.samples {
                    let _ = snap.ingest(s, now);
                }
                count += 1;
                last = Instant::now();
            }
        });
        (
            count,
            first.map(|f| last.duration_since(f)).unwrap_or_default(),
        )
    });
    std::thread::sleep(Duration::from_millis(800));
    let pub_b = publish(broker.port, &lines);
    let end = Instant::now() + Duration::from_secs(60);
    std::thread::sleep(Duration::from_secs(2));
    while Instant::now() < end && !handle.is_finished() {
        stop.store(true, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(50));
    }
    let (pp_count, pp_time) = handle.join().expect("source");
    let rate = |c: usize, t: Duration| c as f64 / t.as_secs_f64().max(1e-9);
    println!(
        "mqtt ingest, {n} JSON messages, one publisher, QoS 0, consumers pinned to core {core}"
    );
    println!("  mosquitto_sub : {sub_count:>8} received in {:>7.3} s = {:>10.0} msg/s (publisher took {:.3} s)", sub_time.as_secs_f64(), rate(sub_count, sub_time), pub_a.as_secs_f64());
    println!("  powerplane    : {pp_count:>8} received in {:>7.3} s = {:>10.0} msg/s (publisher took {:.3} s)", pp_time.as_secs_f64(), rate(pp_count, pp_time), pub_b.as_secs_f64());
    println!(
        "  ratio powerplane/mosquitto_sub: {:.2}",
        rate(pp_count, pp_time) / rate(sub_count, sub_time)
    );
    println!(
        "  peak RSS of the powerplane process: {:.1} MB",
        peak_rss_mb()
    );
}

/// utime + stime of a process, in seconds, and its peak RSS in MB.
fn proc_usage(pid: u32) -> (f64, f64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // fields after the command name in parentheses
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 of stat; 100 ticks per second on Linux
    let cpu = (ticks(11) + ticks(12)) / 100.0;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let hwm = status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0);
    (cpu, hwm / 1024.0)
}

fn bench_agent() {
    use sources::mqtt::Link;
    use telemetry::agent_proto::{Action, Channel, Command as Cmd, GpuSel, Key, Topics};
    let seconds = arg("--seconds", 60);
    let gpus = arg("--gpus", 8);
    let root = workspace_root();
    let bin = root.join("target/release/powerplane");
    assert!(
        bin.exists(),
        "build it first: cargo build --release --bin powerplane"
    );
    let broker = Broker::start();
    let dir = tempfile::tempdir().expect("tmp");
    let key_hex = "4d".repeat(32);
    std::fs::write(dir.path().join("site.key"), &key_hex).expect("key");
    std::fs::set_permissions(
        dir.path().join("site.key"),
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .expect("chmod");
    std::fs::write(
        dir.path().join("agent.toml"),
        format!(
            "node = \"bench-n1\"\nkey_file = \"site.key\"\nstate_file = \"state.json\"\n[backend]\nkind = \"sim\"\ngpus = {gpus}\n[mqtt]\nurl = \"mqtt://127.0.0.1:{}\"\n",
            broker.port
        ),
    )
    .expect("agent.toml");
    let mut child = Command::new(&bin)
        .args(["agent", "--config"])
        .arg(dir.path().join("agent.toml"))
        .env("POWERPLANE_LOG", "warn")
        .spawn()
        .expect("agent");
    let key = Key::from_text(&key_hex).expect("key");
    let topics = Topics::default();
    let (link, events) = Link::open(
        &MqttConfig::new(&format!("mqtt://127.0.0.1:{}", broker.port)),
        vec![topics.all(Channel::Gpus), topics.all(Channel::Ack)],
        None,
    )
    .expect("link");
    let started = Instant::now();
    let (mut reports, mut acks, mut n) = (0u32, 0u32, 0u32);
    let mut next_cmd = Instant::now() + Duration::from_secs(2);
    while started.elapsed() < Duration::from_secs(seconds as u64) {
        if Instant::now() >= next_cmd {
            n += 1;
            let c = Cmd {
                v: 1,
                id: format!("bench-{n}"),
                node: "bench-n1".into(),
                issued_at: powerplane_tests_now(),
                lease_s: 60.0,
                action: Action::SetPowerLimit {
                    gpus: GpuSel::all(),
                    watts: Some(if n % 2 == 0 { 250.0 } else { 200.0 }),
                    percent: None,
                },
                epoch: None,
            };
            link.publish(
                &topics.topic("bench-n1", Channel::Cmd),
                c.seal(&key),
                true,
                false,
            );
            next_cmd += Duration::from_secs(10);
        }
        if let Ok(sources::mqtt::LinkEvent::Message { topic, .. }) =
            events.recv_timeout(Duration::from_millis(100))
        {
            if topic.ends_with("/gpus") {
                reports += 1;
            } else if topic.ends_with("/ack") {
                acks += 1;
            }
        }
    }
    let (cpu_s, rss_mb) = proc_usage(child.id());
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let wall = started.elapsed().as_secs_f64();
    println!("agent: {gpus} simulated GPUs at 1 Hz for {wall:.0} s; {reports} reports, {acks}/{n} commands acknowledged");
    println!(
        "agent: CPU {cpu_s:.2} s = {:.3}% of one core; peak RSS {rss_mb:.1} MB",
        100.0 * cpu_s / wall
    );
    drop(broker);
}

fn powerplane_tests_now() -> Timestamp {
    Timestamp(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0),
    )
}

fn bench_backtest() {
    use orchestrator::backtest::{run, BacktestConfig, Input};
    let root = workspace_root();
    let data = root.join("../shared/data");
    let trace = data.join("traces/pollux_philly.csv");
    let prices = data.join("prices/de_lu_2024_spot_ct_per_kwh_netztransparenz.csv");
    if !trace.exists() || !prices.exists() {
        eprintln!(
            "bench backtest: {} or {} is absent: nothing to measure",
            trace.display(),
            prices.display()
        );
        return;
    }
    let args: Vec<String> = std::env::args().collect();
    let lengths: Vec<usize> = args
        .iter()
        .position(|a| a == "--jobs")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.split(',').filter_map(|n| n.parse().ok()).collect())
        .unwrap_or_else(|| vec![10_000, 40_000, 82_247]);
    pin(1);
    let text = std::fs::read_to_string(&trace).expect("trace");
    let mut lines: Vec<&str> = text.lines().collect();
    let header = lines.remove(0);
    // by submission time (the first column sorts as text)
    lines.sort_by_key(|l| l.split(',').next().unwrap_or("").to_string());
    let read = |p: &std::path::Path| Input::read(p).expect("input");
    let ex = root.join("examples/backtest");
    println!("backtest: Philly-derived trace, 2024 DE-LU prices, 2,048-GPU example site, 300 s ticks, one core");
    for n in lengths {
        let n = n.min(lines.len());
        let mut t = String::from(header);
        t.push('\n');
        for l in &lines[..n] {
            t.push_str(l);
            t.push('\n');
        }
        let out = std::env::temp_dir().join(format!("bench-backtest-{n}"));
        let cfg = BacktestConfig {
            site: read(&ex.join("site.toml")),
            policy: read(&ex.join("policy.toml")),
            jobs: Input::builtin("philly", &t),
            prices: read(&prices),
            carbon: None,
            scenario: Some(read(&ex.join("scenario.toml"))),
            from: None,
            to: None,
            out,
            load: 1.0,
        };
        let began = Instant::now();
        let s = run(&cfg, &mut std::io::sink()).expect("backtest");
        let took = began.elapsed().as_secs_f64();
        println!(
            "  {:>6} jobs: {:>7.1} s ({:>6.0} simulated hours, {:.2} ms per simulated hour; cost saving {:.1}%)",
            n,
            took,
            s.span_h,
            1000.0 * took / s.span_h.max(1.0),
            s.savings_pct.cost
        );
    }
    println!("  peak RSS: {:.1} MB", peak_rss_mb());
}

/// jemalloc, not the system allocator: each tick allocates and frees the engine's
/// working state (per GPU at 100,000 GPUs and more), and glibc's malloc fragments under
/// that (docs/performance.md: peak memory and time at 1,000,000 GPUs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() {
    match std::env::args().nth(1).as_deref() {
        Some("backtest") => bench_backtest(),
        Some("mqtt") => bench_mqtt(),
        Some("redfish") => redfish::run(),
        Some("agent") => bench_agent(),
        Some("engine") => bench_engine(),
        Some("http") => http::bench_http(),
        Some("metrics") => bench_metrics(),
        Some("failover") => failover::run(arg("--runs", 20), arg("--replicas", 3)),
        Some("latency") => latency::run(
            arg("--nodes", 1000),
            arg("--steps", 100),
            arg("--shards", 8),
            std::env::args().any(|a| a == "--grid"),
        ),
        _ => {
            eprintln!(
                "usage: bench mqtt [--messages N] | bench redfish [--bmcs N] [--delay-ms D] [--interval-s S] | bench agent | bench engine [--gpus N,N,...] [--runs R] [--rules N] [--plans FILE] [--at MILLIS] [--stale] | bench backtest [--jobs N,N,...] | bench http [--rate R] [--seconds S] [--connections N] [--bin PATH] | bench metrics [--gpus N,N,...] [--gpu-series M] | bench failover [--runs N] [--replicas R] | bench latency [--nodes N] [--steps S] [--shards K] [--grid]"
            );
            std::process::exit(2);
        }
    }
}

fn bench_metrics() {
    use orchestrator::http::metrics::{render, DEFAULT_GPU_SERIES};
    use telemetry::metric::names::*;
    use telemetry::{Sample, Snapshot};
    let sizes: Vec<usize> = std::env::args()
        .skip_while(|a| a != "--gpus")
        .nth(1)
        .unwrap_or_else(|| "10000,100000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let series = arg("--gpu-series", DEFAULT_GPU_SERIES);
    println!("metrics: /metrics rendered (median of 5), six readings per GPU");
    println!(
        "{:>9} {:>12} {:>10} {:>10} {:>9} {:>13} {:>10}",
        "gpus", "gpu_series", "bytes", "mb", "lines", "render_ms", "per_node"
    );
    for gpus in sizes {
        let site = telemetry::Site::parse("bench.toml", &engine_site(gpus)).expect("bench site");
        let now = powerplane_tests_now();
        let mut snap = Snapshot::new();
        snap.register(&site.snapshot_order());
        let mut put = |id: telemetry::EntityId, metric: &str, v: f64| {
            snap.ingest(Sample::new(id, metric, v, now, "bench"), now)
                .expect("sample");
        };
        for (i, g) in site.gpus().iter().enumerate() {
            let id = telemetry::EntityId::clone(&g.id);
            let f = (i % 97) as f64;
            put(id.clone(), POWER_W, 150.0 + f);
            put(id.clone(), ENERGY_J, 1.0e9 + f * 1.0e6);
            put(id.clone(), POWER_LIMIT_W, 300.0);
            put(id.clone(), GPU_TEMP_C, 50.0 + f / 4.0);
            put(id.clone(), UTILIZATION_PCT, f);
            put(id, SM_CLOCK_MHZ, 1410.0);
        }
        for rack in &site.racks {
            let id = telemetry::EntityId::rack(&rack.id);
            put(id.clone(), POWER_W, 9000.0);
            put(id, INLET_TEMP_C, 25.0);
        }
        let mut board = orchestrator::http::Board::new(site, "policy.toml".into(), now);
        let _ = board.update(
            now,
            std::sync::Arc::new(snap),
            std::sync::Arc::new(policies::State::default()),
            &orchestrator::control::Counters::default(),
            &[],
            0,
        );
        for limit in [series, usize::MAX] {
            let mut times = Vec::new();
            let mut text = String::new();
            for _ in 0..5 {
                let t = Instant::now();
                text = render(&board, None, limit);
                times.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            times.sort_by(f64::total_cmp);
            println!(
                "{:>9} {:>12} {:>10} {:>10.2} {:>9} {:>13.1} {:>10}",
                gpus,
                if limit == usize::MAX {
                    "all".to_string()
                } else {
                    limit.to_string()
                },
                text.len(),
                text.len() as f64 / 1e6,
                text.lines().count(),
                times[2],
                gpus > limit
            );
        }
    }
}

/// A synthetic site of `gpus` A40 GPUs: 50 per rack (5 nodes of 10), 20 racks per row,
/// two PDUs per rack, a CRAH per row, four utility feeds.
pub(crate) fn engine_site(gpus: usize) -> String {
    use std::fmt::Write;
    let racks = gpus.div_ceil(50);
    let rows = racks.div_ceil(20);
    let mut s = String::from("version = 1\n[site]\nname = \"bench\"\n[[rooms]]\nid = \"hall\"\n");
    let feed_kw = racks as f64 * 18.0 / 4.0;
    for f in 0..4 {
        let _ = write!(s, "[[feeds]]\nid = \"f{f}\"\nrating_kw = {feed_kw}\n");
    }
    for r in 0..racks {
        let _ = write!(
            s,
            "[[pdus]]\nid = \"p{r}a\"\nfeed = \"f{}\"\nrating_kw = 14\n[[pdus]]\nid = \"p{r}b\"\nfeed = \"f{}\"\nrating_kw = 14\n",
            r % 4,
            (r + 1) % 4
        );
    }
    for w in 0..rows {
        let members: Vec<String> = (w * 20..((w + 1) * 20).min(racks))
            .map(|r| format!("\"r{r}\""))
            .collect();
        let _ = write!(
            s,
            "[[rows]]\nid = \"w{w}\"\nroom = \"hall\"\n[[cooling]]\nid = \"c{w}\"\ncapacity_kw = 400\nracks = [{}]\n",
            members.join(", ")
        );
    }
    for r in 0..racks {
        let _ = write!(
            s,
            "[[racks]]\nid = \"r{r}\"\nrow = \"w{}\"\npdus = [\"p{r}a\", \"p{r}b\"]\nnodes = 5\ngpus_per_node = 10\ngpu_model = \"A40\"\nnode_base_w = 400\n",
            r / 20
        );
    }
    s
}

pub(crate) const ENGINE_POLICY: &str = r#"
version = 1
[budget]
cut_order = ["batch"]
[thermal]
supply_limit_c = 24
[price]
defer_above = 0.25
classes = ["batch"]

[[rules]]
name = "hot-racks"
scope = "rack"
when = "inlet_temp_c > 30 for 1m"
release = "inlet_temp_c < 28 for 5m"
action = { cap_pct = 85 }
ramp_per_min = 5

[[rules]]
name = "hot-gpus"
scope = "gpu"
when = "gpu_temp_c > 85"
release = "gpu_temp_c < 80"
action = { cap_pct = 80 }

[[rules]]
name = "evening-peak"
scope = "site"
when = "hour >= 17 and hour < 21 and price > price.p75(24h)"
action = { cap_pct = 90 }

[[rules]]
name = "cheapest-hours"
scope = "job"
select = { class = "batch", deferrable = true }
when = "price > price.cheapest_before_deadline"
action = { hold = true }
"#;

/// `bench engine --rules N`: N rules beside the four, as a large site's policy has them
/// (one of each kind in turn): a rack rule for one row (inlet, with a duration), a GPU
/// rule for one rack (temperature), a rack rule for one rack (power), and a rack rule
/// for one row on the price; thresholds vary so that some fire and some do not. (The
/// four include a site-wide rule; a site-wide cap costs a want per GPU whenever it
/// fires, so a policy of hundreds of them is a different load, not this one.)
pub(crate) fn extra_rules(n: usize, racks: usize) -> String {
    use std::fmt::Write;
    let rows = racks.div_ceil(20);
    let mut s = String::new();
    for k in 0..n {
        let pct = 80 + (k % 15);
        // a threshold of its own per rule (no two rules the same condition on the
        // same entities, which the policy check refuses as a contradiction)
        let x = k as f64 * 0.001;
        let _ = match k % 4 {
            0 => write!(
                s,
                "\n[[rules]]\nname = \"row-inlet-{k}\"\nscope = \"rack\"\nselect = {{ within = \"row/w{}\" }}\nwhen = \"inlet_temp_c > {:.3} for 1m\"\nrelease = \"inlet_temp_c < {:.3} for 5m\"\naction = {{ cap_pct = {pct} }}\n",
                k % rows,
                26.0 + (k % 7) as f64 + x,
                24.0 + (k % 7) as f64 + x
            ),
            1 => write!(
                s,
                "\n[[rules]]\nname = \"rack-gpus-{k}\"\nscope = \"gpu\"\nselect = {{ within = \"rack/r{}\" }}\nwhen = \"gpu_temp_c > {:.3}\"\nrelease = \"gpu_temp_c < {:.3}\"\naction = {{ cap_pct = {pct} }}\n",
                (k * 7) % racks,
                70.0 + (k % 20) as f64 + x,
                65.0 + (k % 20) as f64 + x
            ),
            2 => write!(
                s,
                "\n[[rules]]\nname = \"rack-power-{k}\"\nscope = \"rack\"\nselect = {{ within = \"rack/r{}\" }}\nwhen = \"power_w > {:.3}\"\naction = {{ cap_pct = {pct} }}\n",
                (k * 13) % racks,
                9000.0 + 100.0 * (k % 40) as f64 + x
            ),
            _ => write!(
                s,
                "\n[[rules]]\nname = \"row-price-{k}\"\nscope = \"rack\"\nselect = {{ within = \"row/w{}\" }}\nwhen = \"price > {:.4}\"\naction = {{ cap_pct = {pct} }}\n",
                (k / 4) % rows,
                0.2 + 0.01 * (k % 30) as f64 + x * 0.01
            ),
        };
    }
    s
}

/// `bench engine --plans FILE`: the file the plans of the evaluations at `gpus` GPUs
/// are written to (`FILE.GPUS`), where asked for.
fn plans_file(gpus: usize) -> Option<std::io::BufWriter<std::fs::File>> {
    let path = std::env::args().skip_while(|a| a != "--plans").nth(1)?;
    let file = std::fs::File::create(format!("{path}.{gpus}")).expect("create --plans file");
    Some(std::io::BufWriter::new(file))
}

fn vm_hwm_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1).and_then(|v| v.parse().ok()))
        })
        .unwrap_or(0)
}

fn bench_engine() {
    use telemetry::metric::names::*;
    use telemetry::{Job, JobState, Sample, Snapshot};
    let arg = std::env::args()
        .skip_while(|a| a != "--gpus")
        .nth(1)
        .unwrap_or_else(|| "10000,100000".into());
    let sizes: Vec<usize> = arg
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let runs: usize = std::env::args()
        .skip_while(|a| a != "--runs")
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    let extra: usize = std::env::args()
        .skip_while(|a| a != "--rules")
        .nth(1)
        .and_then(|r| r.parse().ok())
        .unwrap_or(0);
    println!(
        "engine: one evaluation (budgets, thermal, price, {} rules), single thread",
        4 + extra
    );
    println!(
        "{:>9} {:>6} {:>7} {:>10} {:>10} {:>10} {:>12} {:>10} {:>7}",
        "gpus",
        "racks",
        "jobs",
        "build_ms",
        "median_ms",
        "max_ms",
        "peak_rss_mb",
        "kernel_ms",
        "ratio"
    );
    let mut rows: Vec<(usize, f64, f64)> = Vec::new();
    for gpus in sizes {
        let text = engine_site(gpus);
        let t = Instant::now();
        let site = telemetry::Site::parse("bench.toml", &text).expect("bench site");
        let policy_text = format!("{ENGINE_POLICY}{}", extra_rules(extra, gpus.div_ceil(50)));
        let parse_t = Instant::now();
        let policy = policies::Policy::parse("policy.toml", &policy_text).expect("bench policy");
        if extra > 0 {
            println!(
                "  policy of {} rules parsed and checked in {:.1} ms",
                4 + extra,
                parse_t.elapsed().as_secs_f64() * 1000.0
            );
        }
        // `--at MILLIS`: a fixed time (Unix milliseconds) for runs to compare
        let now = std::env::args()
            .skip_while(|a| a != "--at")
            .nth(1)
            .and_then(|t| t.parse().ok())
            .map_or_else(powerplane_tests_now, Timestamp);
        let mut snap = Snapshot::new();
        snap.register(&site.snapshot_order());
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % 10_000) as f64 / 10_000.0
        };
        let all = site.gpus();
        // every GPU's power and temperature, every rack's power and inlet, the price:
        // read at each evaluation's time (as a tick sees them), or with `--stale` only
        // once, before the first
        let mut readings: Vec<(telemetry::EntityId, &str, f64)> = Vec::new();
        let mut rack_w = vec![0.0; site.racks.len()];
        for g in &all {
            let w = 120.0 + 180.0 * next();
            rack_w[g.rack_index] += w;
            let id = telemetry::EntityId::clone(&g.id);
            readings.push((id.clone(), POWER_W, w));
            readings.push((id, GPU_TEMP_C, 50.0 + 40.0 * next()));
        }
        for (r, rack) in site.racks.iter().enumerate() {
            let id = telemetry::EntityId::rack(&rack.id);
            readings.push((id.clone(), POWER_W, rack_w[r] + 2000.0));
            readings.push((id, INLET_TEMP_C, 22.0 + 10.0 * next()));
        }
        readings.push((site.site_entity(), PRICE_PER_KWH, 0.3));
        let read_at = |snap: &mut Snapshot, at: Timestamp| {
            for (id, metric, value) in &readings {
                snap.ingest(Sample::new(id.clone(), metric, *value, at, "bench"), at)
                    .expect("sample");
            }
        };
        read_at(&mut snap, now);
        // half the jobs run on two GPUs each; the rest wait, most of them deferrable batch
        let njobs = gpus / 2;
        let running = njobs * 4 / 5;
        let jobs: Vec<Job> = (0..njobs)
            .map(|i| {
                let run = i < running;
                Job {
                    id: format!("slurm:{i}"),
                    scheduler: "slurm".into(),
                    name: format!("job{i}"),
                    user: format!("u{}", i % 50),
                    project: format!("p{}", i % 20),
                    class: if i % 3 == 0 {
                        "batch".into()
                    } else {
                        "training".into()
                    },
                    priority: (i % 10) as i32,
                    gpus: 2,
                    allocated: if run {
                        vec![
                            all[2 * i].id.clone().into_owned(),
                            all[2 * i + 1].id.clone().into_owned(),
                        ]
                    } else {
                        vec![]
                    },
                    state: if run {
                        JobState::Running
                    } else {
                        JobState::Pending
                    },
                    submit_time: now + -3600.0,
                    start_time: None,
                    end_time: None,
                    deadline: Some(now + 86400.0),
                    est_duration_s: 4.0 * 3600.0,
                    deferrable: i % 3 == 0,
                    preemptible: false,
                    gpu_power_limit: None,
                }
            })
            .collect();
        let forecast = policies::Forecast {
            price: policies::StepSeries::new(
                (0..48)
                    .map(|h| (now + 3600.0 * h as f64, 0.1 + 0.3 * next()))
                    .collect(),
                3600.0,
            ),
            ..Default::default()
        };
        drop(all);
        let build_ms = t.elapsed().as_secs_f64() * 1000.0;
        let mut prior = policies::State::default();
        // the cut-order rank of each GPU's job (input to the kernel, as the jobs are)
        let mut rank = vec![i64::MIN; site.gpu_count()];
        for (i, j) in jobs
            .iter()
            .enumerate()
            .filter(|(_, j)| !j.allocated.is_empty())
        {
            let r = if j.class == "batch" { 0 } else { 1 };
            rank[2 * i] = (r << 33) + i64::from(j.priority);
            rank[2 * i + 1] = (r << 33) + i64::from(j.priority);
        }
        // the jobs resolved at the edge (their GPUs, their ids), as the job registry does
        // when its jobs change
        let job_table = policies::JobTable::new(&site, &jobs);
        // `--plans FILE`: every evaluation's whole plan, one JSON line each (outside the
        // timing), to check that a change to the engine leaves its output as it was
        let mut plans = plans_file(gpus);
        let stale = std::env::args().any(|a| a == "--stale");
        let mut times = Vec::new();
        let mut kernel = Vec::new();
        let mut checksum = 0.0;
        for i in 0..runs.max(1) {
            let at = now + 10.0 * i as f64;
            if i > 0 && !stale {
                read_at(&mut snap, at);
            }
            let t = Instant::now();
            let plan = policies::evaluate(
                &policies::Inputs {
                    site: &site,
                    snapshot: &snap,
                    jobs: &jobs,
                    prior: &prior,
                    policy: &policy,
                    forecast: &forecast,
                    job_table: Some(&job_table),
                },
                at,
            );
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            if let Some(f) = plans.as_mut() {
                use std::io::Write;
                serde_json::to_writer(&mut *f, &plan).expect("plan as JSON");
                writeln!(f).expect("write plans");
            }
            prior = plan.state;
        }
        // the reference kernel as many times, on readings taken the same way (the ticks
        // after the evaluations'; with `--stale`, the evaluations' ticks, on the same
        // aging readings)
        for i in 0..runs.max(1) {
            let at = if stale {
                now + 10.0 * i as f64
            } else {
                let at = now + 10.0 * (runs.max(1) + i) as f64;
                read_at(&mut snap, at);
                at
            };
            let t = Instant::now();
            checksum += reference_kernel(&site, &snap, &rank, at);
            kernel.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        let median = |v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            (s[s.len() / 2], s[s.len() - 1])
        };
        let (eval_ms, max_ms) = median(&times);
        let (kernel_ms, _) = median(&kernel);
        let rss_mb = vm_hwm_kb() as f64 / 1024.0;
        println!(
            "{:>9} {:>6} {:>7} {:>10.0} {:>10.1} {:>10.1} {:>12.0} {:>10.2} {:>7.1}",
            gpus,
            site.racks.len(),
            jobs.len(),
            build_ms,
            eval_ms,
            max_ms,
            rss_mb,
            kernel_ms,
            eval_ms / kernel_ms.max(1e-9)
        );
        std::hint::black_box(checksum);
        rows.push((gpus, eval_ms, rss_mb));
    }
    // growth from the smallest size to each larger one, against the growth in GPUs
    if let Some(&(g0, t0, m0)) = rows.first() {
        for &(g, t, m) in rows.iter().skip(1) {
            println!(
                "  growth {g0} -> {g} GPUs (x{:.0}): time x{:.1}, peak RSS x{:.1}",
                g as f64 / g0 as f64,
                t / t0.max(1e-9),
                m / m0.max(1e-9)
            );
        }
    }
}

/// The least any evaluation must do: one pass reading every GPU's power, temperature
/// and power limit from the snapshot (by slot: the site's GPUs have the first ones),
/// then the GPUs sorted by cut order (job rank, then the highest draw first). Returns
/// a checksum so that nothing is optimised away.
fn reference_kernel(site: &telemetry::Site, snap: &Snapshot, rank: &[i64], now: Timestamp) -> f64 {
    use telemetry::metric::names::{GPU_TEMP_C, POWER_LIMIT_W, POWER_W};
    let (p, t, l) = (
        snap.metric_id(POWER_W),
        snap.metric_id(GPU_TEMP_C),
        snap.metric_id(POWER_LIMIT_W),
    );
    let read = |slot, m: Option<telemetry::snapshot::MetricId>| {
        m.and_then(|m| snap.observe_slot(slot, m, now))
            .filter(|o| o.usable())
            .map(|o| o.value)
    };
    let mut keys: Vec<(i64, i64, u32)> = Vec::with_capacity(rank.len());
    let mut sum = 0.0;
    for rack in &site.racks {
        for &n in &rack.nodes {
            let default_w = site
                .gpu_models
                .get(&site.nodes[n].gpu_model)
                .map_or(0.0, |m| m.default_w);
            for _ in 0..site.nodes[n].gpus {
                let i = keys.len() as u32;
                let power = read(i, p).unwrap_or(0.0);
                sum += read(i, t).unwrap_or(0.0) + read(i, l).unwrap_or(default_w);
                keys.push((rank[i as usize], -(power * 10.0) as i64, i));
            }
        }
    }
    keys.sort_unstable();
    sum + f64::from(keys.first().map_or(0, |k| k.2))
}
