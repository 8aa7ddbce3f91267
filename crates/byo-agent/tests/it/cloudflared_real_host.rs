//! The operator tunnel's connector on a real Debian host container: no registry here ships
//! cloudflared (nor does DGX OS's), so the test serves a stand-in build over HTTP at the
//! control plane's path (`/cloudflared/cloudflared-<arch>`) and pins its digest in the kept
//! credentials, as enrolment does. A build with another digest is refused with nothing
//! installed; the pinned one is installed 0755 at /usr/local/bin/cloudflared and the tunnel's
//! unit runs it. Then the heartbeat's judge of the tunnel reads that very unit (issue #38: it
//! read a unit named `cloudflared`, so every tunnel read as down): running, stopped,
//! crash-looping and failed.

use crate::support;

use std::io::{Read, Write};
use std::net::TcpListener;

use byo_agent::heartbeat::tunnel_health;
use byo_agent::host::{Fallible, Host, LxdBody, LxdReply, Output};
use byo_wire::vm::Health;
use sha2::{Digest, Sha256};
use support::host_container::{HostContainer, bridge_gateway};
use support::prepared::{enrolled, text};

/// A stand-in that answers like cloudflared: `--version`, and `tunnel … run` stays up.
const STAND_IN: &[u8] = b"#!/bin/sh\ncase \"$1\" in\n  --version) echo 'cloudflared version 2026.1.0 (stand-in)' ;;\n  tunnel) while :; do sleep 3600; done ;;\n  *) exit 2 ;;\nesac\n";

/// Serves `body` at `path` (anything else is a 404) on this machine's every address;
/// returns the port.
fn serve(path: String, body: &'static [u8]) -> u16 {
    let listener = TcpListener::bind("0.0.0.0:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
            }
            let line = String::from_utf8_lossy(&request);
            let asked = line.split_whitespace().nth(1).unwrap_or_default();
            let (status, body): (&str, &[u8]) = if asked == path {
                ("200 OK", body)
            } else {
                ("404 Not Found", b"no such cloudflared build")
            };
            let head = format!(
                "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes());
            let _ = stream.write_all(body);
        }
    });
    port
}

