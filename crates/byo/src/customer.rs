//! A customer's commands (issue #43): log in with an API token, then rent, reach and release
//! instances, keep SSH keys, and read the queue and bookings — each one call (or a few) to
//! the public API, printed as a table or, with `--json`, as the API's own types.

use std::io::{BufRead, IsTerminal, Write};
use std::time::Duration;

use byo_wire::api::UserView;
use byo_wire::prebooking::PrebookingView;
use byo_wire::states::VmStatus;
use byo_wire::vm::{
    EndedQueuedView, InstanceCreated, InstanceDeletion, InstanceQueued, InstanceRequest,
    InstanceView, NewSshKey, QueueEnding, QueuedView, SshKeyView, VmAction, VmStateChange,
};
use clap::{Args, Subcommand};
use reqwest::{Method, StatusCode};

use crate::api::{Api, ApiError, Credentials, normalise_server};
use crate::print::{Output, details, print_with, table, when};

type Result<T> = std::result::Result<T, ApiError>;

#[derive(Args)]
pub struct LoginArgs {
    /// The byo server, e.g. https://app.enverge.ai (or `byo up`'s http://localhost:… URL).
    #[arg(long, env = "BYO_SERVER")]
    pub server: String,
}

#[derive(Subcommand)]
pub enum InstancesCommand {
    /// Your instances: every live one and those that ended in the last week.
    ///
    /// Example: byo instances list
    List(Output),
    /// One instance, by name or id.
    ///
    /// Example: byo instances show brave-otter-42
    Show(InstanceArgs),
    /// Rent an instance of a GPU kind, reachable with one of your SSH keys. When no host is
    /// free it is queued (nothing is billed until a host takes it); --wait follows it to
    /// running and prints the ssh line.
    ///
    /// Example: byo instances create --gpu spark-1 --key laptop --wait
    Create(CreateArgs),
    /// Log in to an instance: runs your ssh with its host (and any arguments after --).
    ///
    /// Example: byo instances ssh brave-otter-42 -- nvidia-smi
    Ssh(SshArgs),
    /// Stop a running instance (billing continues while it exists; delete to stop paying).
    ///
    /// Example: byo instances stop brave-otter-42
    Stop(InstanceArgs),
    /// Start a stopped instance.
    ///
    /// Example: byo instances start brave-otter-42
    Start(InstanceArgs),
    /// Reboot a running instance.
    ///
    /// Example: byo instances reboot brave-otter-42
    Reboot(InstanceArgs),
    /// Delete an instance: its container and disk are gone for good; billing stops when the
    /// host confirms.
    ///
    /// Example: byo instances delete brave-otter-42
    Delete(InstanceArgs),
}

#[derive(Args)]
pub struct InstanceArgs {
    /// The instance's name (as `byo instances list` prints it) or id.
    pub instance: String,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args)]
pub struct CreateArgs {
    /// The GPU kind, e.g. spark-1 (the dashboard lists the kinds).
    #[arg(long)]
    pub gpu: String,
    /// The SSH key to reach it with, by name or id; may be left out when you have one.
    #[arg(long)]
    pub key: Option<String>,
    /// Follow it until it runs (queued with its place in line, creating, running) and print
    /// the ssh line. Ctrl-C stops following, not the create.
    #[arg(long)]
    pub wait: bool,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args)]
pub struct SshArgs {
    /// The instance's name or id.
    pub instance: String,
    /// Print the ssh command instead of running it.
    #[arg(long)]
    pub print: bool,
    /// Passed to ssh after the host: a command to run, or ssh's own options.
    #[arg(last = true)]
    pub ssh_args: Vec<String>,
}

#[derive(Subcommand)]
pub enum SshKeysCommand {
    /// Your SSH keys.
    ///
    /// Example: byo ssh-keys list
    List(Output),
    /// Add a public key from a file (or - for standard input); named after its comment
    /// unless --name says otherwise.
    ///
    /// Example: byo ssh-keys add ~/.ssh/id_ed25519.pub --name laptop
    Add(AddKeyArgs),
    /// Remove a key, by name or id. Instances already created keep the key they were made
    /// with.
    ///
    /// Example: byo ssh-keys rm laptop
    Rm(KeyRef),
}

#[derive(Args)]
pub struct AddKeyArgs {
    /// The public key's file (`*.pub`), or - to read it from standard input.
    pub file: String,
    /// What to call it (default: the key's comment, else the file's name).
    #[arg(long)]
    pub name: Option<String>,
    #[command(flatten)]
    pub output: Output,
}

