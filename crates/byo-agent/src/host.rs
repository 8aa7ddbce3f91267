//! The host-operations adapter. Everything a prepare step does to a machine goes through
//! [`Host`]: run a program, read or write a file, call LXD's REST API. So the step code is
//! written once and runs on node0 itself ([`LocalHost`]), on a satellite over SSH
//! ([`SshHost`], the node1 block), and on the simulated Spark in tests.
//!
//! The typed operations steps use (apt, systemd, users, ufw, …) are free functions over
//! these primitives, so an adapter implements five methods and nothing else.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// What a host operation failed with, in words an operator can act on.
pub type Fallible<T> = Result<T, String>;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Output {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    pub fn ok(&self) -> bool {
        self.code == 0
    }
    pub fn success(stdout: impl Into<String>) -> Self {
        Output {
            code: 0,
            stdout: stdout.into(),
            stderr: String::new(),
        }
    }
    pub fn failure(code: i32, stderr: impl Into<String>) -> Self {
        Output {
            code,
            stdout: String::new(),
            stderr: stderr.into(),
        }
    }
}

/// A body for LXD: JSON, or raw bytes (an image tarball, a file pushed into an instance).
#[derive(Clone, Debug)]
pub enum LxdBody<'a> {
    None,
    Json(&'a Value),
    Raw {
        bytes: &'a [u8],
        headers: &'a [(&'a str, String)],
    },
}

/// LXD's answer: the HTTP status and the body (JSON for the API, raw for a file or log).
#[derive(Clone, Debug)]
pub struct LxdReply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl LxdReply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
}

pub trait Host {
    /// Run a program and wait for it; `stdin` is written to it when given.
    fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output>;
    /// A file's bytes, `None` when it does not exist.
    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>>;
    /// Replace a file whole (a reader sees the old or the new), with its mode and owner
    /// (`user:group`), creating the directory.
    fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Fallible<()>;
    /// Remove a file; absent is fine.
    fn remove(&mut self, path: &str) -> Fallible<()>;
    /// One call to LXD's REST API over its unix socket (never the `lxc` CLI).
    fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply>;
    /// Where this host is, for messages ("node0", "node1 (fe80::…)").
    fn describe(&self) -> String;
}

/// A host behind a pointer (`&mut H`, `Box<H>`, `Box<dyn Host>`) is a host.
macro_rules! forward_host {
    ($($ptr:ty),*) => {$(
        impl<H: Host + ?Sized> Host for $ptr {
            fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output> {
                (**self).run(argv, stdin)
            }
            fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
                (**self).read(path)
            }
            fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Fallible<()> {
                (**self).write(path, bytes, mode, owner)
            }
            fn remove(&mut self, path: &str) -> Fallible<()> {
                (**self).remove(path)
            }
            fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
                (**self).lxd(method, path, body)
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
        }
    )*};
}

forward_host!(&mut H, Box<H>);

// --- typed operations over the primitives --------------------------------------------------

/// Run, and fail with the program's own words when it exits non-zero.
pub fn must<H: Host + ?Sized>(h: &mut H, argv: &[&str]) -> Fallible<String> {
    let out = h.run(argv, None)?;
    if out.ok() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "`{}` exited {}: {}",
            argv.join(" "),
            out.code,
            last_lines(&out.stderr, &out.stdout)
        ))
    }
}

/// The tail of what a failed program said: where the reason usually is.
pub fn last_lines(stderr: &str, stdout: &str) -> String {
    let text = if stderr.trim().is_empty() {
        stdout
    } else {
        stderr
    };
    let lines: Vec<&str> = text.trim().lines().collect();
    lines[lines.len().saturating_sub(3)..].join(" / ")
}

