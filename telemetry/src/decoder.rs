//! The decoder a source owns: the mapping (stateless) plus the Sparkplug session (the
//! alias tables and sequence numbers of every edge node seen).

use crate::mapping::{Decoded, Mapping, Reject};
use crate::sparkplug::{parse_topic, Session};
use crate::Timestamp;

#[derive(Debug, Clone)]
pub struct Decoder {
    mapping: Mapping,
    session: Session,
}

impl Decoder {
    pub fn new(mapping: Mapping) -> Self {
        Decoder {
            mapping,
            session: Session::new(),
        }
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
        let handled = self.session.handle(&t, payload);
        let mut out = Decoded::default();
        for (reason, detail) in handled.problems {
            out.rejects.push(Reject { reason, detail });
        }
        if let Some(device) = handled.death {
            out.dead = self
                .session
                .entities_of(&t, device.as_deref())
                .into_iter()
                .collect();
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
