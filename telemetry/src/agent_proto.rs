//! The wire protocol between the controller and its GPU node agents, version 1.
//!
//! Topics, under a prefix (`powerplane/v1` by default):
//!
//! | topic | from | retained | payload |
//! | --- | --- | --- | --- |
//! | `{prefix}/nodes/{node}/gpus` | agent | no | [`NodeReport`] every read interval |
//! | `{prefix}/nodes/{node}/health` | agent | yes | [`Health`]; the broker publishes the last will (`offline`) when the agent vanishes |
//! | `{prefix}/nodes/{node}/cmd` | controller | no | [`Signed`] envelope around a [`Command`] |
//! | `{prefix}/nodes/{node}/ack` | agent | no | [`Signed`] envelope around an [`Ack`] |
//!
//! Commands and acks are signed: `sig` is the lower-case hex HMAC-SHA256, under the
//! site key, of a domain line (`powerplane-cmd-v1\n` or `powerplane-ack-v1\n`) followed
//! by the exact bytes of the `body` member as they appear in the message. The verifier
//! never re-serializes, so any JSON writer can produce a valid command.

use std::fmt;

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::Sha256;

use crate::Timestamp;

pub const VERSION: u32 = 1;
pub const DEFAULT_PREFIX: &str = "powerplane/v1";
const CMD_DOMAIN: &[u8] = b"powerplane-cmd-v1\n";
const ACK_DOMAIN: &[u8] = b"powerplane-ack-v1\n";

/// What a topic under the prefix carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    Gpus,
    Health,
    Cmd,
    Ack,
}

impl Channel {
    fn as_str(self) -> &'static str {
        match self {
            Channel::Gpus => "gpus",
            Channel::Health => "health",
            Channel::Cmd => "cmd",
            Channel::Ack => "ack",
        }
    }
}

/// Topic names under one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topics {
    pub prefix: String,
}

impl Default for Topics {
    fn default() -> Self {
        Topics {
            prefix: DEFAULT_PREFIX.into(),
        }
    }
}

impl Topics {
    pub fn new(prefix: &str) -> Self {
        Topics {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }
    pub fn topic(&self, node: &str, ch: Channel) -> String {
        format!("{}/nodes/{node}/{}", self.prefix, ch.as_str())
    }
    /// The filter matching one channel of every node.
    pub fn all(&self, ch: Channel) -> String {
        format!("{}/nodes/+/{}", self.prefix, ch.as_str())
    }
    /// `(node, channel)` of a topic under this prefix.
    pub fn parse<'a>(&self, topic: &'a str) -> Option<(&'a str, Channel)> {
        let rest = topic.strip_prefix(&self.prefix)?.strip_prefix("/nodes/")?;
        let (node, ch) = rest.split_once('/')?;
        let ch = match ch {
            "gpus" => Channel::Gpus,
            "health" => Channel::Health,
            "cmd" => Channel::Cmd,
            "ack" => Channel::Ack,
            _ => return None,
        };
        (!node.is_empty()).then_some((node, ch))
    }
}

/// The site key commands and acks are signed with.
#[derive(Clone)]
pub struct Key(Vec<u8>);

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({} bytes)", self.0.len())
    }
}

/// Shortest key accepted, in bytes.
pub const MIN_KEY_BYTES: usize = 16;

/// Why the text of a key file is no key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyError {
    #[error("the site key is {0} bytes; at least {MIN_KEY_BYTES} are needed (make one with `openssl rand -hex 32`)")]
    TooShort(usize),
}

impl Key {
    /// A key from the text of a key file: hex (64 digits for 32 bytes, as
    /// `openssl rand -hex 32` writes) or, failing that, the trimmed text itself.
    pub fn from_text(text: &str) -> Result<Key, KeyError> {
        let t = text.trim();
        let bytes = hex::decode(t).unwrap_or_else(|_| t.as_bytes().to_vec());
        if bytes.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort(bytes.len()));
        }
        Ok(Key(bytes))
    }

    fn mac(&self, domain: &[u8], body: &[u8]) -> Hmac<Sha256> {
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(&self.0).expect("hmac takes any key");
        m.update(domain);
        m.update(body);
        m
    }

    fn sign(&self, domain: &[u8], body: &[u8]) -> String {
        hex::encode(self.mac(domain, body).finalize().into_bytes())
    }

    fn verify(&self, domain: &[u8], body: &[u8], sig: &str) -> bool {
        match hex::decode(sig) {
            // constant-time comparison
            Ok(s) => self.mac(domain, body).verify_slice(&s).is_ok(),
            Err(_) => false,
        }
    }
}

