//! `powerplane-agent`: the node agent alone, for GPU nodes. It carries no store, no
//! HTTP server, no scheduler client and no policy engine; `powerplane agent` runs the
//! same code.

use std::process::ExitCode;

use clap::Parser;

/// The GPU node agent: publishes the node's GPUs, applies the controller's signed,
/// leased commands, applies its fail-safe when the controller goes silent.
#[derive(Debug, Parser)]
#[command(name = "powerplane-agent", version)]
struct Cli {
    #[command(flatten)]
    args: agent::cli::AgentArgs,
}

fn main() -> ExitCode {
    agent::logs::init("info");
    match Cli::parse().args.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