#[derive(Args)]
pub struct KeyRef {
    /// The key's name or id.
    pub key: String,
}

#[derive(Subcommand)]
pub enum QueueCommand {
    /// Your queued creates, each with its place in line (1 is next).
    ///
    /// Example: byo queue list
    List(Output),
    /// Cancel a queued create, by id.
    ///
    /// Example: byo queue cancel 0193c1e2-…
    Cancel(QueueRef),
    /// Keep waiting: a queued create lapses the installation's age (72 h by default) from
    /// now instead (the page's *Keep waiting*).
    ///
    /// Example: byo queue extend 0193c1e2-…
    Extend(QueueRef),
}

/// `byo bookings`: with no command, the list.
#[derive(Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct BookingsArgs {
    #[command(subcommand)]
    pub command: Option<BookingsCommand>,
    #[command(flatten)]
    pub out: Output,
}

#[derive(Subcommand)]
pub enum BookingsCommand {
    /// Your bookings, open ones first (the same as `byo bookings`).
    ///
    /// Example: byo bookings list --json
    List(Output),
    /// Cancel a booking that is open and not paid, by id (a paid one is refunded on the
    /// page, before its window opens).
    ///
    /// Example: byo bookings cancel 0193c1e2-…
    Cancel(BookingRef),
}

#[derive(Args)]
pub struct BookingRef {
    /// The booking's id (`byo bookings`).
    pub prebooking_id: String,
}

#[derive(Args)]
pub struct QueueRef {
    /// The queued create's id (`byo queue list`).
    pub queue_id: String,
}

/// `byo login`: the token from standard input (typed unechoed on a terminal), checked
/// against the server before anything is written.
pub async fn login(args: LoginArgs) -> Result<()> {
    let server = normalise_server(&args.server)?;
    let token = read_token()?;
    if !token.starts_with("byo_api_") {
        return Err(ApiError::Local(
            "that is not an API token (they start byo_api_): make one on your account page \
             (Account → API tokens) and paste it here"
                .into(),
        ));
    }
    let credentials = Credentials { server, token };
    let api = Api::new(&credentials);
    let me: UserView = api.get("/api/me").await?;
    let path = credentials.save()?;
    println!(
        "Logged in to {} as {}; the token is kept in {} (readable by you only).",
        credentials.server,
        me.email,
        path.display()
    );
    Ok(())
}

fn read_token() -> Result<String> {
    let stdin = std::io::stdin();
    let token = if stdin.is_terminal() {
        rpassword::prompt_password("API token (byo_api_…, not echoed): ")
            .map_err(|e| ApiError::Local(format!("reading the token: {e}")))?
    } else {
        let mut line = String::new();
        stdin
            .lock()
            .read_line(&mut line)
            .map_err(|e| ApiError::Local(format!("reading the token from standard input: {e}")))?;
        line
    };
    Ok(token.trim().to_owned())
}

/// `byo logout`: forgets the token on this machine (it stays valid until revoked on the
/// account page).
pub fn logout() -> Result<()> {
    match Credentials::remove()? {
        Some(path) => println!(
            "Logged out: removed {}. The token itself stays valid until you revoke it on your \
             account page.",
            path.display()
        ),
        None => println!("Not logged in on this machine; nothing to remove."),
    }
    Ok(())
}

pub async fn instances(command: InstancesCommand) -> Result<()> {
    let api = Api::from_saved()?;
    match command {
        InstancesCommand::List(out) => {
            let all: Vec<InstanceView> = api.get("/api/vms").await?;
            print_with(out, &all, || instance_table(&all));
        }
        InstancesCommand::Show(a) => {
            let vm = find_instance(&api, &a.instance).await?;
            print_with(a.output, &vm, || instance_detail(&vm));
        }
        InstancesCommand::Create(a) => create(&api, a).await?,
        InstancesCommand::Ssh(a) => ssh(&api, a).await?,
        InstancesCommand::Stop(a) => power(&api, a, VmAction::Stop).await?,
        InstancesCommand::Start(a) => power(&api, a, VmAction::Start).await?,
        InstancesCommand::Reboot(a) => power(&api, a, VmAction::Reboot).await?,
        InstancesCommand::Delete(a) => {
            let vm = find_instance(&api, &a.instance).await?;
            let (_, d): (_, InstanceDeletion) = api
                .send(Method::DELETE, &format!("/api/vms/{}", vm.id), None::<&()>)
                .await?;
            print_with(a.output, &d, || {
                format!("{}: {}\n", d.instance.name, d.message)
            });
        }
    }
    Ok(())
}

