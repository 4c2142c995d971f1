//! `bench http [--rate R] [--seconds S] [--connections N]`: the release `powerplane
//! serve` on the demo site with `[http]`, driven at R requests per second (half
//! `/metrics`, half `/api/v1/status` with a viewer token) for S seconds over N
//! keep-alive connections, each a tokio task sending on a fixed schedule. Latency is
//! counted from when a request was due (not when it went out), so a stall shows in
//! full; errors are answers other than 200 and broken connections.
//!
//! `--gpus G [--rules K]`: instead of the demo, the engine bench's site of G GPUs (50
//! per rack) with its four rules and K more, `tick_s = 1`, every rack's inlet and power
//! and every cooling unit's supply published once a second on a private Mosquitto, and
//! the load split between `/readyz` and `/api/v1/status`, with `/metrics` scraped every
//! 5 s beside it (as Prometheus would, a little more often). The loop's tick time is
//! read from its histogram at the end.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use super::{arg, proc_usage};
use powerplane_tests::workspace_root;

const VIEWER: &str = "viewer-token-0123456789abcdef";

/// One connection's results: (path index, latency) per answer, and errors.
#[derive(Default)]
struct Tally {
    latencies: Vec<(usize, Duration)>,
    errors: u64,
}

impl Tally {
    /// One answer to a request due at `due`: its latency, or an error (a broken
    /// connection is dropped, to be opened again).
    fn record(
        &mut self,
        which: usize,
        due: Instant,
        answer: std::io::Result<u16>,
        conn: &mut Option<BufReader<TcpStream>>,
    ) {
        match answer {
            Ok(200) => self.latencies.push((which, due.elapsed())),
            Ok(_) => self.errors += 1,
            Err(_) => {
                self.errors += 1;
                *conn = None;
            }
        }
    }
}

const PATHS: [&str; 2] = ["/metrics", "/api/v1/status"];
const SCALED_PATHS: [&str; 3] = ["/readyz", "/api/v1/status", "/metrics"];

/// Sends one request on `conn` (opening it when needed) and reads the answer.
async fn one(
    port: u16,
    conn: &mut Option<BufReader<TcpStream>>,
    path: &str,
) -> std::io::Result<u16> {
    if conn.is_none() {
        let s = TcpStream::connect(("127.0.0.1", port)).await?;
        s.set_nodelay(true)?;
        *conn = Some(BufReader::new(s));
    }
    let Some(c) = conn.as_mut() else {
        return Err(std::io::ErrorKind::NotConnected.into());
    };
    let req =
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {VIEWER}\r\n\r\n");
    c.get_mut().write_all(req.as_bytes()).await?;
    let mut line = String::new();
    c.read_line(&mut line).await?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or(std::io::ErrorKind::InvalidData)?;
    let mut length = 0usize;
    loop {
        line.clear();
        if c.read_line(&mut line).await? == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| std::io::ErrorKind::InvalidData)?;
            }
        }
    }
    let mut body = vec![0u8; length];
    c.read_exact(&mut body).await?;
    Ok(status)
}

