//! Coverage of the Redfish survey on DMTF's public mockups served by `sushy-static`:
//! the ground truth is computed here from the mockup's JSON files (every numeric
//! `Reading`, `ReadingCelsius`, `ReadingVolts`, `PowerConsumedWatts`, ... with its
//! unit, each physical reading once), and compared with what the survey read, value
//! and unit.

use std::collections::BTreeMap;
use std::path::Path;

use powerplane_tests::{workspace_root, Sushy};
use serde_json::Value;
use sources::redfish::survey::{survey_blocking, Survey};
use sources::redfish::{EndpointConfig, Poller};
use telemetry::Timestamp;

/// One distinct reading of the ground truth: value in the canonical unit, and unit.
#[derive(Debug)]
struct Truth {
    value: f64,
    unit: Option<&'static str>,
    own: bool,
}

/// Legacy properties that are readings, with their UCUM units.
const LEGACY: &[(&str, &str)] = &[
    ("ReadingCelsius", "Cel"),
    ("ReadingVolts", "V"),
    ("PowerConsumedWatts", "W"),
    ("PowerInputWatts", "W"),
    ("PowerOutputWatts", "W"),
    ("LastPowerOutputWatts", "W"),
    ("LineInputVoltage", "V"),
    // PowerControl[].PowerMetrics (Power.v1): statistics over IntervalInMin
    ("AverageConsumedWatts", "W"),
    ("MinConsumedWatts", "W"),
    ("MaxConsumedWatts", "W"),
    // ProcessorMetrics.v1
    ("ConsumedPowerWatt", "W"),
    ("TemperatureCelsius", "Cel"),
];

/// UCUM unit, or a property name's unit suffix, to (canonical unit, factor).
fn to_canonical(unit: &str) -> Option<(&'static str, f64)> {
    Some(match unit {
        "Cel" | "Celsius" => ("°C", 1.0),
        "W" | "Watts" | "Watt" => ("W", 1.0),
        "A" | "Amps" => ("A", 1.0),
        "V" | "Volts" | "Voltage" | "Voltages" => ("V", 1.0),
        "kW.h" | "kWh" => ("J", 3.6e6),
        "W.h" | "WattHours" => ("J", 3600.0),
        "J" | "Joules" => ("J", 1.0),
        "L/min" | "LitersPerMinute" => ("L/min", 1.0),
        "kPa" => ("kPa", 1.0),
        "Pa" => ("kPa", 0.001),
        "%" | "Percent" => ("%", 1.0),
        "Hz" => ("Hz", 1.0),
        "RPM" | "{rev}/min" => ("RPM", 1.0),
        "kW" => ("kW", 1.0),
        _ => return None,
    })
}

/// The unit DSP0268 fixes for a `Sensor`'s `ReadingType`.
fn unit_of_type(t: &str) -> Option<&'static str> {
    Some(match t {
        "Temperature" => "Cel",
        "Humidity" | "Percent" => "%",
        "Power" => "W",
        "EnergykWh" => "kW.h",
        "EnergyJoules" => "J",
        "Voltage" => "V",
        "Current" => "A",
        "Frequency" => "Hz",
        "PressurekPa" => "kPa",
        "Pressure" | "PressurePa" => "Pa",
        "Rotational" => "RPM",
        "LiquidFlowLPM" => "L/min",
        "Heat" => "kW",
        _ => return None,
    })
}

fn unit_from_names(names: &[String]) -> Option<&'static str> {
    const SUFFIX: &[&str] = &[
        "kWh",
        "WattHours",
        "Joules",
        "Watts",
        "Watt",
        "Amps",
        "Volts",
        "Voltage",
        "Voltages",
        "Celsius",
        "LitersPerMinute",
        "kPa",
        "Percent",
        "Hz",
        "RPM",
    ];
    names
        .iter()
        .rev()
        .find_map(|n| SUFFIX.iter().find(|s| n.ends_with(*s)).copied())
}

struct Collector<'a> {
    path: &'a str,
    /// A `Control`'s `SetPointUnits`: the units of its sensor excerpt.
    set_point_units: Option<String>,
    out: &'a mut BTreeMap<String, Truth>,
}