async fn power(api: &Api, a: InstanceArgs, action: VmAction) -> Result<()> {
    let vm = find_instance(api, &a.instance).await?;
    let (_, now): (_, InstanceView) = api
        .send(
            Method::POST,
            &format!("/api/vms/{}/state", vm.id),
            Some(&VmStateChange { action }),
        )
        .await?;
    print_with(a.output, &now, || format!("{}: {}\n", now.name, now.status));
    Ok(())
}

/// An instance of yours by name or id; a live one before one that ended with the same name.
async fn find_instance(api: &Api, reference: &str) -> Result<InstanceView> {
    let all: Vec<InstanceView> = api.get("/api/vms").await?;
    let mut matching: Vec<InstanceView> = all
        .into_iter()
        .filter(|v| v.id == reference || v.name == reference)
        .collect();
    matching.sort_by_key(|v| (v.deleted_at.is_some(), std::cmp::Reverse(v.created_at)));
    matching.into_iter().next().ok_or_else(|| {
        ApiError::Local(format!(
            "none of your instances is named {reference:?} (nor has that id): \
             `byo instances list` shows them"
        ))
    })
}

async fn create(api: &Api, a: CreateArgs) -> Result<()> {
    let keys: Vec<SshKeyView> = api.get("/api/ssh-keys").await?;
    let key = match &a.key {
        Some(reference) => find_key(&keys, reference)?,
        None => match keys.as_slice() {
            [only] => only.clone(),
            [] => {
                return Err(ApiError::Local(
                    "you have no SSH key yet: add one first (byo ssh-keys add ~/.ssh/id_ed25519.pub)"
                        .into(),
                ));
            }
            many => {
                let names: Vec<&str> = many.iter().map(|k| k.name.as_str()).collect();
                return Err(ApiError::Local(format!(
                    "you have {} SSH keys: say which with --key ({})",
                    many.len(),
                    names.join(", ")
                )));
            }
        },
    };
    let request = InstanceRequest {
        gpu_type: a.gpu.clone(),
        ssh_key_id: key.id.clone(),
    };
    let (status, answer): (_, serde_json::Value) =
        api.send(Method::POST, "/api/vms", Some(&request)).await?;
    let unreadable = |e: serde_json::Error| ApiError::Unreachable {
        server: api.server.clone(),
        reason: format!("POST /api/vms answered something this byo cannot read ({e})"),
    };
    if status == StatusCode::ACCEPTED {
        let queued: InstanceQueued = serde_json::from_value(answer).map_err(unreadable)?;
        if !a.wait {
            print_with(a.output, &queued, || {
                format!(
                    "No {} host is free: your create is queued ({}), place {} in line. Nothing \
                     is billed until a host takes it; `byo instances create … --wait` or \
                     `byo queue list` follows it.\n",
                    queued.queued.gpu_type, queued.queued.id, queued.queued.position
                )
            });
            return Ok(());
        }
        let vm_id = follow_queue(api, &queued.queued).await?;
        let vm = follow_instance(api, &vm_id).await?;
        return finish(a.output, &vm);
    }
    let created: InstanceCreated = serde_json::from_value(answer).map_err(unreadable)?;
    if a.wait {
        let vm = follow_instance(api, &created.instance.id).await?;
        return finish(a.output, &vm);
    }
    print_with(a.output, &created, || {
        let mut text = instance_detail(&created.instance);
        for (what, advisory) in [
            ("GPU check", &created.gpu_check),
            ("startup script", &created.startup_script),
        ] {
            if let Some(advisory) = advisory {
                text.push_str(&format!(
                    "{what:<15} {}\n",
                    serde_json::to_string(advisory).unwrap_or_default()
                ));
            }
        }
        text
    });
    Ok(())
}

fn finish(out: Output, vm: &InstanceView) -> Result<()> {
    print_with(out, vm, || match &vm.ssh_command {
        Some(ssh) => format!("{} is running. Log in with:\n  {ssh}\n", vm.name),
        None => format!(
            "{} is running; its address is not published yet (byo instances show {}).\n",
            vm.name, vm.name
        ),
    });
    Ok(())
}

