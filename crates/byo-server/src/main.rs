//! `byo-server`: the control plane.

use std::io::{BufRead, IsTerminal};
use std::path::PathBuf;

use anyhow::Context;
use byo_db::Store;
use byo_server::app::accounts;
use byo_server::{AppState, Config, routes, telemetry};
use clap::{Parser, Subcommand};
use secrecy::ExposeSecret;

/// The byo control plane: the API, the pages and the scheduled jobs.
///
/// Configuration comes from defaults, then the file given with --config, then BYO_*
/// environment variables (BYO_DATABASE_URL, BYO_LISTEN, BYO_PUBLIC_URL, ...).
#[derive(Parser)]
#[command(version, about, long_about)]
struct Cli {
    /// A TOML configuration file.
    #[arg(long, short, env = "BYO_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Migrate the database and serve (the default).
    Serve,
    /// Bring the database schema up to date, then exit.
    Migrate,
    /// Create a user holding superadmin. The password is read from standard input (one
    /// line); on a terminal you are asked for it.
    CreateSuperadmin {
        /// The new superadmin's email address.
        #[arg(long)]
        email: String,
    },
    /// Print the OpenAPI document.
    Openapi,
}

/// Errors print as one readable chain of causes, for the operator at the terminal.
fn main() -> std::process::ExitCode {
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("byo-server: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("byo-server: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Serve);
    if let Command::Openapi = command {
        println!("{}", routes::openapi().to_pretty_json()?);
        return Ok(());
    }
    let config = Config::load(cli.config.as_deref()).context("loading configuration")?;
    telemetry::init(config.log_format);
    let store = Store::connect(config.database_url.expose_secret())
        .await
        .context("connecting to the database")?;
    let migrated = store.migrate().await.context("migrating the database")?;
    if !migrated.applied.is_empty() && !matches!(command, Command::Migrate) {
        tracing::info!(backend = %store.backend(), "{migrated}");
    }
    match command {
        Command::Serve => {
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .with_context(|| format!("binding {}", config.listen))?;
            let providers = config.providers().context("setting up the providers")?;
            let state =
                AppState::new(store, config).with_providers(providers.relays, providers.tunnels);
            byo_server::serve(state, listener, shutdown_signal()).await
        }
        Command::Migrate => {
            println!("{migrated} ({})", store.backend());
            Ok(())
        }
        Command::CreateSuperadmin { email } => {
            if std::io::stdin().is_terminal() {
                eprint!(
                    "Password for {email} (at least {} characters): ",
                    accounts::MIN_PASSWORD_CHARS
                );
            }
            let mut password = String::new();
            std::io::stdin()
                .lock()
                .read_line(&mut password)
                .context("reading the password")?;
            let password = password.trim_end_matches(['\r', '\n']);
            let state = AppState::new(store, config);
            let user = accounts::create_superadmin(&state, &email, password)
                .await
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            println!("created superadmin {} ({})", user.email, user.sub);
            Ok(())
        }
        Command::Openapi => unreachable!("handled above"),
    }
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { () = ctrl_c => {}, () = term => {} }
}
