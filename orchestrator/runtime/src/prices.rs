//! `serve`'s price and carbon edge: the feed (a file, or a URL fetched every
//! `refresh_s` on the runtime's blocking pool), and what the tick takes from it: the price and
//! carbon samples now (the feed while it covers now, else the site's tariff) and the
//! forecast the engine plans with.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use serde::Deserialize;
use telemetry::metric::names::{CARBON_G_PER_KWH, PRICE_PER_KWH};
use telemetry::prices::Series;
use telemetry::{Sample, Site, Timestamp};
use tracing::{info, warn};

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

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CarbonSection {
    pub file: PathBuf,
    #[serde(flatten)]
    pub format: FeedFormat,
}

fn default_refresh() -> f64 {
    3600.0
}
fn default_stale() -> f64 {
    7200.0
}

/// The price and carbon series, shared with the fetching thread.
pub struct Prices {
    feed: Arc<RwLock<(Series, Series)>>,
    stale_after_s: f64,
    /// Where the last tick's price came from: `feed`, `tariff` or `feed (stale)`.
    pub source: &'static str,
}

impl Prices {
    /// The series loaded with the config and (with `url`) the fetcher that refreshes
    /// them, on the runtime's blocking pool until its shutdown token is cancelled; a
    /// failed fetch keeps the last series.
    pub fn start(
        section: Option<&PricesSection>,
        loaded: Option<(Series, Series)>,
        runtime: &crate::Runtime,
    ) -> Prices {
        let feed = Arc::new(RwLock::new(loaded.unwrap_or_default()));
        let prices = Prices {
            feed: feed.clone(),
            stale_after_s: section.map_or(f64::INFINITY, |p| p.stale_after_s),
            source: "",
        };
        let Some((p, url)) = section.and_then(|p| Some((p.clone(), p.url.clone()?))) else {
            return prices;
        };
        let token = runtime.shutdown.clone();
        let keep = move || !token.is_cancelled();
        runtime.spawn_blocking(move || {
                let every = Duration::from_secs_f64(p.refresh_s);
                while keep() {
                    let got = sources::http::fetch_text(&url, Duration::from_secs(30), &p.tls)
                    .map_err(anyhow::Error::msg)
                    .and_then(|text| Ok(p.format.read(&url, &text, "price_per_kwh")?));
                    match got {
                        Ok(series) => {
                            info!(url = %url, points = series.points().len(), last = ?series.points().last().map(|p| p.0), "price feed fetched");
                            feed.write().unwrap_or_else(|p| p.into_inner()).0 = series;
                        }
                        Err(e) => warn!(url = %url, error = %e, "price feed fetch failed; keeping the last series"),
                    }
                    let t = Instant::now();
                    while keep() && t.elapsed() < every {
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
            });
        prices
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