impl Collector<'_> {
    fn add(&mut self, key: String, t: Truth) {
        match self.out.get(&key) {
            Some(old) if old.own || !t.own => {}
            _ => {
                self.out.insert(key, t);
            }
        }
    }

    fn walk(&mut self, v: &Value, ptr: &str, names: &[String]) {
        match v {
            Value::Object(o) => {
                if ptr.is_empty() {
                    self.set_point_units = o
                        .get("SetPointUnits")
                        .and_then(Value::as_str)
                        .map(str::to_string);
                }
                if let Some(r) = o.get("Reading").and_then(Value::as_f64) {
                    let own = ptr.is_empty();
                    let typed = o
                        .get("ReadingType")
                        .and_then(Value::as_str)
                        .filter(|_| own)
                        .and_then(unit_of_type);
                    let stated = typed.or(o.get("ReadingUnits").and_then(Value::as_str));
                    let conv = match stated {
                        Some(u) => to_canonical(u),
                        None => unit_from_names(names)
                            .or(self.set_point_units.as_deref())
                            .and_then(to_canonical),
                    };
                    let key = match (own, o.get("DataSourceUri").and_then(Value::as_str)) {
                        (true, _) => self.path.to_string(),
                        (false, Some(s)) => s.to_string(),
                        (false, None) => format!("{}#{ptr}", self.path),
                    };
                    let t = Truth {
                        value: conv.map_or(r, |c| r * c.1),
                        unit: conv.map(|c| c.0),
                        own,
                    };
                    self.add(key, t);
                }
                for (name, unit) in LEGACY {
                    if let Some(x) = o.get(*name).and_then(Value::as_f64) {
                        let (u, f) = to_canonical(unit).expect("legacy unit");
                        self.add(
                            format!("{}#{ptr}/{name}", self.path),
                            Truth {
                                value: x * f,
                                unit: Some(u),
                                own: false,
                            },
                        );
                    }
                }
                for (k, x) in o {
                    // thresholds are limits, not readings
                    if matches!(
                        k.as_str(),
                        "Thresholds" | "NumericThresholds" | "Links" | "Actions"
                    ) {
                        continue;
                    }
                    let mut n = names.to_vec();
                    n.push(k.clone());
                    self.walk(x, &format!("{ptr}/{k}"), &n);
                }
            }
            Value::Array(a) => {
                for (i, x) in a.iter().enumerate() {
                    self.walk(x, &format!("{ptr}/{i}"), names);
                }
            }
            _ => {}
        }
    }
}

/// Every link in `v`: `@odata.id` and `DataSourceUri`, fragments dropped.
fn links(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(o) => {
            for (k, x) in o {
                match (k.as_str(), x.as_str()) {
                    ("@odata.id" | "DataSourceUri", Some(s)) => {
                        let s = s.split('#').next().unwrap_or_default();
                        out.push(s.trim_end_matches('/').to_string());
                    }
                    _ => links(x, out),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| links(x, out)),
        _ => {}
    }
}

/// Every `index.json` under `dir`, by the resource path it is served as.
fn resources(dir: &Path) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read mockup dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.file_name().is_some_and(|n| n == "index.json") {
                let rel = p
                    .parent()
                    .and_then(|x| x.strip_prefix(dir).ok())
                    .expect("under the mockup")
                    .to_string_lossy()
                    .to_string();
                let path = if rel.is_empty() {
                    "/redfish/v1".to_string()
                } else {
                    format!("/redfish/v1/{rel}")
                };
                let text = std::fs::read_to_string(&p).expect("read json");
                out.insert(path, serde_json::from_str(&text).expect("mockup json"));
            }
        }
    }
    out
}

/// The ground truth of a mockup: the readings of every resource a client can reach
/// from the service root by following links, and how many files no link reaches.
fn ground_truth(dir: &Path) -> (BTreeMap<String, Truth>, usize) {
    ground_truth_of(dir, false)
}

/// With `every_file`, the readings of every file, reached by a link or not.
fn ground_truth_of(dir: &Path, every_file: bool) -> (BTreeMap<String, Truth>, usize) {
    let all = resources(dir);
    let mut reached = std::collections::BTreeSet::new();
    let mut todo = vec!["/redfish/v1".to_string()];
    while let Some(p) = todo.pop() {
        if let Some(v) = all.get(&p) {
            if reached.insert(p) {
                links(v, &mut todo);
            }
        }
    }
    let mut out = BTreeMap::new();
    let keys: Vec<&String> = if every_file {
        all.keys().collect()
    } else {
        reached.iter().collect()
    };
    for p in keys {
        Collector {
            path: p,
            set_point_units: None,
            out: &mut out,
        }
        .walk(&all[p], "", &[]);
    }
    (out, all.len() - reached.len())
}

