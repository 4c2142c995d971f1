//! `powerplane`: the controller, the agent and the operator's tools, in one binary.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{CommandFactory, Parser, Subcommand};
use orchestrator::demo::{self, DemoConfig, Input};
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
        /// Validate the config and everything it names (an embedded store file is read,
        /// never written), then exit.
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
        /// What the rows are (days in the site's time zone).
        #[arg(long, value_enum, default_value_t = tools::report_cli::GroupByArg::Project)]
        group_by: tools::report_cli::GroupByArg,
        /// How the report is written.
        #[arg(long, value_enum, default_value_t = tools::report_cli::Format::Table)]
        format: tools::report_cli::Format,
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
    /// Write the man pages and the bash, zsh and fish completions of this binary
    /// under OUT (for the packages).
    #[command(hide = true)]
    GenerateDocs {
        /// The folder to write `man/` and `completions/` into.
        out: PathBuf,
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
    Probe(Box<tools::probe_cli::ProbeOpts>),
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
    exit_code(dispatch(cli.command))
}

/// A command's exit code; an error is printed (with its causes) and fails.
fn exit_code(result: Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the command the line names, in the crate that holds it.
fn dispatch(command: Command) -> Result<ExitCode> {
    match command {
        Command::GenerateDocs { out } => {
            let files =
                common::cli_docs::write(Cli::command(), "powerplane", &out).with_context(|| {
                    format!("writing man pages and completions to {}", out.display())
                })?;
            for f in files {
                println!("{}", f.display());
            }
            Ok(ExitCode::SUCCESS)
        }
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
        } => tools::check_cli::site(&files, config.as_deref()),
        Command::Serve {
            config,
            run_for_s,
            check,
        } => serve(&config, run_for_s, check),
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
        } => tools::report_cli::run(config, site, store, from, to, group_by, format, out),
        Command::Telemetry {
            command: TelemetryCommand::Probe(opts),
        } => tools::probe_cli::run(opts),
        Command::Policy { command } => policy(command),
    }
}

/// `serve`: the controller until a signal (or `--run-for-s`); `--check`: the config,
/// and an embedded store's file read-only.
fn serve(config: &Path, run_for_s: Option<f64>, check: bool) -> Result<ExitCode> {
    if check {
        let loaded = orchestrator::config::load(config)?;
        // the store's file is only read: a damaged one is reported as serve would refuse it
        let store = orchestrator::serve::check_store(config, &loaded.config.store)?;
        println!("{}: ok", config.display());
        if let Some(store) = store {
            println!("{store}");
        }
        Ok(ExitCode::SUCCESS)
    } else {
        orchestrator::serve::run(config, run_for_s.map(std::time::Duration::from_secs_f64))
            .map(|_| ExitCode::SUCCESS)
    }
}

/// `policy check|test|explain|diff`.
fn policy(command: PolicyCommand) -> Result<ExitCode> {
    match command {
        PolicyCommand::Check { files, site } => tools::check_cli::policy(&files, site),
        PolicyCommand::Test(a) => orchestrator::policy_cli::test_cmd(&a),
        PolicyCommand::Explain(a) => orchestrator::policy_cli::explain_cmd(&a),
        PolicyCommand::Diff(a) => orchestrator::policy_cli::diff_cmd(&a),
    }
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