/// `{"body": ..., "sig": "..."}` as it travels.
#[derive(Debug, Deserialize)]
struct Envelope<'a> {
    #[serde(borrow)]
    body: Option<&'a RawValue>,
    #[serde(default)]
    sig: Option<String>,
}

/// Why a signed message was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unsealed {
    Malformed(String),
    Unsigned,
    BadSignature,
}

impl Unsealed {
    pub fn reason(&self) -> &'static str {
        match self {
            Unsealed::Malformed(_) => "malformed",
            Unsealed::Unsigned => "unsigned",
            Unsealed::BadSignature => "bad_signature",
        }
    }
}

impl fmt::Display for Unsealed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unsealed::Malformed(m) => write!(f, "malformed message: {m}"),
            Unsealed::Unsigned => f.write_str("the message carries no signature"),
            Unsealed::BadSignature => {
                f.write_str("the signature does not match (wrong site key or altered message)")
            }
        }
    }
}

fn seal<T: Serialize>(key: &Key, domain: &[u8], body: &T) -> Vec<u8> {
    let body = serde_json::to_string(body).expect("protocol types serialize");
    let sig = key.sign(domain, body.as_bytes());
    format!("{{\"body\":{body},\"sig\":\"{sig}\"}}").into_bytes()
}

fn open<T: for<'de> Deserialize<'de>>(
    key: &Key,
    domain: &[u8],
    bytes: &[u8],
) -> Result<T, Unsealed> {
    let env: Envelope =
        serde_json::from_slice(bytes).map_err(|e| Unsealed::Malformed(e.to_string()))?;
    let body = env
        .body
        .ok_or_else(|| Unsealed::Malformed("no `body` member".into()))?;
    let sig = env.sig.ok_or(Unsealed::Unsigned)?;
    if !key.verify(domain, body.get().as_bytes(), &sig) {
        return Err(Unsealed::BadSignature);
    }
    serde_json::from_str(body.get()).map_err(|e| Unsealed::Malformed(e.to_string()))
}

/// Which GPUs of the node a command is for: `"all"` or a list of indexes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GpuSel {
    All(AllWord),
    List(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllWord {
    All,
}

impl GpuSel {
    pub fn all() -> Self {
        GpuSel::All(AllWord::All)
    }
    pub fn contains(&self, index: u32) -> bool {
        match self {
            GpuSel::All(_) => true,
            GpuSel::List(l) => l.contains(&index),
        }
    }
}

/// What a command asks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Action {
    /// Set the power limit, in watts or in percent of the GPU's default limit (one of
    /// the two). Clamped into the GPU's min/max constraints.
    SetPowerLimit {
        gpus: GpuSel,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        watts: Option<f64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        percent: Option<f64>,
    },
    /// Lock the SM clock into `min_mhz..=max_mhz` (clamped into the supported range).
    LockSmClocks {
        gpus: GpuSel,
        min_mhz: f64,
        max_mhz: f64,
    },
    /// Default power limit, clocks unlocked. With a lease like every command: when it
    /// ends unrenewed, the fail-safe applies.
    Reset { gpus: GpuSel },
}

impl Action {
    pub fn gpus(&self) -> &GpuSel {
        match self {
            Action::SetPowerLimit { gpus, .. }
            | Action::LockSmClocks { gpus, .. }
            | Action::Reset { gpus } => gpus,
        }
    }
}

/// A command from the controller to one node's agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    pub v: u32,
    /// Unique; an agent refuses an id it has seen (replay).
    pub id: String,
    pub node: String,
    pub issued_at: Timestamp,
    /// How long what it sets stays in force unless renewed by a later command.
    pub lease_s: f64,
    pub action: Action,
    /// The fencing epoch of the leader that sent it (with `[ha]`): an agent keeps the
    /// highest it has seen and refuses a command from a lower one (`stale_epoch`).
    /// Absent from a controller without `[ha]`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
}

impl Command {
    pub fn seal(&self, key: &Key) -> Vec<u8> {
        seal(key, CMD_DOMAIN, self)
    }
    pub fn open(key: &Key, bytes: &[u8]) -> Result<Command, Unsealed> {
        open(key, CMD_DOMAIN, bytes)
    }

