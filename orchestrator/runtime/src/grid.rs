//! `serve`'s demand-response edge (`[demand_response]`): the grid events it knows (a
//! VTN's through the VEN of `protocol`, the operators' posted targets, the file of
//! scheduled targets), and what each tick gives the engine of them: the site readings
//! of the strictest interval in force (see [`control::grid::targets::publish`]). The
//! engine's grid controller meets the target; its memory (the state's `grid`) is what
//! `/metrics`, the API and the VEN's reports show.
//!
//! Nothing here waits on the network: the VEN runs as a task of its own on the runtime
//! and hands its events over a `watch` channel (the newest list wins; nothing queues),
//! so a VTN that hangs delays no tick; the file is reread only when its modification
//! time changes, at most every [`SCHEDULE_CHECK`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Deserialize;
use telemetry::grid::GridEvent;
use telemetry::{Sample, Site, Timestamp};
use tracing::{info, warn};

use control::grid::targets::{self, Book};

/// How often the file of scheduled targets is looked at.
pub const SCHEDULE_CHECK: Duration = Duration::from_secs(5);

/// `[demand_response]` in `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DemandResponseSection {
    /// `openadr2b` or `openadr3`: the VEN that takes a VTN's events; left out, only the
    /// operators' targets (posted, or in `targets_file`).
    #[serde(default)]
    pub protocol: Option<Protocol>,
    /// The VTN's base URL (OpenADR 2.0b: the EiEvent service's parent, e.g.
    /// `https://vtn.example/OpenADR2/Simple/2.0b`).
    #[serde(default)]
    pub vtn_url: Option<String>,
    /// The VEN's name as the utility enrolled it.
    #[serde(default)]
    pub ven_name: Option<String>,
    /// Every call to the VTN ends by this deadline.
    #[serde(default = "default_timeout")]
    pub timeout_s: f64,
    /// How often the VEN polls; left out, as the VTN asks.
    #[serde(default)]
    pub poll_s: Option<f64>,
    /// The longest wait between the VEN's retries after failures.
    #[serde(default = "default_backoff_max")]
    pub backoff_max_s: f64,
    /// How the VTN is trusted and what the VEN shows it (OpenADR 2.0b: mutual TLS with
    /// `client_cert_file` and `client_key_file`).
    #[serde(default)]
    pub tls: sources::tls::Tls,
    /// Scheduled targets an operator edits (`[[targets]]`, see
    /// [`control::grid::targets`]); reread when it changes.
    #[serde(default)]
    pub targets_file: Option<PathBuf>,
    /// Where the targets posted through the API are kept across restarts.
    #[serde(default)]
    pub posted_file: Option<PathBuf>,
    /// What each SIMPLE level sheds, in percent of the baseline.
    #[serde(default = "default_levels")]
    pub levels: BTreeMap<String, f64>,
    /// Opt out of a VTN's event whose target is under what the site can reach without
    /// touching protected work (as the last tick saw it), with that reason (OpenADR
    /// 2.0b; OpenADR 3 has no opt message).
    #[serde(default = "default_true")]
    pub opt_out_when_unreachable: bool,
    /// OpenADR 3: the OAuth 2 client the utility issued, and the file that holds its
    /// secret (read when the configuration is loaded).
    #[serde(default)]
    pub client_id: Option<String>,
    #[serde(default)]
    pub client_secret_file: Option<PathBuf>,
    /// The secret read from `client_secret_file`.
    #[serde(skip)]
    pub client_secret: Option<String>,
    /// OpenADR 3: the token endpoint; left out, the one the VTN names at
    /// `GET /auth/server`.
    #[serde(default)]
    pub token_url: Option<String>,
    /// OpenADR 3: only the events of these programs (by name); left out, all.
    #[serde(default)]
    pub programs: Vec<String>,
    /// OpenADR 3: how often the meter is reported during an event that asks for
    /// reports, seconds.
    #[serde(default = "default_report_s")]
    pub report_s: f64,
    /// OpenADR 3: subscribe to the VTN's MQTT notifier where it offers one (a message
    /// makes the VEN poll at once; polling every `poll_s` goes on beside).
    #[serde(default = "default_true")]
    pub notifications: bool,
}

