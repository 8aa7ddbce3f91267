//! Where notices go (issue #38, 3): email over SMTP (`lettre`) and an HMAC-signed outbound
//! webhook, each optional, both configured in `[notices]`. Neither configured (`byo up`),
//! the outbox page at `/admin/outbox` is the delivery. One client per system: the SMTP
//! transport and the webhook's `reqwest` client are built once, here.

use std::time::Duration;

use byo_core::notices::{
    WEBHOOK_ID_HEADER, WEBHOOK_SIGNATURE_HEADER, WEBHOOK_TIMESTAMP_HEADER, webhook_signature,
};
use byo_db::notices::NoticeRow;
use lettre::message::{Mailbox, header::ContentType};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// How long one SMTP conversation or webhook call may take before it counts as failed.
const SEND_TIMEOUT: Duration = Duration::from_secs(15);

/// `[notices]` in byo.toml.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NoticesConfig {
    /// `smtps://user:pass@mail.example.com` (TLS from the first byte),
    /// `smtp://user:pass@mail.example.com:587?tls=required` (STARTTLS, required), or plain
    /// `smtp://127.0.0.1:25` to a relay on this machine. Plain SMTP to any other machine is
    /// refused at load: the notices and the password would cross a network in clear.
    #[serde(default)]
    pub smtp_url: Option<SecretString>,
    /// The sender, e.g. `byo <noreply@example.com>`.
    #[serde(default = "default_from")]
    pub from: String,
    /// Every notice is POSTed here as JSON, signed (`byo-signature`); https, or http to
    /// loopback.
    #[serde(default)]
    pub webhook_url: Option<String>,
    /// The webhook's shared secret, at least 32 characters.
    #[serde(default)]
    pub webhook_secret: Option<SecretString>,
}

impl Default for NoticesConfig {
    fn default() -> Self {
        NoticesConfig {
            smtp_url: None,
            from: default_from(),
            webhook_url: None,
            webhook_secret: None,
        }
    }
}

fn default_from() -> String {
    "byo <byo@localhost>".to_owned()
}

/// Whether `url` names this machine: a loopback address, or `localhost`.
fn is_loopback(url: &reqwest::Url) -> bool {
    match url.host_str() {
        Some(h) => {
            h.eq_ignore_ascii_case("localhost")
                || h.trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|a| a.is_loopback())
        }
        None => false,
    }
}

impl NoticesConfig {
    /// Refusals in words, at load.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(smtp) = &self.smtp_url {
            let url = reqwest::Url::parse(smtp.expose_secret())
                .map_err(|e| format!("notices.smtp_url does not parse: {e}"))?;
            let tls_required = url
                .query_pairs()
                .any(|(k, v)| k == "tls" && v == "required");
            match url.scheme() {
                "smtps" => {}
                "smtp" if tls_required || is_loopback(&url) => {}
                "smtp" => {
                    return Err(format!(
                        "notices.smtp_url is plain SMTP to {}: notices (and the password) would \
                         cross the network in clear; use smtps://, or smtp://…?tls=required for STARTTLS",
                        url.host_str().unwrap_or("?")
                    ));
                }
                other => {
                    return Err(format!(
                        "notices.smtp_url must start with smtps:// or smtp://, not {other}://"
                    ));
                }
            }
            self.from.parse::<Mailbox>().map_err(|e| {
                format!("notices.from must be an address like \"byo <noreply@example.com>\": {e}")
            })?;
        }
        match (&self.webhook_url, &self.webhook_secret) {
            (None, None) => {}
            (Some(_), None) | (None, Some(_)) => {
                return Err("notices.webhook_url and notices.webhook_secret go together".to_owned());
            }
            (Some(u), Some(secret)) => {
                let url = reqwest::Url::parse(u)
                    .map_err(|e| format!("notices.webhook_url does not parse: {e}"))?;
                if !(url.scheme() == "https" || url.scheme() == "http" && is_loopback(&url)) {
                    return Err(format!(
                        "notices.webhook_url must be https (http only to this machine): {u}"
                    ));
                }
                if secret.expose_secret().chars().count() < 32 {
                    return Err("notices.webhook_secret must be at least 32 characters".to_owned());
                }
            }
        }
        Ok(())
    }
}

/// Why a send failed; `permanent` when trying again cannot help (SMTP 5xx: no such
/// mailbox). The text is for the outbox and the log, never a secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendError {
    pub permanent: bool,
    pub error: String,
}

/// The channels configured, built once.
pub struct Notifier {
    email: Option<(AsyncSmtpTransport<Tokio1Executor>, Mailbox)>,
    webhook: Option<(reqwest::Client, reqwest::Url, SecretString)>,
}