    /// Seals a command's body as given, whatever text it is: for the fuzzer, whose
    /// mutated bodies no [`Command`] serializes to, to reach the parser behind the
    /// signature check.
    pub fn seal_text(key: &Key, body: &str) -> Vec<u8> {
        let sig = key.sign(CMD_DOMAIN, body.as_bytes());
        format!("{{\"body\":{body},\"sig\":\"{sig}\"}}").into_bytes()
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AckStatus {
    /// Every GPU it named now runs as asked (possibly clamped).
    Applied,
    /// Some GPUs failed; see `gpus`.
    Partial,
    /// Nothing was applied; `reason` says why.
    Rejected,
    /// `--dry-run`: checked and logged, no setter called.
    DryRun,
}

/// One GPU's outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuOutcome {
    pub index: u32,
    /// The limit the GPU enforces afterwards (W).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_w: Option<f64>,
    /// The clock range locked afterwards (MHz).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_mhz: Option<(f64, f64)>,
    /// The value asked for lay outside the GPU's constraints and was clamped.
    #[serde(default)]
    pub clamped: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// An agent's answer to a command.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ack {
    pub v: u32,
    pub node: String,
    /// The command's id (absent when the command could not be read).
    pub id: Option<String>,
    pub time: Timestamp,
    pub status: AckStatus,
    /// For rejections: `malformed`, `unsigned`, `bad_signature`, `unsupported_version`,
    /// `wrong_node`, `expired`, `replayed`, `superseded`, `out_of_range`,
    /// `no_such_gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_until: Option<Timestamp>,
    #[serde(default)]
    pub gpus: Vec<GpuOutcome>,
}

impl Ack {
    pub fn seal(&self, key: &Key) -> Vec<u8> {
        seal(key, ACK_DOMAIN, self)
    }
    pub fn open(key: &Key, bytes: &[u8]) -> Result<Ack, Unsealed> {
        open(key, ACK_DOMAIN, bytes)
    }
}

/// What the agent holds a GPU to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Desired {
    /// A power limit in watts (after clamping).
    Limit {
        watts: f64,
        command: String,
        lease_until: Timestamp,
    },
    /// SM clocks locked to a range.
    Clocks {
        min_mhz: f64,
        max_mhz: f64,
        command: String,
        lease_until: Timestamp,
    },
    /// Default limit and clocks, as commanded.
    Default {
        command: String,
        lease_until: Timestamp,
    },
    /// The lease ended unrenewed; the declared fail-safe is in force.
    FailSafe {
        fail_safe: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        watts: Option<f64>,
        since: Timestamp,
        /// The command whose lease ended.
        after: String,
    },
}

/// A process using a GPU, with the job it belongs to when the agent could tell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Process {
    pub pid: u32,
    /// `slurm:JOBID` or `k8s:POD-UID`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
}

/// One GPU in a node report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuReport {
    #[serde(flatten)]
    pub reading: crate::gpu_backend::GpuReading,
    #[serde(default)]
    pub processes: Vec<Process>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired: Option<Desired>,
    /// The Kubernetes pods holding this GPU (`namespace/name`, sorted), as the
    /// kubelet's pod-resources API says, idle or not; empty (and left out) without
    /// `[kubernetes]` in the agent's config, or when no pod holds the GPU. Older
    /// controllers ignore the member; reports without it read as empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pods: Vec<String>,
}

/// A GPU that could not be read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuFailure {
    pub index: u32,
    pub reason: String,
    pub message: String,
}

/// What the agent publishes every read interval.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub v: u32,
    pub node: String,
    pub time: Timestamp,
    /// Increases by one per report since the agent started.
    pub seq: u64,
    pub backend: String,
    pub gpus: Vec<GpuReport>,
    #[serde(default)]
    pub errors: Vec<GpuFailure>,
}

