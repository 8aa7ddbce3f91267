//! Stripe (issue #13, 4): the one client over Stripe's REST API. Bodies are form-encoded
//! (`metadata[user_sub]=…`), the secret key goes as `Authorization: Bearer sk_…`, and every
//! POST carries an `Idempotency-Key` — derived from what it does where a retry must not
//! repeat it (a customer per account, an invoice item per instance and period), fresh
//! otherwise. Stripe's error envelope `{error: {type, code, message, decline_code, param}}`
//! becomes [`StripeError::Api`]; no answer, or one that does not parse, is
//! [`StripeError::Unreachable`]. The rules that use it are `app::billing`'s.

use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::Value;

/// `[billing]`: Stripe. Absent, billing is off (`byo up`): everyone may rent, nobody is
/// charged, and the pages say so.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BillingConfig {
    /// `sk_live_…` / `sk_test_…`.
    pub stripe_secret_key: SecretString,
    /// `whsec_…`: the signing secret of the webhook endpoint `/api/stripe/webhook`.
    pub stripe_webhook_secret: SecretString,
    #[serde(default = "default_api_base")]
    pub api_base: String,
    /// What an hour of an instance costs, in the currency's smallest unit.
    pub price_cents_per_hour: u32,
    /// ISO 4217, lower case (`usd`).
    #[serde(default = "default_currency")]
    pub currency: String,
    /// An account is invoiced each calendar month, and earlier once its uninvoiced usage
    /// reaches this (in the currency's smallest unit; default 10000, $100).
    #[serde(default = "default_invoice_threshold")]
    pub invoice_threshold_cents: u32,
    /// How long an account's running instances keep running after an invoice's payment is
    /// declined; then they are stopped (never deleted) until it is paid. Default 72.
    #[serde(default = "default_payment_grace_hours")]
    pub payment_grace_hours: u32,
    /// The owner's share of every cent invoiced for their hosts, in basis points (default
    /// 7000: 70 %); the rest is the platform's.
    #[serde(default = "default_owner_share_bps")]
    pub owner_share_bps: u32,
}

fn default_owner_share_bps() -> u32 {
    7_000
}

fn default_payment_grace_hours() -> u32 {
    72
}

fn default_invoice_threshold() -> u32 {
    10_000
}

fn default_api_base() -> String {
    "https://api.stripe.com".into()
}

fn default_currency() -> String {
    "usd".into()
}

/// Why a Stripe call failed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StripeError {
    /// Stripe answered with its error envelope.
    #[error("stripe: {status} {kind}{}: {message}", code.as_deref().map(|c| format!(" ({c})")).unwrap_or_default())]
    Api {
        status: u16,
        /// `card_error`, `invalid_request_error`, `idempotency_error`, `api_error`, …
        kind: String,
        /// `resource_missing`, `card_declined`, …
        code: Option<String>,
        decline_code: Option<String>,
        param: Option<String>,
        message: String,
    },
    /// No answer, or one that is not Stripe's: an outage, not a refusal.
    #[error("stripe: {0}")]
    Unreachable(String),
}

impl StripeError {
    pub fn code(&self) -> Option<&str> {
        match self {
            StripeError::Api { code, .. } => code.as_deref(),
            StripeError::Unreachable(_) => None,
        }
    }

    /// Stripe's own trouble (5xx, 429) or none at all: worth trying again later.
    pub fn is_outage(&self) -> bool {
        match self {
            StripeError::Api { status, .. } => *status >= 500 || *status == 429,
            StripeError::Unreachable(_) => true,
        }
    }
}

