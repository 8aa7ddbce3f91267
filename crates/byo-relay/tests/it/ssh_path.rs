//! The customer's SSH path (F) with real kernel parts: network namespaces for the customer,
//! the relay, the host and the container; WireGuard between relay and host (wireguard-go);
//! real sshd and ssh; ssh_mapd driving nftables. Named after the design's sections.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Command;

use byo_core::tokens::{SecretToken, TokenKind};
use byo_relay::nft::parse_map;
use support::{
    Netns, eventually, kernel_parts, link, run, ssh, sshd, wg_keypair, wg_name, wireguard,
};

struct World {
    dir: tempfile::TempDir,
    customer: Netns,
    iap: Netns,
    relay: Netns,
    host: Netns,
    _container: Netns,
    key: PathBuf,
    token: SecretToken,
    relay_wg: String,
    mapd_pid: Option<u32>,
}

const PUBLIC: &str = "10.99.0.1";

impl World {
    fn start_mapd(&mut self) {
        let hash = self.dir.path().join("ssh-map-token.sha256");
        std::fs::write(&hash, format!("{}\n", self.token.hash().as_str())).unwrap();
        let pid = self.relay.spawn(&format!(
            "exec {bin} serve --listen 10.8.0.1:8754 --token-hash-file {hash} --host 10.8.0.2 --tunnel {wg}",
            bin = env!("CARGO_BIN_EXE_byo-relay"),
            hash = hash.display(),
            wg = self.relay_wg
        ));
        self.mapd_pid = Some(pid);
        eventually("ssh_mapd to answer through the tunnel", || {
            self.call("GET", "/map", None, None).0 == 200
        });
    }

    fn stop_mapd(&mut self) {
        if let Some(pid) = self.mapd_pid.take() {
            run(Command::new("kill").args(["-TERM", &pid.to_string()]));
            eventually("ssh_mapd to stop", || {
                self.call("GET", "/map", None, None).0 == 0
            });
        }
    }

    /// The agent calling ssh_mapd from the host, through the tunnel (`token` `Some("")`:
    /// no Authorization header at all). Returns (status, body); status 0 when nothing
    /// answered.
    fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        token: Option<&str>,
    ) -> (u16, String) {
        let auth = match token.unwrap_or(self.token.expose()) {
            "" => String::new(),
            token => format!("-H 'authorization: Bearer {token}'"),
        };
        let mut script = format!(
            "curl -s -m 3 -o /dev/stdout -w '\\n%{{http_code}}' -X {method} {auth} http://10.8.0.1:8754{path}"
        );
        if let Some(b) = body {
            script.push_str(&format!(
                " -H 'content-type: application/json' --data '{b}'"
            ));
        }
        let out = self.host.try_sh(&script);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
        (code.trim().parse().unwrap_or(0), body.to_owned())
    }

    /// The map as the kernel holds it, read directly.
    fn kernel_map(&self) -> String {
        let out = self
            .relay
            .try_sh("nft -j list map ip lofispark vmssh_ports");
        if !out.status.success() {
            return "no table".into();
        }
        format!(
            "{:?}",
            parse_map(&String::from_utf8_lossy(&out.stdout)).unwrap()
        )
    }

    fn customer_ssh(&self) -> Option<String> {
        ssh(&self.customer, &self.key, PUBLIC, 22)
    }
}