struct Coverage {
    distinct: usize,
    matched: usize,
    wrong: Vec<String>,
    missing: Vec<String>,
    named: usize,
}

fn compare(truth: &BTreeMap<String, Truth>, s: &Survey) -> Coverage {
    let mut c = Coverage {
        distinct: truth.len(),
        matched: 0,
        wrong: Vec::new(),
        missing: Vec::new(),
        named: 0,
    };
    let unknown: Vec<&str> = s
        .not_understood
        .values()
        .flatten()
        .map(|u| u.key.as_str())
        .collect();
    for (key, t) in truth {
        match s.readings.get(key) {
            Some(r)
                if Some(r.unit) == t.unit
                    && (r.value - t.value).abs() <= 1e-9 * t.value.abs().max(1.0) =>
            {
                c.matched += 1
            }
            Some(r) => c.wrong.push(format!(
                "{key}: read {} {}, the JSON says {} {:?}",
                r.value, r.unit, t.value, t.unit
            )),
            None if unknown.contains(&key.as_str()) => c.named += 1,
            None => c.missing.push(key.clone()),
        }
    }
    c
}

fn coverage_of(mockup: &str) -> Coverage {
    let bmc = Sushy::start(mockup, None);
    let dir = workspace_root().join("tests/fixtures/redfish").join(mockup);
    let (truth, orphans) = ground_truth(&dir);
    let t = std::time::Instant::now();
    let s = survey_blocking(EndpointConfig::new(mockup, &bmc.url)).expect("survey");
    let survey_s = t.elapsed().as_secs_f64();
    // the poller's discovery of the same tree, for the cost beside it
    let mut poller = Poller::new(vec![EndpointConfig::new(mockup, &bmc.url)], 1).expect("poller");
    let d = poller.poll(Timestamp::from(chrono::Utc::now())).remove(0);
    eprintln!(
        "{mockup}: survey {} GETs in {survey_s:.2} s; poller discovery {} GETs in {:.2} s, {} samples",
        s.requests,
        d.requests,
        d.elapsed.as_secs_f64(),
        d.samples.len()
    );
    let c = compare(&truth, &s);
    let (every, _) = ground_truth_of(&dir, true);
    let e = compare(&every, &s);
    eprintln!(
        "{mockup}: counting the files no link reaches too: {}/{} distinct readings",
        e.matched, e.distinct
    );
    eprintln!(
        "{mockup}: {}/{} distinct readings right ({:.1}%), {} named not understood, {} wrong, {} missing; {} GETs; {orphans} files no link reaches",
        c.matched,
        c.distinct,
        100.0 * c.matched as f64 / c.distinct.max(1) as f64,
        c.named,
        c.wrong.len(),
        c.missing.len(),
        s.requests
    );
    for w in &c.wrong {
        eprintln!("  wrong: {w}");
    }
    for m in &c.missing {
        eprintln!("  missing: {m}");
    }
    for f in &s.failed {
        eprintln!("  failed: {f}");
    }
    for (p, u) in &s.not_understood {
        eprintln!("  not understood: {p}: {} numeric properties", u.len());
    }
    c
}

fn assert_covered(mockup: &str) {
    let c = coverage_of(mockup);
    assert!(c.distinct > 0, "{mockup}: no readings in the ground truth");
    assert!(
        c.wrong.is_empty(),
        "{mockup}: wrong values or units: {:?}",
        c.wrong
    );
    assert!(
        c.missing.is_empty(),
        "{mockup}: readings neither read nor named not understood: {:?}",
        c.missing
    );
    let share = c.matched as f64 / c.distinct as f64;
    assert!(
        share >= 0.95,
        "{mockup}: {:.1}% of the distinct readings",
        100.0 * share
    );
}

#[test]
fn coverage_public_pdu() {
    assert_covered("public-pdu");
}

#[test]
fn coverage_public_rackmount1() {
    assert_covered("public-rackmount1");
}