/// A customer, with its default payment method expanded when asked for.
#[derive(Clone, Debug, Deserialize)]
pub struct Customer {
    pub id: String,
    #[serde(default)]
    pub deleted: bool,
    /// Stripe sets it when the customer's latest invoice payment failed.
    #[serde(default)]
    pub delinquent: bool,
    #[serde(default)]
    pub invoice_settings: InvoiceSettings,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct InvoiceSettings {
    /// An id, or the expanded payment method object.
    #[serde(default)]
    pub default_payment_method: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct CheckoutSession {
    pub id: String,
    pub url: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SetupIntent {
    pub id: String,
    pub payment_method: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct InvoiceItem {
    pub id: String,
    pub amount: i64,
}

/// An invoice, as its API answers and its webhooks carry it.
#[derive(Clone, Debug, Deserialize)]
pub struct Invoice {
    pub id: String,
    /// `draft`, `open`, `paid`, `uncollectible`, `void`.
    pub status: Option<String>,
    #[serde(default)]
    pub total: i64,
    #[serde(default)]
    pub amount_due: i64,
    #[serde(default)]
    pub hosted_invoice_url: Option<String>,
    #[serde(default)]
    pub metadata: serde_json::Map<String, Value>,
}

/// A refund of a payment.
#[derive(Clone, Debug, Deserialize)]
pub struct Refund {
    pub id: String,
    pub amount: i64,
    /// `succeeded`, `pending`, `failed`, …
    #[serde(default)]
    pub status: Option<String>,
}

/// A connected account (Connect, Express): an owner's, which their payouts are transferred to.
#[derive(Clone, Debug, Deserialize)]
pub struct Account {
    pub id: String,
    #[serde(default)]
    pub details_submitted: bool,
    #[serde(default)]
    pub payouts_enabled: bool,
    /// `{"transfers": "active" | "inactive" | "pending"}`.
    #[serde(default)]
    pub capabilities: serde_json::Map<String, Value>,
}

impl Account {
    /// Whether a transfer to it would be taken now.
    pub fn transfers_active(&self) -> bool {
        self.capabilities.get("transfers").and_then(Value::as_str) == Some("active")
    }
}

/// A single-use link to Stripe's onboarding of a connected account (it expires in minutes).
#[derive(Clone, Debug, Deserialize)]
pub struct AccountLink {
    pub url: String,
}

/// A transfer from the platform's balance to a connected account.
#[derive(Clone, Debug, Deserialize)]
pub struct Transfer {
    pub id: String,
    pub amount: i64,
    #[serde(default)]
    pub transfer_group: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
struct List<T> {
    data: Vec<T>,
}

/// One line of a payment Checkout session.
#[derive(Clone, Debug)]
pub struct PaymentLine<'a> {
    pub name: &'a str,
    pub amount: i64,
    pub currency: &'a str,
}

/// An invoice item: a charge (positive) or a credit (negative).
#[derive(Clone, Debug)]
pub struct NewInvoiceItem<'a> {
    pub customer: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub description: &'a str,
    pub period: (i64, i64),
    pub metadata: &'a [(&'a str, &'a str)],
}

pub struct StripeClient {
    api_base: String,
    secret_key: SecretString,
    client: reqwest::Client,
}

impl StripeClient {
    pub fn new(config: &BillingConfig) -> Self {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client with timeouts builds");
        StripeClient {
            api_base: config.api_base.trim_end_matches('/').to_owned(),
            secret_key: config.stripe_secret_key.clone(),
            client,
        }
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        form: &[(String, String)],
        idempotency_key: Option<&str>,
    ) -> Result<T, StripeError> {
        let url = format!("{}/{path}", self.api_base);
        let mut req = self
            .client
            .request(method.clone(), url)
            .bearer_auth(self.secret_key.expose_secret());
        if method == reqwest::Method::GET {
            req = req.query(form);
        } else {
            let key = idempotency_key
                .map(str::to_owned)
                .unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            req = req.header("Idempotency-Key", key).form(form);
        }
        let resp = req.send().await.map_err(|e| {
            StripeError::Unreachable(format!("{method} {path}: {}", e.without_url()))
        })?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| {
            StripeError::Unreachable(format!("{method} {path}: {}", e.without_url()))
        })?;
        if !status.is_success() {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let e = &v["error"];
            if !e.is_object() {
                return Err(StripeError::Unreachable(format!(
                    "{method} {path}: {status} without Stripe's error envelope"
                )));
            }
            let text = |k: &str| e[k].as_str().map(str::to_owned);
            return Err(StripeError::Api {
                status: status.as_u16(),
                kind: text("type").unwrap_or_else(|| "api_error".into()),
                code: text("code"),
                decline_code: text("decline_code"),
                param: text("param"),
                message: text("message").unwrap_or_else(|| status.to_string()),
            });
        }
        serde_json::from_slice(&body).map_err(|e| {
            StripeError::Unreachable(format!(
                "{method} {path}: an answer that does not parse: {e}"
            ))
        })
    }

    /// A customer for an account, `metadata[user_sub]` naming it. Keyed by the account, so
    /// two racing requests get the one customer.
    pub async fn create_customer(
        &self,
        user_sub: &str,
        email: &str,
    ) -> Result<Customer, StripeError> {
        let form = vec![
            ("email".into(), email.to_owned()),
            ("metadata[user_sub]".into(), user_sub.to_owned()),
        ];
        self.call(
            reqwest::Method::POST,
            "v1/customers",
            &form,
            Some(&format!("customer-{user_sub}")),
        )
        .await
    }

    /// The customer, its default payment method expanded (the live check).
    pub async fn retrieve_customer(&self, id: &str) -> Result<Customer, StripeError> {
        let form = vec![(
            "expand[]".into(),
            "invoice_settings.default_payment_method".into(),
        )];
        self.call(
            reqwest::Method::GET,
            &format!("v1/customers/{id}"),
            &form,
            None,
        )
        .await
    }

    /// Make `payment_method` the customer's default for invoices.
    pub async fn set_default_payment_method(
        &self,
        customer: &str,
        payment_method: &str,
    ) -> Result<Customer, StripeError> {
        let form = vec![(
            "invoice_settings[default_payment_method]".into(),
            payment_method.to_owned(),
        )];
        self.call(
            reqwest::Method::POST,
            &format!("v1/customers/{customer}"),
            &form,
            Some(&format!("default-pm-{customer}-{payment_method}")),
        )
        .await
    }

    /// A Checkout session in setup mode: the customer adds a card.
    pub async fn checkout_setup(
        &self,
        customer: &str,
        success_url: &str,
        cancel_url: &str,
    ) -> Result<CheckoutSession, StripeError> {
        let form = vec![
            ("mode".into(), "setup".into()),
            ("customer".into(), customer.to_owned()),
            ("payment_method_types[]".into(), "card".into()),
            ("success_url".into(), success_url.to_owned()),
            ("cancel_url".into(), cancel_url.to_owned()),
        ];
        self.call(reqwest::Method::POST, "v1/checkout/sessions", &form, None)
            .await
    }

    /// A Checkout session in payment mode for one line, `metadata` on the session (the
    /// webhook reads it back).
    pub async fn checkout_payment(
        &self,
        customer: &str,
        line: &PaymentLine<'_>,
        metadata: &[(&str, &str)],
        success_url: &str,
        cancel_url: &str,
    ) -> Result<CheckoutSession, StripeError> {
        let mut form: Vec<(String, String)> = vec![
            ("mode".into(), "payment".into()),
            ("customer".into(), customer.to_owned()),
            (
                "line_items[0][price_data][currency]".into(),
                line.currency.to_owned(),
            ),
            (
                "line_items[0][price_data][unit_amount]".into(),
                line.amount.to_string(),
            ),
            (
                "line_items[0][price_data][product_data][name]".into(),
                line.name.to_owned(),
            ),
            ("line_items[0][quantity]".into(), "1".into()),
            ("success_url".into(), success_url.to_owned()),
            ("cancel_url".into(), cancel_url.to_owned()),
        ];
        for (k, v) in metadata {
            form.push((format!("metadata[{k}]"), (*v).to_owned()));
        }
        self.call(reqwest::Method::POST, "v1/checkout/sessions", &form, None)
            .await
    }

    pub async fn retrieve_setup_intent(&self, id: &str) -> Result<SetupIntent, StripeError> {
        self.call(
            reqwest::Method::GET,
            &format!("v1/setup_intents/{id}"),
            &[],
            None,
        )
        .await
    }

    /// An invoice of every pending invoice item of `customer` (Stripe's default since
    /// 2022-08-01 is to leave them out, hence `pending_invoice_items_behavior=include`), a
    /// draft we finalize and pay ourselves (`auto_advance=false`), `metadata[invoice_id]`
    /// naming our row, under the key `invoice-<id>`.
    pub async fn create_invoice(
        &self,
        customer: &str,
        currency: &str,
        invoice_id: &str,
    ) -> Result<Invoice, StripeError> {
        let form: Vec<(String, String)> = vec![
            ("customer".into(), customer.to_owned()),
            ("currency".into(), currency.to_owned()),
            ("collection_method".into(), "charge_automatically".into()),
            ("auto_advance".into(), "false".into()),
            ("pending_invoice_items_behavior".into(), "include".into()),
            ("metadata[invoice_id]".into(), invoice_id.to_owned()),
        ];
        self.call(
            reqwest::Method::POST,
            "v1/invoices",
            &form,
            Some(&format!("invoice-{invoice_id}")),
        )
        .await
    }

    /// Finalize a draft (key `finalize-<our id>`): it becomes `open`, or `paid` when there is
    /// nothing to collect.
    pub async fn finalize_invoice(
        &self,
        stripe_id: &str,
        invoice_id: &str,
    ) -> Result<Invoice, StripeError> {
        self.call(
            reqwest::Method::POST,
            &format!("v1/invoices/{stripe_id}/finalize"),
            &[],
            Some(&format!("finalize-{invoice_id}")),
        )
        .await
    }

    /// Pay an open invoice with the customer's default payment method, under
    /// `idempotency_key` (`pay-<our id>` the first time, `pay-<our id>-<card>` with a new
    /// card). A decline is `StripeError::Api` with status 402 and code `card_declined`.
    pub async fn pay_invoice(
        &self,
        stripe_id: &str,
        idempotency_key: &str,
    ) -> Result<Invoice, StripeError> {
        self.call(
            reqwest::Method::POST,
            &format!("v1/invoices/{stripe_id}/pay"),
            &[],
            Some(idempotency_key),
        )
        .await
    }

    /// Refund `amount` of a payment (its payment intent), `metadata` on the refund, under
    /// `idempotency_key`.
    pub async fn create_refund(
        &self,
        payment_intent: &str,
        amount: i64,
        metadata: &[(&str, &str)],
        idempotency_key: &str,
    ) -> Result<Refund, StripeError> {
        let mut form: Vec<(String, String)> = vec![
            ("payment_intent".into(), payment_intent.to_owned()),
            ("amount".into(), amount.to_string()),
        ];
        for (k, v) in metadata {
            form.push((format!("metadata[{k}]"), (*v).to_owned()));
        }
        self.call(
            reqwest::Method::POST,
            "v1/refunds",
            &form,
            Some(idempotency_key),
        )
        .await
    }

    /// An invoice item (a negative amount is a credit), under `idempotency_key`.
    pub async fn create_invoice_item(
        &self,
        item: &NewInvoiceItem<'_>,
        idempotency_key: &str,
    ) -> Result<InvoiceItem, StripeError> {
        let mut form: Vec<(String, String)> = vec![
            ("customer".into(), item.customer.to_owned()),
            ("amount".into(), item.amount.to_string()),
            ("currency".into(), item.currency.to_owned()),
            ("description".into(), item.description.to_owned()),
            ("period[start]".into(), item.period.0.to_string()),
            ("period[end]".into(), item.period.1.to_string()),
        ];
        for (k, v) in item.metadata {
            form.push((format!("metadata[{k}]"), (*v).to_owned()));
        }
        self.call(
            reqwest::Method::POST,
            "v1/invoiceitems",
            &form,
            Some(idempotency_key),
        )
        .await
    }

    /// An Express connected account for an owner, able to receive transfers,
    /// `metadata[user_sub]` naming them. Keyed by the owner (`connect-account-<sub>`), so two
    /// racing requests get the one account.
    pub async fn create_account(
        &self,
        user_sub: &str,
        email: &str,
    ) -> Result<Account, StripeError> {
        let form = vec![
            ("type".into(), "express".into()),
            ("email".into(), email.to_owned()),
            ("capabilities[transfers][requested]".into(), "true".into()),
            ("metadata[user_sub]".into(), user_sub.to_owned()),
        ];
        self.call(
            reqwest::Method::POST,
            "v1/accounts",
            &form,
            Some(&format!("connect-account-{user_sub}")),
        )
        .await
    }

    pub async fn retrieve_account(&self, id: &str) -> Result<Account, StripeError> {
        self.call(
            reqwest::Method::GET,
            &format!("v1/accounts/{id}"),
            &[],
            None,
        )
        .await
    }

    /// A link to the account's onboarding on Stripe's pages. Each is single-use, so each
    /// call makes a new one (no derived key).
    pub async fn account_link(
        &self,
        account: &str,
        refresh_url: &str,
        return_url: &str,
    ) -> Result<AccountLink, StripeError> {
        let form = vec![
            ("account".into(), account.to_owned()),
            ("refresh_url".into(), refresh_url.to_owned()),
            ("return_url".into(), return_url.to_owned()),
            ("type".into(), "account_onboarding".into()),
        ];
        self.call(reqwest::Method::POST, "v1/account_links", &form, None)
            .await
    }

    /// The transfers made under `transfer_group` (a payout's), newest first.
    pub async fn transfers_in_group(
        &self,
        transfer_group: &str,
    ) -> Result<Vec<Transfer>, StripeError> {
        let form = vec![("transfer_group".into(), transfer_group.to_owned())];
        let list: List<Transfer> = self
            .call(reqwest::Method::GET, "v1/transfers", &form, None)
            .await?;
        Ok(list.data)
    }

    /// Transfer `amount` of the platform's balance to `destination`, under `transfer_group`
    /// and `idempotency_key`, `metadata` on the transfer.
    pub async fn create_transfer(
        &self,
        amount: i64,
        currency: &str,
        destination: &str,
        transfer_group: &str,
        metadata: &[(&str, &str)],
        idempotency_key: &str,
    ) -> Result<Transfer, StripeError> {
        let mut form: Vec<(String, String)> = vec![
            ("amount".into(), amount.to_string()),
            ("currency".into(), currency.to_owned()),
            ("destination".into(), destination.to_owned()),
            ("transfer_group".into(), transfer_group.to_owned()),
        ];
        for (k, v) in metadata {
            form.push((format!("metadata[{k}]"), (*v).to_owned()));
        }
        self.call(
            reqwest::Method::POST,
            "v1/transfers",
            &form,
            Some(idempotency_key),
        )
        .await
    }
}