fn world() -> Option<World> {
    if !kernel_parts(&[
        "ip",
        "nft",
        "wg",
        "wireguard-go",
        "ssh",
        "ssh-keygen",
        "sshd",
        "curl",
    ]) {
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let (customer, iap, relay, host, container) = (
        Netns::new("cust"),
        Netns::new("iap"),
        Netns::new("relay"),
        Netns::new("host"),
        Netns::new("ctr"),
    );
    link(&customer, "10.99.0.2/24", &relay, "10.99.0.1/24");
    link(&iap, "35.235.240.9/20", &relay, "35.235.240.1/20");
    link(&relay, "192.168.77.1/24", &host, "192.168.77.2/24");
    link(&host, "10.20.0.1/24", &container, "10.20.0.2/24");
    container.sh("ip route add default via 10.20.0.1");
    customer.sh("ip route add default via 10.99.0.2 2>/dev/null || true");
    for ns in [&relay, &host] {
        ns.sh("sysctl -q -w net.ipv4.ip_forward=1");
    }

    // WireGuard: the host dials the relay, as from behind a home router.
    let (relay_private, relay_public) = wg_keypair();
    let (host_private, host_public) = wg_keypair();
    let (relay_wg, host_wg) = (wg_name(), wg_name());
    wireguard(
        &relay,
        dir.path(),
        &relay_wg,
        &format!(
            "[Interface]\nPrivateKey = {relay_private}\nListenPort = 51820\n\n[Peer]\nPublicKey = {host_public}\nAllowedIPs = 10.8.0.2/32\n"
        ),
        "10.8.0.1/24",
    );
    wireguard(
        &host,
        dir.path(),
        &host_wg,
        &format!(
            "[Interface]\nPrivateKey = {host_private}\n\n[Peer]\nPublicKey = {relay_public}\nEndpoint = 192.168.77.1:51820\nAllowedIPs = 10.8.0.1/32\nPersistentKeepalive = 1\n"
        ),
        "10.8.0.2/24",
    );
    eventually("the tunnel's first handshake", || {
        let out = host.try_sh(&format!("wg show {host_wg} latest-handshakes"));
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .nth(1)
            .is_some_and(|t| t != "0")
    });

    // What the agent sets up on the host for an instance: its port to the container's :22.
    host.sh("nft 'add table ip instance; add chain ip instance pre { type nat hook prerouting priority dstnat; }; add rule ip instance pre tcp dport 2201 dnat to 10.20.0.2:22'");

    let key = dir.path().join("customer");
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key));
    let authorized = dir.path().join("authorized_keys");
    std::fs::copy(key.with_extension("pub"), &authorized).unwrap();
    sshd(
        &container,
        dir.path(),
        "0.0.0.0:22",
        "container",
        &authorized,
    );
    sshd(&host, dir.path(), "10.8.0.2:22", "host", &authorized);
    sshd(&relay, dir.path(), "0.0.0.0:22", "relay", &authorized);

    let mut w = World {
        dir,
        customer,
        iap,
        relay,
        host,
        _container: container,
        key,
        token: SecretToken::generate(TokenKind::SshMap),
        relay_wg,
        mapd_pid: None,
    };
    w.start_mapd();
    Some(w)
}

fn map_22() -> &'static str {
    r#"{"target":"10.8.0.2","target_port":2201}"#
}

