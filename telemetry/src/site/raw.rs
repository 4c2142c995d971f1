//! The site file as written: every field with its position, before validation.

use std::collections::BTreeMap;

use serde::Deserialize;
use toml::Spanned;

use super::CoolingKind;

pub(super) type S<T> = Spanned<T>;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSite {
    pub(super) version: S<i64>,
    pub(super) site: RawSiteInfo,
    #[serde(default)]
    pub(super) gpu_models: BTreeMap<String, S<RawGpuModel>>,
    #[serde(default)]
    pub(super) feeds: Vec<RawFeed>,
    #[serde(default)]
    pub(super) pdus: Vec<RawPdu>,
    #[serde(default)]
    pub(super) cooling: Vec<RawCooling>,
    #[serde(default)]
    pub(super) rooms: Vec<RawRoom>,
    #[serde(default)]
    pub(super) rows: Vec<RawRow>,
    #[serde(default)]
    pub(super) racks: Vec<RawRack>,
    #[serde(default)]
    pub(super) nodes: Vec<RawNode>,
    #[serde(default)]
    pub(super) tariff: Option<RawTariff>,
    /// Redfish readings bound to site entities.
    #[serde(default)]
    pub(super) redfish: Vec<super::redfish::RawBinding>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTariff {
    pub(super) default_per_kwh: S<f64>,
    #[serde(default)]
    pub(super) periods: Vec<RawTouPeriod>,
    #[serde(default)]
    pub(super) demand_charge_per_kw: Option<S<f64>>,
    #[serde(default)]
    pub(super) demand_interval_min: Option<S<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTouPeriod {
    pub(super) name: S<String>,
    /// `mon`..`sun`; every day when left out.
    #[serde(default)]
    pub(super) days: Option<Vec<S<String>>>,
    pub(super) from: S<String>,
    pub(super) to: S<String>,
    pub(super) per_kwh: S<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSiteInfo {
    pub(super) name: S<String>,
    #[serde(default = "default_tz")]
    pub(super) timezone: S<String>,
    #[serde(default = "default_currency")]
    pub(super) currency: String,
}

pub(super) fn default_tz() -> S<String> {
    Spanned::new(0..0, "UTC".to_string())
}
pub(super) fn default_currency() -> String {
    "EUR".to_string()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGpuModel {
    pub(super) min_w: f64,
    pub(super) max_w: f64,
    pub(super) default_w: Option<f64>,
    pub(super) idle_w: Option<f64>,
    pub(super) speed: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFeed {
    pub(super) id: S<String>,
    pub(super) rating_kw: S<f64>,
    pub(super) derate: Option<S<f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPdu {
    pub(super) id: S<String>,
    pub(super) feed: S<String>,
    pub(super) rating_kw: S<f64>,
    pub(super) derate: Option<S<f64>>,
    #[serde(default)]
    pub(super) branches: Vec<RawBranch>,
    #[serde(default)]
    pub(super) outlets: Vec<RawOutlet>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBranch {
    pub(super) id: S<String>,
    pub(super) rating_kw: S<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawOutlet {
    pub(super) id: S<String>,
    pub(super) branch: Option<S<String>>,
    pub(super) rating_kw: S<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCooling {
    pub(super) id: S<String>,
    #[serde(default)]
    pub(super) kind: CoolingKind,
    pub(super) capacity_kw: S<f64>,
    pub(super) supply_temp_c: Option<S<f64>>,
    pub(super) full_load_rise_c: Option<S<f64>>,
    pub(super) overload_rise_c_per_kw: Option<S<f64>>,
    pub(super) time_constant_s: Option<S<f64>>,
    #[serde(default)]
    pub(super) rack_skew_c_per_kw: Option<S<f64>>,
    pub(super) racks: S<Vec<S<String>>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRoom {
    pub(super) id: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRow {
    pub(super) id: S<String>,
    pub(super) room: S<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRack {
    pub(super) id: S<String>,
    pub(super) row: S<String>,
    #[serde(default)]
    pub(super) pdus: Vec<S<String>>,
    pub(super) power_budget_kw: Option<S<f64>>,
    pub(super) inlet_limit_c: Option<S<f64>>,
    #[serde(default)]
    pub(super) nodes: Option<S<i64>>,
    pub(super) gpus_per_node: Option<S<i64>>,
    pub(super) gpu_model: Option<S<String>>,
    pub(super) node_base_w: Option<S<f64>>,
    #[serde(default)]
    pub(super) labels: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNode {
    pub(super) id: S<String>,
    pub(super) rack: S<String>,
    pub(super) gpus: S<i64>,
    pub(super) gpu_model: S<String>,
    pub(super) base_w: Option<S<f64>>,
    /// `pdu.outlet` for each power supply.
    #[serde(default)]
    pub(super) outlets: Vec<S<String>>,
}
