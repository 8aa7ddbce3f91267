//! `byo`: the operator's command line.

use clap::{Parser, Subcommand};

/// byo, from an operator's machine.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the whole platform on this machine: SQLite in a data directory, the control
    /// plane on loopback, and a first superadmin. Prints the URL and how to sign in.
    Up(byo::up::UpArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Up(args) => byo::up::run(args).await,
    }
}
