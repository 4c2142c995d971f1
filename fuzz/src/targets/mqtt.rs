//! The MQTT decoders: the JSON mapping (a topic and its payload to samples or
//! rejects) and Sparkplug B (protobuf payloads through the session that follows each
//! edge node), both behind [`telemetry::decoder::Decoder`] as the MQTT source holds it.

use common::rng::Rng;
use prost::Message;
use serde_json::json;
use telemetry::decoder::Decoder;
use telemetry::mapping::Mapping;
use telemetry::sparkplug::{datatype, Metric, Payload};
use telemetry::Timestamp;

use crate::bytes::{self, below};
use crate::corpus::{join_line, mutate_levels, split_line, JsonCorpus};
use crate::json as gen;
use crate::runner::Target;

const T0: i64 = 1_790_000_000;

/// The JSON rules of the mapping's module docs and of `deploy/etc/mapping.toml`, and a
/// Sparkplug rule per kind of metric.
const MAPPING: &str = r#"version = 1
[[json]]
topic = "dc1/{room}/{rack}/inlet"
entity = "rack/{rack}"
metric = "inlet_temp_c"
value = "/value"
unit = "degF"
timestamp = "/ts"
[[json]]
topic = "dc1/pdu/{pdu}/power"
entity = "pdu/{pdu}"
metric = "power_w"
value = "/watts"
unit_pointer = "/unit"
[[json]]
topic = "dc1/cdu/{cdu}/state"
entity = "cooling/{cdu}"
readings = [
  { metric = "supply_temp_c", value = "/supply/temp", unit = "degC" },
  { metric = "heat_load_kw", value = "/heat", unit = "kW" },
]
[[json]]
topic = "dc1/pdu/{pdu}/outlets"
each = "/outlets"
entity = "outlet/{pdu}.{/name}"
metric = "power_w"
value = "/watts"
unit = "W"
[[json]]
topic = "dc1/bare/{rack}"
entity = "rack/{rack}"
metric = "inlet_temp_c"
value = ""
[[sparkplug]]
group = "dc1"
node = "gw1"
metric = "Inlet"
entity = "rack/a01"
to = "inlet_temp_c"
[[sparkplug]]
group = "dc1"
node = "gw1"
metric = "Leak"
entity = "cooling/cdu-1"
to = "leak_detected"
[[sparkplug]]
group = "dc1"
node = "gw1"
metric = "Power"
entity = "pdu/p1"
to = "power_w"
"#;

fn decoder() -> Decoder {
    Decoder::new(Mapping::parse("fuzz-mapping.toml", MAPPING).expect("the fuzz mapping is valid"))
}

/// The JSON mapping: inputs are `topic\npayload`.
pub struct JsonMapping {
    decoder: Decoder,
    topics: Vec<&'static str>,
    corpus: JsonCorpus,
}

/// Seeds: a message for each rule, as the docs show them.
pub fn json_mapping() -> Box<dyn Target> {
    let seeds = vec![
        (
            "dc1/hall-1/r01/inlet",
            json!({"value": 75.2, "ts": 1717416000}),
        ),
        (
            "dc1/hall-1/r02/inlet",
            json!({"value": 76, "ts": "2024-06-03T12:00:00Z"}),
        ),
        ("dc1/pdu/p1/power", json!({"watts": 5120.0, "unit": "kW"})),
        (
            "dc1/cdu/c1/state",
            json!({"supply": {"temp": 18.5}, "heat": 120.5}),
        ),
        (
            "dc1/pdu/p2/outlets",
            json!({"outlets": [{"name": "o1", "watts": 310.0}, {"name": "o2", "watts": 295.5}]}),
        ),
        ("dc1/bare/r09", json!(24.5)),
    ];
    let topics = seeds.iter().map(|(t, _)| *t).collect();
    let corpus = JsonCorpus::new(seeds.into_iter().map(|(_, v)| v).collect());
    Box::new(JsonMapping {
        decoder: decoder(),
        topics,
        corpus,
    })
}

