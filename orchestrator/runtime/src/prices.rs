//! `serve`'s price and carbon edge: the feeds (a file, or a URL fetched every
//! `refresh_s` on the runtime's blocking pool with the credentials its API wants, see
//! [`crate::feed_fetch`]; a failed fetch keeps the last good series), and what the tick
//! takes from them: the price and carbon samples now (the feed while it covers now,
//! else the site's tariff) and the forecast the engine plans with. Each feed's age
//! and fetches are counted for `/metrics` ([`FeedStats`]).

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};

use serde::Deserialize;
use telemetry::metric::names::{CARBON_G_PER_KWH, PRICE_PER_KWH};
use telemetry::prices::Series;
use telemetry::{Sample, Site, Timestamp};
use tracing::{info, warn};

use crate::feed_fetch::{FeedAuth, Fetcher};
use control::feeds::FeedFormat;

/// `[prices]` in `powerplane.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricesSection {
    /// The price feed: by default a CSV with `start,price_per_kwh[,carbon_g_per_kwh]`.
    #[serde(default)]
    pub file: Option<PathBuf>,
    /// Or fetched from here every `refresh_s` (a failed fetch keeps the last series).
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default = "default_refresh")]
    pub refresh_s: f64,
    /// With `url`: the credentials the feed's API takes (see [`FeedAuth`]).
    #[serde(default)]
    pub auth: FeedAuth,
    /// With `url`: how its server is trusted and what the client shows (the `tls` keys
    /// of every outbound client: `ca_file`, `pinned_sha256`, `insecure`,
    /// `client_cert_file`, `client_key_file`).
    #[serde(default)]
    pub tls: sources::tls::Tls,
    /// The feed is stale this long after its last point: the site's tariff applies.
    #[serde(default = "default_stale")]
    pub stale_after_s: f64,
    #[serde(flatten)]
    pub format: FeedFormat,
    /// A carbon-intensity feed of its own (else the `carbon_g_per_kwh` column).
    #[serde(default)]
    pub carbon: Option<CarbonSection>,
}

/// `[prices.carbon]`: a carbon-intensity feed of its own, a file or a URL as the price
/// feed (Electricity Maps, WattTime, a generic CSV or JSON).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarbonSection {
    #[serde(default)]
    pub file: Option<PathBuf>,
    #[serde(default)]
    pub url: Option<String>,
    #[serde(default = "default_refresh")]
    pub refresh_s: f64,
    #[serde(default)]
    pub auth: FeedAuth,
    #[serde(default)]
    pub tls: sources::tls::Tls,
    #[serde(flatten)]
    pub format: FeedFormat,
}

/// A feed's fetches and the age of what it holds, for `/metrics`.
#[derive(Debug, Default)]
pub struct FeedStats {
    /// `price` or `carbon`.
    pub feed: &'static str,
    /// When the feed last gave a good series (Unix ms; 0: never).
    last_ok_ms: AtomicI64,
    ok: AtomicU64,
    failed: AtomicU64,
}

/// What [`FeedStats`] holds now.
#[derive(Debug, Clone, PartialEq)]
pub struct FeedReport {
    pub feed: &'static str,
    /// Since the last good series (from a fetch, or the file at start), s.
    pub age_s: Option<f64>,
    pub fetches_ok: u64,
    pub fetches_failed: u64,
}

impl FeedStats {
    fn new(feed: &'static str) -> Self {
        FeedStats {
            feed,
            ..FeedStats::default()
        }
    }

    fn good(&self, at: Timestamp) {
        self.last_ok_ms.store(at.0, Relaxed);
    }

    pub fn report(&self, now: Timestamp) -> FeedReport {
        let last = self.last_ok_ms.load(Relaxed);
        FeedReport {
            feed: self.feed,
            age_s: (last != 0).then(|| now.secs_since(Timestamp(last)).max(0.0)),
            fetches_ok: self.ok.load(Relaxed),
            fetches_failed: self.failed.load(Relaxed),
        }
    }
}

fn default_refresh() -> f64 {
    3600.0
}
fn default_stale() -> f64 {
    7200.0
}

