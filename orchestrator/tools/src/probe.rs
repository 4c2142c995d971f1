//! `powerplane telemetry probe`: what an operator runs to see what powerplane sees.
//!
//! It connects to the sources given on the command line, collects for a while, and
//! prints the latest value of every metric of every entity with its unit, age, source
//! and quality (or, with `--json`, one sample per line as it arrives), and every
//! rejected input with its reason. For each Redfish endpoint it then surveys the whole
//! tree (`sources::redfish::survey`) and ends with the readings it found there and every
//! resource whose numeric readings it did not understand.

use std::collections::BTreeMap;
use std::io::Write;
use std::time::{Duration, Instant};

use anyhow::Result;
use sources::mqtt::{Event, MqttConfig, MqttSource};
use sources::redfish::survey::{survey_blocking, Survey};
use sources::redfish::{EndpointConfig, Polled, Poller, RedfishError};
use telemetry::mapping::Mapping;
use telemetry::snapshot::Snapshot;
use telemetry::Timestamp;

pub struct ProbeArgs {
    pub mqtt: Option<MqttConfig>,
    pub mapping: Option<Mapping>,
    pub redfish: Vec<EndpointConfig>,
    /// Seconds between two Redfish polls.
    pub redfish_interval_s: f64,
    pub seconds: f64,
    pub json: bool,
}

/// What the probe saw.
#[derive(Debug, Default)]
pub struct Seen {
    pub snapshot: Snapshot,
    pub messages: u64,
    pub rejects: BTreeMap<String, (u64, String)>,
    /// The survey of each Redfish endpoint that answered.
    pub surveys: Vec<Survey>,
    /// Endpoints that could not be read at all, with why.
    pub unreachable: Vec<String>,
}

impl Seen {
    fn reject(&mut self, reason: &str, detail: String) {
        let e = self
            .rejects
            .entry(reason.to_string())
            .or_insert((0, detail));
        e.0 += 1;
    }
}
/// The time now, from the system clock (the agent crate's clock).
use common::wall_clock;

/// Runs the probe; samples (with `--json`) go to `out`, status lines to `err`.
pub fn run(args: ProbeArgs, out: &mut dyn Write, err: &mut dyn Write) -> Result<Seen> {
    let mut seen = Seen::default();
    let deadline = Instant::now() + Duration::from_secs_f64(args.seconds);
    let bound = args.redfish.clone();
    let interval = Duration::from_secs_f64(args.redfish_interval_s.max(1.0));
    let redfish = start_redfish(args.redfish, interval, deadline, err)?;
    if let Some(cfg) = args.mqtt {
        let mapping = args.mapping.ok_or_else(|| {
            anyhow::anyhow!("--mqtt needs --mapping FILE: how to turn messages into samples")
        })?;
        listen_mqtt(cfg, mapping, deadline, &mut seen, args.json, out, err)?;
    }
    if let Some(h) = redfish {
        let (polled, surveys) = h
            .join()
            .map_err(|_| anyhow::anyhow!("the redfish poller panicked"))?;
        for s in surveys {
            match s {
                Ok(s) => seen.surveys.push(s),
                Err(e) => seen.unreachable.push(e.to_string()),
            }
        }
        for p in polled {
            take_poll(p, &bound, &mut seen, args.json, out, err)?;
        }
    }
    Ok(seen)
}

/// What the Redfish thread hands back: every poll, and each endpoint's survey (or
/// why it could not be read).
type RedfishRun = std::thread::JoinHandle<(Vec<Polled>, Vec<Result<Survey, RedfishError>>)>;

