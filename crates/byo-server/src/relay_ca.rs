//! The installation's relay CA. The backend reaches every agent through its host's relay
//! (Caddy on the relay's public :443, proxying only to the agent on the tunnel) and sends
//! the agent token there, so that hop is TLS and the backend trusts nothing but this CA
//! and the relay's own name. The CA is made once per installation and kept as one row, its
//! key sealed with the server key; each relay's certificate is issued at relay-provision
//! and delivered in the relay's first-boot script. No public DNS or ACME is involved, so
//! the agent path works before (and without) any DNS record and has no per-domain
//! issuance limit as the fleet grows.

use chrono::{DateTime, Datelike, Utc};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, date_time_ymd,
};

use crate::seal::{SealedAt, Sealer};

/// The CA's subject. The issuer of every relay certificate is rebuilt from it and the key,
/// so it never changes.
const CA_NAME: &str = "byo relay CA";

/// The relay CA: its certificate (what the backend trusts) and its key.
pub struct RelayCa {
    cert_pem: String,
    key: KeyPair,
}

impl std::fmt::Debug for RelayCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayCa").finish_non_exhaustive()
    }
}

/// A relay's certificate and key, PEM, for its first-boot script.
#[derive(Clone)]
pub struct RelayCert {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for RelayCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayCert").finish_non_exhaustive()
    }
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, CA_NAME);
    p.distinguished_name = dn;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = date_time_ymd(2025, 1, 1);
    p.not_after = date_time_ymd(2125, 1, 1);
    p
}

impl RelayCa {
    /// A new CA (ECDSA P-256).
    pub fn generate() -> anyhow::Result<RelayCa> {
        let key = KeyPair::generate()?;
        let cert_pem = ca_params().self_signed(&key)?.pem();
        Ok(RelayCa { cert_pem, key })
    }

    /// The kept CA: its certificate and its key, unsealed.
    pub fn from_row(row: &byo_db::relay_ca::RelayCaRow, sealer: &Sealer) -> anyhow::Result<Self> {
        let key_pem = sealer
            .open(&SealedAt::relay_ca_key(), &row.sealed_key)
            .map_err(|e| anyhow::anyhow!("opening the relay CA's key: {e}"))?;
        Ok(RelayCa {
            cert_pem: row.cert_pem.clone(),
            key: KeyPair::from_pem(&key_pem)?,
        })
    }

    /// This CA as a row to keep, its key sealed.
    pub fn to_row(&self, sealer: &Sealer, now: DateTime<Utc>) -> byo_db::relay_ca::RelayCaRow {
        byo_db::relay_ca::RelayCaRow {
            cert_pem: self.cert_pem.clone(),
            sealed_key: sealer.seal(&SealedAt::relay_ca_key(), &self.key.serialize_pem()),
            created_at: now,
        }
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// A server certificate for `name` (the relay's `<slug>.relay.<domain>`), valid from
    /// today for twenty years: a relay lives as long as its host and nothing renews it.
    pub fn issue(&self, name: &str, now: DateTime<Utc>) -> anyhow::Result<RelayCert> {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![name.to_owned()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        p.distinguished_name = dn;
        p.is_ca = IsCa::ExplicitNoCa;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        p.use_authority_key_identifier_extension = true;
        let (y, m, d) = (now.year(), now.month() as u8, now.day() as u8);
        p.not_before = date_time_ymd(y, m, d);
        p.not_after = date_time_ymd(y + 20, m, d.min(28));
        let issuer = Issuer::new(ca_params(), &self.key);
        let cert = p.signed_by(&key, &issuer)?;
        Ok(RelayCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The relay's name: what its certificate says and what the backend checks, never looked
/// up in DNS (the backend connects to the relay's recorded address). Under the public
/// host's domain when it has one; `relay.internal` when the server is addressed by IP.
pub fn relay_name(slug: &str, public_url: &str) -> String {
    let after = public_url
        .split_once("://")
        .map_or(public_url, |(_, rest)| rest);
    let host = after.split(['/', ':']).next().unwrap_or(after);
    let is_ip = host.parse::<std::net::IpAddr>().is_ok() || host.starts_with('[');
    if host.is_empty() || is_ip {
        format!("{slug}.relay.internal")
    } else {
        format!("{slug}.relay.{host}")
    }
}

/// Where the relay CA is had: made on first use and kept, then read once per process.
/// Provisioning issues relay certificates from it; the agent client trusts only it.
#[derive(Clone)]
pub struct RelayCaSource {
    /// Where the CA is kept; none for a source given its CA outright.
    kept: Option<(byo_db::Store, Option<Sealer>)>,
    cell: std::sync::Arc<tokio::sync::OnceCell<std::sync::Arc<RelayCa>>>,
}

impl std::fmt::Debug for RelayCaSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RelayCaSource").finish_non_exhaustive()
    }
}

impl RelayCaSource {
    pub fn new(store: byo_db::Store, sealer: Option<Sealer>) -> Self {
        RelayCaSource {
            kept: Some((store, sealer)),
            cell: Default::default(),
        }
    }

    /// A source that has `ca` and keeps nothing (a client that only checks relays).
    pub fn fixed(ca: RelayCa) -> Self {
        RelayCaSource {
            kept: None,
            cell: std::sync::Arc::new(tokio::sync::OnceCell::new_with(Some(std::sync::Arc::new(
                ca,
            )))),
        }
    }

    /// The installation's CA, made and kept if there is none yet.
    pub async fn get(&self) -> anyhow::Result<std::sync::Arc<RelayCa>> {
        self.cell
            .get_or_try_init(|| async {
                let (store, sealer) = self
                    .kept
                    .as_ref()
                    .ok_or_else(|| anyhow::anyhow!("no relay CA"))?;
                let sealer = sealer.as_ref().ok_or_else(|| {
                    anyhow::anyhow!("this server has no secret_key to seal the relay CA")
                })?;
                let row = match store.relay_ca().await? {
                    Some(row) => row,
                    None => {
                        let fresh = RelayCa::generate()?.to_row(sealer, Utc::now());
                        store.relay_ca_or_insert(&fresh).await?
                    }
                };
                Ok(std::sync::Arc::new(RelayCa::from_row(&row, sealer)?))
            })
            .await
            .cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The certificate and key a relay is given fit the answer its first-boot script reads
    /// (`RelaySecrets`), name the relay, and chain to the CA (checked by rustls' own
    /// verifier in the agent client's tests).
    #[test]
    fn a_relay_certificate_fits_the_secrets_answer_and_names_the_relay() {
        let ca = RelayCa::generate().unwrap();
        let cert = ca.issue("spark-7.relay.example.com", Utc::now()).unwrap();
        let answer = byo_core::render::relay_bootstrap::RelaySecrets {
            wireguard_private_key: "a".repeat(43) + "=",
            tls_cert_pem: cert.cert_pem.clone(),
            tls_key_pem: cert.key_pem.clone(),
        }
        .render()
        .unwrap();
        assert!(answer.contains(cert.cert_pem.trim_end()));
        assert!(answer.contains(cert.key_pem.trim_end()));
    }

    #[test]
    fn relays_are_named_under_the_installation_or_internal() {
        assert_eq!(
            relay_name("spark-7", "https://app.enverge.ai"),
            "spark-7.relay.app.enverge.ai"
        );
        assert_eq!(
            relay_name("spark-7", "http://localhost:8080"),
            "spark-7.relay.localhost"
        );
        assert_eq!(
            relay_name("spark-7", "http://10.231.0.1:8080"),
            "spark-7.relay.internal"
        );
    }
}
