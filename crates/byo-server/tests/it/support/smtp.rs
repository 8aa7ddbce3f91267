//! A real SMTP server for the tests that mail: Debian's aiosmtpd (`smtp_sink.py`) on a free
//! loopback port, keeping what it accepts in a spool.

use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

/// Debian's aiosmtpd on a free loopback port, with its spool. `None` where aiosmtpd is
/// missing and the run is not CI (`have_tools`).
pub struct Smtp {
    child: Child,
    spool: tempfile::TempDir,
    pub port: u16,
}

impl Smtp {
    pub fn start() -> Option<Smtp> {
        if !byo_core::testing::have_tools(&["aiosmtpd"]) {
            return None;
        }
        let spool = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script: PathBuf = [env!("CARGO_MANIFEST_DIR"), "tests/it/support/smtp_sink.py"]
            .iter()
            .collect();
        let mut child = Command::new("/usr/bin/python3")
            .arg(script)
            .arg(spool.path())
            .arg(port.to_string())
            .spawn()
            .expect("python3 runs");
        let ready = spool.path().join("ready");
        for _ in 0..200 {
            if ready.exists() {
                return Some(Smtp { child, spool, port });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("aiosmtpd did not start on 127.0.0.1:{port}");
    }

    pub fn refuse(&self, refusing: bool) {
        let flag = self.spool.path().join("refuse");
        if refusing {
            std::fs::write(flag, b"").unwrap();
        } else {
            std::fs::remove_file(flag).unwrap();
        }
    }

    /// Every message received, in order, as a mail reader shows it: quoted-printable
    /// decoded (lettre sends a body with a long line, such as a link, that way).
    pub fn read(&self) -> Vec<String> {
        self.messages()
            .iter()
            .map(|m| quoted_printable(m))
            .collect()
    }

    /// Every message received, in order.
    pub fn messages(&self) -> Vec<String> {
        let mut names: Vec<_> = std::fs::read_dir(self.spool.path())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "eml"))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|p| std::fs::read_to_string(p).unwrap())
            .collect()
    }
}

impl Drop for Smtp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Quoted-printable undone: soft line breaks joined, `=XX` bytes restored.
fn quoted_printable(raw: &str) -> String {
    let joined = raw.replace("=\r\n", "").replace("=\n", "");
    let bytes = joined.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'=', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
