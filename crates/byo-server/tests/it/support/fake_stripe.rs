//! A fake Stripe API that keeps the real one's shapes: form-encoded requests with
//! `Authorization: Bearer sk_…`, objects with their `object` field (`customer`,
//! `checkout.session`, `setup_intent`, `invoiceitem`, `invoice`, `account`, `transfer`), expanded fields on `expand[]`, and
//! the error envelope `{error: {type, code, message, decline_code, param}}` — 401 for a wrong
//! key, 404 `resource_missing`, 402 `card_declined` with its `decline_code` (by fault
//! injection). Idempotency as Stripe keeps it: a POST's `Idempotency-Key` replayed with the
//! same parameters answers the first response again (and creates nothing); reused with
//! different parameters it is 400 `idempotency_error`. [`signature`] signs a webhook payload
//! exactly as Stripe does. `billing.rs` runs the server on it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use byo_server::providers::stripe::BillingConfig;
use serde_json::{Value, json};

pub const SECRET_KEY: &str = "sk_test_fake";
pub const WEBHOOK_SECRET: &str = "whsec_test_fake";

/// An error Stripe answers the next matching request with (fault injection).
#[derive(Clone, Debug)]
pub struct Fault {
    pub method: Method,
    pub path_prefix: String,
    pub status: StatusCode,
    pub kind: String,
    pub code: Option<String>,
    pub decline_code: Option<String>,
    /// Answer every matching request, not only the next.
    pub sticky: bool,
}

#[derive(Default)]
pub struct Fake {
    pub customers: BTreeMap<String, Value>,
    pub payment_methods: BTreeMap<String, Value>,
    pub sessions: BTreeMap<String, Value>,
    pub setup_intents: BTreeMap<String, Value>,
    /// Every invoice item created (a replayed key creates none); `invoice` is null while it
    /// is pending, then the invoice that took it.
    pub invoice_items: Vec<Value>,
    /// Every invoice, by id.
    pub invoices: BTreeMap<String, Value>,
    /// Payment intents a Checkout payment made: id → amount.
    pub payment_intents: BTreeMap<String, i64>,
    /// Every refund made (a replayed key makes none).
    pub refunds: Vec<Value>,
    /// Connected accounts (Connect, Express), by id.
    pub accounts: BTreeMap<String, Value>,
    /// Every onboarding link made, with the URLs it returns to.
    pub account_links: Vec<Value>,
    /// Every transfer made (a replayed key makes none), oldest first.
    pub transfers: Vec<Value>,
    /// The platform's available balance, which transfers draw on; None: enough for any.
    pub balance: Option<i64>,
    /// Customers whose card attaches but declines every charge (Stripe's test card
    /// 4000 0000 0000 0341).
    pub declining: std::collections::BTreeSet<String>,
    /// Idempotency-Key → (the request's parameters, the first response).
    pub idempotency: BTreeMap<String, (String, u16, Vec<u8>)>,
    /// Every request: method, path, Idempotency-Key.
    pub requests: Vec<(String, String, Option<String>)>,
    pub faults: Vec<Fault>,
    pub next: u32,
}

pub type Shared = Arc<Mutex<Fake>>;

impl Fake {
    fn id(&mut self, prefix: &str) -> String {
        self.next += 1;
        format!("{prefix}_{:08}", self.next)
    }

    /// A card, attached to `customer` (as a finished setup would leave it), not yet the
    /// default. `exp` is (year, month).
    pub fn add_card(&mut self, customer: &str, exp: (i32, u32)) -> String {
        let id = self.id("pm");
        self.payment_methods.insert(
            id.clone(),
            json!({"id": id, "object": "payment_method", "type": "card", "customer": customer,
                   "card": {"brand": "visa", "last4": "4242", "exp_year": exp.0, "exp_month": exp.1}}),
        );
        id
    }

    /// A finished Checkout session in setup mode for `customer`, its setup intent holding
    /// a new card: what `checkout.session.completed` carries.
    pub fn completed_setup(&mut self, customer: &str) -> (Value, String) {
        let pm = self.add_card(customer, (2099, 12));
        let si = self.id("seti");
        self.setup_intents.insert(
            si.clone(),
            json!({"id": si, "object": "setup_intent", "customer": customer, "payment_method": pm, "status": "succeeded"}),
        );
        let cs = self.id("cs_test");
        let session = json!({"id": cs, "object": "checkout.session", "mode": "setup",
                             "customer": customer, "setup_intent": si, "status": "complete",
                             "payment_status": "no_payment_required", "metadata": {}});
        self.sessions.insert(cs, session.clone());
        (session, pm)
    }

