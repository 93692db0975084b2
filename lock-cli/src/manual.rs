//! `distlock completions SHELL` and `distlock man [SUBCOMMAND]`: shell completions and
//! manual pages generated from the same clap definitions as `--help`, so they cannot drift
//! from the command line.

use clap::{Args, Command};
use clap_complete::Shell;

use crate::common::print_stdout_bytes;
use crate::exit::{CliError, Exit, INTERNAL, USAGE};

pub const COMPLETIONS_HELP: &str = "\
Examples:
  # bash, for every user (bash-completion), or in ~/.bashrc for yourself
  distlock completions bash > /etc/bash_completion.d/distlock
  source <(distlock completions bash)
  # zsh: a directory on $fpath
  distlock completions zsh > ~/.zfunc/_distlock
  # fish
  distlock completions fish > ~/.config/fish/completions/distlock.fish";

pub const MAN_HELP: &str = "\
Examples:
  distlock man > /usr/local/share/man/man1/distlock.1
  distlock man run > /usr/local/share/man/man1/distlock-run.1
  distlock man | man -l -";

/// `distlock completions` arguments.
#[derive(Args, Debug)]
pub struct CompletionsArgs {
    /// The shell to complete in.
    #[arg(value_name = "SHELL", value_enum)]
    shell: Shell,
}

/// `distlock man` arguments.
#[derive(Args, Debug)]
pub struct ManArgs {
    /// The subcommand whose page to print (`run` prints distlock-run(1)) [default:
    /// distlock(1), which lists the subcommands].
    #[arg(value_name = "SUBCOMMAND")]
    subcommand: Option<String>,
}

/// Prints the completion script of `args.shell` for `command` (distlock's definition).
///
/// # Errors
/// None in practice; the signature matches the other subcommands'.
pub fn completions(args: CompletionsArgs, mut command: Command) -> Result<Exit, CliError> {
    let mut out = Vec::new();
    clap_complete::generate(args.shell, &mut command, "distlock", &mut out);
    print_stdout_bytes(&out);
    Ok(Exit::Code(0))
}

/// Prints the manual page of `top` (distlock's definition) or of one of its subcommands.
///
/// # Errors
/// An unknown subcommand (exit 64).
pub fn man(args: ManArgs, mut top: Command) -> Result<Exit, CliError> {
    // Names and versions are what the pages' headers and SEE ALSO use.
    top.build();
    let page = match args.subcommand.as_deref() {
        None => top,
        Some(name) => {
            let sub = top.find_subcommand(name).cloned().ok_or_else(|| {
                let names: Vec<&str> = top.get_subcommands().map(|c| c.get_name()).collect();
                CliError::new(USAGE, format!("no subcommand {name:?}"))
                    .hint(format!("one of: {}", names.join(", ")))
            })?;
            sub.name(format!("distlock-{name}"))
        }
    };
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .map_err(|e| CliError::new(INTERNAL, format!("cannot render the manual page: {e}")))?;
    print_stdout_bytes(&out);
    Ok(Exit::Code(0))
}