#[test]
fn f_customer_ssh_through_the_relay_lands_in_the_container_only_while_mapped() {
    let Some(mut w) = world() else { return };

    // Until the map is written, :22 is a blackhole (F note 2).
    assert_eq!(
        w.call("GET", "/map", None, None),
        (200, r#"{"mappings":[]}"#.into())
    );
    assert_eq!(
        w.customer_ssh(),
        None,
        "nothing answers before a mapping exists"
    );
    // The relay's own connection to the host is not caught by PREROUTING (I).
    assert_eq!(
        ssh(&w.relay, &w.key, "10.8.0.2", 22).as_deref(),
        Some("host")
    );
    // IAP still reaches the relay's own sshd.
    assert_eq!(
        ssh(&w.iap, &w.key, "35.235.240.1", 22).as_deref(),
        Some("relay")
    );

    // Step 49: the agent writes the map.
    let (status, body) = w.call("PUT", "/map/22", Some(map_22()), None);
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        r#"{"port":22,"target":"10.8.0.2","target_port":2201}"#
    );
    assert_eq!(
        w.customer_ssh().as_deref(),
        Some("container"),
        "plain ssh lands in the container"
    );
    assert_eq!(
        ssh(&w.relay, &w.key, "10.8.0.2", 22).as_deref(),
        Some("host"),
        "still the host from the relay"
    );
    assert_eq!(
        ssh(&w.iap, &w.key, "35.235.240.1", 22).as_deref(),
        Some("relay"),
        "IAP is exempt"
    );
    let kernel = w.kernel_map();
    assert_eq!(kernel, "[Mapping { port: 22, target_port: 2201 }]");

    // Refusals change nothing: neither the map nor the rest of the table.
    let table = || {
        String::from_utf8_lossy(&w.relay.try_sh("nft list table ip lofispark").stdout).into_owned()
    };
    let table_before = table();
    let wrong = SecretToken::generate(TokenKind::SshMap);
    for (method, path, body, token, want) in [
        (
            "PUT",
            "/map/22",
            Some(r#"{"target":"10.8.0.2","target_port":2299}"#),
            Some(wrong.expose()),
            401,
        ),
        ("GET", "/map", None, Some("byo_map_not-a-token"), 401),
        ("PUT", "/map/22", Some(r#"{"target":"10.8.0.2""#), None, 400),
        (
            "PUT",
            "/map/22",
            Some(r#"{"target":"10.8.0.9","target_port":2201}"#),
            None,
            400,
        ),
        (
            "PUT",
            "/map/22",
            Some(r#"{"target":"8.8.8.8","target_port":2201}"#),
            None,
            400,
        ),
        (
            "PUT",
            "/map/8754",
            Some(r#"{"target":"10.8.0.2","target_port":2201}"#),
            None,
            400,
        ),
        (
            "PUT",
            "/map/0",
            Some(r#"{"target":"10.8.0.2","target_port":2201}"#),
            None,
            400,
        ),
        ("PUT", "/map/ssh", Some(map_22()), None, 400),
        (
            "PUT",
            "/map/22",
            Some(r#"{"target":"10.8.0.2","target_port":2201,"extra":1}"#),
            None,
            400,
        ),
        ("DELETE", "/map/22", None, Some(wrong.expose()), 401),
        // No token at all.
        ("GET", "/map", None, Some(""), 401),
        ("PUT", "/map/22", Some(map_22()), Some(""), 401),
        ("DELETE", "/map/22", None, Some(""), 401),
        // Every one of the relay's own ports, one at a time and in a whole map.
        ("PUT", "/map/80", Some(map_22()), None, 400),
        ("PUT", "/map/443", Some(map_22()), None, 400),
        ("PUT", "/map/51820", Some(map_22()), None, 400),
        (
            "PUT",
            "/map",
            Some(r#"{"mappings":[{"port":443,"target":"10.8.0.2","target_port":2201}]}"#),
            None,
            400,
        ),
        // #16: no public port but :22 (step 49), alone or in a whole map.
        ("PUT", "/map/2222", Some(map_22()), None, 400),
        ("PUT", "/map/8080", Some(map_22()), None, 400),
        ("PUT", "/map/65535", Some(map_22()), None, 400),
        (
            "PUT",
            "/map",
            Some(
                r#"{"mappings":[{"port":22,"target":"10.8.0.2","target_port":2201},{"port":2222,"target":"10.8.0.2","target_port":2202}]}"#,
            ),
            None,
            400,
        ),
        // One port mapped twice in a whole map.
        (
            "PUT",
            "/map",
            Some(
                r#"{"mappings":[{"port":22,"target":"10.8.0.2","target_port":2201},{"port":22,"target":"10.8.0.2","target_port":2202}]}"#,
            ),
            None,
            400,
        ),
    ] {
        let (status, reply) = w.call(method, path, body, token);
        assert_eq!(status, want, "{method} {path} {body:?}: {reply}");
        assert_eq!(w.kernel_map(), kernel, "{method} {path} changed the kernel");
    }
    assert!(
        w.call(
            "PUT",
            "/map/22",
            Some(r#"{"target":"10.8.0.9","target_port":2201}"#),
            None
        )
        .1
        .contains("forwards only to its own host")
    );
    for port in byo_relay::mapd::RESERVED_PORTS {
        let (status, reply) = w.call("PUT", &format!("/map/{port}"), Some(map_22()), None);
        assert_eq!(status, 400, "{port}: {reply}");
        assert!(reply.contains("one of the relay's own services"), "{reply}");
    }
    assert_eq!(
        w.call(
            "PUT",
            "/map",
            Some(
                r#"{"mappings":[{"port":22,"target":"10.8.0.2","target_port":2201},{"port":22,"target":"10.8.0.2","target_port":2202}]}"#
            ),
            None
        ),
        (
            400,
            r#"{"error":"invalid","message":"a port is mapped twice"}"#.into()
        )
    );
    // #16: the relay maps its public :22 and nothing else, to the one host.
    assert_eq!(
        w.call("PUT", "/map/2222", Some(map_22()), None),
        (
            400,
            r#"{"error":"invalid","message":"port 2222 is not a port this relay maps: only [22]"}"#
                .into()
        )
    );
    assert_eq!(
        w.call(
            "PUT",
            "/map/22",
            Some(r#"{"target":"10.8.0.3","target_port":2201}"#),
            None
        ),
        (
            400,
            r#"{"error":"invalid","message":"this relay forwards only to its own host 10.8.0.2, not 10.8.0.3"}"#
                .into()
        )
    );
    assert_eq!(w.kernel_map(), kernel, "and the kernel is as it was");
    assert_eq!(table(), table_before, "and so is the chain");

    // GET /map is the kernel, across a daemon restart.
    w.stop_mapd();
    w.start_mapd();
    assert_eq!(
        w.call("GET", "/map", None, None).1,
        r#"{"mappings":[{"port":22,"target":"10.8.0.2","target_port":2201}]}"#,
        "the kernel kept the mapping"
    );
    assert_eq!(w.customer_ssh().as_deref(), Some("container"));

    // A relay restart comes back with an empty chain; the agent's next write restores it.
    w.stop_mapd();
    w.relay.sh("nft delete table ip lofispark");
    w.start_mapd();
    assert_eq!(w.call("GET", "/map", None, None).1, r#"{"mappings":[]}"#);
    assert_eq!(w.kernel_map(), "[]");
    assert_eq!(w.customer_ssh(), None, "blackholed again after the restart");
    assert_eq!(
        w.call(
            "PUT",
            "/map",
            Some(r#"{"mappings":[{"port":22,"target":"10.8.0.2","target_port":2201}]}"#),
            None
        )
        .0,
        200
    );
    assert_eq!(
        w.customer_ssh().as_deref(),
        Some("container"),
        "restored by the agent's write"
    );

    // Delete clears the map (G): ssh gets nowhere again.
    assert_eq!(w.call("DELETE", "/map/22", None, None).0, 204);
    assert_eq!(w.kernel_map(), "[]");
    assert_eq!(w.customer_ssh(), None);
    // Clearing what is not mapped is not an error: the caller wanted it gone.
    assert_eq!(w.call("DELETE", "/map/22", None, None).0, 204);
}

/// The relay forwards into the tunnel only what its chain DNATs, and lets nothing else the
/// host sends out through the tunnel leave except replies: a host whose own WireGuard would
/// route the internet through its relay still reaches nothing there.
#[test]
fn the_relay_forwards_nothing_from_the_host_but_replies() {
    let Some(w) = world() else { return };
    // A listener on the relay's public side, and a host that routes to it through the tunnel.
    let authorized = w.dir.path().join("authorized_keys");
    sshd(
        &w.customer,
        w.dir.path(),
        "10.99.0.2:22",
        "outside",
        &authorized,
    );
    w.customer.sh("ip route replace 10.8.0.0/24 via 10.99.0.1");
    let relay_public = String::from_utf8(
        w.relay
            .sh(&format!("wg show {} public-key", w.relay_wg))
            .stdout,
    )
    .unwrap();
    // The host's WireGuard interface: the one whose peer is the relay.
    let listed = String::from_utf8(w.host.sh("wg show all peers").stdout).unwrap();
    let host_wg = listed
        .lines()
        .find_map(|l| {
            let (iface, peer) = l.split_once('\t')?;
            (peer.trim() == relay_public.trim()).then_some(iface.to_owned())
        })
        .expect("the host has the relay as a peer");
    let host_wg = host_wg.as_str();
    w.host.sh(&format!(
        "wg set {host_wg} peer {} allowed-ips 10.8.0.1/32,10.99.0.0/24 && ip route add 10.99.0.0/24 dev {host_wg}",
        relay_public.trim()
    ));
    // What arrives from the host's tunnel address on the outside, counted there.
    w.customer.sh("nft 'add table ip watch; add chain ip watch in { type filter hook input priority 0; }; add rule ip watch in ip saddr 10.8.0.2 tcp dport 22 counter'");
    let arrived = || {
        let out = String::from_utf8(w.customer.sh("nft list chain ip watch in").stdout).unwrap();
        out.split("packets ")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert_eq!(
        ssh(&w.host, &w.key, "10.99.0.2", 22),
        None,
        "the host reached past its relay"
    );
    assert_eq!(arrived(), 0, "the host's packets left the relay");
    // The customer's mapped path still works through the same chain.
    assert_eq!(w.call("PUT", "/map/22", Some(map_22()), None).0, 200);
    assert_eq!(w.customer_ssh().as_deref(), Some("container"));
    // Without the forward chain the same attempt gets through: the chain is what stops it.
    w.relay.sh("nft delete chain ip lofispark forward");
    eventually("the host to reach past its relay without the chain", || {
        ssh(&w.host, &w.key, "10.99.0.2", 22).as_deref() == Some("outside")
    });
}

/// I, "Why there are two": break glass through the relay. With the operator tunnel down
/// (no cloudflared anywhere in this world), an operator's key from the signed list logs in
/// to the host's sshd from the relay over wg0, because LOFISPARK_VMSSH is on PREROUTING and a
/// connection the relay opens never passes it; the customer's connection to the relay's
/// public :22 still lands in the container, whoever's key it carries; and with the host's
/// tenant firewall (the ruleset preparation installs, rendered by byo-core) loaded, nothing
/// on the tenant's side reaches the host's sshd — which, without that table, it does.
/// (Logins are as root: the namespaces share this machine's accounts, which have no spark.)
#[test]
fn i_break_glass_reaches_the_hosts_sshd_from_the_relay_with_the_tunnel_down() {
    use byo_core::keylist_testing as keys;
    use byo_core::render::nft::tenants::{self, Tenants};
    let Some(w) = world() else { return };
    // No cloudflared in the host's namespace. (pgrep would read the whole machine, whose
    // other suites run cloudflared in their LXD hosts at the same time.)
    let pids = run(Command::new("ip").args(["netns", "pids", &w.host.name])).stdout;
    let programs: Vec<String> = String::from_utf8_lossy(&pids)
        .split_whitespace()
        .filter_map(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).ok())
        .map(|comm| comm.trim().to_owned())
        .collect();
    assert!(
        !programs.is_empty() && !programs.iter().any(|p| p == "cloudflared"),
        "the operator tunnel is down: the host's namespace runs {programs:?}"
    );

    // The operator's key, as the host's signed list renders it into authorized_keys.
    let operator = w.dir.path().join("operator");
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
        .arg(&operator));
    let public = std::fs::read_to_string(operator.with_extension("pub")).unwrap();
    let list = keys::list(
        "production",
        1,
        vec![byo_core::keylist::OperatorKey {
            user_sub: "op-sub-1".into(),
            label: "laptop".into(),
            public_key: public
                .split_whitespace()
                .take(2)
                .collect::<Vec<_>>()
                .join(" "),
        }],
        chrono::Utc::now(),
    );
    let authorized = w.dir.path().join("authorized_keys");
    let mut text = std::fs::read_to_string(&authorized).unwrap();
    text.push_str(&list.authorized_keys());
    std::fs::write(&authorized, text).unwrap();

    // The tenant's container is mapped: the customer's path is live.
    assert_eq!(w.call("PUT", "/map/22", Some(map_22()), None).0, 200);

    // Without the tenant firewall the container reaches the host's sshd: what the table
    // below must stop.
    assert_eq!(
        ssh(&w._container, &w.key, "10.8.0.2", 22).as_deref(),
        Some("host"),
        "the world is not the one this test means"
    );
    // The host's tenant firewall, as preparation renders and loads it: the bridge is the
    // host's side of the container's link.
    let addr = String::from_utf8(w.host.sh("ip -o -4 addr show to 10.20.0.1/32").stdout).unwrap();
    let bridge = addr
        .split_whitespace()
        .nth(1)
        .expect("the host's side of the link")
        .to_owned();
    let ruleset = tenants::ruleset(&Tenants {
        bridge,
        bridge_address: "10.20.0.1".parse().unwrap(),
        host_nets4: vec![
            ("10.8.0.2".parse().unwrap(), 24),
            ("192.168.77.2".parse().unwrap(), 24),
        ],
        host_nets6: vec![],
        wan4: vec![],
    });
    let file = w.dir.path().join("tenant-firewall.nft");
    std::fs::write(&file, &ruleset).unwrap();
    w.host.sh(&format!("nft -f {}", file.display()));

    // Break glass: from the relay, over wg0, the operator's key, the host's own sshd.
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22).as_deref(),
        Some("host"),
        "the relay path lands on the host's sshd with the tunnel down"
    );
    // The customer's public :22 still lands in the container — with the operator's key too:
    // the public port never reaches the host's sshd.
    assert_eq!(w.customer_ssh().as_deref(), Some("container"));
    assert_eq!(
        ssh(&w.customer, &operator, PUBLIC, 22).as_deref(),
        Some("container")
    );
    // Nothing from the tenant's side reaches the host's sshd, on any of its addresses.
    for target in ["10.8.0.2", "10.20.0.1", "192.168.77.2"] {
        assert_eq!(
            ssh(&w._container, &w.key, target, 22),
            None,
            "the tenant reached the host's sshd at {target}"
        );
    }
    // And the relay still does, after all that.
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22).as_deref(),
        Some("host")
    );
}

/// M at expiry, through I's relay path (#39, 5; docs/operator-keys.md, "At expiry"): with
/// the list the host holds expired, sshd refuses the operator's list key; a certificate one
/// of the list's signers issued for this host (`byo keys break-glass`'s very ssh-keygen
/// arguments) lets the operator in from the relay — not from anywhere else, not when it
/// names another host, not when another key signed it; and the next list, unexpired, ends it
/// while its own keys work again. authorized_keys is what the agent renders at each moment.
#[test]
fn m_at_expiry_break_glass_from_the_relay_admits_a_signers_certificate_until_the_next_list() {
    use byo_core::break_glass::{Request, Trust};
    use byo_core::keylist::OperatorKey;
    use byo_core::keylist_testing as keys;
    use ssh_key::{Certificate, PublicKey};
    let Some(w) = world() else { return };
    let keygen = |name: &str| {
        let path = w.dir.path().join(name);
        run(Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-C", "", "-f"])
            .arg(&path));
        let public = std::fs::read_to_string(path.with_extension("pub")).unwrap();
        (path, PublicKey::from_openssh(public.trim()).unwrap())
    };
    let (operator, operator_pub) = keygen("bg-operator");
    let (signer, signer_pub) = keygen("bg-signer");
    let (stranger, _) = keygen("bg-stranger");
    let entry = |key: &PublicKey| OperatorKey {
        user_sub: "op-sub-1".into(),
        label: "laptop".into(),
        public_key: key
            .to_openssh()
            .unwrap()
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" "),
    };
    let now = chrono::Utc::now();
    let trust = [signer_pub.clone()];
    let trust = Trust {
        host: "spark-7",
        signers: &trust,
    };
    let authorized = w.dir.path().join("authorized_keys");
    let customer_line = std::fs::read_to_string(&authorized).unwrap();
    let host_holds = |list: &byo_core::keylist::KeyList| {
        let text = list.authorized_keys_at(now, Some(trust));
        std::fs::write(&authorized, format!("{customer_line}{text}")).unwrap();
        text
    };
    let certify = |by: &Path, hosts: &[&str]| {
        let request = Request {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            operator: "op@enverge.ai".into(),
            minutes: 15,
            serial: 7,
        };
        run(Command::new("ssh-keygen")
            .arg("-s")
            .arg(by)
            .args(request.keygen_args())
            .arg(operator.with_extension("pub")));
        let cert = w.dir.path().join("bg-operator-cert.pub");
        let text = std::fs::read_to_string(&cert).unwrap();
        (request, Certificate::from_openssh(text.trim()).unwrap())
    };

    // The list the host holds expired a minute ago, nobody having signed the renewal.
    let mut expired = keys::list("production", 1, vec![entry(&operator_pub)], now);
    expired.expires = now - chrono::Duration::minutes(1);
    let text = host_holds(&expired);
    assert!(text.contains("cert-authority"), "{text}");
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22),
        None,
        "the expired list's key is refused"
    );

    // A signer certifies the operator's key for this host: in from the relay.
    let (request, cert) = certify(&signer, &["spark-7"]);
    request
        .verify(&cert, &operator_pub, &signer_pub, now)
        .unwrap();
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22).as_deref(),
        Some("host"),
        "break glass lands on the host's sshd from the relay"
    );
    // Audited: sshd's own line names the certificate, and the agent's reader attributes it
    // to the operator whose key it certifies, from the relay.
    let log = std::fs::read_to_string(w.dir.path().join("host-sshd.log")).unwrap();
    let checked = expired.check().unwrap();
    let login = log
        .lines()
        .filter_map(|l| l.find("Accepted ").map(|at| &l[at..]))
        .filter_map(byo_core::logins::parse_message)
        .find_map(|a| byo_core::logins::attribute(&a, "root", now, &checked))
        .unwrap_or_else(|| panic!("no certified login in {log}"));
    assert_eq!(
        (
            login.user_sub.as_deref(),
            login.certificate.as_deref(),
            login.source.as_str()
        ),
        (
            Some("op-sub-1"),
            Some("break-glass:op@enverge.ai:spark-7 (serial 7)"),
            "10.8.0.1"
        ),
        "{log}"
    );
    // Not from anywhere but the relay: the host itself is another source.
    assert_eq!(ssh(&w.host, &operator, "10.8.0.2", 22), None);
    // Not for another host; not signed by a key the host does not trust.
    certify(&signer, &["spark-8"]);
    assert_eq!(ssh(&w.relay, &operator, "10.8.0.2", 22), None);
    certify(&stranger, &["spark-7"]);
    assert_eq!(ssh(&w.relay, &operator, "10.8.0.2", 22), None);

    // The first list that has not expired ends it, and its keys work again.
    certify(&signer, &["spark-7"]);
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22).as_deref(),
        Some("host")
    );
    let (renewed_key, renewed_pub) = keygen("bg-renewed");
    let renewed = keys::list("production", 2, vec![entry(&renewed_pub)], now);
    let text = host_holds(&renewed);
    assert!(!text.contains("cert-authority"), "{text}");
    assert_eq!(
        ssh(&w.relay, &operator, "10.8.0.2", 22),
        None,
        "the certificate no longer opens the host"
    );
    assert_eq!(
        ssh(&w.relay, &renewed_key, "10.8.0.2", 22).as_deref(),
        Some("host")
    );
}

#[test]
fn the_relay_after_bootstrap_holds_exactly_the_seeded_chain() {
    if !kernel_parts(&["ip", "nft"]) {
        return;
    }
    let relay = Netns::new("seed");
    let out = relay.sh(&format!("{} seed", env!("CARGO_BIN_EXE_byo-relay")));
    assert!(String::from_utf8_lossy(&out.stdout).contains("seeded"));
    let again = relay.sh(&format!("{} seed", env!("CARGO_BIN_EXE_byo-relay")));
    assert!(
        String::from_utf8_lossy(&again.stdout).contains("left as it is"),
        "seeding twice changes nothing"
    );
    let listing = String::from_utf8(relay.sh("nft list table ip lofispark").stdout).unwrap();
    // Exactly this, line for line (indentation aside): a rule added, dropped, reordered or
    // reworded fails, as does one more chain.
    let lines = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| l.trim().to_owned())
            .filter(|l| !l.is_empty())
            .collect()
    };
    assert_eq!(
        lines(&listing),
        lines(SEEDED_CHAIN),
        "the relay's table after bootstrap:\n{listing}"
    );
    // Only our table: nothing else in the ruleset was created or touched.
    let tables = String::from_utf8(relay.sh("nft list tables").stdout).unwrap();
    assert_eq!(tables.trim(), "table ip lofispark");
    write_listing(&listing);
}