impl Notifier {
    /// `config` has been validated.
    pub fn new(config: &NoticesConfig) -> Result<Notifier, String> {
        let email = match &config.smtp_url {
            None => None,
            Some(url) => {
                let transport = AsyncSmtpTransport::<Tokio1Executor>::from_url(url.expose_secret())
                    .map_err(|e| format!("notices.smtp_url: {e}"))?
                    .timeout(Some(SEND_TIMEOUT))
                    .build();
                let from = config
                    .from
                    .parse::<Mailbox>()
                    .map_err(|e| format!("notices.from: {e}"))?;
                Some((transport, from))
            }
        };
        let webhook = match (&config.webhook_url, &config.webhook_secret) {
            (Some(u), Some(secret)) => {
                let client = reqwest::Client::builder()
                    .timeout(SEND_TIMEOUT)
                    .redirect(reqwest::redirect::Policy::none())
                    .build()
                    .map_err(|e| format!("notices webhook client: {e}"))?;
                let url =
                    reqwest::Url::parse(u).map_err(|e| format!("notices.webhook_url: {e}"))?;
                Some((client, url, secret.clone()))
            }
            _ => None,
        };
        Ok(Notifier { email, webhook })
    }

    /// Nothing configured: notices stay in the outbox.
    pub fn none() -> Notifier {
        Notifier {
            email: None,
            webhook: None,
        }
    }

    pub fn sends_email(&self) -> bool {
        self.email.is_some()
    }

    pub fn sends_webhook(&self) -> bool {
        self.webhook.is_some()
    }

    /// Whether any channel is configured (else a notice is kept in the outbox only).
    pub fn delivers(&self) -> bool {
        self.sends_email() || self.sends_webhook()
    }

    /// Mail `n` to its recipient. The notice's id is the message's `Message-ID`, so a mail
    /// system can tell a re-delivery from a new notice.
    pub async fn email(&self, n: &NoticeRow) -> Result<(), SendError> {
        self.mail(&n.email, &n.subject, &n.body, Some(&n.id)).await
    }

    /// Mail `body` to `to` now, on the one SMTP transport (a notice, or the link that
    /// confirms an address at sign-up). `id` makes the `Message-ID`; with none the mail
    /// system gives one. Without SMTP configured, nothing is sent.
    pub async fn mail(
        &self,
        to: &str,
        subject: &str,
        body: &str,
        id: Option<&str>,
    ) -> Result<(), SendError> {
        let Some((transport, from)) = &self.email else {
            return Ok(());
        };
        let to: Mailbox = to.parse().map_err(|e| SendError {
            permanent: true,
            error: format!("the address {to:?} does not parse: {e}"),
        })?;
        let domain = from.email.domain().to_owned();
        let message = Message::builder()
            .from(from.clone())
            .to(to)
            .subject(subject)
            .message_id(id.map(|id| format!("<{id}@{domain}>")))
            .header(ContentType::TEXT_PLAIN)
            .body(body.to_owned())
            .map_err(|e| SendError {
                permanent: true,
                error: format!("the message could not be built: {e}"),
            })?;
        transport
            .send(message)
            .await
            .map(|_| ())
            .map_err(|e| SendError {
                permanent: e.is_permanent(),
                error: format!("smtp: {e}"),
            })
    }

    /// POST `n` to the webhook, signed. 2xx is delivered; anything else is tried again.
    pub async fn webhook(
        &self,
        n: &NoticeRow,
        now: chrono::DateTime<chrono::Utc>,
    ) -> Result<(), SendError> {
        let Some((client, url, secret)) = &self.webhook else {
            return Ok(());
        };
        let body = serde_json::to_vec(&serde_json::json!({
            "id": n.id,
            "kind": n.kind,
            "to": n.email,
            "subject": n.subject,
            "body": n.body,
            "created_at": n.created_at,
        }))
        .expect("a notice serialises");
        let ts = now.timestamp();
        let signature = webhook_signature(secret.expose_secret().as_bytes(), ts, &body);
        let answer = client
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(WEBHOOK_ID_HEADER, &n.id)
            .header(WEBHOOK_TIMESTAMP_HEADER, ts.to_string())
            .header(WEBHOOK_SIGNATURE_HEADER, signature)
            .body(body)
            .send()
            .await
            .map_err(|e| SendError {
                permanent: false,
                error: format!("webhook: {}", e.without_url()),
            })?;
        if answer.status().is_success() {
            Ok(())
        } else {
            Err(SendError {
                permanent: false,
                error: format!("webhook answered {}", answer.status()),
            })
        }
    }
}
