//! `byo up`: the platform on one machine — SQLite in a data directory, the control plane
//! on loopback, and a first superadmin whose credentials are kept in the data directory
//! (mode 0600) so every start can print them.

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use byo_db::Store;
use byo_server::{AppState, Config, accounts, telemetry};
use rand::Rng;
use rand::distributions::Alphanumeric;

pub const ADMIN_EMAIL: &str = "admin@byo.localhost";
const CREDENTIALS_FILE: &str = "admin-credentials";

#[derive(Debug, clap::Args)]
pub struct UpArgs {
    /// Where the platform keeps its state (the SQLite database, the first admin's
    /// credentials). Created if missing; running again resumes from it.
    #[arg(long, default_value = ".byo", env = "BYO_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Address for the pages and the API. Port 0 picks a free port.
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Also serve Prometheus metrics here.
    #[arg(long)]
    pub metrics_listen: Option<SocketAddr>,
}

struct Credentials {
    email: String,
    password: String,
}

fn read_credentials(path: &Path) -> anyhow::Result<Option<Credentials>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
            .with_context(|| format!("{} has no {name} line", path.display()))
    };
    Ok(Some(Credentials {
        email: field("email:")?,
        password: field("password:")?,
    }))
}

fn write_credentials(path: &Path, c: &Credentials) -> anyhow::Result<()> {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    writeln!(
        f,
        "# The first superadmin of this byo up installation. Change the password after signing in;\n# this file keeps the one it was created with.\nemail: {}\npassword: {}",
        c.email, c.password
    )?;
    Ok(())
}

/// Make sure a superadmin exists; return the credentials to print.
async fn first_admin(state: &AppState, data_dir: &Path) -> anyhow::Result<Credentials> {
    let path = data_dir.join(CREDENTIALS_FILE);
    if let Some(c) = read_credentials(&path)? {
        return Ok(c);
    }
    if state.store.superadmin_count().await? > 0 {
        bail!(
            "{} is missing but the database already has a superadmin; \
             create another with `byo-server create-superadmin`",
            path.display()
        );
    }
    let password: String = rand::thread_rng()
        .sample_iter(&Alphanumeric)
        .take(20)
        .map(char::from)
        .collect();
    let c = Credentials {
        email: ADMIN_EMAIL.to_owned(),
        password,
    };
    accounts::create_superadmin(state, &c.email, &c.password)
        .await
        .map_err(|e| anyhow::anyhow!("creating the first superadmin: {e}"))?;
    write_credentials(&path, &c)?;
    Ok(c)
}

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("creating {}", args.data_dir.display()))?;
    std::fs::set_permissions(&args.data_dir, std::fs::Permissions::from_mode(0o700))?;
    let data_dir = args.data_dir.canonicalize()?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {} (is another byo up running?)", args.listen))?;
    let addr = listener.local_addr()?;
    // Browsers treat http://localhost as a secure context, so the Secure session cookie
    // works; the Origin check compares against this exact URL.
    let host = if addr.ip().is_loopback() {
        "localhost".to_owned()
    } else {
        addr.ip().to_string()
    };
    let public_url = format!("http://{host}:{}", addr.port());
    let config = Config {
        listen: addr,
        metrics_listen: args.metrics_listen,
        database_url: format!("sqlite://{}", data_dir.join("byo.db").display()).into(),
        public_url: public_url.clone(),
        ..Config::default()
    };
    telemetry::init(config.log_format);
    let store = Store::connect(&format!("sqlite://{}", data_dir.join("byo.db").display()))
        .await
        .context("opening the database")?;
    store.migrate().await.context("migrating the database")?;
    let state = AppState::new(store, config);
    let admin = first_admin(&state, &data_dir).await?;
    println!("byo is running at {public_url}");
    println!("  sign in as  {}", admin.email);
    println!("  password    {}", admin.password);
    println!("  data        {} (SQLite)", data_dir.display());
    println!("Ctrl-C stops it; running byo up again resumes from the same data.");
    byo_server::serve(state, listener, async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
}