    /// The customer pays an open invoice on its hosted page (with a card that works): it is
    /// paid and the customer no longer delinquent. The invoice, as the webhooks carry it.
    pub fn pay_on_hosted_page(&mut self, invoice: &str) -> Value {
        let inv = self.invoices.get_mut(invoice).expect("the invoice");
        inv["status"] = json!("paid");
        inv["amount_paid"] = inv["amount_due"].clone();
        let inv = inv.clone();
        let customer = inv["customer"].as_str().unwrap().to_owned();
        self.declining.remove(&customer);
        self.customers.get_mut(&customer).unwrap()["delinquent"] = json!(false);
        inv
    }

    /// The owner finishes the account's onboarding on Stripe's pages: it takes transfers.
    pub fn finish_onboarding(&mut self, account: &str) {
        let a = self.accounts.get_mut(account).expect("the account");
        a["details_submitted"] = json!(true);
        a["payouts_enabled"] = json!(true);
        a["capabilities"]["transfers"] = json!("active");
    }

    /// A transfer Stripe made whose answer never reached us (the connection dropped).
    pub fn transfer_answered_to_nobody(
        &mut self,
        amount: i64,
        destination: &str,
        group: &str,
    ) -> String {
        let id = self.id("tr");
        self.transfers
            .push(json!({"id": id, "object": "transfer", "amount": amount,
            "currency": "usd", "destination": destination, "transfer_group": group,
            "metadata": {}, "reversed": false}));
        id
    }

    /// Make `pm` the customer's default, as the dashboard would.
    pub fn set_default(&mut self, customer: &str, pm: &str) {
        if let Some(c) = self.customers.get_mut(customer) {
            c["invoice_settings"]["default_payment_method"] = json!(pm);
        }
    }
}

fn error(status: StatusCode, kind: &str, code: Option<&str>, message: &str) -> Response {
    let mut e = json!({"type": kind, "message": message});
    if let Some(c) = code {
        e["code"] = json!(c);
    }
    (status, Json(json!({"error": e}))).into_response()
}

fn missing(what: &str, id: &str, param: &str) -> Response {
    let mut r = json!({"error": {"type": "invalid_request_error", "code": "resource_missing",
        "message": format!("No such {what}: '{id}'"), "param": param}});
    r["error"]["doc_url"] = json!("https://stripe.com/docs/error-codes/resource-missing");
    (StatusCode::NOT_FOUND, Json(r)).into_response()
}

/// Authentication, the request log, fault injection and idempotency, as Stripe does them
/// before any handler.
async fn front(State(s): State<Shared>, req: Request, next: Next) -> Response {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if auth.as_deref() != Some(&format!("Bearer {SECRET_KEY}")) {
        return error(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            None,
            "Invalid API Key provided",
        );
    }
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    {
        let mut f = s.lock().unwrap();
        f.requests
            .push((method.to_string(), path.clone(), key.clone()));
        if let Some(i) = f
            .faults
            .iter()
            .position(|x| x.method == method && path.starts_with(&x.path_prefix))
        {
            let fault = f.faults[i].clone();
            if !fault.sticky {
                f.faults.remove(i);
            }
            let mut e = json!({"type": fault.kind, "message": "injected by the fake"});
            if let Some(c) = &fault.code {
                e["code"] = json!(c);
                if c == "card_declined" {
                    e["message"] = json!("Your card was declined.");
                }
            }
            if let Some(d) = &fault.decline_code {
                e["decline_code"] = json!(d);
            }
            return (fault.status, Json(json!({"error": e}))).into_response();
        }
    }
    if method != Method::POST {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let params = format!("{path}?{}", String::from_utf8_lossy(&bytes));
    if let Some(k) = &key {
        let seen = s.lock().unwrap().idempotency.get(k).cloned();
        if let Some((first_params, status, body)) = seen {
            if first_params != params {
                return error(
                    StatusCode::BAD_REQUEST,
                    "idempotency_error",
                    None,
                    &format!(
                        "Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '{k}' if you meant to execute a different request."
                    ),
                );
            }
            let mut r = (StatusCode::from_u16(status).unwrap(), body).into_response();
            r.headers_mut()
                .insert("content-type", "application/json".parse().unwrap());
            r.headers_mut()
                .insert("idempotent-replayed", "true".parse().unwrap());
            return r;
        }
    }
    let response = next
        .run(Request::from_parts(parts, axum::body::Body::from(bytes)))
        .await;
    let Some(k) = key else { return response };
    let (parts, body) = response.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    // Stripe keeps the result of a request that got as far as running, errors included.
    s.lock()
        .unwrap()
        .idempotency
        .insert(k, (params, parts.status.as_u16(), bytes.to_vec()));
    Response::from_parts(parts, axum::body::Body::from(bytes))
}

type Form = axum::Form<Vec<(String, String)>>;

fn param<'a>(form: &'a [(String, String)], key: &str) -> Option<&'a str> {
    form.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// `metadata[k]=v` pairs as an object.