pub fn read_string<H: Host + ?Sized>(h: &mut H, path: &str) -> Fallible<Option<String>> {
    Ok(h.read(path)?
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

pub fn exists<H: Host + ?Sized>(h: &mut H, path: &str) -> Fallible<bool> {
    Ok(h.run(&["test", "-e", path], None)?.ok())
}

pub fn package_installed<H: Host + ?Sized>(h: &mut H, name: &str) -> Fallible<bool> {
    let out = h.run(&["dpkg-query", "-W", "-f=${Status}", name], None)?;
    Ok(out.ok() && out.stdout.trim() == "install ok installed")
}

/// apt, unattended, waiting for the lock a host's own apt timers may hold.
const APT_ENV: &[&str] = &[
    "env",
    "DEBIAN_FRONTEND=noninteractive",
    "apt-get",
    "-o",
    "DPkg::Lock::Timeout=120",
];

/// Install packages, refreshing the lists once if the first attempt fails.
pub fn apt_install<H: Host + ?Sized>(h: &mut H, packages: &[&str]) -> Fallible<()> {
    let mut argv: Vec<&str> = APT_ENV.to_vec();
    argv.extend(["install", "-y", "-q", "--no-install-recommends"]);
    argv.extend(packages);
    if h.run(&argv, None)?.ok() {
        return Ok(());
    }
    let mut update = APT_ENV.to_vec();
    update.extend(["update", "-q"]);
    must(h, &update)?;
    must(h, &argv).map(drop)
}

pub fn apt_purge<H: Host + ?Sized>(h: &mut H, packages: &[&str]) -> Fallible<()> {
    let mut argv: Vec<&str> = APT_ENV.to_vec();
    argv.extend(["purge", "-y", "-q"]);
    argv.extend(packages);
    must(h, &argv).map(drop)
}

pub fn unit_active<H: Host + ?Sized>(h: &mut H, unit: &str) -> Fallible<bool> {
    Ok(h.run(&["systemctl", "is-active", "--quiet", unit], None)?
        .ok())
}

pub fn unit_enabled<H: Host + ?Sized>(h: &mut H, unit: &str) -> Fallible<bool> {
    Ok(h.run(&["systemctl", "is-enabled", "--quiet", unit], None)?
        .ok())
}

pub fn user_exists<H: Host + ?Sized>(h: &mut H, user: &str) -> Fallible<bool> {
    Ok(h.run(&["getent", "passwd", user], None)?.ok())
}

pub fn user_groups<H: Host + ?Sized>(h: &mut H, user: &str) -> Fallible<Vec<String>> {
    let out = h.run(&["id", "-nG", user], None)?;
    Ok(if out.ok() {
        out.stdout.split_whitespace().map(str::to_owned).collect()
    } else {
        Vec::new()
    })
}

/// A user's home directory from the passwd database.
pub fn home_of<H: Host + ?Sized>(h: &mut H, user: &str) -> Fallible<Option<String>> {
    let out = h.run(&["getent", "passwd", user], None)?;
    Ok(out
        .ok()
        .then(|| out.stdout.trim().split(':').nth(5).map(str::to_owned))
        .flatten())
}

/// The host's IPv4 networks (interface, address/prefix), from `ip -j addr`.
pub fn ipv4_networks<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<(String, String)>> {
    networks(h, &["ip", "-j", "-4", "addr", "show"])
}

/// The host's global IPv6 networks (interface, address/prefix), from `ip -j addr`.
pub fn ipv6_networks<H: Host + ?Sized>(h: &mut H) -> Fallible<Vec<(String, String)>> {
    networks(h, &["ip", "-j", "-6", "addr", "show", "scope", "global"])
}

fn networks<H: Host + ?Sized>(h: &mut H, argv: &[&str]) -> Fallible<Vec<(String, String)>> {
    let out = must(h, argv)?;
    let v: Value = serde_json::from_str(&out).map_err(|e| format!("`{}`: {e}", argv.join(" ")))?;
    let mut nets = Vec::new();
    for link in v.as_array().into_iter().flatten() {
        let ifname = link["ifname"].as_str().unwrap_or_default();
        for a in link["addr_info"].as_array().into_iter().flatten() {
            if let (Some(local), Some(len)) = (a["local"].as_str(), a["prefixlen"].as_u64()) {
                nets.push((ifname.to_owned(), format!("{local}/{len}")));
            }
        }
    }
    Ok(nets)
}

/// Quote one word for a POSIX shell.
pub fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b))
    {
        s.to_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

// --- the machine itself ------------------------------------------------------------------

/// node0: this machine, as root. `root` prefixes every file path (tests use a directory).
#[derive(Clone, Debug)]
pub struct LocalHost {
    pub root: PathBuf,
    /// LXD's socket: Debian's package or the snap, whichever answers first.
    pub lxd_sockets: Vec<PathBuf>,
    /// Programs run so far (the check-only benchmark reports it).
    pub spawned: usize,
}

impl Default for LocalHost {
    fn default() -> Self {
        LocalHost {
            root: PathBuf::from("/"),
            lxd_sockets: vec![
                PathBuf::from("/var/snap/lxd/common/lxd/unix.socket"),
                PathBuf::from("/var/lib/lxd/unix.socket"),
            ],
            spawned: 0,
        }
    }
}

impl LocalHost {
    /// This machine as serving reaches it: LXD only through root's gate
    /// ([`crate::names::LXD_GATE_SOCKET`]), never LXD's own socket.
    pub fn serving() -> Self {
        LocalHost {
            lxd_sockets: vec![PathBuf::from(crate::names::LXD_GATE_SOCKET)],
            ..LocalHost::default()
        }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }
}

fn id_of(db: &str, name: &str) -> Option<u32> {
    db.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next() == Some(name))
            .then(|| f.nth(1).and_then(|id| id.parse().ok()))
            .flatten()
    })
}