/// The price and carbon series, shared with the fetching threads.
pub struct Prices {
    feed: Arc<RwLock<(Series, Series)>>,
    stale_after_s: f64,
    /// Where the last tick's price came from: `feed`, `tariff` or `feed (stale)`.
    pub source: &'static str,
    /// The feeds configured, price first.
    stats: Vec<Arc<FeedStats>>,
}

/// One live feed: where, how often, with what, and which half of the series it fills.
struct Live {
    url: String,
    refresh_s: f64,
    auth: FeedAuth,
    tls: sources::tls::Tls,
    format: FeedFormat,
    column: &'static str,
    carbon: bool,
}

impl Prices {
    /// The series loaded with the config and (with `url`s) the fetchers that refresh
    /// them, on the runtime's blocking pool until its shutdown token is cancelled; a
    /// failed fetch keeps the last series.
    pub fn start(
        section: Option<&PricesSection>,
        loaded: Option<(Series, Series)>,
        runtime: &crate::Runtime,
    ) -> Prices {
        let now = common::clock::wall_clock();
        let feed = Arc::new(RwLock::new(loaded.unwrap_or_default()));
        let mut prices = Prices {
            feed: feed.clone(),
            stale_after_s: section.map_or(f64::INFINITY, |p| p.stale_after_s),
            source: "",
            stats: Vec::new(),
        };
        let Some(p) = section else {
            return prices;
        };
        let mut feeds = vec![(
            "price",
            p.file.is_some(),
            p.url.clone().map(|url| Live {
                url,
                refresh_s: p.refresh_s,
                auth: p.auth.clone(),
                tls: p.tls.clone(),
                format: p.format.clone(),
                column: "price_per_kwh",
                carbon: false,
            }),
        )];
        if let Some(c) = &p.carbon {
            feeds.push((
                "carbon",
                c.file.is_some(),
                c.url.clone().map(|url| Live {
                    url,
                    refresh_s: c.refresh_s,
                    auth: c.auth.clone(),
                    tls: c.tls.clone(),
                    format: c.format.clone(),
                    column: "carbon_g_per_kwh",
                    carbon: true,
                }),
            ));
        }
        for (name, from_file, live) in feeds {
            let stats = Arc::new(FeedStats::new(name));
            if from_file {
                stats.good(now);
            }
            prices.stats.push(stats.clone());
            if let Some(live) = live {
                let token = runtime.shutdown.clone();
                let feed = feed.clone();
                runtime.spawn_blocking(move || {
                    fetch_loop(&live, &feed, &stats, &|| !token.is_cancelled())
                });
            }
        }
        prices
    }

    /// Each feed's fetches and age, price first.
    pub fn reports(&self, now: Timestamp) -> Vec<FeedReport> {
        self.stats.iter().map(|s| s.report(now)).collect()
    }

    /// The price and carbon samples at `now` (into `samples`) and the forecast the
    /// engine plans with.
    pub fn tick(
        &mut self,
        site: &Site,
        now: Timestamp,
        samples: &mut Vec<Sample>,
    ) -> policies::Forecast {
        let (price, carbon) = &*self.feed.read().unwrap_or_else(|p| p.into_inner());
        let site_id = site.site_entity();
        // the feed while it covers now; past its last point, the site's tariff
        let fresh = price
            .points()
            .last()
            .is_some_and(|(t, _)| now.secs_since(*t) <= self.stale_after_s)
            && price.at(now).is_some();
        let (value, source) = match (fresh, &site.tariff) {
            (true, _) => (price.at(now), "feed"),
            (false, Some(t)) => (Some(t.at(now, site.timezone).0), "tariff"),
            (false, None) => (price.at(now), "feed (stale)"),
        };
        if source != self.source {
            if source == "feed" {
                info!(source, "price source");
            } else {
                warn!(source, last_point = ?price.points().last().map(|p| p.0), "the price feed is stale or empty");
            }
            self.source = source;
        }
        if let Some(p) = value {
            let mut s = Sample::new(site_id.clone(), PRICE_PER_KWH, p, now, source);
            if source == "feed (stale)" {
                s.quality = telemetry::Quality::Uncertain;
            }
            samples.push(s);
        }
        if let Some(c) = carbon.at(now) {
            samples.push(Sample::new(site_id, CARBON_G_PER_KWH, c, now, "prices"));
        }
        forecast(price, carbon, fresh, site.tariff.as_ref(), site, now)
    }