/// The agent's own health (retained).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    pub v: u32,
    pub node: String,
    /// `online`, `degraded` (some GPUs fail or the fail-safe is in force), `stopped`
    /// (clean exit), `offline` (the last will: the connection died).
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<String>,
    #[serde(default)]
    pub dry_run: bool,
    /// The declared fail-safe (`restore_default`, `cap`, `keep`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fail_safe: Option<String>,
    /// GPUs under the fail-safe now.
    #[serde(default)]
    pub fail_safe_gpus: Vec<u32>,
    #[serde(default)]
    pub counters: std::collections::BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> Key {
        Key::from_text("00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff")
            .expect("key")
    }

    fn cmd() -> Command {
        Command {
            v: 1,
            id: "c1".into(),
            node: "n1".into(),
            issued_at: Timestamp::from_secs(1_700_000_000),
            lease_s: 60.0,
            action: Action::SetPowerLimit {
                gpus: GpuSel::List(vec![0, 2]),
                watts: Some(200.0),
                percent: None,
            },
            epoch: None,
        }
    }

    #[test]
    fn a_sealed_command_opens_with_the_key_and_not_without_it() {
        let sealed = cmd().seal(&key());
        assert_eq!(Command::open(&key(), &sealed), Ok(cmd()));
        let other = Key::from_text("another key of enough length!").expect("key");
        assert_eq!(Command::open(&other, &sealed), Err(Unsealed::BadSignature));
        // an ack signature never passes as a command signature
        let ack_sig = key().sign(
            ACK_DOMAIN,
            serde_json::to_string(&cmd()).expect("json").as_bytes(),
        );
        let forged = format!(
            "{{\"body\":{},\"sig\":\"{ack_sig}\"}}",
            serde_json::to_string(&cmd()).expect("json")
        );
        assert_eq!(
            Command::open(&key(), forged.as_bytes()),
            Err(Unsealed::BadSignature)
        );
    }

    #[test]
    fn altered_unsigned_and_malformed_commands_are_told_apart() {
        let sealed = String::from_utf8(cmd().seal(&key())).expect("utf8");
        let altered = sealed.replace("200.0", "100.0");
        assert_ne!(altered, sealed);
        assert_eq!(
            Command::open(&key(), altered.as_bytes()),
            Err(Unsealed::BadSignature)
        );
        let body = serde_json::to_string(&cmd()).expect("json");
        let unsigned = format!("{{\"body\":{body}}}");
        assert_eq!(
            Command::open(&key(), unsigned.as_bytes()),
            Err(Unsealed::Unsigned)
        );
        assert_eq!(
            Command::open(&key(), b"{not json").map_err(|e| e.reason()),
            Err("malformed")
        );
    }

    #[test]
    fn the_signature_covers_the_bytes_as_sent_so_any_writer_can_sign() {
        // hand-written JSON with other spacing and member order
        let body = r#"{ "action": {"kind": "reset", "gpus": "all"}, "v": 1, "id": "x",
            "node": "n1", "issued_at": "2026-01-01T00:00:00Z", "lease_s": 30 }"#;
        let sig = key().sign(CMD_DOMAIN, body.as_bytes());
        let msg = format!("{{\"sig\": \"{sig}\", \"body\": {body}}}");
        let c = Command::open(&key(), msg.as_bytes()).expect("opens");
        assert_eq!(
            c.action,
            Action::Reset {
                gpus: GpuSel::all()
            }
        );
    }

    #[test]
    fn topics_round_trip() {
        let t = Topics::new("site-a/powerplane/v1/");
        let topic = t.topic("gpu-n07", Channel::Ack);
        assert_eq!(topic, "site-a/powerplane/v1/nodes/gpu-n07/ack");
        assert_eq!(t.parse(&topic), Some(("gpu-n07", Channel::Ack)));
        assert_eq!(t.parse("site-a/powerplane/v1/nodes/x/other"), None);
        assert_eq!(t.all(Channel::Gpus), "site-a/powerplane/v1/nodes/+/gpus");
    }

    #[test]
    fn short_keys_are_refused_and_hex_keys_decode() {
        assert!(Key::from_text("short").is_err());
        assert_eq!(Key::from_text(&"ab".repeat(32)).expect("key").0.len(), 32);
    }

    #[test]
    fn a_key_that_is_not_hex_is_its_trimmed_text_and_hex_may_be_upper_case() {
        let upper = "00112233445566778899AABBCCDDEEFF00112233445566778899AABBCCDDEEFF";
        assert_eq!(Key::from_text(upper).expect("key").0, key().0);
        let text = "  not hex but long enough  \n";
        assert_eq!(
            Key::from_text(text).expect("key").0,
            b"not hex but long enough".to_vec()
        );
        // odd length: the text, not half a byte
        let odd = "00112233445566778899aabbccddeeff0";
        assert_eq!(Key::from_text(odd).expect("key").0, odd.as_bytes());
        assert_eq!(Key::from_text("").err(), Some(KeyError::TooShort(0)));
    }

    #[test]
    fn signatures_are_lower_case_hex_and_upper_case_or_junk_is_judged_as_hex() {
        let k = key();
        let sig = k.sign(b"d", b"body");
        assert_eq!(sig.len(), 64);
        assert!(sig
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase()));
        assert!(k.verify(b"d", b"body", &sig));
        assert!(k.verify(b"d", b"body", &sig.to_ascii_uppercase()));
        assert!(!k.verify(b"d", b"body", &sig[1..]));
        assert!(!k.verify(b"d", b"body", "zz"));
        assert!(!k.verify(b"d", b"body", ""));
    }
}