/// One connection: request `k` is due at `start + (k * connections + index) / rate`.
async fn driver(
    port: u16,
    index: usize,
    connections: usize,
    rate: f64,
    until: Instant,
    start: Instant,
    paths: &'static [&'static str],
) -> Tally {
    let mut tally = Tally::default();
    let mut conn = None;
    for k in 0.. {
        let due = start + Duration::from_secs_f64((k * connections + index) as f64 / rate);
        if due >= until {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let which = (k + index) % paths.len();
        let answer = one(port, &mut conn, paths[which]).await;
        tally.record(which, due, answer, &mut conn);
    }
    tally
}

/// `/metrics` every 5 s from `start` to `until`, as a scraper would (its latencies under
/// path index `which`).
async fn scraper(port: u16, which: usize, until: Instant, start: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut conn = None;
    for k in 0.. {
        let due = start + Duration::from_secs(5 * k);
        if due >= until {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let answer = one(port, &mut conn, "/metrics").await;
        tally.record(which, due, answer, &mut conn);
    }
    tally
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn write_config(d: &Path, port: u16) {
    let root = workspace_root();
    for f in ["site.toml", "policy.toml", "prices.csv"] {
        std::fs::copy(root.join("examples/demo").join(f), d.join(f)).expect("copy");
    }
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 1\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n[prices]\nfile = \"prices.csv\"\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"bench\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
}

/// The scaled site: `site.toml`, `policy.toml` (the engine bench's, with `rules`
/// more), a mapping of the readings' two topics and prices over now. Returns the racks
/// and cooling units.
fn write_scaled(d: &Path, port: u16, mqtt: u16, gpus: usize, rules: usize) -> (usize, usize) {
    let site = super::engine_site(gpus);
    let racks = gpus.div_ceil(50);
    let cooling = racks.div_ceil(20);
    std::fs::write(d.join("site.toml"), site).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        format!(
            "{}{}",
            super::ENGINE_POLICY,
            super::extra_rules(rules, racks)
        ),
    )
    .expect("policy");
    std::fs::write(
        d.join("mapping.toml"),
        "version = 1\n[[json]]\ntopic = \"bench/racks\"\neach = \"/racks\"\nentity = \"rack/{/rack}\"\nreadings = [ { metric = \"inlet_temp_c\", value = \"/inlet\" }, { metric = \"power_w\", value = \"/w\" } ]\n[[json]]\ntopic = \"bench/cooling\"\neach = \"/units\"\nentity = \"cooling/{/id}\"\nmetric = \"supply_temp_c\"\nvalue = \"/c\"\n",
    )
    .expect("mapping");
    // hourly prices from a day ago to two days ahead
    let now = chrono::Utc::now().timestamp();
    let mut csv = String::from("start,price_per_kwh,carbon_g_per_kwh\n");
    for h in -24..48 {
        let t = chrono::DateTime::from_timestamp((now / 3600 + h) * 3600, 0).expect("time");
        csv.push_str(&format!(
            "{},{:.3},300\n",
            t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
            0.10 + 0.05 * ((h.rem_euclid(24)) as f64 / 24.0)
        ));
    }
    std::fs::write(d.join("prices.csv"), csv).expect("prices");
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\ntick_s = 1\n[store]\nkind = \"embedded\"\npath = \"state.redb\"\n[prices]\nfile = \"prices.csv\"\n[mqtt]\nurl = \"mqtt://127.0.0.1:{mqtt}\"\nmapping = \"mapping.toml\"\nmax_packet_bytes = 1048576\n[http]\nlisten = \"127.0.0.1:{port}\"\n[[http.tokens]]\nname = \"bench\"\nrole = \"viewer\"\ntoken = \"{VIEWER}\"\n"
        ),
    )
    .expect("config");
    (racks, cooling)
}

/// Publishes every rack's inlet and power (500 racks a message) and every cooling
/// unit's supply once a second until `stop`.
fn readings(
    mqtt: u16,
    racks: usize,
    cooling: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut k = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let t = Instant::now();
            let mut racks_lines = Vec::new();
            for chunk in (0..racks).collect::<Vec<_>>().chunks(500) {
                let items: Vec<String> = chunk
                    .iter()
                    .map(|r| {
                        // a few racks run hot in turn, so that rules fire and release
                        let hot = (r + k as usize / 30).is_multiple_of(97);
                        format!(
                            "{{\"rack\":\"r{r}\",\"inlet\":{:.1},\"w\":{}}}",
                            if hot {
                                31.5
                            } else {
                                24.0 + (r % 5) as f64 * 0.5
                            },
                            9000 + (r % 40) * 100
                        )
                    })
                    .collect();
                racks_lines.push(format!("{{\"racks\":[{}]}}", items.join(",")));
            }
            super::publish_to(mqtt, "bench/racks", &racks_lines);
            let units: Vec<String> = (0..cooling)
                .map(|c| format!("{{\"id\":\"c{c}\",\"c\":18.0}}"))
                .collect();
            super::publish_to(
                mqtt,
                "bench/cooling",
                &[format!("{{\"units\":[{}]}}", units.join(","))],
            );
            k += 1;
            std::thread::sleep(Duration::from_secs(1).saturating_sub(t.elapsed()));
        }
    })
}

/// The loop's tick time, s: the mean of every tick since start
/// (the histogram `powerplane_tick_seconds`).
fn tick_figures(metrics: &str) -> String {
    let get = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
    };
    match (
        get("powerplane_tick_seconds_sum"),
        get("powerplane_tick_seconds_count"),
    ) {
        (Some(sum), Some(n)) if n > 0.0 => format!("{n} ticks, mean {:.3} s", sum / n),
        _ => "no tick histogram".into(),
    }
}