/// Polls the Redfish endpoints every `interval` until `deadline` on a thread, then
/// surveys each; `None` without endpoints.
fn start_redfish(
    endpoints: Vec<EndpointConfig>,
    interval: Duration,
    deadline: Instant,
    err: &mut dyn Write,
) -> Result<Option<RedfishRun>> {
    if endpoints.is_empty() {
        return Ok(None);
    }
    for e in &endpoints {
        refuse_a_path(&e.url)?;
        writeln!(err, "probe: redfish {} ({})", e.url, e.name)?;
    }
    let configs = endpoints.clone();
    let mut poller = Poller::new(endpoints, 16)?;
    Ok(Some(std::thread::spawn(move || {
        let mut all: Vec<Polled> = Vec::new();
        loop {
            let started = Instant::now();
            all.extend(poller.poll(wall_clock()));
            let next = started + interval;
            if next >= deadline {
                break;
            }
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        let surveys: Vec<_> = configs.into_iter().map(survey_blocking).collect();
        (all, surveys)
    })))
}

/// Takes the broker's messages until `deadline`.
fn listen_mqtt(
    cfg: MqttConfig,
    mapping: Mapping,
    deadline: Instant,
    seen: &mut Seen,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    let mut source = MqttSource::new(cfg.clone(), mapping)?;
    writeln!(
        err,
        "probe: mqtt {} subscribing to {}",
        cfg.url,
        source.filters().join(", ")
    )?;
    let keep_going = || Instant::now() < deadline;
    let mut io_error = None;
    source.run(&keep_going, &wall_clock, &mut |ev| {
        let r = handle(ev, seen, json, out, err);
        if let Err(e) = r {
            io_error.get_or_insert(e);
        }
    });
    if let Some(e) = io_error {
        return Err(e.into());
    }
    Ok(())
}

/// One Redfish poll, taken as a message would be (but not counted as one).
fn take_poll(
    p: Polled,
    bound: &[EndpointConfig],
    seen: &mut Seen,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<()> {
    if let Some(e) = &p.error {
        writeln!(err, "probe: redfish {}: {e}", p.endpoint)?;
    }
    if p.discovery {
        write!(err, "{}", bindings_summary(bound, &p))?;
    }
    let decoded = telemetry::mapping::Decoded {
        samples: p.samples,
        rejects: p.rejects,
        dead: Vec::new(),
        rebirth: None,
    };
    handle(
        Event::Message {
            topic: String::new(),
            bytes: 0,
            decoded,
        },
        seen,
        json,
        out,
        err,
    )?;
    seen.messages -= 1; // a poll is not a message
    Ok(())
}

/// What each site binding of an endpoint took in a discovery (`--config` with a site
/// that has `[[redfish]]` entries): its value, or why it has none.
fn bindings_summary(configs: &[EndpointConfig], p: &Polled) -> String {
    use sources::redfish::bind::Outcome;
    use std::fmt::Write as _;
    let mut t = String::new();
    let Some(cfg) = configs.iter().find(|c| c.name == p.endpoint) else {
        return t;
    };
    for r in &p.bindings {
        let Some(b) = cfg.bind.get(r.index) else {
            continue;
        };
        let what = match &r.outcome {
            Outcome::Value { value, .. } => format!("= {value:.3}"),
            Outcome::Nothing => "no reading".to_string(),
            Outcome::Ambiguous(n) => format!("{n} readings and no combine"),
        };
        let _ = writeln!(
            t,
            "probe: redfish {}: {} {} {} {what}",
            p.endpoint, b.at, b.entity, b.metric
        );
    }
    t
}

/// A Redfish URL is the base (`https://10.1.2.3`): the service root `/redfish/v1` and
/// every resource are found from there, so a URL with a path is refused, not guessed at.
fn refuse_a_path(url: &str) -> Result<()> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let path = rest.split_once('/').map_or("", |(_, p)| p);
    anyhow::ensure!(
        path.trim_matches('/').is_empty(),
        "--redfish {url}: give the base url without a path (e.g. {}); the service root /redfish/v1 and every resource are found from there",
        url.split_once("://")
            .map(|(s, r)| format!("{s}://{}", r.split('/').next().unwrap_or(r)))
            .unwrap_or_else(|| url.to_string())
    );
    Ok(())
}

fn handle(
    ev: Event,
    seen: &mut Seen,
    json: bool,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> std::io::Result<()> {
    match ev {
        Event::Connected => writeln!(err, "probe: connected"),
        Event::Disconnected { error, retry_in } => writeln!(
            err,
            "probe: disconnected ({error}); retrying in {:.1} s",
            retry_in.as_secs_f64()
        ),
        Event::Message { decoded, .. } => {
            seen.messages += 1;
            let now = wall_clock();
            for r in decoded.rejects {
                if json {
                    writeln!(err, "rejected: {}: {}", r.reason, r.detail)?;
                }
                seen.reject(r.reason, r.detail);
            }
            for e in &decoded.dead {
                seen.snapshot.mark_bad(e);
                writeln!(
                    err,
                    "probe: {e}: its Sparkplug node or device died; readings marked bad"
                )?;
            }
            for s in decoded.samples {
                let line = json.then(|| serde_json::to_string(&s));
                match seen.snapshot.ingest(s, now) {
                    Ok(_) => {
                        if let Some(Ok(l)) = line {
                            writeln!(out, "{l}")?;
                        }
                    }
                    Err(e) => {
                        if json {
                            writeln!(err, "rejected: {}: {e}", e.reason())?;
                        }
                        seen.reject(e.reason(), e.to_string());
                    }
                }
            }
            Ok(())
        }
    }
}

/// The table of what was seen, as of `now`.
pub fn table(seen: &Seen, now: Timestamp) -> String {
    use std::fmt::Write as _;
    let mut rows: Vec<[String; 7]> = Vec::new();
    for s in seen.snapshot.samples() {
        let o = seen.snapshot.observe(&s.entity, s.metric.as_str(), now);
        let age = o
            .map(|o| format!("{:.1} s{}", o.age_s, if o.stale { " STALE" } else { "" }))
            .unwrap_or_default();
        rows.push([
            s.entity.to_string(),
            s.metric.to_string(),
            format!("{:.3}", s.value),
            s.unit.to_string(),
            age,
            s.source.to_string(),
            format!("{:?}", s.quality).to_lowercase(),
        ]);
    }
    let head = [
        "ENTITY", "METRIC", "VALUE", "UNIT", "AGE", "SOURCE", "QUALITY",
    ];
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut t = String::new();
    let line = |t: &mut String, cells: &[&str]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if i == 2 {
                    format!("{c:>w$}", w = w[i])
                } else {
                    format!("{c:<w$}", w = w[i])
                }
            })
            .collect();
        let _ = writeln!(t, "{}", parts.join("  ").trim_end());
    };
    line(&mut t, &head);
    for r in &rows {
        line(&mut t, &r.iter().map(String::as_str).collect::<Vec<_>>());
    }
    let _ = writeln!(t, "\n{} messages, {} readings", seen.messages, rows.len());
    if !seen.rejects.is_empty() {
        let _ = writeln!(t, "rejected:");
        for (reason, (n, example)) in &seen.rejects {
            let _ = writeln!(t, "  {reason:<18} {n:>6}  e.g. {example}");
        }
    }
    for s in &seen.surveys {
        t.push_str(&survey_table(s));
    }
    t
}

