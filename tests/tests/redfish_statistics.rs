//! Readings the survey and the site's bindings take beyond sensors, against the DMTF
//! `public-rackmount1` mockup served by the real `sushy-static`: the legacy `Power`
//! resource's `PowerControl[].PowerMetrics` (average, minimum and maximum consumed
//! watts over `IntervalInMin`) and an accelerator's `ProcessorMetrics`
//! (`ConsumedPowerWatt`, `TemperatureCelsius`). The values are read by the test from the
//! mockup's files, not typed in; the interval travels with the reading.

use std::path::PathBuf;

use powerplane_tests::Sushy;
use serde_json::Value;
use sources::redfish::survey::readings::Stat;
use sources::redfish::survey::survey_blocking;
use sources::redfish::{EndpointConfig, Poller};
use telemetry::{Site, Timestamp};

const MOCKUP: &str = "public-rackmount1";
const POWER: &str = "/redfish/v1/Chassis/1U/Power";
const ACCELERATOR: &str = "/redfish/v1/Systems/437XR1138R2/Processors/FPGA1/ProcessorMetrics";

fn fixture(path: &str) -> Value {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/redfish")
        .join(MOCKUP)
        .join(path.trim_start_matches("/redfish/v1/"))
        .join("index.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).expect("fixture json")
}

fn number(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer}"))
}

const BINDINGS: &str = r#"
[[redfish]]
endpoint = "bmc"
resource = "Chassis/1U/Power"
property = "PowerControl/0/PowerMetrics/AverageConsumedWatts"
entity = "node/a01-n01"
metric = "power_w"

[[redfish]]
endpoint = "bmc"
resource = "Chassis/1U/Power"
property = "PowerControl/0/PowerMetrics/MaxConsumedWatts"
entity = "node/a01-n02"
metric = "power_w"

[[redfish]]
endpoint = "bmc"
resource = "Systems/437XR1138R2/Processors/*/ProcessorMetrics"
property = "ConsumedPowerWatt"
entity = "gpu/a01-n03:0"
metric = "power_w"

[[redfish]]
endpoint = "bmc"
resource = "Systems/437XR1138R2/Processors/*/ProcessorMetrics"
property = "TemperatureCelsius"
entity = "gpu/a01-n03:0"
metric = "gpu_temp_c"
"#;

#[test]
fn power_statistics_and_accelerator_metrics_are_surveyed_and_bound_with_their_interval() {
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join("examples/demo/site.toml");
    let text = std::fs::read_to_string(demo).expect("demo site") + BINDINGS;
    let site = Site::parse("site.toml", &text).expect("site with bindings");
    let bmc = Sushy::start(MOCKUP, None);

    // the ground truth, from the mockup's files
    let power = fixture(POWER);
    let metrics = &power["PowerControl"][0]["PowerMetrics"];
    let interval_s = number(metrics, "/IntervalInMin") * 60.0;
    let average = number(metrics, "/AverageConsumedWatts");
    let max = number(metrics, "/MaxConsumedWatts");
    let min = number(metrics, "/MinConsumedWatts");
    let accel = fixture(ACCELERATOR);
    let accel_w = number(&accel, "/ConsumedPowerWatt");
    let accel_c = number(&accel, "/TemperatureCelsius");

    // telemetry probe's survey: every one of them, the statistics with their interval
    let s = survey_blocking(EndpointConfig::new("bmc", &bmc.url)).expect("survey");
    let at = |key: &str| {
        s.readings
            .get(key)
            .unwrap_or_else(|| panic!("survey lacks {key}: {:#?}", s.readings.keys()))
    };
    for (prop, want, stat) in [
        ("AverageConsumedWatts", average, Stat::Mean),
        ("MaxConsumedWatts", max, Stat::Max),
        ("MinConsumedWatts", min, Stat::Min),
    ] {
        let r = at(&format!("{POWER}#/PowerControl/0/PowerMetrics/{prop}"));
        assert_eq!((r.metric, r.value), ("power_w", want), "{prop}");
        let w = r
            .window
            .unwrap_or_else(|| panic!("{prop} without its window"));
        assert_eq!((w.stat, w.interval_s), (stat, Some(interval_s)), "{prop}");
    }
    let instantaneous = at(&format!("{POWER}#/PowerControl/0/PowerConsumedWatts"));
    assert_eq!(instantaneous.window, None);
    let w = at(&format!("{ACCELERATOR}#/ConsumedPowerWatt"));
    assert_eq!((w.metric, w.value, w.window), ("power_w", accel_w, None));
    let c = at(&format!("{ACCELERATOR}#/TemperatureCelsius"));
    assert_eq!((c.metric, c.value), ("temperature_c", accel_c));
    let table = orchestrator::probe::survey_table(&s);
    let over = format!("(mean over {} min)", interval_s / 60.0);
    assert!(
        table
            .lines()
            .any(|l| l.contains("PowerMetrics/AverageConsumedWatts") && l.ends_with(&over)),
        "{table}"
    );
    assert!(
        table.contains("ProcessorMetrics#/ConsumedPowerWatt"),
        "{table}"
    );

    // the site's bindings: samples of its entities, the interval in the source
    let mut cfg = EndpointConfig::new("bmc", &bmc.url);
    cfg.bind = site.redfish.clone();
    let mut poller = Poller::new(vec![cfg], 4).expect("poller");
    let polled = poller.poll(Timestamp::from(chrono::Utc::now()));
    assert!(polled[0].error.is_none(), "{:?}", polled[0].error);
    let sample = |entity: &str, metric: &str| {
        polled[0]
            .samples
            .iter()
            .find(|s| s.entity.to_string() == entity && s.metric.as_str() == metric)
            .unwrap_or_else(|| panic!("no {entity} {metric}: {:#?}", polled[0].bindings))
            .clone()
    };
    let avg = sample("node/a01-n01", "power_w");
    assert_eq!(avg.value, average);
    assert!(
        avg.source
            .ends_with(&format!("AverageConsumedWatts {over}")),
        "{}",
        avg.source
    );
    let peak = sample("node/a01-n02", "power_w");
    assert_eq!(peak.value, max);
    assert!(
        peak.source
            .ends_with(&format!("(maximum over {} min)", interval_s / 60.0)),
        "{}",
        peak.source
    );
    let gpu_w = sample("gpu/a01-n03:0", "power_w");
    assert_eq!(gpu_w.value, accel_w);
    assert!(
        gpu_w
            .source
            .ends_with("ProcessorMetrics#/ConsumedPowerWatt"),
        "{}",
        gpu_w.source
    );
    assert_eq!(sample("gpu/a01-n03:0", "gpu_temp_c").value, accel_c);
}