impl Host for LocalHost {
    fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output> {
        let (program, args) = argv.split_first().ok_or("empty command")?;
        self.spawned += 1;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .env("LC_ALL", "C");
        let mut child = match cmd.spawn() {
            Ok(c) => c,
            // Absent programs answer like a shell would, so "is it installed" is a check.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Output::failure(
                    127,
                    format!("{program}: command not found"),
                ));
            }
            Err(e) => return Err(format!("running {program}: {e}")),
        };
        if let (Some(bytes), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(bytes)
                .map_err(|e| format!("writing to {program}: {e}"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(|e| format!("waiting for {program}: {e}"))?;
        Ok(Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        match std::fs::read(self.path(path)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(format!("reading {path}: {e}")),
        }
    }

    fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Fallible<()> {
        let full = self.path(path);
        if let Some(dir) = full.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        crate::host::write_atomic(&full, bytes, mode)
            .map_err(|e| format!("writing {path}: {e}"))?;
        let (user, group) = owner.split_once(':').unwrap_or((owner, owner));
        let passwd = std::fs::read_to_string(self.path("/etc/passwd")).unwrap_or_default();
        let groups = std::fs::read_to_string(self.path("/etc/group")).unwrap_or_default();
        let uid = id_of(&passwd, user).ok_or_else(|| format!("no user {user}"))?;
        let gid = id_of(&groups, group).ok_or_else(|| format!("no group {group}"))?;
        // Tests write under a directory as an ordinary user: chown only what we may.
        match std::os::unix::fs::chown(&full, Some(uid), Some(gid)) {
            Err(e)
                if e.kind() == std::io::ErrorKind::PermissionDenied
                    && self.root != Path::new("/") =>
            {
                Ok(())
            }
            r => r.map_err(|e| format!("chown {path}: {e}")),
        }
    }

    fn remove(&mut self, path: &str) -> Fallible<()> {
        match std::fs::remove_file(self.path(path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(format!("removing {path}: {e}"))
            }
            _ => Ok(()),
        }
    }

    fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
        let socket = self
            .lxd_sockets
            .iter()
            .find(|s| std::os::unix::net::UnixStream::connect(s).is_ok())
            .ok_or("LXD is not answering on its socket")?
            .clone();
        let client = reqwest::blocking::Client::builder()
            .unix_socket(socket)
            .timeout(std::time::Duration::from_secs(900))
            .build()
            .map_err(|e| format!("LXD client: {e}"))?;
        let method = reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| e.to_string())?;
        let mut req = client.request(method, format!("http://lxd{path}"));
        match body {
            LxdBody::None => {}
            LxdBody::Json(v) => req = req.json(v),
            LxdBody::Raw { bytes, headers } => {
                for (k, v) in headers {
                    req = req.header(*k, v);
                }
                req = req.body(bytes.to_vec());
            }
        }
        let resp = req.send().map_err(|e| format!("LXD {path}: {e}"))?;
        let status = resp.status().as_u16();
        let body = resp
            .bytes()
            .map_err(|e| format!("LXD {path}: {e}"))?
            .to_vec();
        Ok(LxdReply { status, body })
    }

    fn describe(&self) -> String {
        "node0".into()
    }
}

// --- a satellite, over SSH ---------------------------------------------------------------

/// A satellite reached from node0 over SSH as `spark` (or the owner's login before
/// peer-access), everything run through `sudo -n`. The host key is pinned: a key that is
/// not the pinned one is refused by ssh itself.
#[derive(Clone, Debug)]
pub struct SshHost {
    pub node: u32,
    pub user: String,
    pub addr: String,
    pub key: PathBuf,
    pub known_hosts: PathBuf,
    pub port: u16,
    pub lxd_socket: String,
    /// A login lent by the owner (peer-login: user, then password): ssh asks the agent
    /// itself for it (SSH_ASKPASS), and sudo reads it first on standard input.
    pub password_file: Option<PathBuf>,
    /// The name the pinned host key is filed under in `known_hosts`, when the address is not
    /// a stable name (a link-local address scoped to one of node0's ports, at step 125).
    pub host_key_alias: Option<String>,
    /// One SSH connection shared by every command (ControlMaster), for the cable probe's
    /// many short reads of one machine; it closes itself 10 s after the last.
    pub control_path: Option<PathBuf>,
    /// A `ProxyCommand` ([`SshHost::proxy_to`]): the machine is reached through another.
    pub proxy: Option<String>,
}