/// Waits while the create is queued, saying its place in line; the instance it became.
async fn follow_queue(api: &Api, queued: &QueuedView) -> Result<String> {
    let mut progress = Progress::new();
    loop {
        let open: Vec<QueuedView> = api.get("/api/queue").await?;
        if let Some(q) = open.iter().find(|q| q.id == queued.id) {
            let why = q
                .last_error
                .as_deref()
                .map(|e| format!(" (last try: {e})"))
                .unwrap_or_default();
            progress.say(&format!(
                "queued for a {} host: place {} in line{why}",
                q.gpu_type, q.position
            ));
        } else {
            let ended: Vec<EndedQueuedView> = api.get("/api/queue/ended").await?;
            let Some(e) = ended.into_iter().find(|e| e.id == queued.id) else {
                progress.say("queued: a host is taking it");
                progress.tick().await;
                continue;
            };
            progress.done();
            return match (e.ending, e.vm_id) {
                (QueueEnding::Placed | QueueEnding::PlacedByOperator, Some(vm_id)) => Ok(vm_id),
                (ending, _) => Err(ApiError::Local(format!(
                    "the queued create ended without an instance: {}{}",
                    serde_json::to_value(ending)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default(),
                    e.last_error.map(|l| format!(" ({l})")).unwrap_or_default()
                ))),
            };
        }
        progress.tick().await;
    }
}

/// Waits while the instance is being created; it once running.
async fn follow_instance(api: &Api, vm_id: &str) -> Result<InstanceView> {
    let mut progress = Progress::new();
    loop {
        let vm: InstanceView = api.get(&format!("/api/vms/{vm_id}")).await?;
        match vm.status {
            VmStatus::Running => {
                progress.done();
                return Ok(vm);
            }
            VmStatus::Creating => progress.say(&format!("{}: creating", vm.name)),
            other => {
                progress.done();
                return Err(ApiError::Local(format!(
                    "{} did not come up: it is {other} (nothing is billed for a create that \
                     failed)",
                    vm.name
                )));
            }
        }
        progress.tick().await;
    }
}

/// What a long wait is doing: a spinner redrawn in place on a terminal, else one line on
/// standard error per change, so logs and pipes read cleanly.
struct Progress {
    terminal: bool,
    said: String,
    frame: usize,
}

impl Progress {
    const FRAMES: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

    fn new() -> Progress {
        Progress {
            terminal: std::io::stderr().is_terminal(),
            said: String::new(),
            frame: 0,
        }
    }

    fn say(&mut self, status: &str) {
        let mut err = std::io::stderr();
        if self.terminal {
            self.frame = (self.frame + 1) % Self::FRAMES.len();
            let _ = write!(err, "\r{} {status}\x1b[K", Self::FRAMES[self.frame]);
            let _ = err.flush();
        } else if self.said != status {
            let _ = writeln!(err, "{status}");
        }
        status.clone_into(&mut self.said);
    }

    async fn tick(&self) {
        tokio::time::sleep(Duration::from_millis(if self.terminal {
            250
        } else {
            1000
        }))
        .await;
    }

    fn done(&mut self) {
        if self.terminal && !self.said.is_empty() {
            let _ = write!(std::io::stderr(), "\r\x1b[K");
        }
        self.said.clear();
    }
}

async fn ssh(api: &Api, a: SshArgs) -> Result<()> {
    let vm = find_instance(api, &a.instance).await?;
    let Some(line) = vm.ssh_command.as_deref() else {
        return Err(ApiError::Local(format!(
            "{} has no address to log in at yet: it is {}",
            vm.name, vm.status
        )));
    };
    if vm.status != VmStatus::Running {
        return Err(ApiError::Local(format!(
            "{} is {}: start it first (byo instances start {})",
            vm.name, vm.status, vm.name
        )));
    }
    // The server's own line (`ssh root@<host>`), so the CLI and the page never disagree.
    let mut words = line.split_whitespace();
    let program = words.next().unwrap_or("ssh");
    let mut command = std::process::Command::new(program);
    command.args(words).args(&a.ssh_args);
    if a.print {
        let mut shown = vec![program.to_owned()];
        shown.extend(line.split_whitespace().skip(1).map(str::to_owned));
        shown.extend(a.ssh_args.iter().cloned());
        println!("{}", shown.join(" "));
        return Ok(());
    }
    use std::os::unix::process::CommandExt;
    let e = command.exec();
    Err(ApiError::Local(format!("running {program}: {e}")))
}

