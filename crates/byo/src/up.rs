//! `byo up`: the platform on one machine — SQLite in a data directory, the control plane
//! on loopback, and a first superadmin whose credentials are kept in the data directory
//! (mode 0600) so every start can print them. The data directory also holds the sealing
//! key and a local operator-key signing key (standing in for the password manager).

use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use byo_db::Store;
use byo_server::app::accounts;
use byo_server::{AppState, Config, telemetry};
use rand::Rng;
use rand::distributions::Alphanumeric;

pub const ADMIN_EMAIL: &str = "admin@byo.localhost";
const CREDENTIALS_FILE: &str = "admin-credentials";
const SECRET_KEY_FILE: &str = "secret-key";
const SIGNING_KEY_FILE: &str = "operator-signing-key";
/// The local release key: the agent build `byo up` serves is signed with it, and install.sh
/// carries its public half (`byo_core::release`).
const RELEASE_KEY_FILE: &str = "release-signing-key";
/// The admin's own operator key: what logs in to this installation's hosts as spark.
const OPERATOR_KEY_FILE: &str = "operator-key";

/// Read a file of the data directory, or create it (mode 0600) with `make()` first.
fn read_or_create(
    path: &Path,
    make: impl FnOnce() -> anyhow::Result<String>,
) -> anyhow::Result<String> {
    use std::io::Write;
    match std::fs::read_to_string(path) {
        Ok(text) => return Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let text = make()?;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(text)
}

/// A fresh Ed25519 private key in OpenSSH's format.
fn new_ed25519_key() -> anyhow::Result<String> {
    let key =
        ssh_key::PrivateKey::random(&mut ssh_key::rand_core::OsRng, ssh_key::Algorithm::Ed25519)?;
    Ok(key.to_openssh(ssh_key::LineEnding::LF)?.to_string())
}

/// The installation's sealing key and, standing in for the operators' password manager on
/// this one machine, an operator-key signing key whose public half the server trusts.
fn local_keys(data_dir: &Path) -> anyhow::Result<(String, String)> {
    let secret = read_or_create(&data_dir.join(SECRET_KEY_FILE), || {
        Ok(byo_server::seal::Sealer::generate_hex())
    })?;
    let signing = read_or_create(&data_dir.join(SIGNING_KEY_FILE), new_ed25519_key)?;
    let public = ssh_key::PrivateKey::from_openssh(&signing)
        .context("the operator signing key in the data directory does not parse")?
        .public_key()
        .to_openssh()?;
    Ok((secret.trim().to_owned(), public))
}

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
    /// Where hosts' relays run. `lxd`: each relay is a Debian container in this machine's
    /// LXD (scripts/lxd sets it up), booted by the same first-boot script a Compute Engine
    /// relay runs, so customers' ssh really goes through it (root, and --listen on an address
    /// the containers reach, such as the bridge's 10.231.0.1). `none`: relays are recorded
    /// only; hosts enrol and prepare, nothing can be rented. `auto` picks lxd when it can.
    #[arg(long, value_enum, default_value_t = RelayMode::Auto)]
    pub relays: RelayMode,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RelayMode {
    Auto,
    Lxd,
    None,
}

/// The relays `byo up` runs with, and a line saying which.
fn relays(
    mode: RelayMode,
    data_dir: &Path,
    listen: SocketAddr,
) -> anyhow::Result<(
    Option<std::sync::Arc<crate::local_relay::LxdRelays>>,
    String,
)> {
    let relay_bin = std::env::current_exe()?.with_file_name("byo-relay");
    let root = std::fs::read_to_string("/proc/self/status")
        .map(|s| {
            s.lines()
                .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false);
    let why_not = if !root {
        Some("not running as root".to_owned())
    } else if listen.ip().is_loopback() || listen.ip().is_unspecified() {
        Some(format!(
            "listening on {listen}: a relay fetches its daemon from this server, so listen on the LXD bridge's address (--listen 10.231.0.1:8080)"
        ))
    } else if !relay_bin.exists() {
        Some("no byo-relay built beside byo".to_owned())
    } else {
        let missing = crate::local_relay::missing();
        (!missing.is_empty()).then(|| format!("{} missing", missing.join(", ")))
    };
    match (mode, why_not) {
        (RelayMode::None, _) => Ok((None, "none (recorded only: nothing can be rented)".into())),
        (RelayMode::Lxd, Some(why)) => bail!("--relays lxd: {why}"),
        (RelayMode::Auto, Some(why)) => Ok((
            None,
            format!("none ({why}; hosts enrol and prepare, nothing can be rented)"),
        )),
        (_, None) => {
            let prefix = crate::local_relay::prefix_for(data_dir);
            Ok((
                Some(std::sync::Arc::new(crate::local_relay::LxdRelays::new(
                    &prefix,
                ))),
                format!(
                    "an LXD container per host ({prefix}<slug>-relay on {}, 10.231.0.200–254), booted by its own first-boot script",
                    crate::local_relay::BRIDGE
                ),
            ))
        }
    }
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

/// Ready out of the box: preparation's first step needs a published operator-key list (a
/// host nobody can administer is refused), so at first start the admin gets an operator
/// key of their own (kept 0600 in the data directory), it is added to the list, and list
/// v1 is signed with the local signing key and published — the same rules an operator's
/// change and `byo keys sign` go through. Later starts find the list and do nothing.
async fn first_operator_key(
    state: &AppState,
    data_dir: &Path,
    admin: &Credentials,
) -> anyhow::Result<PathBuf> {
    use byo_server::app::operator_keys;
    use byo_server::auth::{CurrentUser, Operator};
    use byo_wire::api::{KeyChangeRequest, SignatureUpload};

    let path = data_dir.join(OPERATOR_KEY_FILE);
    if state.store.published_key_list().await?.is_some() {
        return Ok(path);
    }
    let private = read_or_create(&path, new_ed25519_key)?;
    let private = ssh_key::PrivateKey::from_openssh(&private)
        .with_context(|| format!("{} does not parse", path.display()))?;
    let mut public = private.public_key().clone();
    public.set_comment("");
    let public_line = public.to_openssh()?;
    std::fs::write(path.with_extension("pub"), format!("{public_line}\n"))?;

    let user = state
        .store
        .user_by_email(&admin.email)
        .await?
        .context("the first superadmin is missing")?;
    let roles = state.store.roles_of(&user.sub).await?;
    let admin = CurrentUser {
        user,
        roles,
        via: None,
    };
    let op = Operator(admin.clone());
    let draft = operator_keys::change_keys(
        state,
        &op,
        KeyChangeRequest::Add {
            public_key: public_line,
            label: "byo up admin".into(),
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("adding the admin's operator key: {e}"))?;
    let signing = std::fs::read_to_string(data_dir.join(SIGNING_KEY_FILE))?;
    let signing = ssh_key::PrivateKey::from_openssh(&signing)?;
    let signature = ssh_key::SshSig::sign(
        &signing,
        byo_core::keylist::NAMESPACE,
        ssh_key::HashAlg::Sha512,
        draft.body.as_bytes(),
    )?
    .to_pem(ssh_key::LineEnding::LF)?;
    operator_keys::publish(
        state,
        &admin,
        draft.version,
        SignatureUpload {
            signature,
            more_signatures: Vec::new(),
        },
    )
    .await
    .map_err(|e| anyhow::anyhow!("publishing operator-key list v{}: {e}", draft.version))?;
    Ok(path)
}

/// Serve the `byo-agent` built beside this binary at /agent/, so the one-liner works
/// against this machine: copy it into the data directory with its digest.
fn publish_local_agent(data_dir: &Path) -> anyhow::Result<Option<(PathBuf, String)>> {
    use sha2::{Digest, Sha256};
    let exe = std::env::current_exe()?;
    let Some(agent) = exe
        .parent()
        .map(|d| d.join("byo-agent"))
        .filter(|p| p.exists())
    else {
        return Ok(None);
    };
    let releases = data_dir.join("releases");
    std::fs::create_dir_all(&releases)?;
    let bytes = std::fs::read(&agent).with_context(|| format!("reading {}", agent.display()))?;
    let arch = std::env::consts::ARCH;
    std::fs::write(releases.join(format!("byo-agent-{arch}")), &bytes)?;
    std::fs::write(
        releases.join(format!("byo-agent-{arch}.sha256")),
        format!(
            "{}  byo-agent-{arch}\n",
            hex::encode(Sha256::digest(&bytes))
        ),
    )?;
    let key = ssh_key::PrivateKey::from_openssh(read_or_create(
        &data_dir.join(RELEASE_KEY_FILE),
        new_ed25519_key,
    )?)
    .context("the release key in the data directory does not parse")?;
    let sig = byo_core::release::sign(&key, &bytes).map_err(anyhow::Error::msg)?;
    std::fs::write(releases.join(format!("byo-agent-{arch}.sig")), sig)?;
    Ok(Some((releases, key.public_key().to_openssh()?)))
}

/// A `cloudflared-<arch>` the operator put in the release directory is served at
/// /cloudflared/ and pinned by its digest here, so enrolment hands hosts of that arch the
/// URL and the SHA-256 to check it against.
fn pin_local_cloudflared(config: &mut Config) {
    use sha2::{Digest, Sha256};
    let Some(dir) = config.release_dir.clone() else {
        return;
    };
    for arch in ["x86_64", "aarch64"] {
        let path = dir.join(format!("cloudflared-{arch}"));
        if let Ok(bytes) = std::fs::read(&path) {
            config
                .cloudflared
                .sha256
                .insert(arch.to_owned(), hex::encode(Sha256::digest(&bytes)));
        }
    }
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
    let (secret_key, signing_public) = local_keys(&data_dir)?;
    let mut config = Config {
        listen: addr,
        metrics_listen: args.metrics_listen,
        database_url: format!("sqlite://{}", data_dir.join("byo.db").display()).into(),
        public_url: public_url.clone(),
        // A Secure cookie is kept over plain HTTP only for localhost (a secure context).
        cookie_secure: host == "localhost",
        environment: "local".into(),
        secret_key: Some(secret_key.into()),
        // Opened at http://127.0.0.1:PORT rather than localhost, the browser's Origin names
        // the address: both are this listener, so both are its origins.
        loopback_origins: byo_server::config::loopback_origins(addr),
        // Its hosts are test hosts (linux-test): customers who sign up here rent them too.
        test_hosts_for_everyone: true,
        signup_without_mail: true,
        ..Config::default()
    };
    config.operator_keys.signing_keys = vec![signing_public];
    if let Some((releases, release_key)) = publish_local_agent(&data_dir)? {
        config.release_dir = Some(releases);
        config.release_key = Some(release_key);
    }
    pin_local_cloudflared(&mut config);
    let (lxd_relays, relays_line) = relays(args.relays, &data_dir, addr)?;
    if lxd_relays.is_some() {
        // Each relay fetches this build of the daemon from here and checks its digest.
        use sha2::{Digest, Sha256};
        let bin = std::env::current_exe()?.with_file_name("byo-relay");
        let bytes = std::fs::read(&bin).with_context(|| format!("reading {}", bin.display()))?;
        let arch = std::env::consts::ARCH;
        let releases = config
            .release_dir
            .clone()
            .context("no release directory to serve the relay daemon from")?;
        std::fs::write(releases.join(format!("byo-relay-{arch}")), &bytes)?;
        config.relay_release = Some(byo_server::config::RelayRelease {
            url: format!("{public_url}/relay/byo-relay-{arch}"),
            sha256: hex::encode(Sha256::digest(&bytes)),
        });
    }
    telemetry::init(config.log_format);
    let store = Store::connect(&format!("sqlite://{}", data_dir.join("byo.db").display()))
        .await
        .context("opening the database")?;
    store.migrate().await.context("migrating the database")?;
    let mut state = AppState::new(store, config);
    if let Some(r) = lxd_relays {
        state = state.with_providers(
            r,
            std::sync::Arc::new(byo_server::providers::local::LocalTunnels::default()),
        );
    }
    let admin = first_admin(&state, &data_dir).await?;
    let operator_key = first_operator_key(&state, &data_dir, &admin).await?;
    println!("byo is running at {public_url}");
    println!("  sign in as  {}", admin.email);
    println!("  password    {}", admin.password);
    println!("  data        {} (SQLite)", data_dir.display());
    println!("  relays      {relays_line}");
    // The list as it stands: a restart after v2 was signed says v2 (issue #42, 8).
    let list = match state.store.published_key_list().await? {
        Some(row) => format!("list v{} is published", row.version),
        None => "no list is published yet: sign the draft with the line below".to_owned(),
    };
    println!(
        "  hosts       ssh -i {} spark@<host address>   (your operator key; {list})",
        operator_key.display()
    );
    println!(
        "  sign keys   byo keys sign --server {public_url} --email {} < {}",
        admin.email,
        data_dir.join(SIGNING_KEY_FILE).display()
    );
    // Ctrl-C is caught from before the banner says it stops byo up: `ctrl_c()` would only
    // take the signal over once first polled, and a Ctrl-C just after the banner killed it.
    let mut interrupted =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    println!("Ctrl-C stops it; running byo up again resumes from the same data.");
    byo_server::serve(state, listener, async move {
        interrupted.recv().await;
    })
    .await
}
