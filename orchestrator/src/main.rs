//! `powerplane`: the controller, the agent and the operator's tools, in one binary.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use orchestrator::demo::{self, DemoConfig, Input};
use policies::Policy;
use telemetry::{Site, Timestamp};

#[derive(Parser)]
#[command(
    name = "powerplane",
    version,
    about = "Power- and cooling-aware job orchestration for GPU datacenters"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a simulated facility under the control loop and write a report (no network needed).
    Demo {
        /// Simulated minutes to run.
        #[arg(long, default_value_t = 240)]
        minutes: u32,
        /// Where to write report.html, report.csv, jobs.csv, audit.jsonl and state.redb.
        #[arg(long, default_value = "demo-out")]
        out: PathBuf,
        /// Seed of the simulated workload: one seed, one run.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Control loop period, in simulated seconds.
        #[arg(long, default_value_t = 15.0)]
        tick_s: f64,
        /// Site file (default: the built-in demo hall, examples/demo/site.toml).
        #[arg(long)]
        site: Option<PathBuf>,
        /// Policy file (default: examples/demo/policy.toml).
        #[arg(long)]
        policy: Option<PathBuf>,
        /// Price and carbon CSV: start,price_per_kwh,carbon_g_per_kwh (default: examples/demo/prices.csv).
        #[arg(long)]
        prices: Option<PathBuf>,
        /// Simulated start time, RFC 3339.
        #[arg(long, default_value = demo::DEFAULT_START)]
        start: String,
        /// A cooling fault to inject, repeatable: UNIT=FACTOR@MINUTES (from that minute
        /// the unit removes only FACTOR of its capacity) or UNIT=pump@MINUTES (a failed
        /// pump: half its capacity).
        #[arg(long = "fault")]
        faults: Vec<String>,
        /// Start from the facility as it was with no caps (inlets and power settled
        /// uncapped) instead of settled under the first tick's plan.
        #[arg(long)]
        uncontrolled_start: bool,
        /// Read the facility every S simulated seconds between ticks too, and evaluate
        /// a reading that crosses a threshold as `serve` does (20 ms debounce, at most
        /// 4 per second, on simulated time); default: read at the ticks only.
        #[arg(long)]
        sample_s: Option<f64>,
    },
    /// Replay a job trace with real prices under the policy and a no-policy baseline.
    Backtest(orchestrator::backtest::cli::Args),
    /// Run the controller: ingest telemetry, evaluate the policy, keep the store.
    Serve {
        /// The controller's config file (powerplane.toml).
        #[arg(long)]
        config: PathBuf,
        /// Stop after this many seconds (for tests and dry runs); default: until SIGTERM.
        #[arg(long)]
        run_for_s: Option<f64>,
        /// Validate the config and everything it names, then exit.
        #[arg(long)]
        check: bool,
    },
    /// The GPU node agent: publishes the node's GPUs, applies the controller's signed,
    /// leased commands, applies its fail-safe when the controller goes silent.
    Agent(agent::cli::AgentArgs),
    /// Check site files.
    Site {
        #[command(subcommand)]
        command: SiteCommand,
    },
    /// Energy, cost, carbon, peak power, time capped and time held from the ledger and
    /// the audit log, grouped.
    Report {
        /// The controller's config (its site and store).
        #[arg(long, conflicts_with_all = ["site", "store"])]
        config: Option<PathBuf>,
        /// A site file, with --store (e.g. a demo's output).
        #[arg(long, requires = "store")]
        site: Option<PathBuf>,
        /// An embedded store file (state.redb), with --site.
        #[arg(long, requires = "site")]
        store: Option<PathBuf>,
        /// Start of the period (RFC 3339; default: the first ledger entry).
        #[arg(long)]
        from: Option<String>,
        /// End of the period, exclusive (RFC 3339; default: after the last entry).
        #[arg(long)]
        to: Option<String>,
        /// job, project, user, rack or day (in the site's time zone).
        #[arg(long, default_value = "project")]
        group_by: String,
        /// table, csv, json or html.
        #[arg(long, default_value = "table")]
        format: String,
        /// Write here instead of standard output.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// See what the telemetry sources deliver.
    Telemetry {
        #[command(subcommand)]
        command: TelemetryCommand,
    },
    /// Check policy files.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
}

