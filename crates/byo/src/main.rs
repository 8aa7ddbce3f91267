//! `byo`: the command line for customers (log in with an API token, rent, reach and
//! release instances), and for operators (run the platform, sign key lists, releases and
//! fleet upgrades, break glass). Exit codes: 0 done, 1 refused (the server's message),
//! 2 usage, 3 the server unreachable (docs/cli.md).

use clap::{CommandFactory, Parser, Subcommand};

/// byo: rent GPU machines from the terminal, and run the platform.
///
/// Start with `byo login --server https://… ` and an API token from your account page, then
/// `byo instances create --gpu spark-1 --wait`. Every command that prints data takes --json.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Keep an API token for this machine's commands (read from standard input, unechoed
    /// on a terminal), checked against the server first; stored 0600 in ~/.config/byo.
    ///
    /// Example: byo login --server https://app.enverge.ai < token.txt
    Login(byo::customer::LoginArgs),
    /// Forget the token kept on this machine (revoke it on your account page to end it).
    ///
    /// Example: byo logout
    Logout,
    /// Your instances: list, create, reach, stop, start, reboot, delete.
    #[command(subcommand)]
    Instances(byo::customer::InstancesCommand),
    /// The SSH keys your instances are created with.
    #[command(subcommand, name = "ssh-keys")]
    SshKeys(byo::customer::SshKeysCommand),
    /// Your creates waiting for a free host.
    #[command(subcommand)]
    Queue(byo::customer::QueueCommand),
    /// Your GPUs, as their owner: list, show, add, stop hosting.
    #[command(subcommand)]
    Hosts(byo::owner::HostsCommand),
    /// Your pre-bookings: list (the default), cancel.
    ///
    /// Example: byo bookings --json
    Bookings(byo::customer::BookingsArgs),
    /// Print a shell completion script.
    ///
    /// Example: byo completions bash > ~/.local/share/bash-completion/completions/byo
    Completions { shell: clap_complete::Shell },
    /// Run the whole platform on this machine: SQLite in a data directory, the control
    /// plane on loopback, and a first superadmin. Prints the URL and how to sign in.
    Up(byo::up::UpArgs),
    /// The signed operator-key lists.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// One host, by hand, as an operator (break glass).
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
    /// The last resort once the operator-key list has expired and no renewal has reached
    /// the hosts: a certificate for your own key, signed with the list's signing key (from
    /// standard input or --from-clipboard, into a throwaway ssh-agent), valid for at most an
    /// hour, on the hosts named, from their relay only. A host admits it only while the list
    /// it holds has expired; the next list ends it. No server is needed.
    ///
    /// Example: byo keys break-glass --host spark-7 --operator me@enverge.ai < signing-key
    BreakGlass(byo::keys::BreakGlassArgs),
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
            let code = e
                .downcast_ref::<byo::api::ApiError>()
                .map_or(byo::api::EXIT_REFUSED, byo::api::ApiError::exit_code);
            std::process::ExitCode::from(code)
        }
    }
}

async fn run() -> anyhow::Result<()> {
    use byo::customer;
    match Cli::parse().command {
        Command::Login(args) => Ok(customer::login(args).await?),
        Command::Logout => Ok(customer::logout()?),
        Command::Instances(c) => Ok(customer::instances(c).await?),
        Command::SshKeys(c) => Ok(customer::ssh_keys(c).await?),
        Command::Queue(c) => Ok(customer::queue(c).await?),
        Command::Bookings(args) => Ok(customer::bookings(args).await?),
        Command::Hosts(c) => Ok(byo::owner::hosts(c).await?),
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "byo", &mut std::io::stdout());
            Ok(())
        }
        Command::Up(args) => byo::up::run(args).await,
        Command::Keys(KeysCommand::Sign(args)) => byo::keys::sign(args).await,
        Command::Keys(KeysCommand::BreakGlass(args)) => byo::keys::break_glass(args),
        Command::Host(HostCommand::Ssh(args)) => byo::host_ssh::run(args),
        Command::Release(ReleaseCommand::Sign(args)) => byo::release::sign(args),
        Command::Release(ReleaseCommand::Publish(args)) => byo::release::publish(args).await,
        Command::Release(ReleaseCommand::Check(args)) => byo::release::check(args).await,
        Command::Fleet(FleetCommand::Upgrade(args)) => byo::fleet::upgrade(args).await,
    }
}