fn default_report_s() -> f64 {
    60.0
}

/// The VEN's protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Openadr2b,
    Openadr3,
}

fn default_timeout() -> f64 {
    10.0
}

fn default_backoff_max() -> f64 {
    60.0
}

fn default_true() -> bool {
    true
}

fn default_levels() -> BTreeMap<String, f64> {
    telemetry::grid::DEFAULT_LEVELS
        .iter()
        .map(|(k, f)| (k.to_string(), f * 100.0))
        .collect()
}

/// Why `[demand_response]` does not hold together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SectionError {
    #[error("levels maps a SIMPLE level 1, 2 or 3 to a shed in percent (0 < shed <= 100), got {level} = {shed}")]
    Level { level: String, shed: f64 },
    #[error("timeout_s must be within 0.1..=120 and poll_s at least 1 (got {0}, {1:?})")]
    Timing(f64, Option<f64>),
    #[error("protocol {0:?} needs vtn_url and ven_name")]
    Vtn(&'static str),
    #[error("vtn_url, ven_name and poll_s are for a VEN: give protocol too")]
    NoProtocol,
    #[error("{0}")]
    Ven(String),
    #[error("protocol \"openadr3\" needs client_id and client_secret_file")]
    Openadr3Credentials,
    #[error("client_id, client_secret_file, token_url and programs are for protocol \"openadr3\"")]
    Openadr3Only,
}

impl DemandResponseSection {
    /// Every problem of the section, each said once.
    pub fn problems(&self) -> Vec<SectionError> {
        let mut out = Vec::new();
        for (level, shed) in &self.levels {
            let ok = level.parse::<u8>().is_ok_and(|l| (1..=3).contains(&l))
                && shed.is_finite()
                && *shed > 0.0
                && *shed <= 100.0;
            if !ok {
                out.push(SectionError::Level {
                    level: level.clone(),
                    shed: *shed,
                });
            }
        }
        if !(0.1..=120.0).contains(&self.timeout_s) || self.poll_s.is_some_and(|p| p < 1.0) {
            out.push(SectionError::Timing(self.timeout_s, self.poll_s));
        }
        match self.protocol {
            Some(p) if self.vtn_url.is_none() || self.ven_name.is_none() => {
                out.push(SectionError::Vtn(match p {
                    Protocol::Openadr2b => "openadr2b",
                    Protocol::Openadr3 => "openadr3",
                }))
            }
            None if self.vtn_url.is_some() || self.ven_name.is_some() || self.poll_s.is_some() => {
                out.push(SectionError::NoProtocol)
            }
            Some(Protocol::Openadr3) => {
                if self.client_id.is_none() || self.client_secret_file.is_none() {
                    out.push(SectionError::Openadr3Credentials);
                }
                // the secret itself is checked where it is read
                if let Some(Err(e)) = self.ven3_config().map(|c| c.validate()) {
                    use sources::openadr3::{ConfigError, ConfigErrors};
                    let rest: Vec<_> =
                        e.0.into_iter()
                            .filter(|p| *p != ConfigError::Credentials)
                            .collect();
                    if !rest.is_empty() {
                        out.push(SectionError::Ven(ConfigErrors(rest).to_string()));
                    }
                }
            }
            Some(Protocol::Openadr2b) => {
                if let Some(Err(e)) = self.ven_config().map(|c| c.validate()) {
                    out.push(SectionError::Ven(e.to_string()));
                }
            }
            _ => {}
        }
        let openadr3_only = self.client_id.is_some()
            || self.client_secret_file.is_some()
            || self.token_url.is_some()
            || !self.programs.is_empty();
        if openadr3_only && self.protocol != Some(Protocol::Openadr3) {
            out.push(SectionError::Openadr3Only);
        }
        out
    }

