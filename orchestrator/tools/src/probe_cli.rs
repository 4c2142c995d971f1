//! `powerplane telemetry probe`'s command line: the sources from flags or from a
//! config, probed (see [`crate::probe`]), as a table or JSON.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use sources::redfish::{Auth, EndpointConfig, Tls};

use crate::probe::{self, ProbeArgs};

#[derive(clap::Args)]
pub struct ProbeOpts {
    /// Probe the sources a controller config (powerplane.toml) names, instead of flags.
    #[arg(long, conflicts_with_all = ["mqtt", "redfish"])]
    config: Option<PathBuf>,
    /// MQTT broker, mqtt://host[:port].
    #[arg(long)]
    mqtt: Option<String>,
    /// Topic filter to subscribe to (repeatable; default: what the mapping needs).
    #[arg(long = "topic")]
    topics: Vec<String>,
    /// Mapping file: how MQTT messages become samples.
    #[arg(long)]
    mapping: Option<PathBuf>,
    /// QoS of the subscriptions: 0 (at most once), 1 (at least once) or 2.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u8).range(0..=2))]
    qos: u8,
    /// MQTT protocol version.
    #[arg(long, value_enum, default_value_t = MqttProtocol::V311)]
    mqtt_protocol: MqttProtocol,
    /// MQTT user name.
    #[arg(long)]
    username: Option<String>,
    /// A file holding the MQTT password (never the password itself on the command
    /// line, where `ps` and the shell's history see it); without it,
    /// POWERPLANE_MQTT_PASSWORD.
    #[arg(long, value_name = "FILE")]
    password_file: Option<PathBuf>,
    /// Share subscriptions with this group ($share/GROUP/...).
    #[arg(long)]
    shared_group: Option<String>,
    /// Largest message accepted, in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    max_packet_bytes: usize,
    /// Redfish service to poll, e.g. https://10.1.2.3 (repeatable).
    #[arg(long = "redfish")]
    redfish: Vec<String>,
    /// Redfish user name.
    #[arg(long)]
    redfish_user: Option<String>,
    /// A file holding the Redfish password; without it, POWERPLANE_REDFISH_PASSWORD.
    #[arg(long, value_name = "FILE")]
    redfish_password_file: Option<PathBuf>,
    /// Log in with a Redfish session instead of HTTP Basic.
    #[arg(long)]
    redfish_session: bool,
    /// Accept any certificate (say it explicitly; never the default).
    #[arg(long)]
    redfish_insecure: bool,
    /// PEM file of the CA that signed the BMCs' certificates.
    #[arg(long)]
    redfish_ca_file: Option<String>,
    /// SHA-256 fingerprint of the one certificate to trust.
    #[arg(long)]
    redfish_pin: Option<String>,
    /// Deadline of one Redfish request, seconds.
    #[arg(long, default_value_t = 5.0)]
    redfish_timeout_s: f64,
    /// Seconds between two Redfish polls.
    #[arg(long, default_value_t = 10.0)]
    redfish_interval_s: f64,
    /// How long to listen.
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    /// One sample per line as JSON instead of a table; rejects go to standard error.
    #[arg(long)]
    json: bool,
}

/// `--mqtt-protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MqttProtocol {
    #[value(name = "3.1.1")]
    V311,
    #[value(name = "5")]
    V5,
}

impl MqttProtocol {
    fn as_str(self) -> &'static str {
        match self {
            MqttProtocol::V311 => "3.1.1",
            MqttProtocol::V5 => "5",
        }
    }
}

/// A secret: from its file (trimmed), else from the environment variable.
fn secret(file: Option<&Path>, var: &str) -> Result<Option<String>> {
    match file {
        Some(f) => {
            let text = std::fs::read_to_string(f)
                .with_context(|| format!("cannot read the password file {}", f.display()))?;
            Ok(Some(text.trim_end_matches(['\r', '\n']).to_string()))
        }
        None => Ok(std::env::var(var).ok()),
    }
}