impl Target for JsonMapping {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.corpus.len());
        let topic = mutate_levels(rng, self.topics[i], &self.corpus.dict);
        join_line(&topic, &self.corpus.mutant(rng, i, None))
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        let (topic, payload) = split_line(input);
        let out = self
            .decoder
            .decode(&topic, payload, "fuzz", Timestamp::from_secs(T0));
        !out.samples.is_empty()
    }
}

/// Sparkplug B: inputs are `topic\npayload`; the session lives across inputs, as in
/// the MQTT source.
pub struct Sparkplug {
    decoder: Decoder,
    seeds: Vec<(&'static str, Payload)>,
    texts: Vec<Vec<u8>>,
    dict: Vec<String>,
    nodes: u64,
}

fn metric(name: Option<&str>, alias: Option<u64>, dt: u32) -> Metric {
    Metric {
        name: name.map(str::to_string),
        alias,
        datatype: Some(dt),
        ..Metric::default()
    }
}

/// Seeds: a birth of a node and a device, data by alias, deaths, as an edge node
/// sends them (built with the payload types the decoder reads).
pub fn sparkplug() -> Box<dyn Target> {
    let mut inlet = metric(Some("Inlet"), Some(1), datatype::DOUBLE);
    inlet.double_value = Some(24.5);
    let mut leak = metric(Some("Leak"), Some(2), datatype::BOOLEAN);
    leak.boolean_value = Some(false);
    let mut power = metric(Some("Power"), Some(3), datatype::FLOAT);
    power.float_value = Some(5120.0);
    let mut bd = metric(Some("bdSeq"), None, datatype::INT64);
    bd.long_value = Some(0);
    let mut text = metric(Some("Label"), Some(4), datatype::STRING);
    text.string_value = Some("row b".into());
    let birth = Payload {
        timestamp: Some(1_790_000_000_000),
        seq: Some(0),
        metrics: vec![bd.clone(), inlet.clone(), leak.clone(), power.clone(), text],
        ..Payload::default()
    };
    let by_alias = |seq: u64, m: &Metric| {
        let mut m = m.clone();
        m.name = None;
        Payload {
            timestamp: Some(1_790_000_001_000),
            seq: Some(seq),
            metrics: vec![m],
            ..Payload::default()
        }
    };
    let mut int = metric(None, Some(1), datatype::INT32);
    int.int_value = Some(u32::MAX);
    let seeds = vec![
        ("spBv1.0/dc1/NBIRTH/gw1", birth.clone()),
        ("spBv1.0/dc1/NDATA/gw1", by_alias(1, &inlet)),
        ("spBv1.0/dc1/NDATA/gw1", by_alias(2, &power)),
        ("spBv1.0/dc1/NDATA/gw1", by_alias(3, &int)),
        (
            "spBv1.0/dc1/DBIRTH/gw1/dev1",
            Payload {
                seq: Some(4),
                ..birth.clone()
            },
        ),
        ("spBv1.0/dc1/DDATA/gw1/dev1", by_alias(5, &leak)),
        (
            "spBv1.0/dc1/DDEATH/gw1/dev1",
            Payload {
                seq: Some(6),
                ..Payload::default()
            },
        ),
        (
            "spBv1.0/dc1/NDEATH/gw1",
            Payload {
                metrics: vec![bd],
                ..Payload::default()
            },
        ),
    ];
    let texts = seeds.iter().map(|(_, p)| p.encode_to_vec()).collect();
    let mut dict: Vec<String> = [
        "Inlet", "Leak", "Power", "bdSeq", "Label", "gw1", "dc1", "dev1",
    ]
    .map(String::from)
    .to_vec();
    dict.extend(["Node Control/Rebirth".to_string()]);
    Box::new(Sparkplug {
        decoder: decoder(),
        seeds,
        texts,
        dict,
        nodes: 0,
    })
}

impl Sparkplug {
    /// A topic of any kind, for the seed's node, another of a few, or a new one now
    /// and then (up to the session's node limit and past it).
    fn topic(&mut self, rng: &mut Rng, seed: &str) -> String {
        const KINDS: &[&str] = &[
            "NBIRTH", "NDATA", "DBIRTH", "DDATA", "NDEATH", "DDEATH", "NCMD", "STATE", "",
        ];
        match below(rng, 10) {
            0..=5 => mutate_levels(rng, seed, &self.dict),
            6 | 7 => {
                let kind = KINDS[below(rng, KINDS.len())];
                let node = format!("gw{}", below(rng, 4));
                let dev = ["", "/dev1", "/dev2/x"][below(rng, 3)];
                format!("spBv1.0/dc1/{kind}/{node}{dev}")
            }
            _ => {
                self.nodes += 1;
                format!("spBv1.0/g{}/NBIRTH/n{}", self.nodes % 7, self.nodes)
            }
        }
    }

