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
    /// The signed operator-key lists.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// One host, by hand (break glass).
    #[command(subcommand)]
    Host(HostCommand),
    /// Agent builds: sign one where the release key is, publish it, check the path an
    /// owner's installer follows. Publishing changes nothing on any host.
    #[command(subcommand)]
    Release(ReleaseCommand),
    /// Every BYO host at once.
    #[command(subcommand)]
    Fleet(FleetCommand),
}

#[derive(Subcommand)]
enum ReleaseCommand {
    /// Sign an agent build with the release key read from standard input, on this machine;
    /// writes <build>.sig and sends nothing.
    ///
    /// Example: byo release sign --build target/release/byo-agent < release-key
    Sign(byo::release::SignArgs),
    /// Upload a signed build; the server verifies the signature against its release key
    /// before recording it, and its installer serves it from then on.
    ///
    /// Example: byo release publish --server https://app.enverge.ai --email me@enverge.ai --build target/release/byo-agent
    Publish(byo::release::PublishArgs),
    /// Fetch what an owner's one-liner fetches, through the public URL, verify it and run
    /// it; names every broken link and exits non-zero.
    ///
    /// Example: byo release check --server https://app.enverge.ai --arch aarch64
    Check(byo::release::CheckArgs),
}

#[derive(Subcommand)]
enum FleetCommand {
    /// Upgrade every prepared host to a published build, in waves (a canary, then doubling
    /// cohorts), each host's heartbeat reporting the build healthy before the next wave;
    /// halts on the first failure, resumable with --resume.
    ///
    /// Example: byo fleet upgrade --server https://app.enverge.ai --email me@enverge.ai --build 3f2a9c1b7d4e
    Upgrade(byo::fleet::UpgradeArgs),
}

#[derive(Subcommand)]
enum HostCommand {
    /// Log in to a host as spark when the operator tunnel is down: through its relay (IAP to
    /// the relay, WireGuard to 10.8.0.2), with your own operator key.
    ///
    /// Example: byo host ssh spark-7 --via relay --project enverge-prod --zone europe-west4-a
    Ssh(byo::host_ssh::SshArgs),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Sign the list waiting for a signature, on this machine: prints the operators and key
    /// fingerprints decoded from the bytes it will sign, asks, loads the signing key from
    /// standard input (or --from-clipboard) into a throwaway ssh-agent, signs and uploads.
    ///
    /// Example: byo keys sign --server https://app.enverge.ai --email me@enverge.ai < key
    Sign(byo::keys::SignArgs),
}

/// Errors print as one readable chain of causes, for the operator at the terminal.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("byo: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Up(args) => byo::up::run(args).await,
        Command::Keys(KeysCommand::Sign(args)) => byo::keys::sign(args).await,
        Command::Host(HostCommand::Ssh(args)) => byo::host_ssh::run(args),
        Command::Release(ReleaseCommand::Sign(args)) => byo::release::sign(args),
        Command::Release(ReleaseCommand::Publish(args)) => byo::release::publish(args).await,
        Command::Release(ReleaseCommand::Check(args)) => byo::release::check(args).await,
        Command::Fleet(FleetCommand::Upgrade(args)) => byo::fleet::upgrade(args).await,
    }
}