#[derive(Subcommand)]
enum SiteCommand {
    /// Validate site files; print every problem as file:line:col: message. With
    /// --config, also check the site's Redfish bindings against the live services.
    Check {
        #[arg(required_unless_present = "config")]
        files: Vec<PathBuf>,
        /// A controller config (powerplane.toml): its site against its live Redfish
        /// endpoints: each binding's reading, what nothing maps, entities no reading reaches.
        #[arg(long)]
        config: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
enum TelemetryCommand {
    /// Connect to sources for a while and print what they deliver and what was rejected.
    Probe(Box<ProbeOpts>),
}

#[derive(clap::Args)]
struct ProbeOpts {
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
    #[arg(long, default_value_t = 0)]
    qos: u8,
    /// MQTT protocol: 3.1.1 or 5.
    #[arg(long, default_value = "3.1.1")]
    mqtt_protocol: String,
    #[arg(long)]
    username: Option<String>,
    /// Read from POWERPLANE_MQTT_PASSWORD when left out.
    #[arg(long)]
    password: Option<String>,
    /// Share subscriptions with this group ($share/GROUP/...).
    #[arg(long)]
    shared_group: Option<String>,
    /// Largest message accepted, in bytes.
    #[arg(long, default_value_t = 256 * 1024)]
    max_packet_bytes: usize,
    /// Redfish service to poll, e.g. https://10.1.2.3 (repeatable).
    #[arg(long = "redfish")]
    redfish: Vec<String>,
    #[arg(long)]
    redfish_user: Option<String>,
    /// Read from POWERPLANE_REDFISH_PASSWORD when left out.
    #[arg(long)]
    redfish_password: Option<String>,
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

#[derive(Subcommand)]
enum PolicyCommand {
    /// Validate policy files; print every problem as file:line:col: message.
    Check {
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Also check against a site: selectors that pick nothing, caps below a GPU's
        /// minimum, budget limits naming unknown equipment.
        #[arg(long)]
        site: Option<PathBuf>,
    },
    /// Run test files: cases of ticks with readings, jobs and expected caps and holds.
    Test(orchestrator::policy_cli::TestArgs),
    /// Evaluate a policy once on inputs from files; every decision, why, and what
    /// would release it.
    Explain(Box<orchestrator::policy_cli::ExplainArgs>),
    /// Evaluate two policies on the same inputs: what would change (exit 1 when
    /// anything would).
    Diff(Box<orchestrator::policy_cli::DiffArgs>),
}

/// `serve` logs its decisions at info; the tools only warn.
fn default_log_filter() -> &'static str {
    if matches!(std::env::args().nth(1).as_deref(), Some("serve" | "agent")) {
        "info"
    } else {
        "warn"
    }
}

/// jemalloc, not the system allocator: each tick allocates and frees the engine's
/// working state (per GPU at 100,000 GPUs and more), and glibc's malloc fragments under
/// that (docs/performance.md: peak memory and time at 1,000,000 GPUs).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> ExitCode {
    common::logs::init(default_log_filter());
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo {
            minutes,
            out,
            seed,
            tick_s,
            site,
            policy,
            prices,
            start,
            faults,
            uncontrolled_start,
            sample_s,
        } => run_demo(
            DemoArgs {
                minutes,
                out,
                seed,
                tick_s,
                site,
                policy,
                prices,
                faults,
                uncontrolled_start,
                sample_s,
            },
            &start,
        ),
        Command::Site {
            command: SiteCommand::Check { files, config },
        } => site_check(&files, config.as_deref()),
        Command::Serve {
            config,
            run_for_s,
            check,
        } => {
            if check {
                orchestrator::config::load(&config).map(|_| {
                    println!("{}: ok", config.display());
                    ExitCode::SUCCESS
                })
            } else {
                orchestrator::serve::run(&config, run_for_s.map(std::time::Duration::from_secs_f64))
                    .map(|_| ExitCode::SUCCESS)
            }
        }
        Command::Agent(a) => a.run(),
        Command::Backtest(args) => args.run(),
        Command::Report {
            config,
            site,
            store,
            from,
            to,
            group_by,
            format,
            out,
        } => energy_report(config, site, store, from, to, &group_by, &format, out),
        Command::Telemetry {
            command: TelemetryCommand::Probe(opts),
        } => probe(opts),
        Command::Policy {
            command: PolicyCommand::Check { files, site },
        } => {
            let site = match site {
                Some(path) => {
                    let name = path.display().to_string();
                    let text = match std::fs::read_to_string(&path) {
                        Ok(t) => t,
                        Err(e) => {
                            eprintln!("error: cannot read {name}: {e}");
                            return ExitCode::FAILURE;
                        }
                    };
                    match telemetry::Site::parse(&name, &text) {
                        Ok(s) => Some(s),
                        Err(e) => {
                            eprintln!("{e}");
                            return ExitCode::FAILURE;
                        }
                    }
                }
                None => None,
            };
            check(&files, |name, text| {
                let p = Policy::parse(name, text).map_err(|e| e.to_string())?;
                if let Some(site) = &site {
                    p.check_site(name, text, site).map_err(|e| e.to_string())?;
                }
                let active = p.rules.iter().filter(|r| r.enabled).count();
                Ok(format!(
                    "{} rules, {active} enabled{}",
                    p.rules.len(),
                    if site.is_some() {
                        ", checked against the site"
                    } else {
                        ""
                    }
                ))
            })
        }
        Command::Policy {
            command: PolicyCommand::Test(a),
        } => orchestrator::policy_cli::test_cmd(&a),
        Command::Policy {
            command: PolicyCommand::Explain(a),
        } => orchestrator::policy_cli::explain_cmd(&a),
        Command::Policy {
            command: PolicyCommand::Diff(a),
        } => orchestrator::policy_cli::diff_cmd(&a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Checks every file; prints all problems; exit 1 if any.
fn site_check(files: &[PathBuf], config: Option<&std::path::Path>) -> Result<ExitCode> {
    let files_ok = files.is_empty() || site_files(files)? == ExitCode::SUCCESS;
    let live_ok = match config {
        None => true,
        Some(c) => {
            let checked = orchestrator::site_check::run(c)?;
            print!("{}", checked.report);
            checked.ok
        }
    };
    Ok(if files_ok && live_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn site_files(files: &[PathBuf]) -> Result<ExitCode> {
    check(files, |name, text| {
        Site::parse(name, text)
            .map(|s| {
                format!(
                    "{} racks, {} nodes, {} GPUs, {:.1} kW facility budget",
                    s.racks.len(),
                    s.nodes.len(),
                    s.gpu_count(),
                    s.facility_budget_kw()
                )
            })
            .map_err(|e| e.to_string())
    })
}

fn check(
    files: &[PathBuf],
    parse: impl Fn(&str, &str) -> Result<String, String>,
) -> Result<ExitCode> {
    let mut failed = false;
    for f in files {
        let name = f.display().to_string();
        let text = match std::fs::read_to_string(f) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("{name}: cannot read: {e}");
                failed = true;
                continue;
            }
        };
        match parse(&name, &text) {
            Ok(what) => println!("{name}: ok ({what})"),
            Err(problems) => {
                eprintln!("{problems}");
                failed = true;
            }
        }
    }
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

fn probe(o: Box<ProbeOpts>) -> Result<ExitCode> {
    use orchestrator::probe::ProbeArgs;
    use sources::redfish::{Auth, EndpointConfig, Tls};
    anyhow::ensure!(
        o.seconds > 0.0 && o.seconds <= 86_400.0,
        "--seconds must be within 0..=86400, got {}",
        o.seconds
    );
    if let Some(config) = &o.config {
        let loaded = orchestrator::config::load(config)?;
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
        return finish_probe(args, o.json);
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
    let mqtt = o.mqtt.as_ref().map(|url| {
        let mut c = sources::mqtt::MqttConfig::new(url);
        c.topics = o.topics.clone();
        c.qos = o.qos;
        c.protocol = o.mqtt_protocol.clone();
        c.username = o.username.clone();
        c.password = o
            .password
            .clone()
            .or_else(|| std::env::var("POWERPLANE_MQTT_PASSWORD").ok());
        c.shared_group = o.shared_group.clone();
        c.max_packet_bytes = o.max_packet_bytes;
        c
    });
    let password = o
        .redfish_password
        .clone()
        .or_else(|| std::env::var("POWERPLANE_REDFISH_PASSWORD").ok());
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
            anyhow::bail!("--redfish-user needs --redfish-password or POWERPLANE_REDFISH_PASSWORD")
        }
        _ => Auth::None,
    };
    let redfish = o
        .redfish
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
            };
            e
        })
        .collect();
    let args = ProbeArgs {
        mqtt,
        mapping,
        redfish,
        redfish_interval_s: o.redfish_interval_s,
        seconds: o.seconds,
        json: o.json,
    };
    finish_probe(args, o.json)
}