    /// Reads `client_secret_file` (relative to `base`).
    pub fn read_secrets(&mut self, base: &Path) -> Result<(), sources::secret::SecretError> {
        if let Some(f) = &self.client_secret_file {
            self.client_secret = Some(sources::secret::read(base, f)?);
        }
        Ok(())
    }

    /// The OpenADR 3 VEN's settings, with `protocol = "openadr3"`, a VTN and a client.
    pub fn ven3_config(&self) -> Option<sources::openadr3::VenConfig> {
        if self.protocol != Some(Protocol::Openadr3) {
            return None;
        }
        let (url, name) = (self.vtn_url.as_ref()?, self.ven_name.as_ref()?);
        let mut c = sources::openadr3::VenConfig::new(
            url,
            name,
            self.client_id.as_deref()?,
            self.client_secret.as_deref().unwrap_or_default(),
        );
        c.token_url = self.token_url.clone();
        c.programs = self.programs.clone();
        c.timeout_s = self.timeout_s;
        c.poll_s = self.poll_s.unwrap_or(c.poll_s);
        c.report_s = self.report_s;
        c.notifications = self.notifications;
        c.backoff_max_s = self.backoff_max_s;
        c.tls = self.tls.clone();
        Some(c)
    }

    /// The OpenADR 2.0b VEN's settings, with `protocol = "openadr2b"` and a VTN.
    pub fn ven_config(&self) -> Option<sources::openadr2b::VenConfig> {
        if self.protocol != Some(Protocol::Openadr2b) {
            return None;
        }
        let (url, name) = (self.vtn_url.as_ref()?, self.ven_name.as_ref()?);
        let mut c = sources::openadr2b::VenConfig::new(url, name);
        c.timeout_s = self.timeout_s;
        c.poll_s = self.poll_s;
        c.backoff_max_s = self.backoff_max_s;
        c.tls = self.tls.clone();
        Some(c)
    }

    /// The levels as (level, shed fraction).
    pub fn level_table(&self) -> Vec<(u8, f64)> {
        self.levels
            .iter()
            .filter_map(|(k, v)| k.parse::<u8>().ok().map(|l| (l, v / 100.0)))
            .collect()
    }
}

/// The events a VEN hands over, and its counters.
pub struct VenLink {
    pub events: tokio::sync::watch::Receiver<Vec<GridEvent>>,
    pub stats: sources::source::Stats,
}

/// The demand-response edge of `serve`.
pub struct Grid {
    /// The operators' posted targets (the API writes them).
    pub book: Arc<Mutex<Book>>,
    schedule_path: Option<PathBuf>,
    schedule: Vec<GridEvent>,
    schedule_seen: Option<SystemTime>,
    schedule_checked: Option<Instant>,
    ven: Option<VenLink>,
    levels: Vec<(u8, f64)>,
    /// The meter's power after the last tick, W (as f64 bits), for the VEN's reports.
    pub meter_w: Arc<AtomicU64>,
    /// The lowest meter power reachable without protected work, W (as f64 bits), for
    /// the VEN's opt decisions.
    pub floor_w: Arc<AtomicU64>,
    /// Whether anything asks for grid readings to be published (a section, or an
    /// operator's target ever posted).
    configured: bool,
    /// The id of the event last published as in force (for its log lines).
    in_force: Option<(String, u32)>,
    /// The intervals in force at the last tick (see [`Grid::due`]).
    last_key: Vec<(String, u32, i64)>,
}

/// Which intervals are in force: (event, modification, interval start).
fn key(events: &[GridEvent], now: Timestamp) -> Vec<(String, u32, i64)> {
    telemetry::grid::in_force(events, now)
        .into_iter()
        .map(|(e, i)| (e.id.clone(), e.modification, i.start.as_millis()))
        .collect()
}

