//! The script a relay instance runs at every boot (provisioning note 5), delivered as
//! instance metadata (Compute Engine's `startup-script`, which its guest agent runs at each
//! boot): WireGuard to its host (wireguard-go where the kernel has no module), ssh_mapd,
//! Caddy on :443 with the relay's certificate from the installation's relay CA proxying only
//! to the host's agent, and the `LOFISPARK_VMSSH` chain seeded. Every line is safe to run
//! again. Rendering is pure; the server fills in this relay's public values, so nobody SSHes
//! into a relay to bring it up.
//!
//! Nothing secret is in the script (issue #36): metadata is readable by anything on the relay
//! and by every viewer of the project, for the instance's whole life. The relay's WireGuard
//! key and its TLS certificate and key are fetched from the server once, at the first boot,
//! with a single-use token ([`Bootstrap::secrets_token`]); the server answers them in
//! [`RelaySecrets`]' format. The token the metadata keeps is spent from then on.

use std::fmt::Write as _;

use crate::render::nft::Layout;

/// How long Caddy keeps an idle connection to the agent: under the agent's idle (header-read)
/// timeout, 10 s by default (`byo_listen::Limits`).
pub const CADDY_UPSTREAM_KEEPALIVE_SECS: u64 = 5;

/// Where the relay keeps its certificate and key (readable by Caddy's group only).
pub const TLS_DIR: &str = "/etc/byo-relay/tls";

/// Everything that differs from one relay to the next. Every value here is public but the
/// token, which is spent at the first boot.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    /// The host's slug (`spark-7`): the relay is `<slug>-relay`.
    pub slug: String,
    /// The host's WireGuard public key (base64).
    pub host_public_key: String,
    pub wireguard_port: u16,
    /// SHA-256 (hex) of the relay's ssh_mapd token; the plaintext goes to the agent only.
    pub ssh_map_token_hash: String,
    /// The relay's name: what its certificate says and the backend checks
    /// (`spark-7.relay.enverge.ai`). Never looked up: the backend dials the relay's address.
    pub public_name: String,
    /// Where the relay fetches its secrets (`<server>/api/relay/secrets`), and the
    /// single-use token it presents there (`byo_rly_…`).
    pub secrets_url: String,
    pub secrets_token: String,
    /// Where the relay fetches its daemon, and the SHA-256 it must have.
    pub relay_binary_url: String,
    pub relay_binary_sha256: String,
    pub layout: Layout,
}

/// What the server answers a relay's one fetch, as `text/plain`: a line
/// `wireguard-private-key <base64>`, then the certificate and the key as PEM blocks. Lines a
/// shell splits with `sed`, so the relay needs nothing beyond its base image to read it.
#[derive(Clone)]
pub struct RelaySecrets {
    pub wireguard_private_key: String,
    pub tls_cert_pem: String,
    pub tls_key_pem: String,
}

impl std::fmt::Debug for RelaySecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("RelaySecrets(<redacted>)")
    }
}

impl RelaySecrets {
    /// The answer's text; refused when a value is not what the relay's script reads.
    pub fn render(&self) -> Result<String, String> {
        safe(&self.wireguard_private_key, "relay private key", "+/=")?;
        pem(&self.tls_cert_pem, "CERTIFICATE")?;
        pem(&self.tls_key_pem, "PRIVATE KEY")?;
        Ok(format!(
            "wireguard-private-key {}\n{}{}",
            self.wireguard_private_key,
            with_newline(&self.tls_cert_pem),
            with_newline(&self.tls_key_pem)
        ))
    }
}

fn with_newline(pem: &str) -> String {
    format!("{}\n", pem.trim_end())
}

/// What goes in every rendered value: base64 keys, hex digests, DNS names, URLs. Anything
/// else would be a way to inject into the script, so it is refused.
fn safe(value: &str, what: &str, extra: &str) -> Result<(), String> {
    if value.is_empty()
        || !value
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
    {
        return Err(format!(
            "{what} {value:?} has characters a bootstrap cannot carry"
        ));
    }
    Ok(())
}

/// A single PEM block of `label`: its two armour lines and base64 between, nothing a
/// heredoc could be broken out of.
fn pem(value: &str, label: &str) -> Result<(), String> {
    let body = value
        .trim_end()
        .strip_prefix(&format!("-----BEGIN {label}-----\n"))
        .and_then(|r| r.strip_suffix(&format!("-----END {label}-----")))
        .ok_or_else(|| format!("the relay's {label} is not one PEM block"))?;
    if body
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "+/=\n".contains(c))
    {
        Ok(())
    } else {
        Err(format!(
            "the relay's {label} has characters a bootstrap cannot carry"
        ))
    }
}