#[allow(clippy::too_many_arguments)]
fn energy_report(
    config: Option<PathBuf>,
    site: Option<PathBuf>,
    store: Option<PathBuf>,
    from: Option<String>,
    to: Option<String>,
    group_by: &str,
    format: &str,
    out: Option<PathBuf>,
) -> Result<ExitCode> {
    use orchestrator::energy_report::{build, GroupBy};
    let by: GroupBy = group_by.parse().map_err(|e: String| anyhow::anyhow!(e))?;
    anyhow::ensure!(
        ["table", "csv", "json", "html"].contains(&format),
        "--format {format:?}: use table, csv, json or html"
    );
    let (site, mut store) = match (config, site, store) {
        (Some(c), _, _) => orchestrator::serve::open_for_report(&c)?,
        (None, Some(site), Some(store)) => {
            let text = std::fs::read_to_string(&site)
                .with_context(|| format!("cannot read {}", site.display()))?;
            let site = Site::parse(&site.display().to_string(), &text)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            anyhow::ensure!(store.exists(), "no store at {}", store.display());
            let backend = orchestrator::embedded::EmbeddedBackend::open(&store)?;
            (site, integrations::store::Store::new(Box::new(backend)))
        }
        _ => anyhow::bail!(
            "say where the ledger is: --config powerplane.toml, or --site FILE --store state.redb"
        ),
    };
    let mut ledger = Vec::new();
    let mut next = 1;
    loop {
        let page = store.ledger(next, 10_000)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        ledger.extend(page.into_iter().map(|p| p.1));
        next = last + 1;
    }
    let mut audit = Vec::new();
    let mut next = 1;
    loop {
        let page = store.audit(next, 10_000)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        audit.extend(page.into_iter().map(|p| p.1));
        next = last + 1;
    }
    let mut conditions = Vec::new();
    let mut next = 1;
    loop {
        let page = store.conditions(next, 10_000)?;
        let Some(last) = page.last().map(|p| p.0) else {
            break;
        };
        conditions.extend(page.into_iter().map(|p| p.1));
        next = last + 1;
    }
    let parse = |s: &str| {
        Timestamp::parse_rfc3339(s)
            .map_err(|e| anyhow::anyhow!("{s:?}: {e} (use RFC 3339, e.g. 2026-11-01T00:00:00Z)"))
    };
    let from = match from {
        Some(f) => parse(&f)?,
        None => ledger.iter().map(|e| e.start).min().unwrap_or_default(),
    };
    let to = match to {
        Some(t) => parse(&t)?,
        None => ledger
            .iter()
            .map(|e| e.end)
            .max()
            .unwrap_or_default()
            .plus_secs(0.001),
    };
    anyhow::ensure!(from < to, "--from must be before --to");
    let gpu_racks = site
        .gpus()
        .iter()
        .map(|g| (g.id.to_string(), g.rack.id.clone()))
        .collect();
    let mut r = build(
        &gpu_racks,
        &ledger,
        &audit,
        by,
        site.timezone,
        &site.currency,
        from,
        to,
    );
    r.site = site.name.clone();
    let jobs = store.jobs()?;
    let peaks: Vec<orchestrator::demand::PeriodPeak> = store
        .records(orchestrator::demand::COLLECTION)?
        .into_values()
        .collect();
    let r = r
        .with_inlets(&conditions)
        .with_jobs(&jobs)
        .with_demand_charge(
            site.tariff.as_ref().and_then(|t| t.demand_charge_per_kw),
            site.timezone,
            &peaks,
            &ledger,
        );
    let text = match format {
        "csv" => r.csv(),
        "json" => r.json(),
        "html" => r.html(&site.name),
        _ => r.table(),
    };
    match out {
        Some(p) => {
            std::fs::write(&p, text).with_context(|| format!("cannot write {}", p.display()))?
        }
        None => print!("{text}"),
    }
    Ok(ExitCode::SUCCESS)
}

