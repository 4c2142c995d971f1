//! The site file's `[[redfish]]` bindings against DMTF mockups served by the real
//! `sushy-static`: rack inlet, PDU and rack power, feed energy, PSU output power, a CDU's
//! loop and leak detectors become samples of the site's entities, with the values the
//! mockups' JSON holds (read by the test from the files, not typed in); a binding that
//! takes nothing or several readings is reported; `site check --config` shows it all.

use std::path::PathBuf;

use powerplane_tests::Sushy;
use serde_json::Value;
use sources::redfish::bind::Outcome;
use sources::redfish::{EndpointConfig, Polled, Poller};
use telemetry::{Quality, Site, Timestamp};

fn fixture(mockup: &str, path: &str) -> Value {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("fixtures/redfish");
    let rel = path.trim_start_matches("/redfish/v1").trim_matches('/');
    let file = root.join(mockup).join(rel).join("index.json");
    let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    serde_json::from_str(&text).expect("fixture json")
}

fn reading(v: &Value, pointer: &str) -> f64 {
    v.pointer(pointer)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {pointer}"))
}

fn members(mockup: &str, path: &str) -> Vec<String> {
    fixture(mockup, path)["Members"]
        .as_array()
        .expect("members")
        .iter()
        .map(|m| m["@odata.id"].as_str().expect("id").to_string())
        .collect()
}

const BINDINGS: &str = r#"
[[redfish]]
endpoint = "pdu"
resource = "PowerEquipment/RackPDUs/1/Metrics"
property = "PowerWatts"
entity = "pdu/pdu-a01"
metric = "power_w"

[[redfish]]
endpoint = "pdu"
resource = "PowerEquipment/RackPDUs/1/Metrics"
property = "EnergykWh"
entity = "feed/utility"
metric = "energy_j"

[[redfish]]
endpoint = "pdu"
resource = "PowerEquipment/RackPDUs/1/Outlets/*"
property = "PowerWatts"
entity = "rack/a02"
metric = "power_w"
combine = "sum"

[[redfish]]
endpoint = "pdu"
resource = "PowerEquipment/RackPDUs/1/Mains/AC1"
entity = "pdu/pdu-a02"
metric = "power_w"

[[redfish]]
endpoint = "bmc"
resource = "Chassis/1U/Sensors/IntakeTemp"
entity = "rack/a01"
metric = "inlet_temp_c"

[[redfish]]
endpoint = "bmc"
resource = "Chassis/1U/PowerSubsystem/PowerSupplies/*/Metrics"
property = "OutputPowerWatts"
entity = "node/a01-n01"
metric = "output_power_w"
combine = "sum"

[[redfish]]
endpoint = "bmc"
resource = "Chassis/1U/EnvironmentMetrics"
property = "NoSuchReading"
entity = "node/a01-n02"
metric = "power_w"

[[redfish]]
endpoint = "cdu"
resource = "ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1"
property = "SupplyTemperatureCelsius"
entity = "cooling/crah-a"
metric = "supply_temp_c"

[[redfish]]
endpoint = "cdu"
resource = "ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1"
property = "ReturnTemperatureCelsius"
entity = "cooling/crah-a"
metric = "return_temp_c"

[[redfish]]
endpoint = "cdu"
resource = "ThermalEquipment/CDUs/1/LeakDetection"
entity = "cooling/crah-a"
metric = "leak_detected"
combine = "max"
"#;

fn site_text() -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace")
        .join("examples/demo/site.toml");
    std::fs::read_to_string(root).expect("demo site") + BINDINGS
}

fn endpoints(site: &Site, servers: &[(&str, &Sushy)]) -> Vec<EndpointConfig> {
    servers
        .iter()
        .map(|(name, s)| {
            let mut c = EndpointConfig::new(name, &s.url);
            c.bind = site
                .redfish
                .iter()
                .filter(|b| b.endpoint == *name)
                .cloned()
                .collect();
            c
        })
        .collect()
}

fn sample(polled: &[Polled], entity: &str, metric: &str) -> Option<(f64, Quality)> {
    polled
        .iter()
        .flat_map(|p| &p.samples)
        .find(|s| s.entity.to_string() == entity && s.metric.as_str() == metric)
        .map(|s| (s.value, s.quality))
}