pub fn run(o: Box<ProbeOpts>) -> Result<ExitCode> {
    anyhow::ensure!(
        o.seconds > 0.0 && o.seconds <= 86_400.0,
        "--seconds must be within 0..=86400, got {}",
        o.seconds
    );
    if let Some(config) = &o.config {
        return from_config(config, &o);
    }
    anyhow::ensure!(
        o.mqtt.is_some() || !o.redfish.is_empty(),
        "nothing to probe: give --mqtt URL (with --mapping FILE), --redfish URL or --config FILE"
    );
    let mapping = match &o.mapping {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read {}", p.display()))?;
            match telemetry::mapping::Mapping::parse(&p.display().to_string(), &text) {
                Ok(m) => Some(m),
                Err(problems) => {
                    eprintln!("{problems}");
                    return Ok(ExitCode::from(1));
                }
            }
        }
        None => None,
    };
    let mqtt = mqtt_config(&o)?;
    let redfish = redfish_endpoints(&o)?;
    let args = ProbeArgs {
        mqtt,
        mapping,
        redfish,
        redfish_interval_s: o.redfish_interval_s,
        seconds: o.seconds,
        json: o.json,
    };
    finish(args, o.json)
}

fn finish(args: ProbeArgs, json: bool) -> Result<ExitCode> {
    let mut out = std::io::stdout();
    let mut err = std::io::stderr();
    let seen = probe::run(args, &mut out, &mut err)?;
    if !json {
        print!("{}", probe::table(&seen, common::wall_clock()));
    }
    eprint!("{}", probe::survey_summary(&seen));
    if !seen.unreachable.is_empty() {
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}

/// The sources a controller config names.
fn from_config(config: &Path, o: &ProbeOpts) -> Result<ExitCode> {
    let loaded = serve::config::load(config)?;
    let args = ProbeArgs {
        mqtt: loaded.config.mqtt.as_ref().map(|m| m.client.clone()),
        mapping: loaded.mapping,
        redfish: loaded
            .config
            .redfish
            .as_ref()
            .map(|r| r.endpoints.clone())
            .unwrap_or_default(),
        redfish_interval_s: loaded
            .config
            .redfish
            .as_ref()
            .map_or(o.redfish_interval_s, |r| r.interval_s),
        seconds: o.seconds,
        json: o.json,
    };
    anyhow::ensure!(
        args.mqtt.is_some() || !args.redfish.is_empty(),
        "{}: names no [mqtt] and no [redfish] to probe",
        config.display()
    );
    finish(args, o.json)
}

/// `--mqtt` and its flags; the password from the environment when left out.
fn mqtt_config(o: &ProbeOpts) -> Result<Option<sources::mqtt::MqttConfig>> {
    let Some(url) = o.mqtt.as_ref() else {
        return Ok(None);
    };
    let mut c = sources::mqtt::MqttConfig::new(url);
    c.topics = o.topics.clone();
    c.qos = o.qos;
    c.protocol = o.mqtt_protocol.as_str().to_string();
    c.username = o.username.clone();
    c.password = secret(o.password_file.as_deref(), "POWERPLANE_MQTT_PASSWORD")?;
    c.shared_group = o.shared_group.clone();
    c.max_packet_bytes = o.max_packet_bytes;
    Ok(Some(c))
}

/// `--redfish` endpoints, named bmc1, bmc2, ..., with the credentials and trust flags.
fn redfish_endpoints(o: &ProbeOpts) -> Result<Vec<EndpointConfig>> {
    let password = secret(
        o.redfish_password_file.as_deref(),
        "POWERPLANE_REDFISH_PASSWORD",
    )?;
    let auth = match (o.redfish_user.clone(), password) {
        (Some(username), Some(password)) if o.redfish_session => Auth::Session {
            username,
            password,
            password_file: None,
        },
        (Some(username), Some(password)) => Auth::Basic {
            username,
            password,
            password_file: None,
        },
        (Some(_), None) => {
            anyhow::bail!(
                "--redfish-user needs --redfish-password-file or POWERPLANE_REDFISH_PASSWORD"
            )
        }
        _ => Auth::None,
    };
    Ok(o.redfish
        .iter()
        .enumerate()
        .map(|(i, url)| {
            let mut e = EndpointConfig::new(&format!("bmc{}", i + 1), url);
            e.auth = auth.clone();
            e.timeout_s = o.redfish_timeout_s;
            e.tls = Tls {
                ca_file: o.redfish_ca_file.clone(),
                pinned_sha256: o.redfish_pin.clone(),
                insecure: o.redfish_insecure,
                ..Tls::default()
            };
            e
        })
        .collect())
}