pub async fn ssh_keys(command: SshKeysCommand) -> Result<()> {
    let api = Api::from_saved()?;
    match command {
        SshKeysCommand::List(out) => {
            let keys: Vec<SshKeyView> = api.get("/api/ssh-keys").await?;
            print_with(out, &keys, || {
                table(
                    &["NAME", "FINGERPRINT", "ADDED", "ID"],
                    keys.iter()
                        .map(|k| {
                            vec![
                                k.name.clone(),
                                k.fingerprint.clone(),
                                when(k.created_at),
                                k.id.clone(),
                            ]
                        })
                        .collect(),
                    "No SSH keys yet: byo ssh-keys add ~/.ssh/id_ed25519.pub",
                )
            });
        }
        SshKeysCommand::Add(a) => {
            let public_key = if a.file == "-" {
                let mut text = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                    .map_err(|e| ApiError::Local(format!("reading standard input: {e}")))?;
                text
            } else {
                std::fs::read_to_string(&a.file)
                    .map_err(|e| ApiError::Local(format!("reading {}: {e}", a.file)))?
            };
            let public_key = public_key.trim().to_owned();
            if public_key.contains("PRIVATE KEY") {
                return Err(ApiError::Local(format!(
                    "{} is a private key: give the public one (the .pub file beside it); \
                     nothing was sent",
                    a.file
                )));
            }
            let name = a.name.clone().unwrap_or_else(|| {
                public_key
                    .split_whitespace()
                    .nth(2)
                    .map(str::to_owned)
                    .unwrap_or_else(|| {
                        std::path::Path::new(&a.file)
                            .file_stem()
                            .map_or_else(|| "key".to_owned(), |s| s.to_string_lossy().into_owned())
                    })
            });
            let (_, key): (_, SshKeyView) = api
                .send(
                    Method::POST,
                    "/api/ssh-keys",
                    Some(&NewSshKey { name, public_key }),
                )
                .await?;
            print_with(a.output, &key, || {
                format!("Added {} ({}).\n", key.name, key.fingerprint)
            });
        }
        SshKeysCommand::Rm(r) => {
            let keys: Vec<SshKeyView> = api.get("/api/ssh-keys").await?;
            let key = find_key(&keys, &r.key)?;
            api.send_empty(Method::DELETE, &format!("/api/ssh-keys/{}", key.id))
                .await?;
            println!("Removed {}; instances created with it keep it.", key.name);
        }
    }
    Ok(())
}

fn find_key(keys: &[SshKeyView], reference: &str) -> Result<SshKeyView> {
    let matching: Vec<&SshKeyView> = keys
        .iter()
        .filter(|k| k.id == reference || k.name == reference)
        .collect();
    match matching.as_slice() {
        [one] => Ok((*one).clone()),
        [] => Err(ApiError::Local(format!(
            "none of your SSH keys is named {reference:?} (nor has that id): `byo ssh-keys list` \
             shows them"
        ))),
        _ => Err(ApiError::Local(format!(
            "more than one of your SSH keys is named {reference:?}: give its id \
             (`byo ssh-keys list`)"
        ))),
    }
}

pub async fn queue(command: QueueCommand) -> Result<()> {
    let api = Api::from_saved()?;
    match command {
        QueueCommand::List(out) => {
            let open: Vec<QueuedView> = api.get("/api/queue").await?;
            print_with(out, &open, || {
                table(
                    &["ID", "GPU", "PLACE", "QUEUED", "EXPIRES", "LAST TRY"],
                    open.iter()
                        .map(|q| {
                            vec![
                                q.id.clone(),
                                q.gpu_type.clone(),
                                q.position.to_string(),
                                when(q.created_at),
                                when(q.expires_at),
                                q.last_error.clone().unwrap_or_default(),
                            ]
                        })
                        .collect(),
                    "Nothing queued.",
                )
            });
        }
        QueueCommand::Cancel(r) => {
            api.send_empty(Method::DELETE, &format!("/api/queue/{}", r.queue_id))
                .await?;
            println!("Cancelled the queued create {}.", r.queue_id);
        }
        QueueCommand::Extend(r) => {
            let (_, q): (_, QueuedView) = api
                .send(
                    Method::POST,
                    &format!("/api/queue/{}/extend", r.queue_id),
                    None::<&()>,
                )
                .await?;
            println!(
                "The queued create {} keeps waiting until {} (place {} in line).",
                q.id,
                when(q.expires_at),
                q.position
            );
        }
    }
    Ok(())
}

