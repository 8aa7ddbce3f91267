//! `byo-relay`: ssh_mapd on a relay.

use clap::Parser;

/// The byo relay daemon (ssh_mapd): maps a relay's public :22 to one port on the host
/// behind it, through the LOFISPARK_VMSSH chain.
///
/// This build carries no commands yet: ssh_mapd lands with the relay issue.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {}

fn main() {
    let _ = Cli::parse();
    eprintln!(
        "byo-relay {}: no commands in this build; see --help",
        env!("CARGO_PKG_VERSION")
    );
    std::process::exit(2);
}
