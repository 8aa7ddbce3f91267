//! The relay's first-boot script and the files it writes pass their real validators:
//! shellcheck, `caddy validate`, `wg` (through a real wireguard-go interface) and `nft -c`.

use crate::support;

use std::process::Command;

use byo_core::render::nft::{Layout, skeleton};
use byo_core::render::relay_bootstrap::{
    Bootstrap, CADDY_UPSTREAM_KEEPALIVE_SECS, RelaySecrets, TLS_DIR,
};
use support::{Netns, kernel_parts, run, wg_keypair};

/// A certificate and key for the relay's name, as PEM (the server's relay CA issues the
/// real ones; any will do for the validators).
static CERT: std::sync::LazyLock<(String, String)> = std::sync::LazyLock::new(|| {
    let c = rcgen::generate_simple_self_signed(vec!["spark-7.relay.example.com".into()]).unwrap();
    (c.cert.pem(), c.signing_key.serialize_pem())
});

fn bootstrap() -> Bootstrap {
    let (_, host_public) = wg_keypair();
    Bootstrap {
        slug: "spark-7".into(),
        host_public_key: host_public,
        wireguard_port: 51820,
        ssh_map_token_hash: "ab".repeat(32),
        public_name: "spark-7.relay.example.com".into(),
        secrets_url: "https://app.example.com/api/relay/secrets".into(),
        secrets_token: byo_core::tokens::SecretToken::generate(
            byo_core::tokens::TokenKind::RelaySecrets,
        )
        .expose()
        .to_owned(),
        relay_binary_url: "https://app.example.com/relay/byo-relay-x86_64".into(),
        relay_binary_sha256: "cd".repeat(32),
        layout: Layout::default(),
    }
}

