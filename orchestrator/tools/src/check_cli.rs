//! `powerplane site check` and `powerplane policy check`: each file parsed and
//! checked, every problem printed, exit 1 if any.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use policies::Policy;
use telemetry::diag::Diagnostics;
use telemetry::Site;

/// Checks every file; prints all problems; exit 1 if any.
pub fn site(files: &[PathBuf], config: Option<&std::path::Path>) -> Result<ExitCode> {
    let files_ok = files.is_empty() || site_files(files)? == ExitCode::SUCCESS;
    let live_ok = match config {
        None => true,
        Some(c) => {
            let checked = crate::site_check::run(c)?;
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
        Site::parse(name, text).map(|s| {
            format!(
                "{} racks, {} nodes, {} GPUs, {:.1} kW facility budget",
                s.racks.len(),
                s.nodes.len(),
                s.gpu_count(),
                s.facility_budget_kw()
            )
        })
    })
}

/// `policy check`: every policy file, with `site` also against the site.
pub fn policy(files: &[PathBuf], site: Option<PathBuf>) -> Result<ExitCode> {
    let site = match site {
        Some(path) => {
            let name = path.display().to_string();
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("error: cannot read {name}: {e}");
                    return Ok(ExitCode::FAILURE);
                }
            };
            match telemetry::Site::parse(&name, &text) {
                Ok(s) => Some(s),
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::FAILURE);
                }
            }
        }
        None => None,
    };
    check(files, |name, text| {
        let p = Policy::parse(name, text)?;
        if let Some(site) = &site {
            p.check_site(name, text, site)?;
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

fn check(
    files: &[PathBuf],
    parse: impl Fn(&str, &str) -> Result<String, Diagnostics>,
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