/// The relay's whole table after `byo-relay seed`, as `nft list table ip lofispark` prints
/// it (docs/relay.md shows the same).
const SEEDED_CHAIN: &str = r#"
table ip lofispark {
	map vmssh_ports {
		type inet_service : inet_service
	}

	chain LOFISPARK_VMSSH {
		ip saddr 35.235.240.0/20 tcp dport 22 return comment "IAP reaches the relay's own sshd"
		meta l4proto tcp dnat to 10.8.0.2:tcp dport map @vmssh_ports
		tcp dport 22 drop comment "blackhole: :22 goes nowhere until it is mapped"
	}

	chain prerouting {
		type nat hook prerouting priority dstnat; policy accept;
		iifname != "wg0" jump LOFISPARK_VMSSH
	}

	chain postrouting {
		type nat hook postrouting priority srcnat; policy accept;
		oifname "wg0" ct status dnat masquerade
	}

	chain forward {
		type filter hook forward priority filter; policy accept;
		oifname "wg0" ct status dnat accept comment "into the tunnel: only what the chain DNATs"
		oifname "wg0" drop
		iifname "wg0" ct state established,related accept comment "out of the tunnel: replies only"
		iifname "wg0" drop
	}
}
"#;

/// Keep the exact chain for the closing note and docs.
fn write_listing(listing: &str) {
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("relay-chain-after-bootstrap.nft");
    let _ = std::fs::write(path, listing);
}