/// One endpoint's survey: every distinct reading, then what it did not understand.
pub fn survey_table(s: &Survey) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(
        t,
        "\nredfish {}: {} readings mapped in {} resources ({} GETs{})",
        s.endpoint,
        s.readings.len(),
        s.resources,
        s.requests,
        if s.truncated { ", crawl cut short" } else { "" }
    );
    for r in s.readings.values() {
        let window = r.window.map(|w| format!(" ({w})")).unwrap_or_default();
        let _ = writeln!(
            t,
            "  {:<18} {:>14.3} {:<6} {}{window}",
            r.metric, r.value, r.unit, r.key
        );
    }
    for (path, unknown) in &s.not_understood {
        let _ = writeln!(
            t,
            "  not understood: {path}: {} numeric properties",
            unknown.len()
        );
    }
    for f in &s.failed {
        let _ = writeln!(t, "  failed: {f}");
    }
    t
}

/// The closing lines for stderr: per endpoint, readings mapped and not understood.
pub fn survey_summary(seen: &Seen) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    for s in &seen.surveys {
        let _ = writeln!(
            t,
            "probe: redfish {}: {} readings mapped, {} resources not understood",
            s.endpoint,
            s.readings.len(),
            s.not_understood.len()
        );
        for (path, unknown) in &s.not_understood {
            let _ = writeln!(
                t,
                "probe: redfish {}: not understood: {path}: {} numeric properties",
                s.endpoint,
                unknown.len()
            );
        }
    }
    for u in &seen.unreachable {
        let _ = writeln!(t, "probe: unreachable: {u}");
    }
    t
}
