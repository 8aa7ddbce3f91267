//! Issue #11, deliverable 3: from inside a customer's container on the prepared host, nothing
//! of the owner's answers — the host on any of its addresses, the tunnel, the owner's LAN and
//! private ranges — while DHCP and DNS from the bridge and the internet still work.
//!
//! "The internet" and the owner's private networks are a network namespace of the test's own
//! inside the host container (`world`), reached through a veth: listeners on 203.0.113.1 (a
//! documentation address, the allowed one) and on 192.168.77.1, 10.77.0.1, 172.16.77.1,
//! 169.254.169.254 and 100.64.77.1 (forbidden). Every forbidden destination with a listener is
//! first shown to answer the host itself, so "refused" from the container is the rule, not an
//! empty address; the listeners' log and the table's counters show the container's attempts
//! never arrived. No packet is sent to an address outside this machine.
//!
//! Issue #36 closed the rest: the owner's public address (198.51.100.7 in `world`, the router
//! answering there; the fake backend's heartbeat answer names it, as the real backend names
//! the address a beat came from), mail to port 25, the owner's resolver (a DNS server on
//! 192.168.77.1 the host resolves through; the bridge's dnsmasq must ask the public
//! resolvers, here fakes on 1.1.1.1 and 9.9.9.9 inside `world`), a network the host joins
//! while it runs (refused within a heartbeat), and a flood of new connections.

use std::collections::BTreeMap;

use super::World;

/// A listener per `addr:port` that logs each connection (destination <- peer) and answers a
/// banner.
const LISTEN_PY: &str = r#"import socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
def serve(addr, port):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(64)
    while True:
        c, peer = s.accept()
        log.write("%s:%d <- %s\n" % (addr, port, peer[0]))
        try:
            c.sendall(("hello from %s:%d\n" % (addr, port)).encode())
        finally:
            c.close()
for spec in sys.argv[2:]:
    a, p = spec.rsplit(":", 1)
    threading.Thread(target=serve, args=(a, int(p))).start()
"#;

const PUBLIC: &str = "203.0.113.1:80";
/// The owner's router on its public address: what the backend sees the host's beats come from.
const WAN: &str = "198.51.100.7";
/// Mail straight to port 25 somewhere on the internet.
const SMTP: &str = "203.0.113.1:25";
/// A neighbour on a network the host joins while it runs (198.18/15 is in no fixed range).
const JOINED: &str = "198.18.5.9:80";
/// A tiny DNS server per `addr=answer`: every A question answered with `answer`, every other
/// question with no answer, each logged (server <- peer name).
const DNS_PY: &str = r#"import socket, sys, threading
log = open(sys.argv[1], "a", buffering=1)
def serve(addr, answer):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 53))
    while True:
        q, peer = s.recvfrom(512)
        i, labels = 12, []
        while q[i] != 0:
            labels.append(q[i + 1:i + 1 + q[i]].decode()); i += 1 + q[i]
        qtype, qend = q[i + 1:i + 3], i + 5
        log.write("%s <- %s %s\n" % (addr, peer[0], ".".join(labels)))
        a = qtype == b"\x00\x01"
        hdr = q[:2] + b"\x81\x80" + q[4:6] + (b"\x00\x01" if a else b"\x00\x00") + b"\x00\x00\x00\x00"
        ans = b"\xc0\x0c\x00\x01\x00\x01\x00\x00\x00\x05\x00\x04" + socket.inet_aton(answer) if a else b""
        s.sendto(hdr + q[12:qend] + ans, peer)
for spec in sys.argv[2:]:
    a, ans = spec.split("=")
    threading.Thread(target=serve, args=(a, ans)).start()
"#;
const DNS_LOG: &str = "/root/dns.log";
/// The owner's resolver (on the owner's LAN) answers the owner's names with a LAN address.
const OWNER_RESOLVER: &str = "192.168.77.1";
const LAN_NAME_ANSWER: &str = "192.168.77.10";
/// The owner's private networks and the cloud metadata address, each with a listener.
const PRIVATE: &[&str] = &[
    "192.168.77.1:80",
    "10.77.0.1:80",
    "172.16.77.1:80",
    "169.254.169.254:80",
    "100.64.77.1:80",
];
const WORLD_LOG: &str = "/root/world.log";