impl Grid {
    /// The edge of `section` (`None`: only the operators' posted targets, kept in
    /// memory); `base` resolves its files.
    pub fn open(
        section: Option<&DemandResponseSection>,
        base: &Path,
    ) -> Result<Grid, targets::FileError> {
        let resolve = |p: &PathBuf| crate::paths::resolve(base, p);
        let book = Book::open(
            section
                .and_then(|s| s.posted_file.as_ref())
                .map(resolve)
                .as_deref(),
        )?;
        let configured = section.is_some() || !book.list.is_empty();
        Ok(Grid {
            book: Arc::new(Mutex::new(book)),
            schedule_path: section.and_then(|s| s.targets_file.as_ref()).map(resolve),
            schedule: Vec::new(),
            schedule_seen: None,
            schedule_checked: None,
            ven: None,
            levels: section.map_or_else(
                || telemetry::grid::DEFAULT_LEVELS.to_vec(),
                DemandResponseSection::level_table,
            ),
            meter_w: Arc::new(AtomicU64::new(f64::NAN.to_bits())),
            floor_w: Arc::new(AtomicU64::new(f64::NAN.to_bits())),
            configured,
            in_force: None,
            last_key: Vec::new(),
        })
    }

    /// Takes the events of a running VEN.
    pub fn link(&mut self, ven: VenLink) {
        self.ven = Some(ven);
    }

    /// Starts the VEN of `section`'s `protocol` on `runtime`: it reports the meter
    /// after each tick; the OpenADR 2.0b one opts out of an event whose target is under
    /// what the site can reach without protected work (as the last tick in an event saw
    /// it) where `opt_out_when_unreachable` says so.
    pub fn start_ven(
        &mut self,
        section: &DemandResponseSection,
        runtime: &crate::Runtime,
    ) -> Result<(), String> {
        let meter_w = self.meter_w.clone();
        let meter: sources::openadr2b::MeterFn = Arc::new(move || read_shared(&meter_w));
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        let stats = if let Some(cfg) = section.ven3_config() {
            let ven = sources::openadr3::Ven::new(cfg, meter).map_err(|e| e.to_string())?;
            info!(what = %ven.describe(), "OpenADR 3 VEN starting");
            let stats = ven.stats();
            runtime.spawn(ven.run(runtime.shutdown.clone(), tx));
            stats
        } else if let Some(cfg) = section.ven_config() {
            let (meter_w, floor_w) = (self.meter_w.clone(), self.floor_w.clone());
            let levels = self.levels.clone();
            let opt_out = section.opt_out_when_unreachable;
            let opt: sources::openadr2b::OptFn = Arc::new(move |e: &GridEvent| {
                opt_for(
                    e,
                    opt_out,
                    read_shared(&meter_w),
                    read_shared(&floor_w),
                    &levels,
                )
            });
            let ven = sources::openadr2b::Ven::new(cfg, opt, meter).map_err(|e| e.to_string())?;
            info!(what = %ven.describe(), "OpenADR 2.0b VEN starting");
            let stats = ven.stats();
            runtime.spawn(ven.run(runtime.shutdown.clone(), tx));
            stats
        } else {
            return Ok(());
        };
        self.link(VenLink { events: rx, stats });
        self.configured = true;
        Ok(())
    }

    /// The VEN's counters, where one runs.
    pub fn ven_stats(&self) -> Option<&sources::source::Stats> {
        self.ven.as_ref().map(|v| &v.stats)
    }

    /// Every event known now, with its status at `now`: the VTN's, the posted ones and
    /// the scheduled ones.
    pub fn events(&self, now: Timestamp) -> Vec<GridEvent> {
        let mut out: Vec<GridEvent> = Vec::new();
        if let Some(v) = &self.ven {
            out.extend(v.events.borrow().iter().cloned());
        }
        out.extend(
            self.book
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .list
                .iter()
                .cloned()
                .map(|e| targets::with_status(e, now)),
        );
        out.extend(
            self.schedule
                .iter()
                .cloned()
                .map(|e| targets::with_status(e, now)),
        );
        out
    }

