//! `bench http [--rate R] [--seconds S] [--connections N]`: the release `powerplane
//! serve` on the demo site with `[http]`, driven at R requests per second (half
//! `/metrics`, half `/api/v1/status` with a viewer token) for S seconds over N
//! keep-alive connections, each a tokio task sending on a fixed schedule. Latency is
//! counted from when a request was due (not when it went out), so a stall shows in
//! full; errors are answers other than 200 and broken connections.

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

const PATHS: [&str; 2] = ["/metrics", "/api/v1/status"];

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
) -> Tally {
    let mut tally = Tally::default();
    let mut conn = None;
    for k in 0.. {
        let due = start + Duration::from_secs_f64((k * connections + index) as f64 / rate);
        if due >= until {
            break;
        }
        tokio::time::sleep_until(due.into()).await;
        let which = (k + index) % PATHS.len();
        match one(port, &mut conn, PATHS[which]).await {
            Ok(200) => tally.latencies.push((which, due.elapsed())),
            Ok(_) => tally.errors += 1,
            Err(_) => {
                tally.errors += 1;
                conn = None;
            }
        }
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

pub fn bench_http() {
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
    write_config(dir.path(), port);
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
    let ready = Instant::now() + Duration::from_secs(20);
    while rt.block_on(one(port, &mut None, "/api/v1/status")).ok() != Some(200) {
        assert!(Instant::now() < ready, "serve never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_secs(2));
    let (cpu0, _) = proc_usage(serve.id());
    let start = Instant::now() + Duration::from_millis(100);
    let until = start + Duration::from_secs(seconds);
    let tallies: Vec<Tally> = rt.block_on(async {
        let tasks: Vec<_> = (0..connections)
            .map(|i| tokio::spawn(driver(port, i, connections, rate, until, start)))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap_or_default());
        }
        out
    });
    let (cpu1, rss_mb) = proc_usage(serve.id());
    let _ = Command::new("kill")
        .args(["-TERM", &serve.id().to_string()])
        .status();
    let _ = serve.wait();
    report(&tallies, rate, seconds, connections, cpu1 - cpu0, rss_mb);
}

fn report(tallies: &[Tally], rate: f64, seconds: u64, connections: usize, cpu_s: f64, rss_mb: f64) {
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
    for (i, path) in PATHS.iter().enumerate() {
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