/// Where the host is, as the tests find it.
struct Addresses {
    /// eth0: the host's address on the owner's LAN.
    lan: String,
    /// lxdbr0's own address (LXD's dnsmasq).
    bridge: String,
    /// The instance's :22 published on the tunnel address.
    published: u16,
    /// This test machine on the host's LAN: the fake ssh_mapd listens there.
    lan_neighbour: String,
}

fn addresses(w: &World) -> Addresses {
    Addresses {
        lan: w.host.ipv4().to_string(),
        bridge: w
            .host
            .sh_ok("lxc network get lxdbr0 ipv4.address")
            .trim()
            .split('/')
            .next()
            .unwrap()
            .to_owned(),
        published: w.map().first().expect("c1 is published").target_port,
        lan_neighbour: format!("{}:{}", w.mapd_host, w.mapd_port),
    }
}

/// The `world` namespace and its listeners, and a listener on the host's LAN address at the
/// agent's port; again after a reboot (namespaces and transient units do not survive one).
fn start_listeners(w: &World, a: &Addresses) {
    w.host.write("/root/listen.py", LISTEN_PY.as_bytes(), 0o644);
    w.host.write("/root/dns.py", DNS_PY.as_bytes(), 0o644);
    let mut private: Vec<&str> = PRIVATE
        .iter()
        .map(|p| p.split(':').next().unwrap())
        .collect();
    // The router's public address and the joined network's neighbour live in `world` too.
    private.extend([WAN, JOINED.split(':').next().unwrap()]);
    let mut script = String::from(
        "set -e
         ip netns del world 2>/dev/null || true
         ip netns add world
         ip link add byo-w0 type veth peer name byo-w1 netns world
         ip addr add 192.0.2.1/24 dev byo-w0 && ip link set byo-w0 up
         ip -n world addr add 192.0.2.2/24 dev byo-w1 && ip -n world link set byo-w1 up
         ip -n world link set lo up
         ip -n world route add default via 192.0.2.1
         ip -n world addr add 203.0.113.1/24 dev byo-w1
         ip route replace 203.0.113.0/24 via 192.0.2.2\n",
    );
    for ip in &private {
        script.push_str(&format!(
            "ip -n world addr add {ip}/32 dev byo-w1\nip route replace {ip}/32 via 192.0.2.2\n"
        ));
    }
    script.push_str(&format!(
        "ip -n world addr add 1.1.1.1/32 dev byo-w1 && ip -n world addr add 9.9.9.9/32 dev byo-w1
         : > {WORLD_LOG}; : > /root/lan.log; : > {DNS_LOG}
         systemctl reset-failed byo-world byo-lan byo-dns 2>/dev/null || true
         systemd-run --quiet --unit byo-world ip netns exec world python3 /root/listen.py {WORLD_LOG} {PUBLIC} {SMTP} {WAN}:80 {JOINED} {}
         systemd-run --quiet --unit byo-dns ip netns exec world python3 /root/dns.py {DNS_LOG} {OWNER_RESOLVER}={LAN_NAME_ANSWER} 1.1.1.1=203.0.113.1 9.9.9.9=203.0.113.1
         systemd-run --quiet --unit byo-lan python3 /root/listen.py /root/lan.log {}:8080\n",
        PRIVATE.join(" "),
        a.lan
    ));
    w.host.sh_ok(&script);
}

/// Tries every `ip:port` in parallel with busybox's nc (a `GET` line, so HTTP servers answer
/// too, and the sending side held open 2 s: a proxy closes on an early EOF before the banner):
/// the first line each answered, empty when nothing did within 3 s.
fn probe(w: &World, from_container: bool, targets: &[String]) -> BTreeMap<String, String> {
    let mut script = String::from("cd /tmp && rm -f probe.*\n");
    for (i, t) in targets.iter().enumerate() {
        let (ip, port) = t.rsplit_once(':').unwrap();
        script.push_str(&format!(
            "( (printf 'GET / HTTP/1.0\\r\\n\\r\\n'; sleep 2) | busybox nc -w 3 {ip} {port} 2>/dev/null | head -n 1 | tr -d '\\r' > probe.{i} ) &\n"
        ));
    }
    script.push_str("wait\nfor f in probe.*; do printf '%s=' \"$f\"; cat \"$f\"; echo; done\n");
    let out = if from_container {
        let q = byo_agent::host::shell_quote(&script);
        w.host.sh_ok(&format!("lxc exec c1 -- sh -c {q}"))
    } else {
        w.host.sh_ok(&script)
    };
    let mut got = BTreeMap::new();
    for line in out.lines() {
        if let Some((f, said)) = line.split_once('=') {
            let i: usize = f.trim_start_matches("probe.").parse().unwrap();
            got.insert(targets[i].clone(), said.trim().to_owned());
        }
    }
    got
}