    /// The feed's next 24 hours, for the API's chart (the feed itself, stale or not).
    pub fn next_24h(&self, now: Timestamp) -> Vec<(Timestamp, f64)> {
        let (price, _) = &*self.feed.read().unwrap_or_else(|p| p.into_inner());
        let horizon = now.plus_secs(24.0 * 3600.0);
        let pts = price.points();
        let from = pts.partition_point(|(t, _)| *t <= now).saturating_sub(1);
        pts[from..]
            .iter()
            .take_while(|(t, _)| *t < horizon)
            .copied()
            .collect()
    }
}

/// Fetches `live` every `refresh_s` while `keep()`: a good series replaces its half
/// of `feed`; a failed fetch (unreachable, refused, an error answer, a document that
/// does not parse) is counted and logged, and the last good series stays.
fn fetch_loop(
    live: &Live,
    feed: &RwLock<(Series, Series)>,
    stats: &FeedStats,
    keep: &dyn Fn() -> bool,
) {
    let every = Duration::from_secs_f64(live.refresh_s);
    let url = &live.url;
    let mut fetcher = match Fetcher::new(url, live.auth.clone(), &live.tls, Duration::from_secs(30))
    {
        Ok(f) => f,
        Err(e) => {
            warn!(feed = stats.feed, url = %url, error = %e, "cannot fetch the feed");
            return;
        }
    };
    while keep() {
        let got = fetcher
            .fetch(chrono::Utc::now())
            .map_err(anyhow::Error::from)
            .and_then(|text| Ok(live.format.read(url, &text, live.column)?));
        match got {
            Ok(series) => {
                info!(feed = stats.feed, url = %url, points = series.points().len(), last = ?series.points().last().map(|p| p.0), "feed fetched");
                let mut f = feed.write().unwrap_or_else(|p| p.into_inner());
                if live.carbon {
                    f.1 = series;
                } else {
                    f.0 = series;
                }
                stats.ok.fetch_add(1, Relaxed);
                stats.good(common::clock::wall_clock());
            }
            Err(e) => {
                stats.failed.fetch_add(1, Relaxed);
                warn!(feed = stats.feed, url = %url, error = %e, "feed fetch failed; keeping the last series");
            }
        }
        let t = Instant::now();
        while keep() && t.elapsed() < every {
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// What the engine plans with: the next 48 hours of the feed while it is fresh, else
/// of the site's tariff (in 15-minute steps, so periods starting at any quarter hour
/// are kept); the carbon series as the feed has it.
fn forecast(
    price: &Series,
    carbon: &Series,
    fresh: bool,
    tariff: Option<&telemetry::tariff::Tariff>,
    site: &telemetry::Site,
    now: Timestamp,
) -> policies::Forecast {
    let horizon = now.plus_secs(48.0 * 3600.0);
    let window = |s: &Series| {
        let pts = s.points();
        let from = pts.partition_point(|(t, _)| *t <= now).saturating_sub(1);
        let kept: Vec<_> = pts[from..]
            .iter()
            .take_while(|(t, _)| *t < horizon)
            .copied()
            .collect();
        // the last step lasts as long as the one before it (hourly feeds: an hour)
        let step = match pts.len() {
            n if n >= 2 => pts[n - 1].0.secs_since(pts[n - 2].0),
            _ => 3600.0,
        };
        policies::StepSeries::new(kept, step)
    };
    let price = match (fresh, tariff) {
        (true, _) | (false, None) => window(price),
        (false, Some(t)) => {
            let start = Timestamp::from_secs((now.as_secs_f64() / 900.0).floor() as i64 * 900);
            let points = (0..192)
                .map(|i| {
                    let at = start.plus_secs(900.0 * i as f64);
                    (at, t.at(at, site.timezone).0)
                })
                .collect();
            policies::StepSeries::new(points, 900.0)
        }
    };
    policies::Forecast {
        price,
        carbon: window(carbon),
        stale: !fresh && tariff.is_none(),
    }
}
