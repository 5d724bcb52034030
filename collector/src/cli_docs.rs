//! Shell completions and man pages made from the command line's own definition, by the hidden subcommands
//! `completions SHELL` (the script on stdout) and `man --out DIR` (one page per command). The release bundle
//! (scripts/release.sh) and the .deb packages ship what these print, so they never drift from the flags.

use std::io::Write;
use std::path::Path;

/// The completion script of `cmd` for `shell`.
pub fn completions(mut cmd: clap::Command, shell: clap_complete::Shell, out: &mut dyn Write) -> std::io::Result<()> {
    let name = cmd.get_name().to_string();
    clap_complete::generate(shell, &mut cmd, name, out);
    out.flush()
}

/// Man pages of `cmd` and each visible subcommand (`NAME.1`, `NAME-SUB.1`) into `dir`, created if missing.
pub fn man_pages(cmd: clap::Command, dir: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    clap_mangen::generate_to(cmd, dir)
}
