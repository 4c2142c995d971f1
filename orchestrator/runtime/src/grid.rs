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
    /// OpenADR 2.0b: sign every payload (XML-DSig) with the mutual-TLS identity
    /// (`tls.client_cert_file`, `tls.client_key_file`).
    #[serde(default)]
    pub xml_signature: bool,
    /// OpenADR 2.0b: the SHA-256 of the certificate the VTN signs with; every VTN
    /// message must then be signed with it.
    #[serde(default)]
    pub vtn_signing_sha256: Option<String>,
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
    #[error("xml_signature and vtn_signing_sha256 are for protocol \"openadr2b\"")]
    Openadr2bOnly,
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
        if (self.xml_signature || self.vtn_signing_sha256.is_some())
            && self.protocol != Some(Protocol::Openadr2b)
        {
            out.push(SectionError::Openadr2bOnly);
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
        c.xml_signature = self.xml_signature;
        c.vtn_signing_sha256 = self.vtn_signing_sha256.clone();
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

/// Why the VEN of `[demand_response]` cannot start.
#[derive(Debug, thiserror::Error)]
pub enum VenStartError {
    #[error(transparent)]
    Openadr3(#[from] sources::openadr3::VenError),
    #[error(transparent)]
    Openadr2b(#[from] sources::openadr2b::VenError),
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
    ) -> Result<(), VenStartError> {
        let meter_w = self.meter_w.clone();
        let meter: sources::openadr2b::MeterFn = Arc::new(move || read_shared(&meter_w));
        let (tx, rx) = tokio::sync::watch::channel(Vec::new());
        let stats = if let Some(cfg) = section.ven3_config() {
            let ven = sources::openadr3::Ven::new(cfg, meter)?;
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
            let ven = sources::openadr2b::Ven::new(cfg, opt, meter)?;
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
#[path = "grid_tests.rs"]
mod tests;
