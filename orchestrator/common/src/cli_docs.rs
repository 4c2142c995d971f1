//! Man pages and shell completions, generated from a binary's clap definition, for
//! the packages (`scripts/package`): what `--help` says is what `man` says.
//!
//! [`write`] lays them out under one folder the way the packages install them:
//!
//! - `man/NAME.1` and `man/NAME-SUBCOMMAND.1` (one page per subcommand, as git does);
//! - `completions/NAME.bash`, `completions/_NAME` (zsh), `completions/NAME.fish`.

use std::io;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_complete::Shell;

/// The shells a package ships completions for.
pub const SHELLS: [Shell; 3] = [Shell::Bash, Shell::Zsh, Shell::Fish];

/// Writes the man pages and completions of `cmd` (named `bin`) under `out`, and
/// returns the files written.
pub fn write(cmd: Command, bin: &'static str, out: &Path) -> io::Result<Vec<PathBuf>> {
    let mut cmd = cmd.name(bin).bin_name(bin);
    let mut pages = without_help(cmd.clone());
    pages.build();
    cmd.build();
    let man = out.join("man");
    std::fs::create_dir_all(&man)?;
    clap_mangen::generate_to(pages, &man)?;
    let completions = out.join("completions");
    std::fs::create_dir_all(&completions)?;
    for shell in SHELLS {
        clap_complete::generate_to(shell, &mut cmd, bin, &completions)?;
    }
    let mut written = Vec::new();
    for dir in [man, completions] {
        for entry in std::fs::read_dir(dir)? {
            written.push(entry?.path());
        }
    }
    written.sort();
    Ok(written)
}

/// `cmd` without clap's `help` subcommands: `-h` is on every page already, and a page
/// per `help` (`NAME-help-serve`) would only repeat the others.
fn without_help(cmd: Command) -> Command {
    cmd.disable_help_subcommand(true)
        .mut_subcommands(without_help)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        Command::new("x")
            .about("a tool")
            .subcommand(
                Command::new("serve")
                    .about("serves")
                    .arg(clap::Arg::new("config").long("config")),
            )
            .subcommand(Command::new("hidden").hide(true))
    }

    #[test]
    fn every_visible_subcommand_gets_a_page_and_every_shell_a_completion() {
        let dir = tempfile::tempdir().expect("tempdir");
        let files = write(cli(), "tool", dir.path()).expect("write");
        let names: Vec<String> = files
            .iter()
            .map(|p| p.file_name().expect("name").to_string_lossy().into_owned())
            .collect();
        for want in ["tool.1", "tool-serve.1", "tool.bash", "_tool", "tool.fish"] {
            assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
        }
        assert!(!names.iter().any(|n| n.contains("hidden")), "{names:?}");
        assert!(!names.iter().any(|n| n.contains("help")), "{names:?}");
        let page = std::fs::read_to_string(dir.path().join("man/tool-serve.1")).expect("page");
        assert!(page.contains("\\-\\-config"), "{page}");
        let bash = std::fs::read_to_string(dir.path().join("completions/tool.bash")).expect("bash");
        assert!(
            bash.contains("--config") && bash.contains("serve"),
            "{bash}"
        );
    }
}
