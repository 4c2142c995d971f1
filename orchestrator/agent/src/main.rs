//! `powerplane-agent`: the node agent alone, for GPU nodes. It carries no store, no
//! HTTP server, no scheduler client and no policy engine; `powerplane agent` runs the
//! same code.

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

/// The GPU node agent: publishes the node's GPUs, applies the controller's signed,
/// leased commands, applies its fail-safe when the controller goes silent.
#[derive(Debug, Parser)]
#[command(name = "powerplane-agent", version)]
struct Cli {
    #[command(flatten)]
    args: agent::cli::AgentArgs,
    /// Write the man page and the bash, zsh and fish completions under this folder
    /// (for the packages), then exit.
    #[arg(long, hide = true, value_name = "DIR")]
    generate_docs: Option<std::path::PathBuf>,
}

fn main() -> ExitCode {
    agent::logs::init("info");
    let cli = Cli::parse();
    if let Some(out) = cli.generate_docs {
        return match common::cli_docs::write(Cli::command(), "powerplane-agent", &out) {
            Ok(files) => {
                for f in files {
                    println!("{}", f.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!(
                    "error: writing man pages and completions to {}: {e}",
                    out.display()
                );
                ExitCode::FAILURE
            }
        };
    }
    match cli.args.run() {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