#[test]
fn the_pinned_cloudflared_build_is_checked_then_installed_and_a_wrong_one_is_refused() {
    let Some(e) = enrolled("byo-cfd", None) else {
        return;
    };
    let host = &e.host;
    let arch = host.sh_ok("uname -m").trim().to_owned();
    let path = format!("/cloudflared/cloudflared-{arch}");
    let port = serve(path.clone(), STAND_IN);
    let url = format!("http://{}:{port}{path}", bridge_gateway());
    let actual = hex::encode(Sha256::digest(STAND_IN));
    let keep = |pinned: &str| {
        let mut creds: serde_json::Value =
            serde_json::from_slice(&host.read("/etc/enverge/credentials.json").unwrap()).unwrap();
        creds["tunnel_connector_token"] = "stand-in-connector-token".into();
        creds["cloudflared"] = serde_json::json!({"url": url, "sha256": pinned});
        host.write(
            "/etc/enverge/credentials.json",
            creds.to_string().as_bytes(),
            0o600,
        );
    };
    let left = || {
        host.sh_ok(
            "for f in /usr/local/bin/cloudflared /usr/bin/cloudflared /var/lib/enverge-agent/cloudflared.download /etc/systemd/system/enverge-tunnel.service; do [ -e $f ] && echo \"left $f\"; done; true",
        )
    };

    // Another digest: refused at operator-access, naming both, and nothing is installed.
    let pinned = hex::encode(Sha256::digest(b"the build the operators pinned"));
    keep(&pinned);
    let out = host.exec(&["/usr/local/bin/byo-agent", "prepare"]);
    let said = text(&out);
    eprintln!("--- a wrong digest\n{said}");
    assert!(!out.status.success(), "{said}");
    for want in [
        "operator-access",
        pinned.as_str(),
        actual.as_str(),
        "nothing was installed",
    ] {
        assert!(said.contains(want), "{want:?} not said:\n{said}");
    }
    assert_eq!(left(), "", "a refused build left something behind");

    // The pinned digest: installed where the unit runs it. Only operator-access matters
    // here, so the rest of preparation is cut short.
    keep(&actual);
    let out = host.exec(&["timeout", "60", "/usr/local/bin/byo-agent", "prepare"]);
    eprintln!("--- the pinned digest\n{}", text(&out));
    let facts = host.sh_ok(
        "stat -c '%U %a' /usr/local/bin/cloudflared
         sha256sum /usr/local/bin/cloudflared
         grep '^ExecStart=' /etc/systemd/system/enverge-tunnel.service
         systemctl is-active enverge-tunnel.service
         pgrep -fa 'cloudflared tunnel' >/dev/null && echo tunnel-running
         [ -e /var/lib/enverge-agent/cloudflared.download ] && echo download-left; true",
    );
    for want in [
        "root 755".to_owned(),
        format!("{actual}  /usr/local/bin/cloudflared"),
        "ExecStart=/usr/local/bin/cloudflared tunnel --no-autoupdate run --token-file /etc/enverge/tunnel-token".to_owned(),
        "\nactive\n".to_owned(),
        "tunnel-running".to_owned(),
    ] {
        assert!(
            facts.contains(&want),
            "{want:?} missing from what the host holds:\n{facts}"
        );
    }
    assert!(!facts.contains("download-left"), "{facts}");

    // Issue #38: the heartbeat judges the tunnel by the unit preparation really wrote.
    let mut node0 = InContainer(host);
    let judged = |node0: &mut InContainer| tunnel_health(node0, Some(true));
    assert_eq!(
        judged(&mut node0),
        (
            Health::Ok,
            "enverge-tunnel.service: active (running)".to_owned()
        )
    );
    host.sh_ok("systemctl stop enverge-tunnel.service");
    assert_eq!(
        judged(&mut node0),
        (
            Health::Down,
            "enverge-tunnel.service: inactive (dead)".to_owned()
        )
    );
    // A connector that dies at once: Restart=always brings it back every 5 s, for ever, and
    // between two restarts the unit is "activating" — down, not on its way up.
    host.write("/usr/local/bin/cloudflared", b"#!/bin/sh\nexit 1\n", 0o755);
    host.sh_ok("systemctl start enverge-tunnel.service");
    let looping = until(host, "ActiveState=activating\nSubState=auto-restart");
    assert!(looping, "the unit never waited to restart");
    assert_eq!(
        judged(&mut node0),
        (
            Health::Down,
            "enverge-tunnel.service: activating (auto-restart)".to_owned()
        )
    );
    // Started too often too quickly: systemd gives up and the unit is failed.
    host.sh_ok(
        "for i in 1 2 3 4 5 6 7; do systemctl restart enverge-tunnel.service 2>/dev/null || true; done",
    );
    assert!(
        until(host, "ActiveState=failed\nSubState=failed"),
        "never failed"
    );
    assert_eq!(
        judged(&mut node0),
        (
            Health::Down,
            "enverge-tunnel.service: failed (failed)".to_owned()
        )
    );
    // The connector put back: up again.
    host.write("/usr/local/bin/cloudflared", STAND_IN, 0o755);
    host.sh_ok(
        "systemctl reset-failed enverge-tunnel.service; systemctl start enverge-tunnel.service",
    );
    assert_eq!(judged(&mut node0).0, Health::Ok);
}

/// Whether the tunnel unit shows `state` (ActiveState, SubState) within 20 s.
fn until(host: &HostContainer, state: &str) -> bool {
    let started = std::time::Instant::now();
    while started.elapsed() < std::time::Duration::from_secs(20) {
        let shown = host.sh_ok("systemctl show enverge-tunnel.service -p ActiveState -p SubState");
        let mut lines: Vec<&str> = shown.lines().collect();
        lines.sort_unstable();
        if lines.join("\n") == state {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    false
}

/// The host container as the heartbeat's host: its programs run in the container; the
/// tunnel's judge asks nothing else.
struct InContainer<'a>(&'a HostContainer);

impl Host for InContainer<'_> {
    fn run(&mut self, argv: &[&str], _stdin: Option<&[u8]>) -> Fallible<Output> {
        let out = self.0.exec(argv);
        Ok(Output {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }
    fn read(&mut self, path: &str) -> Fallible<Option<Vec<u8>>> {
        Ok(self.0.read(path))
    }
    fn write(&mut self, path: &str, _: &[u8], _: u32, _: &str) -> Fallible<()> {
        Err(format!("not written in this test: {path}"))
    }
    fn remove(&mut self, path: &str) -> Fallible<()> {
        Err(format!("not removed in this test: {path}"))
    }
    fn lxd(&mut self, _: &str, path: &str, _: LxdBody<'_>) -> Fallible<LxdReply> {
        Err(format!("no LXD in this test: {path}"))
    }
    fn describe(&self) -> String {
        self.0.name().to_owned()
    }
}