    /// One to four changes to the payload's fields: sequence, times, metrics' names,
    /// aliases, types and values (extremes and non-finite numbers), many metrics.
    fn mutate(&self, rng: &mut Rng, p: &mut Payload) {
        const U64S: &[u64] = &[
            0,
            1,
            255,
            256,
            u64::MAX,
            1 << 63,
            1_790_000_000_000,
            32_503_680_000_000,
        ];
        const F64S: &[f64] = &[
            f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            -0.0,
            1e308,
            f64::MIN_POSITIVE,
            -1e308,
        ];
        let u64s = |rng: &mut Rng| U64S[below(rng, U64S.len())];
        for _ in 0..1 + below(rng, 4) {
            let n = p.metrics.len();
            match below(rng, 10) {
                0 => p.seq = [None, Some(u64s(rng)), Some(below(rng, 256) as u64)][below(rng, 3)],
                1 => p.timestamp = Some(u64s(rng)),
                2 if n > 0 => {
                    p.metrics.remove(below(rng, n));
                }
                3 => {
                    let copies = [10, 1000, 20_000][below(rng, 3)];
                    let mut m = p.metrics.first().cloned().unwrap_or_default();
                    p.metrics.extend((0..copies).map(|k| {
                        m.alias = Some(k as u64);
                        m.name = Some(format!("m{k}"));
                        m.clone()
                    }));
                }
                _ if n > 0 => {
                    let m = &mut p.metrics[below(rng, n)];
                    match below(rng, 8) {
                        0 => m.name = Some(gen::string(rng, &self.dict)),
                        1 => m.alias = [None, Some(u64s(rng))][below(rng, 2)],
                        2 => m.datatype = Some(below(rng, 40) as u32),
                        3 => m.double_value = Some(F64S[below(rng, F64S.len())]),
                        4 => m.float_value = Some(F64S[below(rng, F64S.len())] as f32),
                        5 => m.long_value = Some(u64s(rng)),
                        6 => m.is_null = Some(true),
                        _ => m.timestamp = Some(u64s(rng)),
                    }
                }
                _ => p.metrics.push(Metric::default()),
            }
        }
    }
}

impl Target for Sparkplug {
    fn generate(&mut self, rng: &mut Rng) -> Vec<u8> {
        let i = below(rng, self.seeds.len());
        let topic = self.topic(rng, self.seeds[i].0);
        let other = &self.texts[below(rng, self.texts.len())];
        let payload = match below(rng, 10) {
            0 | 1 => self.texts[i].clone(),
            2..=6 => {
                let mut p = self.seeds[i].1.clone();
                self.mutate(rng, &mut p);
                p.encode_to_vec()
            }
            _ => bytes::mutate(rng, &self.texts[i], other, &self.dict),
        };
        join_line(&topic, &payload)
    }

    fn decode(&mut self, input: &[u8]) -> bool {
        let (topic, payload) = split_line(input);
        let out = self
            .decoder
            .decode(&topic, payload, "fuzz", Timestamp::from_secs(T0));
        !out.samples.is_empty()
    }
}