impl Bootstrap {
    fn check(&self) -> Result<(), String> {
        safe(&self.slug, "slug", "-")?;
        safe(&self.host_public_key, "host public key", "+/=")?;
        safe(&self.ssh_map_token_hash, "token hash", "")?;
        safe(&self.public_name, "public name", "-.")?;
        safe(&self.secrets_url, "secrets URL", ":/.-_")?;
        safe(&self.secrets_token, "secrets token", "_")?;
        safe(&self.relay_binary_url, "binary URL", ":/.-_")?;
        safe(&self.relay_binary_sha256, "binary digest", "")?;
        safe(&self.layout.tunnel, "tunnel interface", "-_")?;
        Ok(())
    }

    /// The relay's end of the tunnel, in wg-quick's format (`/etc/wireguard/wg0.conf`).
    /// The host dials out from behind its router, so the relay's peer has no endpoint. The
    /// private key is not in it: it is the file [`Bootstrap::wireguard_key_path`], written
    /// from the one fetch, and set when the link comes up.
    pub fn wireguard_config(&self) -> String {
        format!(
            "[Interface]\nAddress = 10.8.0.1/24\nListenPort = {}\nPostUp = wg set %i private-key {}\n\n[Peer]\n# {} (the host)\nPublicKey = {}\nAllowedIPs = {}/32\n",
            self.wireguard_port,
            self.wireguard_key_path(),
            self.slug,
            self.host_public_key,
            self.layout.host
        )
    }

    /// Where the relay's WireGuard private key is kept (root, 0600).
    pub fn wireguard_key_path(&self) -> String {
        format!("/etc/wireguard/{}.key", self.layout.tunnel)
    }

    /// Caddy: :443 only, for the relay's name, with its certificate from the relay CA
    /// (no ACME, no :80), proxying only to the host's agent on the tunnel. Caddy keeps an
    /// idle upstream connection for [`CADDY_UPSTREAM_KEEPALIVE_SECS`], below the agent's idle
    /// timeout, so Caddy never reuses a connection the agent is closing (a POST sent on it
    /// would fail, and Caddy does not retry one).
    pub fn caddyfile(&self) -> String {
        format!(
            "{{\n\tauto_https off\n}}\n\nhttps://{}:443 {{\n\ttls {TLS_DIR}/relay.crt {TLS_DIR}/relay.key\n\treverse_proxy {}:8080 {{\n\t\ttransport http {{\n\t\t\tkeepalive {CADDY_UPSTREAM_KEEPALIVE_SECS}s\n\t\t}}\n\t}}\n}}\n",
            self.public_name, self.layout.host
        )
    }

    /// The ssh_mapd unit: after the tunnel, restarted whenever it stops.
    pub fn mapd_unit(&self) -> String {
        format!(
            "[Unit]\nDescription=byo ssh_mapd: the relay's SSH map for {slug}\nAfter=wg-quick@{wg}.service network-online.target\nRequires=wg-quick@{wg}.service\n\n[Service]\nExecStart=/usr/local/bin/byo-relay serve --listen 10.8.0.1:8754 --token-hash-file /etc/byo-relay/ssh-map-token.sha256 --host {host} --tunnel {wg}\nRestart=always\nRestartSec=2\nNoNewPrivileges=yes\nProtectSystem=strict\nProtectHome=yes\nPrivateTmp=yes\nCapabilityBoundingSet=CAP_NET_ADMIN\nAmbientCapabilities=CAP_NET_ADMIN\n\n[Install]\nWantedBy=multi-user.target\n",
            slug = self.slug,
            wg = self.layout.tunnel,
            host = self.layout.host
        )
    }