/// Set in the environment of ssh when a lent login is used: the agent, started by ssh as
/// its askpass program, prints the password from this file and exits (see `main`).
pub const ASKPASS_ENV: &str = "BYO_ASKPASS_FILE";

/// The password of a lent login: the second line of the peer-login file.
pub fn lent_password(file: &Path) -> std::io::Result<String> {
    let text = std::fs::read_to_string(file)?;
    Ok(text.lines().nth(1).unwrap_or_default().to_owned())
}

impl SshHost {
    /// ssh's options for this machine, up to (not including) the target.
    fn options(&self, multiplex: bool) -> Vec<String> {
        let mut argv: Vec<String> = [
            "-p",
            &self.port.to_string(),
            "-i",
            &self.key.to_string_lossy(),
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            &format!("UserKnownHostsFile={}", self.known_hosts.to_string_lossy()),
            "-o",
            "ConnectTimeout=10",
            // A satellite that goes away mid-connection (a reboot, a cable pulled from the
            // LAN) must fail the call, not hang it: serving asks on every beat (L3).
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=2",
        ]
        .map(str::to_owned)
        .to_vec();
        let mut opt = |o: String| argv.extend(["-o".to_owned(), o]);
        if self.password_file.is_some() {
            // BatchMode would forbid the password ssh asks SSH_ASKPASS for.
            opt("BatchMode=no".into());
            opt("NumberOfPasswordPrompts=1".into());
            opt("PreferredAuthentications=publickey,password,keyboard-interactive".into());
        } else {
            opt("BatchMode=yes".into());
        }
        if let Some(a) = &self.host_key_alias {
            opt(format!("HostKeyAlias={a}"));
        }
        if let Some(p) = &self.proxy {
            opt(format!("ProxyCommand={p}"));
        }
        if multiplex && let Some(c) = &self.control_path {
            opt("ControlMaster=auto".into());
            opt(format!("ControlPath={}", c.to_string_lossy()));
            opt("ControlPersist=10".into());
        }
        argv
    }