/// The table's drop counters, by rule comment (packets).
fn counters(w: &World) -> BTreeMap<String, u64> {
    let listed = w.host.sh_ok("nft list table inet enverge_tenants");
    let mut got = BTreeMap::new();
    for line in listed.lines() {
        // The counter's, not the rate limit's "burst 250 packets".
        let (Some(p), Some(c)) = (line.find("counter packets "), line.find("comment \"")) else {
            continue;
        };
        let packets: u64 = line[p + 16..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let comment = line[c + 9..].trim_end_matches('"').to_owned();
        got.insert(comment, packets);
    }
    got
}

fn lines(w: &World, path: &str) -> Vec<String> {
    w.host
        .sh_ok(&format!("cat {path}"))
        .lines()
        .map(str::to_owned)
        .collect()
}

/// What answered, as a readable table for a failure.
fn show(got: &BTreeMap<String, String>) -> String {
    got.iter()
        .map(|(t, s)| format!("  {t:24} {s:?}\n"))
        .collect()
}

/// Every forbidden destination, named, with whether the host itself reaches a listener there.
fn forbidden(a: &Addresses) -> Vec<(&'static str, String, bool)> {
    let mut f = vec![
        (
            "the host's LAN address, sshd",
            format!("{}:22", a.lan),
            true,
        ),
        (
            "the host's LAN address, the agent's port",
            format!("{}:8080", a.lan),
            true,
        ),
        ("the bridge address, sshd", format!("{}:22", a.bridge), true),
        (
            "the agent's API on the tunnel",
            "10.8.0.2:8080".into(),
            true,
        ),
        (
            "the instance's own published ssh on the tunnel",
            format!("10.8.0.2:{}", a.published),
            true,
        ),
        (
            "ssh_mapd through the tunnel (no relay here: counted)",
            "10.8.0.1:8754".into(),
            false,
        ),
        (
            "the owner's LAN: a neighbour (the test's fake ssh_mapd)",
            a.lan_neighbour.clone(),
            true,
        ),
    ];
    let names = [
        "192.168/16",
        "10/8",
        "172.16/12",
        "169.254.169.254, cloud metadata",
        "100.64/10, CGNAT",
    ];
    for (name, t) in names.into_iter().zip(PRIVATE) {
        f.push((name, t.to_string(), true));
    }
    f.push((
        "the owner's router on its public address",
        format!("{WAN}:80"),
        true,
    ));
    f.push(("mail to port 25 on the internet", SMTP.into(), true));
    f
}

/// The full check: every forbidden destination refused, DHCP, DNS and the internet work.
fn check_all(w: &World, a: &Addresses, when: &str) {
    // DHCP: a fresh lease from the bridge (broadcast discover, then the bridge's offer).
    let dhcp = w
        .host
        .sh("lxc exec c1 -- udhcpc -i eth0 -n -q -t 3 -T 1 -s /usr/share/udhcpc/default.script");
    assert!(
        dhcp.status.success(),
        "{when}: no DHCP lease from the bridge:\n{}",
        super::text(&dhcp)
    );
    let forbidden = forbidden(a);
    let targets: Vec<String> = forbidden.iter().map(|(_, t, _)| t.clone()).collect();
    // The host reaches every listener: they are there.
    let from_host = probe(w, false, &targets);
    for (name, t, listened) in &forbidden {
        if *listened {
            assert!(
                !from_host[t].is_empty(),
                "{when}: nothing listens at {t} ({name}) even for the host, so a refusal would prove nothing:\n{}",
                show(&from_host)
            );
        }
    }
    let (world_before, lan_before, count_before) = (
        lines(w, WORLD_LOG).len(),
        lines(w, "/root/lan.log").len(),
        counters(w),
    );
    let mut all = targets.clone();
    all.push(PUBLIC.into());
    let from_c1 = probe(w, true, &all);
    let leaked: Vec<String> = forbidden
        .iter()
        .filter(|(_, t, _)| !from_c1[t].is_empty())
        .map(|(name, t, _)| format!("{t} ({name}) answered {:?}", from_c1[t]))
        .collect();
    assert!(
        leaked.is_empty(),
        "{when}: a tenant reached the owner's side:\n  {}\nall probes:\n{}",
        leaked.join("\n  "),
        show(&from_c1)
    );
    assert_eq!(
        from_c1[PUBLIC],
        "hello from 203.0.113.1:80",
        "{when}: the internet is out of reach:\n{}",
        show(&from_c1)
    );
    // The listeners saw the tenant once: the public one, NATed to the host's address there.
    let world = lines(w, WORLD_LOG);
    assert_eq!(
        &world[world_before..],
        &["203.0.113.1:80 <- 192.0.2.1".to_owned()],
        "{when}: the world's listeners saw:\n{world:#?}"
    );
    assert_eq!(lines(w, "/root/lan.log").len(), lan_before, "{when}");
    // And the drops are ours.
    let count_after = counters(w);
    for rule in [
        "nothing else of the host, on any of its addresses",
        "the tunnel: ssh_mapd, the agent",
        "the owner's networks",
        "the owner's public address: the router's own services and port forwards",
        "mail to port 25",
    ] {
        assert!(
            count_after[rule] > count_before[rule],
            "{when}: the rule {rule:?} dropped nothing ({count_before:?} -> {count_after:?})"
        );
    }
    // DNS from the bridge's dnsmasq, over UDP and TCP (a query for c1.lxd, answered locally).
    let udp = w.host.sh_ok(&format!(
        "lxc exec c1 -- nslookup c1.lxd {} 2>&1 || true",
        a.bridge
    ));
    assert!(
        udp.contains("Name:") && udp.contains("Address"),
        "{when}: DNS over UDP from the bridge:\n{udp}"
    );
    // A raw TCP DNS query (length, id, RD, one question: c1.lxd A IN); any answer has bytes.
    let tcp = w.host.sh_ok(&format!(
        "lxc exec c1 -- sh -c \"printf '\\000\\030\\022\\064\\001\\000\\000\\001\\000\\000\\000\\000\\000\\000\\002c1\\003lxd\\000\\000\\001\\000\\001' | busybox nc -w 3 {} 53 | wc -c\"",
        a.bridge
    ));
    assert!(
        tcp.trim().parse::<u32>().unwrap_or(0) > 24,
        "{when}: DNS over TCP from the bridge answered {} bytes",
        tcp.trim()
    );
    lan_names_are_not_answered(w, a, when);
}

/// The bridge's dnsmasq asks the public resolvers, never the host's own (the owner's, which
/// knows the LAN's names): with the host resolving through the owner's resolver, a tenant's
/// question for a LAN name is answered by a public resolver and the owner's never hears it.
/// The public resolvers are fakes in `world` for the length of the check.
fn lan_names_are_not_answered(w: &World, a: &Addresses, when: &str) {
    let name = format!("nas-{}.home", when.replace(' ', "-"));
    w.host.sh_ok(&format!(
        "cp -P /etc/resolv.conf /root/resolv.conf.kept && rm -f /etc/resolv.conf
         echo 'nameserver {OWNER_RESOLVER}' > /etc/resolv.conf
         ip route replace 1.1.1.1/32 via 192.0.2.2 && ip route replace 9.9.9.9/32 via 192.0.2.2"
    ));
    // The owner's resolver is there, and the host does resolve through it.
    let host_said = w
        .host
        .sh_ok(&format!("getent ahostsv4 host-{name} | head -n 1"));
    let before = lines(w, DNS_LOG).len();
    let said = w
        .host
        .sh(&format!("lxc exec c1 -- nslookup {name} {} 2>&1", a.bridge));
    w.host.sh_ok(
        "ip route del 1.1.1.1/32 via 192.0.2.2; ip route del 9.9.9.9/32 via 192.0.2.2
         rm -f /etc/resolv.conf && cp -P /root/resolv.conf.kept /etc/resolv.conf",
    );
    assert!(
        host_said.starts_with(LAN_NAME_ANSWER),
        "{when}: the host does not resolve through the owner's resolver, so this proves nothing: {host_said:?}"
    );
    let said = super::text(&said);
    let asked: Vec<String> = lines(w, DNS_LOG)[before..].to_vec();
    assert!(
        !said.contains(LAN_NAME_ANSWER) && !asked.iter().any(|l| l.starts_with(OWNER_RESOLVER)),
        "{when}: a tenant's question reached the owner's resolver:\n{said}\nasked: {asked:#?}"
    );
    assert!(
        said.contains("203.0.113.1") && asked.iter().any(|l| l.ends_with(&name)),
        "{when}: the public resolvers did not answer the tenant:\n{said}\nasked: {asked:#?}"
    );
}

/// The table holds `element` in `set` within `within` (serving asks at its next beat).
fn wait_for_set(w: &World, set: &str, element: &str, within: std::time::Duration) {
    w.wait_for(&format!("{element} in {set}"), within, || {
        w.host
            .sh_ok(&format!("nft list set inet enverge_tenants {set}"))
            .contains(element)
            .then_some(())
    });
}

/// A network the host joins while it runs is refused within a heartbeat: reachable until
/// then (the listener is there), refused once serving asked and root reloaded.
fn a_network_the_host_joins_is_refused_within_a_beat(w: &World) {
    let target = [JOINED.to_owned()];
    let before = probe(w, true, &target);
    assert_eq!(
        before[JOINED], "hello from 198.18.5.9:80",
        "before the host joined it, 198.18.5.0/24 is the internet to a tenant"
    );
    w.host.sh_ok("ip addr add 198.18.5.1/24 dev byo-w0");
    wait_for_set(
        w,
        "host_nets4",
        "198.18.5.0/24",
        std::time::Duration::from_secs(20),
    );
    let after = probe(w, true, &target);
    assert_eq!(
        after[JOINED], "",
        "the joined network still answers a tenant"
    );
}

/// What leaves the owner's home address is bounded: a burst of new connections past the
/// rate is dropped (counted), and once it has passed a tenant connects as before.
fn a_flood_of_new_connections_is_cut(w: &World) {
    let rule = "new connections past the rate";
    let count = || {
        *counters(w)
            .get(rule)
            .unwrap_or_else(|| panic!("no rule {rule:?} in the tenant firewall"))
    };
    let before = count();
    assert_eq!(before, 0, "ordinary probes never met the rate");
    w.host.sh_ok(
        "lxc exec c1 -- sh -c 'for i in $(seq 600); do busybox nc -w 1 203.0.113.1 80 </dev/null >/dev/null 2>&1 & done; wait'",
    );
    let dropped = count();
    assert!(
        dropped >= 50,
        "a burst of 600 new connections: {dropped} dropped"
    );
    std::thread::sleep(std::time::Duration::from_secs(6));
    let again = probe(w, true, &[PUBLIC.to_owned()]);
    assert_eq!(again[PUBLIC], "hello from 203.0.113.1:80");
}

/// After the instance exists: the whole check, then again after `ufw reload`.
pub fn tenants_see_the_internet_and_nothing_of_the_owners(w: &World) {
    let started = std::time::Instant::now();
    let a = addresses(w);
    *w.mapd.seen_from.lock().unwrap() = Some(WAN.into());
    start_listeners(w, &a);
    wait_for_set(w, "owner_wan4", WAN, std::time::Duration::from_secs(20));
    check_all(w, &a, "after preparation");
    // ufw rewrites its own tables only (the image has ufw enabled, as an owner's host does).
    let ufw = w.host.sh_ok("ufw status | head -n 1");
    assert!(ufw.contains("active"), "{ufw}");
    w.host.sh_ok("ufw reload");
    check_all(w, &a, "after ufw reload");
    a_network_the_host_joins_is_refused_within_a_beat(w);
    a_flood_of_new_connections_is_cut(w);
    eprintln!(
        "tenant isolation: checked twice in {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// After the host restarted (the unit loaded the table before LXD restored c1).
pub fn still_after_a_reboot(w: &World) {
    let active = w
        .host
        .sh_ok("systemctl is-active enverge-tenant-firewall.service");
    assert_eq!(active.trim(), "active");
    let a = addresses(w);
    start_listeners(w, &a);
    wait_for_set(w, "owner_wan4", WAN, std::time::Duration::from_secs(20));
    check_all(w, &a, "after a reboot");
}