    /// The whole first-boot script.
    pub fn script(&self) -> Result<String, String> {
        self.check()?;
        let wg = &self.layout.tunnel;
        let mut s = String::new();
        let _ = write!(
            s,
            r#"#!/usr/bin/env bash
# {slug}-relay, generated by the byo control plane. Runs as root at every boot (the
# instance's startup-script), so every step is safe to run again.
set -euo pipefail
exec > >(tee -a /var/log/byo-relay-bootstrap.log) 2>&1
echo "byo relay bootstrap for {slug} starting at $(date -u +%FT%TZ)"

# Packages, once. Where the kernel has no WireGuard module, wg-quick falls back to
# wireguard-go.
export DEBIAN_FRONTEND=noninteractive
packages=(wireguard-tools nftables caddy curl ca-certificates)
if ip link add byo-wg-probe type wireguard 2>/dev/null; then
  ip link del byo-wg-probe
else
  packages+=(wireguard-go)
fi
missing=0
for p in "${{packages[@]}}"; do
  dpkg-query -W -f='${{Status}}' "$p" 2>/dev/null | grep -q '^install ok installed$' || missing=1
done
if [ "$missing" -eq 1 ]; then
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${{packages[@]}}"
fi

# Forward what LOFISPARK_VMSSH DNATs into the tunnel.
echo 'net.ipv4.ip_forward = 1' > /etc/sysctl.d/60-byo-relay.conf
sysctl -q -w net.ipv4.ip_forward=1

# This relay's secrets (its WireGuard key, its TLS certificate and key), fetched once with a
# single-use token, so nothing secret stays in the instance's metadata. A later boot has them.
install -d -m 755 /etc/byo-relay
install -d -m 700 /etc/wireguard
install -d -m 750 -o root -g caddy {tls}
if [ ! -s {wgkey} ] || [ ! -s {tls}/relay.crt ] || [ ! -s {tls}/relay.key ]; then
  umask 077
  answer=$(mktemp)
  if ! curl -fsS --retry 10 --retry-connrefused --retry-delay 3 -X POST \
      -H 'Authorization: Bearer {token}' -o "$answer" '{secrets_url}'; then
    rm -f "$answer"
    echo "this relay's secrets could not be fetched: its token is spent (they were fetched \
before) or lapsed, or the server did not answer. Replace the relay from the host's page."
    exit 1
  fi
  key=$(sed -n 's|^wireguard-private-key \([A-Za-z0-9+/]\{{43\}}=\)$|\1|p' "$answer")
  sed -n '/^-----BEGIN CERTIFICATE-----$/,/^-----END CERTIFICATE-----$/p' "$answer" > {tls}/relay.crt.new
  sed -n '/^-----BEGIN PRIVATE KEY-----$/,/^-----END PRIVATE KEY-----$/p' "$answer" > {tls}/relay.key.new
  rm -f "$answer"
  if [ -z "$key" ] || [ ! -s {tls}/relay.crt.new ] || [ ! -s {tls}/relay.key.new ]; then
    echo "the server's answer is not a relay's secrets"
    exit 1
  fi
  printf '%s\n' "$key" > {wgkey}
  chgrp caddy {tls}/relay.key.new
  chmod 0640 {tls}/relay.key.new
  chmod 0644 {tls}/relay.crt.new
  mv {tls}/relay.crt.new {tls}/relay.crt
  mv {tls}/relay.key.new {tls}/relay.key
  umask 022
fi

# WireGuard to the host (10.8.0.2), which dials in.
umask 077
cat > /etc/wireguard/{wg}.conf <<'WIREGUARD'
{wgconf}WIREGUARD
umask 022
systemctl enable wg-quick@{wg}.service
systemctl restart wg-quick@{wg}.service

# ssh_mapd: the daemon (fetched once, and again only if it is not the expected build),
# its token's hash and its unit.
echo '{hash}' > /etc/byo-relay/ssh-map-token.sha256
if ! echo '{sha}  /usr/local/bin/byo-relay' | sha256sum -c --status - 2>/dev/null; then
  curl -fsSL --retry 5 -o /usr/local/bin/byo-relay.download '{url}'
  echo '{sha}  /usr/local/bin/byo-relay.download' | sha256sum -c -
  install -m 755 /usr/local/bin/byo-relay.download /usr/local/bin/byo-relay
  rm -f /usr/local/bin/byo-relay.download
fi
cat > /etc/systemd/system/byo-ssh-mapd.service <<'UNIT'
{unit}UNIT

# The chain, seeded: the IAP exemption and the :22 blackhole; the host's next heartbeat
# puts its map back.
/usr/local/bin/byo-relay seed --host {host} --tunnel {wg}
systemctl daemon-reload
systemctl enable byo-ssh-mapd.service
systemctl restart byo-ssh-mapd.service

# Caddy on :443 with this relay's certificate, proxying only to the host's agent.
cat > /etc/caddy/Caddyfile <<'CADDY'
{caddy}CADDY
systemctl enable caddy.service
systemctl restart caddy.service

echo "byo relay bootstrap for {slug} done at $(date -u +%FT%TZ)"
"#,
            slug = self.slug,
            wgconf = self.wireguard_config(),
            hash = self.ssh_map_token_hash,
            url = self.relay_binary_url,
            sha = self.relay_binary_sha256,
            unit = self.mapd_unit(),
            host = self.layout.host,
            caddy = self.caddyfile(),
            tls = TLS_DIR,
            wgkey = self.wireguard_key_path(),
            token = self.secrets_token,
            secrets_url = self.secrets_url,
        );
        Ok(s)
    }
}

#[cfg(test)]
mod value_tests {
    use super::*;

    /// What may be rendered into the script: the whole refusal suite (each field of a
    /// `Bootstrap`, through `script()`) is `byo-relay/tests/it/bootstrap.rs`; here, the rule.
    #[test]
    fn only_plain_values_are_rendered() {
        assert!(safe("spark-7.relay.example.com", "name", ".-").is_ok());
        for bad in ["", "spark 7", "spark-7;id", "$(id)", "x\n"] {
            assert!(safe(bad, "name", ".-").is_err(), "{bad:?}");
        }
        assert!(
            safe("a.b", "name", "-").is_err(),
            "only the extra characters given"
        );
        assert_eq!(
            safe("x y", "slug", "-").unwrap_err(),
            r#"slug "x y" has characters a bootstrap cannot carry"#
        );
        assert_eq!(with_newline("PEM\n\n"), "PEM\n");
        assert_eq!(with_newline("PEM"), "PEM\n");
    }
}