    /// A `ProxyCommand` that reaches `target` (an address as this machine sees it, a
    /// link-local one scoped to its own port) one hop through this machine: how node0 logs
    /// into a ring's diagonal across a neighbour's cable (K2 note 3). Its own connection, not
    /// the shared one; ssh expands `%` in the command, so each is doubled.
    pub fn proxy_to(&self, target: &str) -> String {
        let mut words = vec!["ssh".to_owned()];
        words.extend(self.options(false));
        words.extend([
            "-W".to_owned(),
            format!("[{target}]:22"),
            format!("{}@{}", self.user, self.addr),
        ]);
        words
            .iter()
            .map(|w| shell_quote(w).replace('%', "%%"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn ssh(&self, remote: &str, stdin: Option<&[u8]>) -> Fallible<Output> {
        let mut local = LocalHost::default();
        let target = format!("{}@{}", self.user, self.addr);
        let options = self.options(true);
        let mut argv: Vec<&str> = vec!["ssh"];
        argv.extend(options.iter().map(String::as_str));
        argv.extend([target.as_str(), "--", remote]);
        let out = match &self.password_file {
            None => local.run(&argv, stdin)?,
            Some(file) => {
                let password =
                    lent_password(file).map_err(|e| format!("reading the lent login: {e}"))?;
                let mut input = format!("{password}\n").into_bytes();
                input.extend_from_slice(stdin.unwrap_or_default());
                let exe = std::env::current_exe().map_err(|e| e.to_string())?;
                let mut cmd = Command::new("ssh");
                cmd.args(&argv[1..])
                    .env("SSH_ASKPASS", exe)
                    .env("SSH_ASKPASS_REQUIRE", "force")
                    .env(ASKPASS_ENV, file)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                let mut child = cmd.spawn().map_err(|e| format!("running ssh: {e}"))?;
                if let Some(mut pipe) = child.stdin.take() {
                    let _ = pipe.write_all(&input);
                }
                let o = child.wait_with_output().map_err(|e| e.to_string())?;
                Output {
                    code: o.status.code().unwrap_or(-1),
                    stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
                    stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
                }
            }
        };
        if out.code == 255 {
            return Err(format!(
                "node{} ({}) could not be reached over SSH: {}",
                self.node,
                self.addr,
                last_lines(&out.stderr, "")
            ));
        }
        Ok(out)
    }
    fn sudo(&self, argv: &[&str]) -> String {
        let words: Vec<String> = argv.iter().map(|a| shell_quote(a)).collect();
        // With a lent login sudo asks for its password, which comes first on stdin.
        let sudo = if self.password_file.is_some() {
            "sudo -S -p ''"
        } else {
            "sudo -n"
        };
        format!("{sudo} LC_ALL=C {}", words.join(" "))
    }
}

impl Host for SshHost {
    fn run(&mut self, argv: &[&str], stdin: Option<&[u8]>) -> Fallible<Output> {
        self.ssh(&self.sudo(argv), stdin)
    }

    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        let q = shell_quote(path);
        let out = self.run(
            // Base64 over the wire: what ssh prints comes back as text, and a file can be a
            // binary (base-image reads busybox from the satellite it builds on).
            &[
                "sh",
                "-c",
                &format!("test -e {q} || exit 3; exec base64 -w 0 {q}"),
            ],
            None,
        )?;
        match out.code {
            0 => {
                use base64::Engine as _;
                base64::engine::general_purpose::STANDARD
                    .decode(out.stdout.trim())
                    .map(Some)
                    .map_err(|e| format!("reading {path} on node{}: {e}", self.node))
            }
            3 => Ok(None),
            _ => Err(format!(
                "reading {path} on node{}: {}",
                self.node,
                out.stderr.trim()
            )),
        }
    }

    fn write(&mut self, path: &str, bytes: &[u8], mode: u32, owner: &str) -> Fallible<()> {
        let (user, group) = owner.split_once(':').unwrap_or((owner, owner));
        // The temporary file is the remote shell's own (`$$`): a write cut off by a timeout may
        // still finish on the far side while the next write runs, and two writers sharing one
        // name move each other's file away.
        let tmp = format!("{path}.enverge-tmp");
        let script = format!(
            "mkdir -p \"$(dirname {p})\" && install -m {mode:o} -o {u} -g {g} /dev/stdin {t}.$$ && mv -f {t}.$$ {p}",
            p = shell_quote(path),
            t = shell_quote(&tmp),
            u = shell_quote(user),
            g = shell_quote(group),
        );
        let out = self.run(&["sh", "-c", &script], Some(bytes))?;
        out.ok()
            .then_some(())
            .ok_or_else(|| format!("writing {path} on node{}: {}", self.node, out.stderr.trim()))
    }

    fn remove(&mut self, path: &str) -> Fallible<()> {
        must(self, &["rm", "-f", path]).map(drop)
    }

    fn lxd(&mut self, method: &str, path: &str, body: LxdBody<'_>) -> Fallible<LxdReply> {
        let mut argv = vec![
            "curl".to_owned(),
            "-sS".into(),
            "--unix-socket".into(),
            self.lxd_socket.clone(),
            "-X".into(),
            method.into(),
            "-w".into(),
            "\n%{http_code}".into(),
        ];
        let data: Vec<u8> = match body {
            LxdBody::None => Vec::new(),
            LxdBody::Json(v) => {
                argv.extend(["-H".into(), "Content-Type: application/json".into()]);
                serde_json::to_vec(v).map_err(|e| e.to_string())?
            }
            LxdBody::Raw { bytes, headers } => {
                for (k, v) in headers {
                    argv.extend(["-H".into(), format!("{k}: {v}")]);
                }
                bytes.to_vec()
            }
        };
        if !data.is_empty() {
            argv.extend(["--data-binary".into(), "@-".into()]);
        }
        argv.push(format!("http://lxd{path}"));
        let words: Vec<&str> = argv.iter().map(String::as_str).collect();
        let out = self.run(&words, (!data.is_empty()).then_some(&data[..]))?;
        if !out.ok() {
            return Err(format!("LXD on node{}: {}", self.node, out.stderr.trim()));
        }
        let (body, status) = out.stdout.rsplit_once('\n').ok_or("LXD answered nothing")?;
        Ok(LxdReply {
            status: status.trim().parse().map_err(|_| "LXD status unreadable")?,
            body: body.as_bytes().to_vec(),
        })
    }

    fn describe(&self) -> String {
        format!("node{} ({})", self.node, self.addr)
    }
}

/// Write `bytes` to `path` so that a reader sees the old file or the new one, never a
/// part: a temporary file beside it, fsynced, renamed over, and the directory fsynced.
pub fn write_atomic(path: &std::path::Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let dir = path
        .parent()
        .ok_or_else(|| std::io::Error::other("path has no parent"))?;
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
        f.write_all(bytes)?;
        f.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}