fn metadata(form: &[(String, String)]) -> Value {
    let mut m = serde_json::Map::new();
    for (k, v) in form {
        if let Some(inner) = k
            .strip_prefix("metadata[")
            .and_then(|r| r.strip_suffix(']'))
        {
            m.insert(inner.to_owned(), json!(v));
        }
    }
    Value::Object(m)
}

async fn create_customer(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let id = f.id("cus");
    let c = json!({"id": id, "object": "customer", "email": param(&form, "email"),
                   "metadata": metadata(&form), "delinquent": false,
                   "invoice_settings": {"default_payment_method": null}});
    f.customers.insert(id, c.clone());
    Json(c).into_response()
}

async fn get_customer(
    State(s): State<Shared>,
    Path(id): Path<String>,
    Query(q): Query<Vec<(String, String)>>,
) -> Response {
    let f = s.lock().unwrap();
    let Some(mut c) = f.customers.get(&id).cloned() else {
        return missing("customer", &id, "id");
    };
    if c["deleted"] == true {
        return Json(json!({"id": id, "object": "customer", "deleted": true})).into_response();
    }
    let expand = q
        .iter()
        .any(|(k, v)| k == "expand[]" && v == "invoice_settings.default_payment_method");
    if expand && let Some(pm) = c["invoice_settings"]["default_payment_method"].as_str() {
        c["invoice_settings"]["default_payment_method"] =
            f.payment_methods.get(pm).cloned().unwrap_or(Value::Null);
    }
    Json(c).into_response()
}

async fn update_customer(
    State(s): State<Shared>,
    Path(id): Path<String>,
    axum::Form(form): Form,
) -> Response {
    let mut f = s.lock().unwrap();
    if !f.customers.contains_key(&id) {
        return missing("customer", &id, "id");
    }
    if let Some(pm) = param(&form, "invoice_settings[default_payment_method]") {
        if !f.payment_methods.contains_key(pm) {
            return missing(
                "PaymentMethod",
                pm,
                "invoice_settings[default_payment_method]",
            );
        }
        let pm = pm.to_owned();
        f.set_default(&id, &pm);
    }
    Json(f.customers[&id].clone()).into_response()
}

async fn create_session(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let Some(mode) = param(&form, "mode") else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            "Missing required param: mode.",
        );
    };
    let Some(success_url) = param(&form, "success_url") else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            "Missing required param: success_url.",
        );
    };
    // Stripe refuses a URL without an explicit scheme, for both pages.
    let cancel_url = param(&form, "cancel_url");
    for url in std::iter::once(success_url).chain(cancel_url) {
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("url_invalid"),
                "Invalid URL: An explicit scheme (such as https) must be provided.",
            );
        }
    }
    let customer = param(&form, "customer").unwrap_or_default().to_owned();
    if !f.customers.contains_key(&customer) {
        return missing("customer", &customer, "customer");
    }
    let amount =
        param(&form, "line_items[0][price_data][unit_amount]").and_then(|a| a.parse::<i64>().ok());
    let id = f.id("cs_test");
    let session = json!({"id": id, "object": "checkout.session", "mode": mode,
        "customer": customer, "metadata": metadata(&form), "amount_total": amount,
        "currency": param(&form, "line_items[0][price_data][currency]"),
        "status": "open", "payment_status": "unpaid",
        "success_url": success_url, "cancel_url": cancel_url,
        "url": format!("https://checkout.stripe.test/c/pay/{id}")});
    f.sessions.insert(id, session.clone());
    Json(session).into_response()
}

async fn get_setup_intent(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    match s.lock().unwrap().setup_intents.get(&id) {
        Some(si) => Json(si.clone()).into_response(),
        None => missing("setupintent", &id, "intent"),
    }
}

