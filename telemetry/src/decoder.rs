//! The decoder a source owns: the mapping (stateless) plus the Sparkplug session (the
//! alias tables and sequence numbers of every edge node seen).

use crate::mapping::{Decoded, Mapping, Rebirth, Reject};
use crate::sparkplug::ValueKind;
use crate::sparkplug::{parse_topic, Held, Limits, Session};
use crate::Timestamp;

#[derive(Debug, Clone)]
pub struct Decoder {
    mapping: Mapping,
    session: Session,
}

impl Decoder {
    pub fn new(mapping: Mapping) -> Self {
        Decoder::with_limits(mapping, Limits::default())
    }

    /// A decoder whose Sparkplug session holds at most what `limits` allow.
    pub fn with_limits(mapping: Mapping, limits: Limits) -> Self {
        Decoder {
            mapping,
            session: Session::with_limits(limits),
        }
    }

    /// What the Sparkplug session holds now.
    pub fn sparkplug_held(&self) -> Held {
        self.session.held()
    }

    pub fn mapping(&self) -> &Mapping {
        &self.mapping
    }

    /// Decodes one message: Sparkplug B on `spBv1.0/...` topics, JSON otherwise.
    pub fn decode(
        &mut self,
        topic: &str,
        payload: &[u8],
        source: &str,
        received: Timestamp,
    ) -> Decoded {
        let Some(t) = parse_topic(topic) else {
            return self.mapping.decode(topic, payload, source, received);
        };
        let handled = self.session.handle(&t, payload, received.as_millis());
        let mut out = Decoded::default();
        for (reason, detail) in handled.problems {
            out.rejects.push(Reject { reason, detail });
        }
        if handled.rebirth {
            out.rebirth = Some(Rebirth {
                group: t.group.to_string(),
                node: t.node.to_string(),
                sent: false,
            });
        }
        if handled.death.is_some() {
            out.dead = handled.dead.into_iter().collect();
            return out;
        }
        for v in handled.values {
            let Some((rule, caps)) = self
                .mapping
                .sparkplug_rules()
                .iter()
                .find_map(|r| r.matches(&t, &v.name).map(|c| (r, c)))
            else {
                continue; // gateways publish far more than a site maps: unmapped metrics are skipped
            };
            // a string is never a number; a boolean only of a boolean metric (a leak)
            let boolean_metric = rule.to().spec().is_some_and(|m| m.unit == "bool");
            let refused = match v.kind {
                ValueKind::Text => Some("a String"),
                ValueKind::Boolean if !boolean_metric => Some("a Boolean"),
                _ => None,
            };
            if let Some(what) = refused {
                out.rejects.push(Reject {
                    reason: "wrong_type",
                    detail: format!(
                        "{topic}: metric {:?} is {what}, not a number for {}",
                        v.name,
                        rule.to()
                    ),
                });
                continue;
            }
            let ts = v
                .timestamp_ms
                .and_then(|ms| i64::try_from(ms).ok())
                .map_or(received, Timestamp);
            match rule.sample(&caps, v.value, ts, source) {
                Ok(s) => {
                    self.session.remember(&t, &s.entity);
                    out.samples.push(s);
                }
                Err(detail) => out.rejects.push(Reject {
                    reason: "bad_entity",
                    detail: format!("{topic}: {detail}"),
                }),
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sparkplug::{datatype, Metric, Payload};
    use prost::Message;

    #[test]
    fn a_string_or_a_boolean_where_a_number_is_mapped_is_wrong_type_and_a_leak_boolean_is_read() {
        let src = r#"version = 1
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
metric = "Alarm"
entity = "rack/a01"
to = "inlet_temp_c"
"#;
        let mut d = Decoder::new(Mapping::parse("m.toml", src).expect("mapping"));
        let birth = Payload {
            seq: Some(0),
            metrics: vec![
                Metric {
                    name: Some("Inlet".into()),
                    datatype: Some(datatype::STRING),
                    string_value: Some("24.5".into()),
                    ..Metric::default()
                },
                Metric {
                    name: Some("Leak".into()),
                    datatype: Some(datatype::BOOLEAN),
                    boolean_value: Some(true),
                    ..Metric::default()
                },
                Metric {
                    name: Some("Alarm".into()),
                    datatype: Some(datatype::BOOLEAN),
                    boolean_value: Some(true),
                    ..Metric::default()
                },
            ],
            ..Payload::default()
        };
        let out = d.decode(
            "spBv1.0/dc1/NBIRTH/gw1",
            &birth.encode_to_vec(),
            "mqtt",
            Timestamp::from_secs(1_790_000_000),
        );
        assert_eq!(
            out.samples
                .iter()
                .map(|s| (s.entity.to_string(), s.value))
                .collect::<Vec<_>>(),
            vec![("cooling/cdu-1".to_string(), 1.0)]
        );
        let reasons: Vec<_> = out.rejects.iter().map(|r| r.reason).collect();
        assert_eq!(
            reasons,
            vec!["wrong_type", "wrong_type"],
            "{:?}",
            out.rejects
        );
        assert!(out.rejects[0].detail.contains("String"));
        assert_eq!(out.rebirth, None);
        let gap = d.decode(
            "spBv1.0/dc1/NDATA/gw1",
            &Payload {
                seq: Some(9),
                ..Payload::default()
            }
            .encode_to_vec(),
            "mqtt",
            Timestamp::from_secs(1_790_000_001),
        );
        assert_eq!(
            gap.rebirth.map(|r| (r.group, r.node, r.sent)),
            Some(("dc1".to_string(), "gw1".to_string(), false))
        );
    }
}
