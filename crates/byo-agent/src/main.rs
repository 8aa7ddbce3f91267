//! `byo-agent`: the host agent.

use clap::Parser;

/// The byo host agent. It is installed by the one-liner from the owner's dashboard and
/// runs as three systemd units: enverge-agent-prepare (enrol and prepare, as root),
/// enverge-agent (serve, unprivileged) and enverge-agent-rollback.
///
/// This build carries no commands yet: enrolment, preparation and serving land with
/// their issues.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!(
        "byo-agent {}: no commands in this build; see --help",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
