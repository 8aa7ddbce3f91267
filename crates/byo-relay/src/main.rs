//! `byo-relay`: ssh_mapd on a relay.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use byo_core::render::nft::{self, Layout};
use byo_core::tokens::TokenHash;
use byo_relay::mapd::Mapd;
use byo_relay::nft::NftCli;
use clap::{Args, Parser, Subcommand};

/// The byo relay daemon. ssh_mapd maps the relay's public :22 (and no other port) to one
/// port on the host behind it, through the LOFISPARK_VMSSH nftables chain.
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Clone)]
struct LayoutArgs {
    /// The one host behind this relay, inside the tunnel.
    #[arg(long, default_value = "10.8.0.2")]
    host: Ipv4Addr,
    /// The WireGuard interface to the host.
    #[arg(long, default_value = "wg0")]
    tunnel: String,
}

impl LayoutArgs {
    fn layout(&self) -> Layout {
        Layout {
            host: self.host,
            tunnel: self.tunnel.clone(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Serve ssh_mapd. At start the chain is created if missing (a relay that restarted
    /// comes back empty; the agent's next write restores it) and kept as is otherwise.
    Serve {
        #[arg(long, default_value = "10.8.0.1:8754")]
        listen: SocketAddr,
        /// The SHA-256 (hex) of this relay's ssh_mapd token.
        #[arg(long, default_value = "/etc/byo-relay/ssh-map-token.sha256")]
        token_hash_file: PathBuf,
        #[command(flatten)]
        layout: LayoutArgs,
        /// The listener's header, idle, body and connection limits (#16).
        #[command(flatten)]
        limits: byo_listen::Limits,
    },
    /// Create the table and chain if missing: the IAP exemption and the :22 blackhole.
    Seed {
        #[command(flatten)]
        layout: LayoutArgs,
    },
    /// Print the table a fresh relay holds.
    Ruleset {
        #[command(flatten)]
        layout: LayoutArgs,
    },
}

fn serve(
    listen: SocketAddr,
    token_hash_file: PathBuf,
    layout: Layout,
    limits: byo_listen::Limits,
) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .compact()
        .init();
    let hash = std::fs::read_to_string(&token_hash_file)
        .with_context(|| format!("reading {}", token_hash_file.display()))?;
    let hash = hash.trim().to_ascii_lowercase();
    anyhow::ensure!(
        hash.len() == 64 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{} must hold a SHA-256 in hex",
        token_hash_file.display()
    );
    let nft = NftCli;
    if nft.ensure(&layout)? {
        tracing::info!("chain created: nothing is mapped until the agent writes");
    }
    let state = Mapd {
        token_hash: Arc::new(TokenHash::from_stored(hash)),
        layout,
        nft,
        writes: Arc::new(tokio::sync::Mutex::new(())),
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
        tracing::info!(%listen, "ssh_mapd serving");
        byo_relay::mapd::serve(listener, state, limits, async {
                let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending::<()>().await } } => {}
                }
            })
            .await?;
        Ok(())
    })
}

fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Serve {
            listen,
            token_hash_file,
            layout,
            limits,
        } => serve(listen, token_hash_file, layout.layout(), limits),
        Command::Seed { layout } => {
            if NftCli.ensure(&layout.layout())? {
                println!("seeded table ip {}", nft::TABLE);
            } else {
                println!("table ip {} already present; left as it is", nft::TABLE);
            }
            Ok(())
        }
        Command::Ruleset { layout } => {
            print!("{}", nft::skeleton(&layout.layout()));
            Ok(())
        }
    }
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo-relay: {e:#}");
            ExitCode::FAILURE
        }
    }
}
