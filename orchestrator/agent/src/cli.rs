//! The agent's command line, shared by `powerplane agent` and the slim
//! `powerplane-agent` binary: run the loop from a config file, or read the GPUs once.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use telemetry::gpu_backend::GpuBackend;

/// The agent's flags.
#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// The agent's config file (agent.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Log what would be set; never call a setter.
    #[arg(long)]
    pub dry_run: bool,
    /// Stop after this many seconds (as on SIGTERM).
    #[arg(long)]
    pub run_for_s: Option<f64>,
    /// Read every GPU once and print it (with --config: the backend it names).
    #[arg(long)]
    pub once: bool,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Where the GPUs are read (without --config).
    #[arg(long, value_enum, default_value_t = Backend::Nvml)]
    pub backend: Backend,
    /// Simulated GPUs (with --backend sim).
    #[arg(long, default_value_t = 8)]
    pub gpus: u32,
    /// Simulated GPU model (with --backend sim).
    #[arg(long, default_value = "A40")]
    pub gpu_model: String,
    /// This node's name (default: the host name).
    #[arg(long)]
    pub node: Option<String>,
    /// Seed of the simulated GPUs' load (with --backend sim): one seed, one reading.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// `--backend`: where `--once` reads the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// The node's NVIDIA GPUs, through NVML (libnvidia-ml.so.1).
    Nvml,
    /// Simulated GPUs (--gpus, --gpu-model, --seed), for a test bench.
    Sim,
}

impl AgentArgs {
    /// Runs what the flags say.
    pub fn run(self) -> Result<ExitCode> {
        match (&self.config, self.once) {
            (Some(config), false) => run_loop(config, self.dry_run, self.run_for_s),
            _ => self.read_once(),
        }
    }

    fn read_once(self) -> Result<ExitCode> {
        anyhow::ensure!(
            self.once,
            "say what to run: `powerplane agent --config agent.toml`, or `powerplane agent --once` to read this node's GPUs"
        );
        let node = self.node.clone().unwrap_or_else(crate::run::hostname);
        if let Some(c) = &self.config {
            let loaded = crate::run::load(c, true)?;
            let node = loaded.rules.node.clone();
            return match crate::run::open_backend(&loaded.config.backend) {
                Ok(mut b) => print_once(&node, b.as_mut(), self.json),
                Err(e) => failed(&e),
            };
        }
        let mut b: Box<dyn GpuBackend> = match self.backend {
            Backend::Nvml => match sources::nvml::NvmlBackend::open() {
                Ok(b) => Box::new(b),
                Err(e) => return failed(&e),
            },
            Backend::Sim => {
                let model = telemetry::GpuModel::builtin(&self.gpu_model).ok_or_else(|| {
                    anyhow::anyhow!(
                        "unknown --gpu-model {:?} (known: {})",
                        self.gpu_model,
                        telemetry::GpuModel::BUILTIN_NAMES.join(", ")
                    )
                })?;
                Box::new(crate::SimGpus::new(self.gpus, model, self.seed))
            }
        };
        print_once(&node, b.as_mut(), self.json)
    }
}

fn failed(e: &dyn std::fmt::Display) -> Result<ExitCode> {
    eprintln!("error: {e}");
    Ok(ExitCode::from(1))
}

/// The agent's loop until SIGTERM or SIGINT (or `run_for_s`).
fn run_loop(config: &Path, dry_run: bool, run_for_s: Option<f64>) -> Result<ExitCode> {
    let loaded = crate::run::load(config, dry_run)?;
    let backend = match crate::run::open_backend(&loaded.config.backend) {
        Ok(b) => b,
        Err(e) => return failed(&e),
    };
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    let started = std::time::Instant::now();
    let keep_going = || {
        !stop.load(std::sync::atomic::Ordering::Relaxed)
            && run_for_s.is_none_or(|s| started.elapsed().as_secs_f64() < s)
    };
    crate::run::run_wall(loaded, backend, &keep_going)?;
    Ok(ExitCode::SUCCESS)
}

fn print_once(node: &str, b: &mut dyn GpuBackend, json: bool) -> Result<ExitCode> {
    let report = match crate::once(node, b) {
        Ok(r) => r,
        Err(e) => return failed(&e),
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} ({}): {} GPUs",
            report.node,
            report.backend,
            report.gpus.len()
        );
        println!(
            "{:>3}  {:<24} {:>8} {:>8} {:>10} {:>6} {:>8} {:>5}  THROTTLE",
            "GPU", "NAME", "POWER W", "LIMIT W", "MIN-MAX W", "TEMP", "SM MHz", "UTIL"
        );
        for g in &report.gpus {
            println!(
                "{:>3}  {:<24} {:>8.1} {:>8.1} {:>4.0}-{:<5.0} {:>6.1} {:>8.0} {:>4.0}%  {}",
                g.index,
                g.name,
                g.power_w,
                g.power_limit_w,
                g.min_limit_w,
                g.max_limit_w,
                g.temp_c,
                g.sm_clock_mhz,
                g.utilization_pct,
                g.throttle_reasons.join(",")
            );
        }
    }
    for e in &report.errors {
        eprintln!(
            "gpu {}: {} ({})",
            e.index.map_or("-".into(), |i| i.to_string()),
            e.message,
            e.reason
        );
    }
    Ok(if report.errors.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}