async fn create_invoice_item(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let customer = param(&form, "customer").unwrap_or_default().to_owned();
    if !f.customers.contains_key(&customer) {
        return missing("customer", &customer, "customer");
    }
    let Some(amount) = param(&form, "amount").and_then(|a| a.parse::<i64>().ok()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("parameter_missing"),
            "Missing required param: amount.",
        );
    };
    let id = f.id("ii");
    let item = json!({"id": id, "object": "invoiceitem", "customer": customer, "invoice": null,
        "amount": amount, "currency": param(&form, "currency"),
        "description": param(&form, "description"), "metadata": metadata(&form),
        "period": {"start": param(&form, "period[start]").and_then(|v| v.parse::<i64>().ok()),
                   "end": param(&form, "period[end]").and_then(|v| v.parse::<i64>().ok())}});
    f.invoice_items.push(item.clone());
    Json(item).into_response()
}

fn invalid(message: &str) -> Response {
    error(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        None,
        message,
    )
}

/// `POST /v1/invoices`: a draft. Its lines are the customer's pending items only with
/// `pending_invoice_items_behavior=include`: since API version 2022-08-01 Stripe's default
/// leaves them out, and the invoice is empty.
async fn create_invoice(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let customer = param(&form, "customer").unwrap_or_default().to_owned();
    if !f.customers.contains_key(&customer) {
        return missing("customer", &customer, "customer");
    }
    let id = f.id("in");
    let include = param(&form, "pending_invoice_items_behavior") == Some("include");
    let mut total = 0;
    let mut lines = Vec::new();
    if include {
        for item in f.invoice_items.iter_mut() {
            if item["customer"] == json!(customer) && item["invoice"].is_null() {
                item["invoice"] = json!(id);
                total += item["amount"].as_i64().unwrap_or(0);
                lines.push(item["id"].clone());
            }
        }
    }
    let invoice = json!({"id": id, "object": "invoice", "customer": customer,
        "status": "draft", "total": total, "amount_due": total.max(0), "amount_paid": 0,
        "attempt_count": 0, "currency": param(&form, "currency"),
        "auto_advance": param(&form, "auto_advance") != Some("false"),
        "collection_method": param(&form, "collection_method").unwrap_or("charge_automatically"),
        "hosted_invoice_url": null, "metadata": metadata(&form),
        "lines": {"object": "list", "data": lines}});
    f.invoices.insert(id, invoice.clone());
    Json(invoice).into_response()
}

async fn get_invoice(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    match s.lock().unwrap().invoices.get(&id) {
        Some(i) => Json(i.clone()).into_response(),
        None => missing("invoice", &id, "invoice"),
    }
}

/// `POST /v1/invoices/{id}/finalize`: a draft becomes open with its hosted page, or paid at
/// once when there is nothing to collect; anything else is refused.
async fn finalize_invoice(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let mut f = s.lock().unwrap();
    let Some(inv) = f.invoices.get_mut(&id) else {
        return missing("invoice", &id, "invoice");
    };
    if inv["status"] != "draft" {
        return invalid(
            "This invoice is already finalized, you can't re-finalize a non-draft invoice.",
        );
    }
    let nothing_due = inv["amount_due"].as_i64().unwrap_or(0) == 0;
    inv["status"] = json!(if nothing_due { "paid" } else { "open" });
    inv["hosted_invoice_url"] = json!(format!("https://invoice.stripe.test/i/{id}"));
    Json(inv.clone()).into_response()
}

/// `POST /v1/invoices/{id}/pay` with the customer's default payment method: paid, or a 402
/// `card_declined` for a declining card (the invoice stays open, its `attempt_count` grows,
/// and the customer becomes `delinquent`).
async fn pay_invoice(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    let mut f = s.lock().unwrap();
    let Some(inv) = f.invoices.get(&id).cloned() else {
        return missing("invoice", &id, "invoice");
    };
    match inv["status"].as_str() {
        Some("open") | Some("uncollectible") => {}
        Some("paid") => return invalid("Invoice is already paid"),
        _ => return invalid("You can only pay an open invoice."),
    }
    let customer = inv["customer"].as_str().unwrap_or_default().to_owned();
    if f.customers[&customer]["invoice_settings"]["default_payment_method"].is_null() {
        return invalid("This customer has no attached payment source or default payment method.");
    }
    let inv = f.invoices.get_mut(&id).unwrap();
    inv["attempt_count"] = json!(inv["attempt_count"].as_i64().unwrap_or(0) + 1);
    if f.declining.contains(&customer) {
        f.customers.get_mut(&customer).unwrap()["delinquent"] = json!(true);
        let e = json!({"error": {"type": "card_error", "code": "card_declined",
            "decline_code": "generic_decline", "message": "Your card was declined.",
            "invoice": id}});
        return (StatusCode::PAYMENT_REQUIRED, Json(e)).into_response();
    }
    let inv = f.invoices.get_mut(&id).unwrap();
    inv["status"] = json!("paid");
    inv["amount_paid"] = inv["amount_due"].clone();
    let paid = inv.clone();
    f.customers.get_mut(&customer).unwrap()["delinquent"] = json!(false);
    Json(paid).into_response()
}