#[test]
fn coverage_public_cooling_unit() {
    assert_covered("public-cooling-unit");
}

#[test]
fn coverage_public_acd() {
    assert_covered("public-acd");
}

#[test]
fn coverage_public_smartnic() {
    assert_covered("public-smartnic");
}

#[test]
fn coverage_public_bladed() {
    assert_covered("public-bladed");
}

#[test]
fn coverage_public_cxl_multiswitch() {
    assert_covered("public-cxl-multiswitch");
}

/// The DSP2046 guide's example of every schema, each read as one resource.
#[test]
fn every_reading_in_the_dsp2046_examples_is_read_or_named() {
    use sources::redfish::survey::readings;
    let dir = workspace_root().join("tests/fixtures/redfish/DSP2046-examples");
    let (mut distinct, mut matched, mut named) = (0, 0, 0);
    let mut bad = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("DSP2046 examples")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.to_string_lossy().ends_with("-example.json"))
        .filter(|p| !p.to_string_lossy().ends_with("request-example.json"))
        .collect();
    files.sort();
    assert!(files.len() > 100, "{} examples", files.len());
    for f in files {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&f).expect("read"))
            .expect("example json");
        let path = format!(
            "/example/{}",
            f.file_name().expect("name").to_string_lossy()
        );
        let mut truth = BTreeMap::new();
        Collector {
            path: &path,
            set_point_units: None,
            out: &mut truth,
        }
        .walk(&v, "", &[]);
        let got = readings::resource(&v, &path);
        for (key, t) in &truth {
            distinct += 1;
            let r = got.readings.iter().find(|r| &r.key == key);
            match r {
                Some(r)
                    if Some(r.unit) == t.unit
                        && (r.value - t.value).abs() <= 1e-9 * t.value.abs().max(1.0) =>
                {
                    matched += 1
                }
                None if got.unknown.iter().any(|u| &u.key == key) => {
                    eprintln!("  not understood: {key}");
                    named += 1
                }
                _ => bad.push(format!("{key}: {r:?} vs {t:?}")),
            }
        }
    }
    eprintln!("DSP2046 examples: {matched}/{distinct} distinct readings right, {named} named not understood");
    assert!(bad.is_empty(), "{bad:#?}");
    assert!(
        matched as f64 >= 0.95 * distinct as f64,
        "{matched}/{distinct}"
    );
}

#[test]
fn a_survey_names_a_tls_failure_as_tls() {
    use powerplane_tests::{self_signed, TlsBmc};
    let dir = tempfile::tempdir().expect("tempdir");
    let (cert, key, _) = self_signed(dir.path());
    let plain = Sushy::start("public-pdu", None);
    let bmc = TlsBmc::start(&cert, &key, &plain.url);
    let e = survey_blocking(EndpointConfig::new("tls", &bmc.url))
        .expect_err("a self-signed certificate is refused");
    assert_eq!(e.reason(), "tls", "{e}");
    assert!(e.to_string().contains("tls"), "{e}");
}

/// A reading in a unit powerplane does not know is named, by the probe's survey and
/// on the poller's counter, not dropped.
#[test]
fn a_reading_in_an_unknown_unit_is_named_and_counted() {
    let bmc = Sushy::start("unknown-units", None);
    let s = survey_blocking(EndpointConfig::new("tank", &bmc.url)).expect("survey");
    let level = "/redfish/v1/Chassis/Tank/Sensors/Level";
    assert_eq!(
        s.not_understood.get(level).map(Vec::len),
        Some(1),
        "{:?}",
        s.not_understood
    );
    let temp = &s.readings["/redfish/v1/Chassis/Tank/Sensors/Temp"];
    assert_eq!(
        (temp.metric, temp.value, temp.unit),
        ("temperature_c", 31.5, "°C")
    );
    assert_eq!(s.readings.len(), 1);
    let mut poller = Poller::new(vec![EndpointConfig::new("tank", &bmc.url)], 1).expect("poller");
    let p = poller.poll(Timestamp::from(chrono::Utc::now())).remove(0);
    assert!(p.discovery && p.error.is_none(), "{:?}", p.error);
    let stats = poller.stats().snapshot();
    let tank = stats
        .iter()
        .find(|e| e.endpoint == "tank")
        .expect("tank stats");
    assert_eq!(tank.not_understood, 1);
}