    /// One tick: the schedule reread where it changed, the posted targets over dropped,
    /// and the site readings of the event in force pushed onto `samples`. `baseline_w`
    /// is what the strictest interval is chosen against (the engine's baseline during
    /// an event, else the meter now). Returns every event known (see [`Grid::events`]),
    /// for the store's record.
    pub fn tick(
        &mut self,
        site: &Site,
        baseline_w: f64,
        now: Timestamp,
        samples: &mut Vec<Sample>,
    ) -> Vec<GridEvent> {
        self.reread_schedule(now);
        {
            let mut book = self.book.lock().unwrap_or_else(|p| p.into_inner());
            if !book.list.is_empty() {
                self.configured = true;
            }
            if book.expire(now) {
                if let Err(e) = book.save() {
                    warn!(error = %e, "cannot save the posted grid targets");
                }
            }
        }
        if !self.configured {
            return Vec::new();
        }
        let events = self.events(now);
        self.last_key = key(&events, now);
        let (published, event) = targets::publish(site, &events, &self.levels, baseline_w, now);
        let seen = event.map(|e| (e.id.clone(), e.modification));
        if seen != self.in_force {
            match event {
                Some(e) => {
                    info!(event = %e.id, source = %e.source, modification = e.modification, "grid event in force")
                }
                None => info!("no grid event in force"),
            }
            self.in_force = seen;
        }
        samples.extend(published);
        events
    }

    /// Whether what is in force changed since the last tick (an event started, ended,
    /// was modified, cancelled or posted): the loop evaluates at once rather than at
    /// its next tick, so that a grid event's caps go out within the loop's step.
    pub fn due(&self, now: Timestamp) -> bool {
        self.configured && key(&self.events(now), now) != self.last_key
    }

    /// After a tick: the meter and the floor the engine saw, for the VEN.
    pub fn saw(&self, meter_w: Option<f64>, floor_w: Option<f64>) {
        self.meter_w
            .store(meter_w.unwrap_or(f64::NAN).to_bits(), Relaxed);
        self.floor_w
            .store(floor_w.unwrap_or(f64::NAN).to_bits(), Relaxed);
    }

    fn reread_schedule(&mut self, now: Timestamp) {
        let Some(path) = &self.schedule_path else {
            return;
        };
        if self
            .schedule_checked
            .is_some_and(|t| t.elapsed() < SCHEDULE_CHECK)
        {
            return;
        }
        self.schedule_checked = Some(Instant::now());
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        if modified.is_some() && modified == self.schedule_seen {
            return;
        }
        self.schedule_seen = modified;
        match targets::read_schedule(path, now) {
            Ok(s) => {
                info!(file = %path.display(), targets = s.len(), "grid targets read");
                self.schedule = s;
            }
            Err(e) => warn!(error = %e, "grid targets file refused; the last good schedule holds"),
        }
    }
}

/// In or out of a VTN's event: out (with the reason) when `opt_out` and its lowest
/// target, against the meter now, is under the floor the controller last estimated;
/// in otherwise (the floor is known only during an event: outside one, the VEN opts
/// in and the controller reports any shortfall).
pub fn opt_for(
    e: &GridEvent,
    opt_out: bool,
    meter_w: Option<f64>,
    floor_w: Option<f64>,
    levels: &[(u8, f64)],
) -> sources::openadr2b::Opt {
    use sources::openadr2b::Opt;
    let (Some(meter), Some(floor)) = (meter_w, floor_w) else {
        return Opt::In;
    };
    if !opt_out {
        return Opt::In;
    }
    let lowest = e
        .intervals
        .iter()
        .filter_map(|i| telemetry::grid::target_w(&i.target, meter, levels))
        .min_by(f64::total_cmp);
    match lowest {
        Some(t) if t < floor => Opt::Out {
            reason: format!(
                "the site reaches {:.1} kW at best without protected work; the event asks {:.1} kW",
                floor / 1000.0,
                t / 1000.0
            ),
        },
        _ => Opt::In,
    }
}