/// `POST /v1/refunds`: a refund of a payment intent, at most what it took in all
/// (`charge_already_refunded` past it).
async fn create_refund(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let pi = param(&form, "payment_intent")
        .unwrap_or_default()
        .to_owned();
    let Some(&paid) = f.payment_intents.get(&pi) else {
        return missing("payment_intent", &pi, "payment_intent");
    };
    let amount = param(&form, "amount")
        .and_then(|a| a.parse::<i64>().ok())
        .unwrap_or(paid);
    let refunded: i64 = f
        .refunds
        .iter()
        .filter(|r| r["payment_intent"] == json!(pi))
        .map(|r| r["amount"].as_i64().unwrap_or(0))
        .sum();
    if amount <= 0 || refunded + amount > paid {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("charge_already_refunded"),
            &format!("Charge for payment intent {pi} has already been refunded."),
        );
    }
    let id = f.id("re");
    let refund = json!({"id": id, "object": "refund", "amount": amount,
        "payment_intent": pi, "status": "succeeded", "metadata": metadata(&form)});
    f.refunds.push(refund.clone());
    Json(refund).into_response()
}

/// `POST /v1/accounts`: an Express account whose requested `transfers` capability stays
/// `inactive` until its owner finishes onboarding ([`Fake::finish_onboarding`]).
async fn create_account(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    if param(&form, "type") != Some("express") {
        return invalid("The account type must be one of standard, express or custom.");
    }
    let id = f.id("acct");
    let requested = param(&form, "capabilities[transfers][requested]") == Some("true");
    let mut capabilities = json!({});
    if requested {
        capabilities["transfers"] = json!("inactive");
    }
    let a = json!({"id": id, "object": "account", "type": "express",
        "email": param(&form, "email"), "metadata": metadata(&form),
        "details_submitted": false, "charges_enabled": false, "payouts_enabled": false,
        "capabilities": capabilities});
    f.accounts.insert(id, a.clone());
    Json(a).into_response()
}

async fn get_account(State(s): State<Shared>, Path(id): Path<String>) -> Response {
    match s.lock().unwrap().accounts.get(&id) {
        Some(a) => Json(a.clone()).into_response(),
        None => missing("account", &id, "account"),
    }
}

/// `POST /v1/account_links`: a single-use onboarding link for an existing account.
async fn create_account_link(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let account = param(&form, "account").unwrap_or_default().to_owned();
    if !f.accounts.contains_key(&account) {
        return missing("account", &account, "account");
    }
    if param(&form, "type") != Some("account_onboarding")
        || param(&form, "refresh_url").is_none()
        || param(&form, "return_url").is_none()
    {
        return invalid("Missing required param: type, refresh_url or return_url.");
    }
    let n = f.id("link");
    let link = json!({"object": "account_link", "created": 0, "expires_at": 300,
        "url": format!("https://connect.stripe.test/setup/e/{account}/{n}"),
        "account": account, "refresh_url": param(&form, "refresh_url"),
        "return_url": param(&form, "return_url")});
    f.account_links.push(link.clone());
    Json(link).into_response()
}