#[test]
fn site_bindings_make_samples_of_site_entities_from_three_mockups() {
    let site = Site::parse("site.toml", &site_text()).expect("site with bindings");
    assert_eq!(site.redfish.len(), 10);
    let (pdu, bmc, cdu) = (
        Sushy::start("public-pdu", None),
        Sushy::start("public-rackmount1", None),
        Sushy::start("public-cooling-unit", None),
    );
    let cfgs = endpoints(&site, &[("pdu", &pdu), ("bmc", &bmc), ("cdu", &cdu)]);
    let mut poller = Poller::new(cfgs, 8).expect("poller");
    let first = poller.poll(Timestamp::from(chrono::Utc::now()));
    for p in &first {
        assert!(p.error.is_none(), "{}: {:?}", p.endpoint, p.error);
    }

    // the ground truth, from the mockups' files
    let metrics = fixture("public-pdu", "PowerEquipment/RackPDUs/1/Metrics");
    let outlets: f64 = members("public-pdu", "PowerEquipment/RackPDUs/1/Outlets")
        .iter()
        .filter_map(|o| {
            fixture("public-pdu", o)
                .pointer("/PowerWatts/Reading")?
                .as_f64()
        })
        .sum();
    let psu_out: f64 = members(
        "public-rackmount1",
        "Chassis/1U/PowerSubsystem/PowerSupplies",
    )
    .iter()
    .filter_map(|p| {
        fixture("public-rackmount1", p)["Metrics"]["@odata.id"]
            .as_str()
            .map(str::to_string)
    })
    .filter(|m| {
        let rel = m.trim_start_matches("/redfish/v1/");
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/redfish/public-rackmount1")
            .join(rel)
            .join("index.json")
            .exists()
    })
    .map(|m| {
        reading(
            &fixture("public-rackmount1", &m),
            "/OutputPowerWatts/Reading",
        )
    })
    .sum();
    let intake = reading(
        &fixture("public-rackmount1", "Chassis/1U/Sensors/IntakeTemp"),
        "/Reading",
    );
    let loop2 = fixture(
        "public-cooling-unit",
        "ThermalEquipment/CDUs/1/SecondaryCoolantConnectors/1",
    );
    let leak = fixture(
        "public-cooling-unit",
        "ThermalEquipment/CDUs/1/LeakDetection",
    );
    let any_leak = leak["LeakDetectorGroups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["Detectors"].as_array().expect("detectors"))
        .any(|d| d["DetectorState"] != "OK");

    let close = |got: Option<(f64, Quality)>, want: f64, what: &str| {
        let (v, _) = got.unwrap_or_else(|| panic!("no sample for {what}: {first:#?}"));
        assert!(
            (v - want).abs() < 1e-6 * want.abs().max(1.0),
            "{what}: {v} != {want}"
        );
    };
    close(
        sample(&first, "pdu/pdu-a01", "power_w"),
        reading(&metrics, "/PowerWatts/Reading"),
        "PDU power",
    );
    close(
        sample(&first, "feed/utility", "energy_j"),
        reading(&metrics, "/EnergykWh/Reading") * 3.6e6,
        "feed energy",
    );
    close(
        sample(&first, "rack/a02", "power_w"),
        outlets,
        "rack power, the sum of its outlets",
    );
    close(
        sample(&first, "rack/a01", "inlet_temp_c"),
        intake,
        "rack inlet",
    );
    close(
        sample(&first, "node/a01-n01", "output_power_w"),
        psu_out,
        "PSU output power",
    );
    close(
        sample(&first, "cooling/crah-a", "supply_temp_c"),
        reading(&loop2, "/SupplyTemperatureCelsius/Reading"),
        "CDU supply",
    );
    close(
        sample(&first, "cooling/crah-a", "return_temp_c"),
        reading(&loop2, "/ReturnTemperatureCelsius/Reading"),
        "CDU return",
    );
    close(
        sample(&first, "cooling/crah-a", "leak_detected"),
        f64::from(u8::from(any_leak)),
        "leak",
    );
    assert!(outlets > 0.0 && psu_out > 0.0);

    // the two bindings that cannot hold are reported, and give no sample
    let report = |ep: &str, entity: &str| {
        first
            .iter()
            .find(|p| p.endpoint == ep)
            .and_then(|p| {
                p.bindings.iter().find(|r| {
                    site.redfish
                        .iter()
                        .filter(|b| b.endpoint == ep)
                        .nth(r.index)
                        .is_some_and(|b| b.entity.to_string() == entity)
                })
            })
            .map(|r| r.outcome.clone())
    };
    assert!(matches!(report("pdu", "pdu/pdu-a02"), Some(Outcome::Ambiguous(n)) if n > 1));
    assert_eq!(report("bmc", "node/a01-n02"), Some(Outcome::Nothing));
    assert_eq!(sample(&first, "pdu/pdu-a02", "power_w"), None);

    // only the bound resources are read (no `entities`: no built-in walk), and after
    // discovery only those that gave readings
    let bmc_first = first.iter().find(|p| p.endpoint == "bmc").expect("bmc");
    assert!(bmc_first
        .samples
        .iter()
        .all(|s| s.entity.to_string() != "node/bmc.1U"));
    assert!(bmc_first.requests < 12, "{} GETs", bmc_first.requests);
    let second = poller.poll(Timestamp::from(chrono::Utc::now()));
    let bmc_second = second.iter().find(|p| p.endpoint == "bmc").expect("bmc");
    // the intake sensor and one PSU's metrics (the environment metrics gave nothing)
    assert_eq!(bmc_second.requests, 2, "{bmc_second:#?}");
    close(
        sample(&second, "rack/a01", "inlet_temp_c"),
        intake,
        "rack inlet, re-read",
    );
    // the probe says what each binding took
    let mut out = Vec::new();
    let mut err = Vec::new();
    let args = orchestrator::probe::ProbeArgs {
        mqtt: None,
        mapping: None,
        redfish: endpoints(&site, &[("bmc", &bmc)]),
        redfish_interval_s: 1.0,
        seconds: 0.1,
        json: false,
    };
    orchestrator::probe::run(args, &mut out, &mut err).expect("probe");
    let err = String::from_utf8_lossy(&err);
    assert!(
        err.contains(&format!("rack/a01 inlet_temp_c = {intake:.3}")),
        "{err}"
    );
    assert!(err.contains("node/a01-n02 power_w no reading"), "{err}");
}

#[test]
fn site_check_shows_bindings_unmapped_readings_and_entities_no_reading_reaches() {
    let (pdu, bmc) = (
        Sushy::start("public-pdu", None),
        Sushy::start("public-rackmount1", None),
    );
    let dir = tempfile::tempdir().expect("tmp");
    let d = dir.path();
    let site: String = site_text()
        .split("[[redfish]]")
        .enumerate()
        .filter(|(i, part)| *i == 0 || !part.contains("\"cdu\""))
        .map(|(i, part)| {
            if i == 0 {
                part.to_string()
            } else {
                format!("[[redfish]]{part}")
            }
        })
        .collect();
    std::fs::write(d.join("site.toml"), site).expect("site");
    std::fs::write(
        d.join("policy.toml"),
        "version = 1\n[budget]\nenabled = false\n[thermal]\nenabled = false\n",
    )
    .expect("policy");
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[redfish]\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"{}\"\n[[redfish.endpoints]]\nname = \"bmc\"\nurl = \"{}\"\n",
            pdu.url, bmc.url
        ),
    )
    .expect("config");
    let checked = orchestrator::site_check::run(&d.join("powerplane.toml")).expect("check runs");
    let r = &checked.report;
    eprintln!("{r}");
    assert!(
        !checked.ok,
        "an ambiguous binding and one that takes nothing:\n{r}"
    );
    assert!(r.contains("rack/a01 inlet_temp_c = "), "{r}");
    assert!(r.contains("AMBIGUOUS"), "{r}");
    assert!(r.contains("NO READING"), "{r}");
    assert!(r.contains("unmapped:"), "{r}");
    // the intake sensor is bound, the exhaust is not
    assert!(
        r.contains("/redfish/v1/Chassis/1U/Sensors/ExhaustTemp"),
        "{r}"
    );
    assert!(
        !r.lines()
            .any(|l| l.starts_with("    ") && l.ends_with("/Sensors/IntakeTemp#/Reading")),
        "{r}"
    );
    assert!(
        r.contains("site entities no Redfish reading reaches"),
        "{r}"
    );
    assert!(r.contains("cooling/crah-a"), "{r}");

    // a site binding of an endpoint the config lacks is refused when the config loads
    std::fs::write(
        d.join("powerplane.toml"),
        format!(
            "[controller]\nsite = \"site.toml\"\npolicy = \"policy.toml\"\n[store]\nkind = \"embedded\"\npath = \"s.redb\"\n[redfish]\n[[redfish.endpoints]]\nname = \"pdu\"\nurl = \"{}\"\n",
            pdu.url
        ),
    )
    .expect("config");
    let err = orchestrator::site_check::run(&d.join("powerplane.toml"))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("[[redfish]] endpoint \"bmc\""), "{err}");
}
