//! `bench redfish --bmcs N --delay-ms D [--interval-s S] [--concurrency C]
//! [--per-endpoint P] [--steady K]`: the async Redfish poller over N simulated BMCs (the
//! DMTF rack-PDU mockup from `tests/fixtures`, served from memory by a tokio listener
//! in this process, every GET answered after D ms, BMC `i` under `/bmc/{i}`), polled
//! every S s until every BMC is discovered and K steady-state polls have run. Prints
//! per poll when the last endpoint read in it delivered, that time over the ideal (D ×
//! the longest chain of dependent GETs of one endpoint, measured first with one BMC and
//! no limits), when the poll ended, requests/s and RSS. Exits non-zero when a
//! steady-state poll misses the interval.

use std::time::{Duration, Instant};

use powerplane_tests::mock_bmc::MockBmcs;
use powerplane_tests::workspace_root;
use sources::redfish::{EndpointConfig, Options, Poller};
use telemetry::Timestamp;

use super::arg;

fn rss_mb(field: &str) -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn wall() -> Timestamp {
    Timestamp::from(chrono::Utc::now())
}

/// The longest chains of dependent GETs (discovery, steady state) of one endpoint:
/// one BMC polled alone without limits, its poll times over the delay.
fn chains(rt: &tokio::runtime::Runtime, bmcs: &MockBmcs, delay: Duration) -> (u32, u32) {
    let opts = Options {
        concurrency: 10_000,
        per_endpoint: 10_000,
        ..Options::default()
    };
    let mut p = Poller::with_options(vec![EndpointConfig::new("calibrate", &bmcs.url(0))], opts)
        .expect("poller");
    rt.block_on(async {
        let t = Instant::now();
        let first = p.poll_async(wall()).await;
        let d = t.elapsed();
        let t = Instant::now();
        let second = p.poll_async(wall()).await;
        let s = t.elapsed();
        assert!(
            first[0].error.is_none() && second[0].error.is_none(),
            "the mock BMC does not answer: {:?}",
            first[0].error
        );
        let steps = |x: Duration| (x.as_secs_f64() / delay.as_secs_f64()).floor().max(1.0) as u32;
        (steps(d), steps(s))
    })
}

pub fn run() {
    let n = arg("--bmcs", 2000);
    let delay = Duration::from_millis(arg("--delay-ms", 300) as u64);
    let interval = Duration::from_secs(arg("--interval-s", 10) as u64);
    let concurrency = arg("--concurrency", 2048);
    let per_endpoint = arg("--per-endpoint", 4);
    let steady_polls = arg("--steady", 3);
    let dir = workspace_root().join("tests/fixtures/redfish/public-pdu");
    let bmcs = MockBmcs::start(&dir, n, delay, 2);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let (disc_chain, steady_chain) = chains(&rt, &bmcs, delay);
    let ideal_disc = delay * disc_chain;
    let ideal_steady = delay * steady_chain;
    println!(
        "redfish: {n} simulated BMCs (DMTF rack-PDU mockup), {} ms per GET, concurrency {concurrency}, per endpoint {per_endpoint}, interval {} s",
        delay.as_millis(),
        interval.as_secs()
    );
    println!(
        "  ideal: discovery {:.1} s ({disc_chain} dependent GETs), steady state {:.1} s ({steady_chain})",
        ideal_disc.as_secs_f64(),
        ideal_steady.as_secs_f64()
    );
    let configs = (0..n)
        .map(|i| EndpointConfig::new(&format!("pdu{i}"), &bmcs.url(i)))
        .collect();
    let mut poller = Poller::with_options(
        configs,
        Options {
            concurrency,
            per_endpoint,
            ..Options::default()
        },
    )
    .expect("poller");
    poller.interval = Some(interval);
    let started = Instant::now();
    let (mut discovered, mut steady, mut missed) = (0usize, 0usize, 0usize);
    let mut all_discovered_at = None;
    for round in 1..=60 {
        let t = Instant::now();
        let before = bmcs.total_requests();
        // when the last endpoint read in this poll delivered its readings
        let mut read_in = Duration::ZERO;
        let r = rt.block_on(poller.poll_streaming(wall(), |p| {
            if p.error.is_none() && !p.deferred && !p.skipped {
                read_in = t.elapsed();
            }
        }));
        let whole = t.elapsed();
        let took = read_in;
        let gets = bmcs.total_requests() - before;
        discovered += r
            .iter()
            .filter(|p| p.discovery && !p.deferred && p.error.is_none())
            .count();
        let read = r
            .iter()
            .filter(|p| p.error.is_none() && !p.deferred && !p.skipped)
            .count();
        let waiting = r.iter().filter(|p| p.deferred).count();
        let failed = r.iter().filter(|p| p.error.is_some()).count();
        let overrun = r.iter().filter(|p| p.overrun).count();
        let is_steady = read == n && r.iter().all(|p| !p.discovery);
        let kind = if is_steady { "steady" } else { "discovery" };
        let ideal = if is_steady { ideal_steady } else { ideal_disc };
        if is_steady && whole > interval {
            missed += 1;
        }
        println!(
            "  poll {round:>2} {kind:<9}: read in {:>6.3} s = {:>5.1}x ideal (poll over at {:>6.3} s), {gets:>6} GETs, {:>6.0} req/s, {read} read, {waiting} discovering, {failed} failed, {overrun} cut off, RSS {:.0} MB",
            took.as_secs_f64(),
            took.as_secs_f64() / ideal.as_secs_f64(),
            whole.as_secs_f64(),
            gets as f64 / whole.as_secs_f64(),
            rss_mb("VmRSS:")
        );
        if discovered >= n && all_discovered_at.is_none() {
            all_discovered_at = Some(started.elapsed());
        }
        if is_steady {
            steady += 1;
            if steady >= steady_polls {
                break;
            }
        }
        std::thread::sleep(interval.saturating_sub(t.elapsed()));
    }
    match all_discovered_at {
        Some(d) => println!(
            "  every BMC discovered after {:.1} s = {:.1}x ideal",
            d.as_secs_f64(),
            d.as_secs_f64() / ideal_disc.as_secs_f64()
        ),
        None => println!("  NOT every BMC discovered ({discovered} of {n})"),
    }
    let ok = missed == 0 && steady >= steady_polls;
    let verdict = if ok {
        "every steady-state poll inside the interval"
    } else {
        "a steady-state poll MISSED the interval (or too few steady polls)"
    };
    println!(
        "  {steady} steady-state polls: {verdict}; peak RSS {:.0} MB (poller and mock BMCs in one process)",
        rss_mb("VmHWM:")
    );
    if !ok {
        std::process::exit(1);
    }
}