pub async fn bookings(args: BookingsArgs) -> Result<()> {
    let api = Api::from_saved()?;
    let out = match args.command {
        None => args.out,
        Some(BookingsCommand::List(out)) => out,
        Some(BookingsCommand::Cancel(r)) => {
            let (_, b): (_, PrebookingView) = api
                .send(
                    Method::POST,
                    &format!("/api/prebookings/{}/cancel", r.prebooking_id),
                    None::<&()>,
                )
                .await?;
            println!("Cancelled the booking {} ({}).", b.id, b.gpu_type);
            return Ok(());
        }
    };
    let all: Vec<PrebookingView> = api.get("/api/prebookings").await?;
    print_with(out, &all, || {
        table(
            &["ID", "GPU", "FROM", "UNTIL", "STATE", "NOTE"],
            all.iter()
                .map(|b| {
                    vec![
                        b.id.clone(),
                        b.gpu_type.clone(),
                        when(b.start_date),
                        when(b.end_date),
                        serde_json::to_value(b.state)
                            .ok()
                            .and_then(|v| v.as_str().map(str::to_owned))
                            .unwrap_or_default(),
                        b.launch_note
                            .clone()
                            .or_else(|| b.how_to_pay.clone())
                            .unwrap_or_default(),
                    ]
                })
                .collect(),
            "No bookings.",
        )
    });
    Ok(())
}

fn instance_table(all: &[InstanceView]) -> String {
    table(
        &["NAME", "GPU", "STATUS", "CREATED", "SSH", "ID"],
        all.iter()
            .map(|v| {
                vec![
                    v.name.clone(),
                    v.gpu_type.clone(),
                    phase(v),
                    when(v.created_at),
                    // As the page: the line only while it reaches something.
                    v.ssh_command
                        .clone()
                        .filter(|_| v.phase() == byo_wire::states::InstancePhase::Running)
                        .unwrap_or_default(),
                    v.id.clone(),
                ]
            })
            .collect(),
        "No instances: byo instances create --gpu spark-1",
    )
}

fn instance_detail(v: &InstanceView) -> String {
    let mut lines = vec![
        ("name", v.name.clone()),
        ("id", v.id.clone()),
        ("gpu", v.gpu_type.clone()),
        ("status", phase(v)),
        ("created", when(v.created_at)),
    ];
    if let Some(ssh) = &v.ssh_command {
        lines.push(("ssh", ssh.clone()));
    }
    for (what, at) in [
        ("create failed", v.creation_failed_at),
        ("delete asked", v.delete_requested_at),
        ("deleted", v.deleted_at),
    ] {
        if let Some(at) = at {
            lines.push((what, when(at)));
        }
    }
    details(lines)
}

/// The status as the page words it: a delete asked and not yet confirmed says so.
fn phase(v: &InstanceView) -> String {
    v.phase().as_str().to_owned()
}

#[cfg(test)]
mod tests {
    use byo_wire::states::VmStatus;
    use byo_wire::vm::InstanceView;

    fn view(name: &str, deleted: bool) -> InstanceView {
        let at = chrono::DateTime::UNIX_EPOCH;
        InstanceView {
            id: format!("id-{name}"),
            name: name.into(),
            gpu_type: "linux-test".into(),
            status: VmStatus::Running,
            ssh_hostname: None,
            relay_address: Some("10.231.0.200".into()),
            ssh_command: Some(format!(
                "ssh -o HostKeyAlias=byo-id-{name} root@10.231.0.200"
            )),
            created_at: at,
            creation_failed_at: None,
            delete_requested_at: deleted.then_some(at),
            deleted_at: deleted.then_some(at),
        }
    }

    /// The list shows an ssh line only where it reaches something, as the page does (the
    /// customers' walk met deleted rows still offering theirs).
    #[test]
    fn only_a_running_instance_shows_its_ssh_line() {
        let table = super::instance_table(&[view("up", false), view("gone", true)]);
        let line = |name: &str| {
            table
                .lines()
                .find(|l| l.starts_with(name))
                .unwrap()
                .to_owned()
        };
        assert!(line("up ").contains("byo-id-up root@"), "{table}");
        assert!(!line("gone ").contains("ssh "), "{table}");
    }
}