/// A meter reading shared as f64 bits (`NaN`: none).
pub fn read_shared(w: &AtomicU64) -> Option<f64> {
    let v = f64::from_bits(w.load(Relaxed));
    v.is_finite().then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SITE: &str = "version = 1\n[site]\nname = \"t\"\n[[feeds]]\nid = \"f\"\nrating_kw = 30\n[[cooling]]\nid = \"c\"\ncapacity_kw = 30\nracks = [\"r1\"]\n[[rooms]]\nid = \"h\"\n[[rows]]\nid = \"w\"\nroom = \"h\"\n[[racks]]\nid = \"r1\"\nrow = \"w\"\npower_budget_kw = 10\nnodes = 1\ngpus_per_node = 2\ngpu_model = \"A40\"\n";

    fn section(toml: &str) -> DemandResponseSection {
        toml::from_str(toml).expect("section")
    }

    #[test]
    fn an_event_under_the_reachable_floor_is_opted_out_with_the_reason() {
        use sources::openadr2b::Opt;
        let e = GridEvent {
            id: "e".into(),
            source: "openadr2b".into(),
            modification: 0,
            status: telemetry::grid::EventStatus::Pending,
            intervals: vec![telemetry::grid::GridInterval {
                start: Timestamp::from_secs(0),
                duration_s: 3600.0,
                target: telemetry::grid::GridTarget::ShedFraction(0.5),
            }],
            program: String::new(),
        };
        let levels = [(1, 0.1)];
        // 100 kW now, half asked: 50 kW against a floor of 60 kW
        match opt_for(&e, true, Some(100_000.0), Some(60_000.0), &levels) {
            Opt::Out { reason } => assert!(reason.contains("60.0 kW at best"), "{reason}"),
            Opt::In => panic!("opted in under the floor"),
        }
        assert_eq!(
            opt_for(&e, true, Some(100_000.0), Some(40_000.0), &levels),
            Opt::In
        );
        assert_eq!(
            opt_for(&e, false, Some(100_000.0), Some(60_000.0), &levels),
            Opt::In
        );
        assert_eq!(opt_for(&e, true, Some(100_000.0), None, &levels), Opt::In);
    }

    #[test]
    fn the_section_says_every_problem() {
        let s = section("protocol = \"openadr2b\"\ntimeout_s = 0\nlevels = { 4 = 10, 1 = 150 }\n");
        let p = s.problems();
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.contains(&SectionError::Vtn("openadr2b")));
        assert!(section("ven_name = \"v\"\n").problems() == vec![SectionError::NoProtocol]);
        assert!(section("").problems().is_empty());
        assert_eq!(
            section("").level_table(),
            vec![(1, 0.1), (2, 0.25), (3, 0.5)]
        );
    }

    #[test]
    fn an_openadr3_section_needs_its_client_and_reads_its_secret_file() {
        let base =
            "protocol = \"openadr3\"\nvtn_url = \"https://vtn/openadr3\"\nven_name = \"site-a\"\n";
        assert_eq!(
            section(base).problems(),
            vec![SectionError::Openadr3Credentials]
        );
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(dir.path().join("secret"), "s3cret\n").expect("secret");
        let mut s = section(&format!(
            "{base}client_id = \"site-a\"\nclient_secret_file = \"secret\"\nprograms = [\"ers-10\"]\npoll_s = 5\nreport_s = 30\nnotifications = false\n"
        ));
        s.read_secrets(dir.path()).expect("read");
        assert!(s.problems().is_empty(), "{:?}", s.problems());
        let c = s.ven3_config().expect("openadr3");
        assert_eq!(
            (c.client_id.as_str(), c.client_secret.as_str()),
            ("site-a", "s3cret")
        );
        assert_eq!((c.poll_s, c.report_s, c.notifications), (5.0, 30.0, false));
        assert_eq!(c.programs, vec!["ers-10".to_string()]);
        assert!(s.ven_config().is_none(), "no 2.0b VEN");
        // a missing secret file is named
        let mut m = section(&format!(
            "{base}client_id = \"a\"\nclient_secret_file = \"nope\"\n"
        ));
        let e = m.read_secrets(dir.path()).expect_err("missing");
        assert!(e.to_string().contains("nope"), "{e}");
        // OpenADR 3's keys with another protocol, and a bad report period
        let p = section(
            "protocol = \"openadr2b\"\nvtn_url = \"https://vtn\"\nven_name = \"v\"\nclient_id = \"c\"\n",
        )
        .problems();
        assert_eq!(p, vec![SectionError::Openadr3Only]);
        let mut r = section(&format!(
            "{base}client_id = \"site-a\"\nclient_secret_file = \"secret\"\nreport_s = 0\n"
        ));
        r.read_secrets(dir.path()).expect("read");
        let p = r.problems();
        assert!(
            matches!(p.as_slice(), [SectionError::Ven(m)] if m.contains("report_s")),
            "{p:?}"
        );
    }

    #[test]
    fn scheduled_targets_are_published_in_their_window_and_reread_when_changed() {
        let dir = tempfile::tempdir().expect("dir");
        let file = dir.path().join("targets.toml");
        std::fs::write(
            &file,
            "[[targets]]\nid = \"peak\"\nstart = \"2026-07-01T14:00:00Z\"\nduration_min = 60\nshed_pct = 20\n",
        )
        .expect("write");
        let s = section("targets_file = \"targets.toml\"\n");
        let mut g = Grid::open(Some(&s), dir.path()).expect("open");
        let site = Site::parse("t.toml", SITE).expect("site");
        let start = Timestamp::parse_rfc3339("2026-07-01T14:00:00Z").expect("time");
        let mut out = Vec::new();
        g.tick(&site, 10_000.0, start.plus_secs(-60.0), &mut out);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].value, 0.0, "before the window: no event");
        out.clear();
        g.schedule_checked = None;
        g.tick(&site, 10_000.0, start.plus_secs(60.0), &mut out);
        let active = out
            .iter()
            .find(|x| x.metric.as_str() == "grid_event_active");
        assert_eq!(active.map(|x| x.value), Some(1.0));
        assert!(out
            .iter()
            .any(|x| x.metric.as_str() == "grid_shed_fraction" && (x.value - 0.2).abs() < 1e-12));
        // a bad edit keeps the last good schedule
        std::fs::write(&file, "[[targets]]\nduration_min = 60\nshed_pct = 20\n").expect("write");
        let later = SystemTime::now() + Duration::from_secs(5);
        let f = std::fs::File::options()
            .write(true)
            .open(&file)
            .expect("open");
        f.set_modified(later).expect("mtime");
        g.schedule_checked = None;
        out.clear();
        g.tick(&site, 10_000.0, start.plus_secs(120.0), &mut out);
        assert!(out
            .iter()
            .any(|x| x.metric.as_str() == "grid_event_active" && x.value == 1.0));
        assert_eq!(g.events(start).len(), 1);
    }

    #[test]
    fn without_a_section_nothing_is_published_until_a_target_is_posted() {
        let dir = tempfile::tempdir().expect("dir");
        let mut g = Grid::open(None, dir.path()).expect("open");
        let site = Site::parse("t.toml", SITE).expect("site");
        let now = Timestamp::from_secs(1_790_000_000);
        let mut out = Vec::new();
        g.tick(&site, 10_000.0, now, &mut out);
        assert!(out.is_empty());
        let spec: targets::TargetSpec =
            serde_json::from_str(r#"{"duration_min": 30, "cap_kw": 7}"#).expect("spec");
        let e = {
            let mut b = g.book.lock().expect("book");
            let id = b.next_id();
            b.post(spec.event("api", id, now, false).expect("valid"))
        };
        assert_eq!(e.id, "t1");
        g.tick(&site, 10_000.0, now.plus_secs(1.0), &mut out);
        assert!(out
            .iter()
            .any(|x| x.metric.as_str() == "grid_cap_w" && x.value == 7000.0));
    }
}