#[test]
fn the_script_is_shellcheck_clean() {
    if !kernel_parts(&["shellcheck", "wg"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bootstrap.sh");
    let b = bootstrap();
    std::fs::write(&path, b.script().unwrap()).unwrap();
    run(Command::new("shellcheck")
        .arg("--severity=style")
        .arg(&path));
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(&b.secrets_token) && text.contains(&b.ssh_map_token_hash));
    assert!(text.contains("byo-relay seed") && text.contains("sha256sum -c"));
    // Nothing secret travels in the metadata (issue #36): no key of any kind, only the
    // single-use token the first boot spends.
    assert!(
        !text.lines().any(|l| l.starts_with("-----BEGIN")) && !text.contains("PrivateKey"),
        "{text}"
    );
}

#[test]
fn values_that_could_inject_into_the_script_are_refused() {
    for bad in [
        Bootstrap {
            slug: "spark-7; rm -rf /".into(),
            ..bootstrap_static()
        },
        Bootstrap {
            public_name: "x'\n".into(),
            ..bootstrap_static()
        },
        Bootstrap {
            relay_binary_url: "https://x/$(id)".into(),
            ..bootstrap_static()
        },
        Bootstrap {
            secrets_url: "https://x/'$(id)'".into(),
            ..bootstrap_static()
        },
        Bootstrap {
            secrets_token: "byo_rly_x' -o /etc/passwd '".into(),
            ..bootstrap_static()
        },
    ] {
        assert!(bad.script().is_err());
    }
    // And the answer the server gives the relay carries nothing its script could be
    // broken out of.
    let good = RelaySecrets {
        wireguard_private_key: "a".repeat(43) + "=",
        tls_cert_pem: CERT.0.clone(),
        tls_key_pem: CERT.1.clone(),
    };
    assert!(good.render().is_ok());
    for bad in [
        RelaySecrets {
            tls_cert_pem: format!("{}CERT\nid\n", CERT.0),
            ..good.clone()
        },
        RelaySecrets {
            tls_key_pem: "-----BEGIN PRIVATE KEY-----\n$(id)\n-----END PRIVATE KEY-----\n".into(),
            ..good.clone()
        },
        RelaySecrets {
            wireguard_private_key: "a\nwireguard-private-key b".into(),
            ..good.clone()
        },
    ] {
        assert!(bad.render().is_err());
    }
}

fn bootstrap_static() -> Bootstrap {
    Bootstrap {
        slug: "spark-7".into(),
        host_public_key: "b".repeat(43) + "=",
        wireguard_port: 51820,
        ssh_map_token_hash: "ab".repeat(32),
        public_name: "spark-7.relay.example.com".into(),
        secrets_url: "https://app.example.com/api/relay/secrets".into(),
        secrets_token: "byo_rly_".to_owned() + &"a".repeat(46),
        relay_binary_url: "https://app.example.com/relay/byo-relay".into(),
        relay_binary_sha256: "cd".repeat(32),
        layout: Layout::default(),
    }
}

#[test]
fn the_caddy_config_validates() {
    if !kernel_parts(&["caddy"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("Caddyfile");
    std::fs::write(dir.path().join("relay.crt"), &CERT.0).unwrap();
    std::fs::write(dir.path().join("relay.key"), &CERT.1).unwrap();
    let caddyfile = bootstrap().caddyfile();
    assert!(
        caddyfile.contains("https://spark-7.relay.example.com:443")
            && caddyfile.contains("auto_https off")
            && caddyfile.contains("reverse_proxy 10.8.0.2:8080"),
        "{caddyfile}"
    );
    // Caddy drops an idle connection to the agent before the agent does, so it never sends a
    // request on one the agent is closing.
    assert!(
        caddyfile.contains(&format!("keepalive {CADDY_UPSTREAM_KEEPALIVE_SECS}s"))
            && CADDY_UPSTREAM_KEEPALIVE_SECS < byo_listen::HEADER_READ_TIMEOUT_SECS,
        "{caddyfile}"
    );
    std::fs::write(
        &path,
        caddyfile.replace(TLS_DIR, &dir.path().to_string_lossy()),
    )
    .unwrap();
    let out = Command::new("caddy")
        .args(["validate", "--adapter", "caddyfile", "--config"])
        .arg(&path)
        .env("HOME", dir.path())
        .env("XDG_DATA_HOME", dir.path())
        .env("XDG_CONFIG_HOME", dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_wireguard_config_is_accepted_by_wg() {
    if !kernel_parts(&["wg", "wg-quick", "wireguard-go", "ip"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("wg0.conf");
    let b = bootstrap();
    std::fs::write(&path, b.wireguard_config()).unwrap();
    let stripped = run(Command::new("wg-quick").arg("strip").arg(&path)).stdout;
    let ns = Netns::new("wgcheck");
    let wg = support::wg_name();
    support::wireguard(
        &ns,
        dir.path(),
        &wg,
        &String::from_utf8(stripped).unwrap(),
        "10.8.0.1/24",
    );
    let shown = ns.sh(&format!("wg show {wg} allowed-ips"));
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.contains(&b.host_public_key) && shown.contains("10.8.0.2/32"),
        "{shown}"
    );
    let port = ns.sh(&format!("wg show {wg} listen-port"));
    assert_eq!(String::from_utf8_lossy(&port.stdout).trim(), "51820");
    // The private key is not in the config (issue #36): the link takes it from the file the
    // first boot wrote, by the config's own PostUp, run here as wg-quick runs it.
    let config = b.wireguard_config();
    assert!(!config.contains("PrivateKey"), "{config}");
    let post_up = config
        .lines()
        .find_map(|l| l.strip_prefix("PostUp = "))
        .expect("a PostUp line");
    let (relay_private, relay_public) = wg_keypair();
    let key_file = dir.path().join("wg0.key");
    std::fs::write(&key_file, format!("{relay_private}\n")).unwrap();
    let post_up = post_up
        .replace("%i", &wg)
        .replace(&b.wireguard_key_path(), &key_file.to_string_lossy());
    assert!(ns.sh(&post_up).status.success(), "{post_up}");
    let public = ns.sh(&format!("wg show {wg} public-key"));
    assert_eq!(String::from_utf8_lossy(&public.stdout).trim(), relay_public);
}

#[test]
fn the_seeded_chain_passes_nft_check() {
    if !kernel_parts(&["nft", "ip"]) {
        return;
    }
    let ns = Netns::new("nftcheck");
    let mut child = ns
        .cmd("nft")
        .args(["-c", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(skeleton(&Layout::default()).as_bytes())
        .unwrap();
    assert!(child.wait().unwrap().success());
}