pub fn bench_http() {
    let gpus = arg("--gpus", 0);
    let rules = arg("--rules", 0);
    let rate = arg("--rate", 2000) as f64;
    let seconds = arg("--seconds", 20) as u64;
    let connections = arg("--connections", 32).max(1);
    // `--bin PATH`: another build to compare (say, the one before a change)
    let bin = std::env::args()
        .skip_while(|a| a != "--bin")
        .nth(1)
        .map_or_else(
            || workspace_root().join("target/release/powerplane"),
            Into::into,
        );
    assert!(
        bin.exists(),
        "build it first: cargo build --release --bin powerplane ({})",
        bin.display()
    );
    println!("serve: {}", bin.display());
    let dir = tempfile::tempdir().expect("tmp");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut _broker = None;
    let mut publisher = None;
    let paths: &'static [&'static str] = if gpus > 0 {
        let broker = powerplane_tests::Broker::start();
        let (racks, cooling) = write_scaled(dir.path(), port, broker.port, gpus, rules);
        println!(
            "site: {gpus} GPUs in {racks} racks, {cooling} cooling units; {} rules",
            rules + 4
        );
        publisher = Some(readings(broker.port, racks, cooling, stop.clone()));
        _broker = Some(broker);
        &SCALED_PATHS
    } else {
        write_config(dir.path(), port);
        &PATHS
    };
    let mut serve = Command::new(&bin)
        .args(["serve", "--config"])
        .arg(dir.path().join("powerplane.toml"))
        .env("POWERPLANE_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .expect("serve");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let ready = Instant::now() + Duration::from_secs(if gpus > 0 { 300 } else { 20 });
    while rt.block_on(one(port, &mut None, "/api/v1/status")).ok() != Some(200) {
        assert!(Instant::now() < ready, "serve never answered");
        if let Ok(Some(status)) = serve.try_wait() {
            panic!("serve exited before it answered: {status}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(if gpus > 0 { 10 } else { 2 }));
    let (cpu0, _) = proc_usage(serve.id());
    let start = Instant::now() + Duration::from_millis(100);
    let until = start + Duration::from_secs(seconds);
    let tallies: Vec<Tally> = rt.block_on(async {
        // scaled: the request load on the first two paths, `/metrics` scraped beside
        let driven: &'static [&'static str] = if gpus > 0 { &paths[..2] } else { paths };
        let mut tasks: Vec<_> = (0..connections)
            .map(|i| tokio::spawn(driver(port, i, connections, rate, until, start, driven)))
            .collect();
        if gpus > 0 {
            tasks.push(tokio::spawn(scraper(port, 2, until, start)));
        }
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_default());
        }
        out
    });
    let (cpu1, rss_mb) = proc_usage(serve.id());
    let metrics = rt.block_on(async {
        let s = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
        let mut c = BufReader::new(s);
        let req = format!("GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {VIEWER}\r\nConnection: close\r\n\r\n");
        c.get_mut().write_all(req.as_bytes()).await.ok()?;
        let mut all = String::new();
        c.read_to_string(&mut all).await.ok()?;
        Some(all)
    });
    if let Some(m) = &metrics {
        println!(
            "  /metrics: {:.1} MB; the loop: {}",
            m.len() as f64 / 1e6,
            tick_figures(m)
        );
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    if let Some(p) = publisher {
        let _ = p.join();
    }
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let _ = serve.wait();
    report(
        &tallies,
        paths,
        (rate, seconds, connections),
        cpu1 - cpu0,
        rss_mb,
    );
}

fn report(
    tallies: &[Tally],
    paths: &[&str],
    (rate, seconds, connections): (f64, u64, usize),
    cpu_s: f64,
    rss_mb: f64,
) {
    let errors: u64 = tallies.iter().map(|t| t.errors).sum();
    let all: Vec<(usize, Duration)> = tallies
        .iter()
        .flat_map(|t| t.latencies.iter().copied())
        .collect();
    println!(
        "http: {rate} req/s for {seconds} s over {connections} keep-alive connections: {} answered 200, {errors} errors ({:.0} req/s)",
        all.len(),
        all.len() as f64 / seconds as f64
    );
    for (i, path) in paths.iter().enumerate() {
        let mut l: Vec<Duration> = all
            .iter()
            .filter(|(w, _)| *w == i)
            .map(|(_, d)| *d)
            .collect();
        l.sort();
        println!(
            "  {path:<16} n={:>6}  p50 {:>9.3?}  p99 {:>9.3?}  max {:>9.3?}",
            l.len(),
            percentile(&l, 0.50),
            percentile(&l, 0.99),
            l.last().copied().unwrap_or_default()
        );
    }
    println!(
        "  serve: {cpu_s:.1} s of CPU over the run ({:.0}% of one core), peak RSS {rss_mb:.1} MB",
        cpu_s / seconds as f64 * 100.0
    );
}