fn finish_probe(args: orchestrator::probe::ProbeArgs, json: bool) -> Result<ExitCode> {
    use orchestrator::probe;
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

/// The demo's command line, as given.
struct DemoArgs {
    minutes: u32,
    out: PathBuf,
    seed: u64,
    tick_s: f64,
    site: Option<PathBuf>,
    policy: Option<PathBuf>,
    prices: Option<PathBuf>,
    faults: Vec<String>,
    uncontrolled_start: bool,
    sample_s: Option<f64>,
}

fn run_demo(args: DemoArgs, start: &str) -> Result<ExitCode> {
    let DemoArgs {
        minutes,
        out,
        seed,
        tick_s,
        site,
        policy,
        prices,
        faults,
        uncontrolled_start,
        sample_s,
    } = args;
    anyhow::ensure!(
        (1.0..=3600.0).contains(&tick_s),
        "--tick-s must be within 1..=3600, got {tick_s}"
    );
    if let Some(s) = sample_s {
        anyhow::ensure!(
            (0.1..=tick_s).contains(&s),
            "--sample-s must be within 0.1..=--tick-s ({tick_s}), got {s}"
        );
    }
    anyhow::ensure!(
        (1..=60 * 24 * 31).contains(&minutes),
        "--minutes must be within 1..=44640, got {minutes}"
    );
    let load = |p: Option<PathBuf>, name: &str, text: &str| {
        p.map_or_else(|| Ok(Input::builtin(name, text)), |p| Input::read(&p))
    };
    let site = load(site, "examples/demo/site.toml", demo::DEFAULT_SITE)?;
    let parsed = Site::parse(&site.name, &site.text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let faults = faults
        .iter()
        .map(|f| orchestrator::sim::Fault::parse(f, &parsed))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| anyhow::anyhow!("--fault: {e}"))?;
    let cfg = DemoConfig {
        minutes,
        seed,
        tick_s,
        site,
        faults,
        uncontrolled_start,
        sample_s,
        policy: load(policy, "examples/demo/policy.toml", demo::DEFAULT_POLICY)?,
        prices: load(prices, "examples/demo/prices.csv", demo::DEFAULT_PRICES)?,
        start: Timestamp::parse_rfc3339(start)
            .with_context(|| format!("--start {start:?} is not RFC 3339"))?,
        out,
    };
    let began = std::time::Instant::now();
    let mut err = std::io::stderr();
    let summary = demo::run(&cfg, &mut err)?;
    print!("{}", summary.table(&cfg.out));
    eprintln!(
        "  ({} simulated minutes in {:.1} s)",
        minutes,
        began.elapsed().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}