/// `POST /v1/transfers`: from the platform's balance to a connected account that takes
/// transfers; `balance_insufficient` past the balance.
async fn create_transfer(State(s): State<Shared>, axum::Form(form): Form) -> Response {
    let mut f = s.lock().unwrap();
    let destination = param(&form, "destination").unwrap_or_default().to_owned();
    let Some(account) = f.accounts.get(&destination) else {
        return missing("destination", &destination, "destination");
    };
    if account["capabilities"]["transfers"] != "active" {
        return error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some("insufficient_capabilities_for_transfer"),
            "Your destination account needs to have at least one of the following capabilities enabled: transfers, crypto_transfers, legacy_payments",
        );
    }
    let Some(amount) = param(&form, "amount").and_then(|a| a.parse::<i64>().ok()) else {
        return invalid("Missing required param: amount.");
    };
    if let Some(balance) = f.balance {
        if amount > balance {
            return error(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                Some("balance_insufficient"),
                "You have insufficient available funds in your Stripe account. Try adding funds directly to your available balance by creating Charges using the 4000000000000077 test card.",
            );
        }
        f.balance = Some(balance - amount);
    }
    let id = f.id("tr");
    let t = json!({"id": id, "object": "transfer", "amount": amount,
        "currency": param(&form, "currency"), "destination": destination,
        "transfer_group": param(&form, "transfer_group"), "metadata": metadata(&form),
        "reversed": false});
    f.transfers.push(t.clone());
    Json(t).into_response()
}

/// `GET /v1/transfers`: a list, newest first, filtered by `transfer_group` and
/// `destination` when given.
async fn list_transfers(
    State(s): State<Shared>,
    Query(q): Query<BTreeMap<String, String>>,
) -> Response {
    let f = s.lock().unwrap();
    let data: Vec<Value> = f
        .transfers
        .iter()
        .rev()
        .filter(|t| {
            q.get("transfer_group")
                .is_none_or(|g| t["transfer_group"] == json!(g))
        })
        .filter(|t| {
            q.get("destination")
                .is_none_or(|d| t["destination"] == json!(d))
        })
        .cloned()
        .collect();
    Json(json!({"object": "list", "url": "/v1/transfers", "has_more": false, "data": data}))
        .into_response()
}

/// The fake, on loopback, and a `[billing]` configuration pointing at it.
pub async fn start(price_cents_per_hour: u32) -> (Shared, BillingConfig) {
    let fake: Shared = Default::default();
    let app = Router::new()
        .route("/v1/customers", post(create_customer))
        .route(
            "/v1/customers/{id}",
            get(get_customer).post(update_customer),
        )
        .route("/v1/checkout/sessions", post(create_session))
        .route("/v1/setup_intents/{id}", get(get_setup_intent))
        .route("/v1/invoiceitems", post(create_invoice_item))
        .route("/v1/refunds", post(create_refund))
        .route("/v1/invoices", post(create_invoice))
        .route("/v1/invoices/{id}", get(get_invoice))
        .route("/v1/invoices/{id}/finalize", post(finalize_invoice))
        .route("/v1/invoices/{id}/pay", post(pay_invoice))
        .route("/v1/accounts", post(create_account))
        .route("/v1/accounts/{id}", get(get_account))
        .route("/v1/account_links", post(create_account_link))
        .route("/v1/transfers", post(create_transfer).get(list_transfers))
        .layer(axum::middleware::from_fn_with_state(fake.clone(), front))
        .with_state(fake.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    let config = BillingConfig {
        stripe_secret_key: SECRET_KEY.to_owned().into(),
        stripe_webhook_secret: WEBHOOK_SECRET.to_owned().into(),
        api_base: base,
        price_cents_per_hour,
        currency: "usd".into(),
        invoice_threshold_cents: 10_000,
        payment_grace_hours: 72,
        owner_share_bps: 7_000,
    };
    (fake, config)
}

/// `Stripe-Signature` for `payload` at unix time `t`, exactly as Stripe builds it:
/// `t=<t>,v1=<hex HMAC-SHA256 of "<t>.<payload>">` (plus a v0 Stripe also sends, which
/// verifiers ignore).
pub fn signature(secret: &str, t: i64, payload: &[u8]) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(payload);
    let v1 = hex::encode(mac.finalize().into_bytes());
    format!("t={t},v1={v1},v0=6ffbb59b2300aae63f272406069a9788598b792a944a07aba816edb039989a39")
}

/// A Stripe event envelope around `object`.
pub fn event(id: &str, kind: &str, object: Value, created: i64) -> Value {
    json!({"id": id, "object": "event", "api_version": "2024-06-20", "created": created,
           "type": kind, "livemode": false, "pending_webhooks": 1,
           "request": {"id": null, "idempotency_key": null},
           "data": {"object": object}})
}

/// Headers Stripe sends with a webhook.
pub fn webhook_headers(sig: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert("stripe-signature", sig.parse().unwrap());
    h.insert("content-type", "application/json".parse().unwrap());
    h
}

/// The raw body as bytes (the signature covers these exact bytes).
pub fn body(v: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(v).unwrap())
}
