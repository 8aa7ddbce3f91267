//! Billing on Stripe (issue #13, 4) against the fake Stripe (`support/fake_stripe.rs`), on
//! both databases: the webhook's refusals (bad signature, stale timestamp, replayed event,
//! unknown booking) each with nothing changed; a paid Checkout writing `paid_at` once; the
//! live check (E2) allowed and refused; usage from the four timestamps (E1 step 44, G.1,
//! G.3) with a retried job charging nothing twice; and billing off saying so.

use crate::support;
use crate::{on_each_backend, with_world};

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use byo_db::Backend;
use byo_db::vms::NewVm;
use byo_server::app::billing::{self, BILLING_OFF, Charge};
use byo_server::app::payouts;
use byo_server::clock::Clock;
use byo_server::providers::stripe::{StripeClient, StripeError};
use byo_server::{AppState, Config};
use chrono::{DateTime, TimeDelta, TimeZone, Utc};
use serde_json::{Value, json};
use support::agents::{FakeAgents, FakeHosts, Op};
use support::fake_stripe::{self, Fault, Shared, WEBHOOK_SECRET};
use support::{Reply, TestApp, User};

/// An hour costs $1.20.
const PRICE: u32 = 120;

struct World {
    app: TestApp,
    fake: Shared,
    clock: Clock,
    customer: User,
    /// The hosts' agents, for the instances an unpaid invoice stops and a payment starts.
    agents: std::sync::Arc<FakeAgents>,
}

fn start() -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 11, 1, 22, 0, 0).unwrap()
}

async fn world(backend: Backend) -> Option<World> {
    world_at(backend, PRICE).await
}

/// A world where an hour costs `price` cents.
async fn world_at(backend: Backend, price: u32) -> Option<World> {
    let (fake, billing) = fake_stripe::start(price).await;
    let config = Config {
        billing: Some(billing),
        ..support::test_config()
    };
    let db = byo_db::testing::fresh(backend).await?;
    let clock = Clock::manual(start());
    let agents = std::sync::Arc::new(FakeAgents::new().with_clock(clock.clone()));
    let state = AppState::new(db.store.clone(), config)
        .with_clock(clock.clone())
        .with_fake_hosts(&agents);
    let router = byo_server::router(state.clone());
    let app = TestApp { db, state, router };
    let customer = app.customer("payer@example.com").await;
    Some(World {
        app,
        fake,
        clock,
        customer,
        agents,
    })
}

impl World {
    fn db(&self) -> &byo_db::Store {
        &self.app.db.store
    }

    /// Every stored value, sorted: "nothing changed" is this, equal before and after.
    async fn dump(&self) -> Vec<(String, String, String)> {
        let mut all: Vec<_> = self
            .db()
            .dump_text()
            .await
            .unwrap()
            .into_iter()
            .map(|d| (d.table, d.column, d.value))
            .collect();
        all.sort();
        all
    }

    async fn webhook_raw(&self, signature: Option<&str>, body: &[u8]) -> Reply {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri("/api/stripe/webhook")
            .header("content-type", "application/json");
        if let Some(s) = signature {
            req = req.header("stripe-signature", s);
        }
        self.app
            .send(req.body(Body::from(body.to_vec())).unwrap())
            .await
    }

    /// An event signed now, as Stripe sends it.
    async fn webhook(&self, event: &Value) -> Reply {
        let body = serde_json::to_vec(event).unwrap();
        let sig = fake_stripe::signature(WEBHOOK_SECRET, self.clock.now().timestamp(), &body);
        self.webhook_raw(Some(&sig), &body).await
    }

    async fn booking(&self, id: &str, owner: &str) {
        self.db()
            .execute_unchecked(&format!(
                "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at)
                 values ('{id}', '{owner}', 'spark-1', '2026-11-10T00:00:00Z', '2026-11-12T12:00:00Z', '2026-11-01T00:00:00Z')"
            ))
            .await
            .unwrap();
    }

    async fn paid_at(&self, id: &str) -> Option<DateTime<Utc>> {
        self.db()
            .prebooking_for_billing(id)
            .await
            .unwrap()
            .unwrap()
            .paid_at
    }

    fn paid_session(&self, booking: &str, user_sub: &str) -> Value {
        json!({"id": "cs_test_paid", "object": "checkout.session", "mode": "payment",
               "payment_status": "paid", "status": "complete", "amount_total": 7200,
               "metadata": {"prebooking_id": booking, "user_sub": user_sub}})
    }

    /// The customer has a Stripe customer with a card as its default, as a finished setup
    /// leaves it.
    async fn chargeable(&self) -> String {
        // A fresh session: tests move the clock past a session's hour.
        let session = self.app.session_for(&self.customer.sub).await;
        let r = self
            .app
            .request(
                Method::POST,
                "/api/billing/payment-method",
                Some(&session),
                None,
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let cus = self
            .db()
            .stripe_customer(&self.customer.sub)
            .await
            .unwrap()
            .unwrap();
        let (session, _) = self.fake.lock().unwrap().completed_setup(&cus);
        let e = fake_stripe::event(
            "evt_setup",
            "checkout.session.completed",
            session,
            self.clock.now().timestamp(),
        );
        assert_eq!(self.webhook(&e).await.status, StatusCode::OK);
        cus
    }

    async fn may_charge(&self) -> Charge {
        self.app
            .state
            .billing
            .may_charge(&self.customer.sub)
            .await
            .unwrap()
    }

    async fn vm(&self, name: &str, at: DateTime<Utc>) -> String {
        let row = self
            .db()
            .create_vm(
                NewVm {
                    user_sub: &self.customer.sub,
                    host_id: None,
                    name,
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                at,
            )
            .await
            .unwrap();
        row.id
    }

    /// An instance made at the start, running, its delete asked `asked` later and confirmed
    /// `gone` later.
    async fn deleted_vm(&self, name: &str, asked: TimeDelta, gone: TimeDelta) -> String {
        let vm = self.vm(name, start()).await;
        self.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
        self.db()
            .request_vm_delete(&vm, start() + asked)
            .await
            .unwrap();
        self.db()
            .confirm_vm_deleted(&vm, start() + gone)
            .await
            .unwrap();
        vm
    }

    async fn bill(&self) -> billing::BillReport {
        billing::bill_usage_once(&self.app.state).await.unwrap()
    }

    /// Stripe's event `id` of `kind` about `object`, signed now.
    async fn send_event(&self, id: &str, kind: &str, object: Value) -> Reply {
        let e = fake_stripe::event(id, kind, object, self.clock.now().timestamp());
        self.webhook(&e).await
    }

    /// A host in service whose agent the fake answers, and an instance of the customer's
    /// running on it since the start.
    async fn running_on_a_host(&self, name: &str) -> String {
        self.running_on_a_host_of(name).await.0
    }

    /// [`Self::running_on_a_host`], with the host's owner.
    async fn running_on_a_host_of(&self, name: &str) -> (String, User) {
        let owner = self
            .app
            .community_host(&format!("{name}-owner@example.com"))
            .await;
        let host = self
            .db()
            .insert_host(
                byo_db::hosts::NewHost {
                    slug: &format!("{name}-host"),
                    owner_sub: &owner.sub,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                start(),
            )
            .await
            .unwrap()
            .id;
        let agent = byo_core::tokens::SecretToken::generate(byo_core::tokens::TokenKind::Agent);
        let sealed = self.app.state.sealer.as_ref().unwrap().seal(
            &byo_server::seal::SealedAt::agent_token(&host),
            agent.expose(),
        );
        self.db()
            .execute_unchecked(&format!(
                "update hosts set agent_token = '{sealed}' where id = '{host}'"
            ))
            .await
            .unwrap();
        self.db()
            .record_relay(
                &host,
                Some("10.8.0.1"),
                byo_wire::states::RelayState::Ready,
                None,
            )
            .await
            .unwrap();
        let vm = self
            .db()
            .create_vm(
                NewVm {
                    user_sub: &self.customer.sub,
                    host_id: Some(&host),
                    name,
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                start(),
            )
            .await
            .unwrap()
            .id;
        self.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
        (vm, owner)
    }

    async fn status_of(&self, vm: &str) -> byo_wire::states::VmStatus {
        self.db().vm(vm).await.unwrap().unwrap().status
    }

    /// The power calls the hosts were sent: (instance name, action).
    fn power_calls(&self) -> Vec<(String, byo_wire::vm::VmAction)> {
        self.agents
            .calls(Op::Power)
            .into_iter()
            .map(|c| (c.name, c.action.unwrap()))
            .collect()
    }

    /// The audit actions recorded about `target`, oldest first.
    async fn audited(&self, target: &str) -> Vec<String> {
        let mut rows: Vec<_> = self
            .db()
            .audit_log(1000)
            .await
            .unwrap()
            .into_iter()
            .filter(|a| a.target.as_deref() == Some(target))
            .collect();
        rows.sort_by_key(|a| a.at);
        rows.into_iter().map(|a| a.action).collect()
    }

    /// The notices raised for the customer: (kind, subject).
    async fn notices(&self) -> Vec<(String, String)> {
        self.db()
            .notices(Some(&self.customer.sub), 50)
            .await
            .unwrap()
            .into_iter()
            .map(|n| (n.kind, n.subject))
            .collect()
    }

    /// The customer starts `vm` (`POST /api/vms/{id}/state`).
    async fn start(&self, vm: &str) -> Reply {
        let session = self.app.session_for(&self.customer.sub).await;
        self.app
            .request(
                Method::POST,
                &format!("/api/vms/{vm}/state"),
                Some(&session),
                Some(json!({"action": "start"})),
            )
            .await
    }

    /// `path` as `sub` sees it now (a fresh session).
    async fn sees_as(&self, sub: &str, path: &str) -> Reply {
        let session = self.app.session_for(sub).await;
        let r = self
            .app
            .request(Method::GET, path, Some(&session), None)
            .await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text());
        r
    }

    /// `path` as the customer sees it now (a fresh session: tests move the clock past one).
    async fn now_sees(&self, path: &str) -> Reply {
        self.sees_as(&self.customer.sub, path).await
    }

    /// The customer pays `invoice` on Stripe's hosted page, and Stripe says so: the invoice
    /// as the events carried it.
    async fn pays_on_hosted_page(&self, invoice: &str) -> Value {
        let paid = self.fake.lock().unwrap().pay_on_hosted_page(invoice);
        for (id, kind) in [
            ("evt_p", "invoice.paid"),
            ("evt_ps", "invoice.payment_succeeded"),
        ] {
            let r = self.send_event(id, kind, paid.clone()).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        }
        paid
    }

    /// Until `vm` was started again and that audited, the release's last write (the
    /// webhook's release works in the background).
    async fn until_running(&self, vm: &str) {
        let began = std::time::Instant::now();
        while !self
            .audited(vm)
            .await
            .contains(&"billing.instance_started".to_owned())
        {
            assert!(
                began.elapsed() < std::time::Duration::from_secs(10),
                "the paid account's instance was not started again"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    /// The tables with a value not in `before` (a dump).
    async fn tables_changed_since(&self, before: &[(String, String, String)]) -> Vec<String> {
        self.dump()
            .await
            .into_iter()
            .filter(|d| !before.contains(d))
            .map(|d| d.0)
            .collect()
    }

    /// Dec 1, 00:15: November is over.
    fn december(&self) {
        let to = Utc.with_ymd_and_hms(2026, 12, 1, 0, 15, 0).unwrap();
        self.clock.advance(to - self.clock.now());
    }

    /// Midnight UTC plus a quarter hour on the first of January 2027: December has ended.
    fn january(&self) {
        let to = Utc.with_ymd_and_hms(2027, 1, 1, 0, 15, 0).unwrap();
        self.clock.advance(to - self.clock.now());
    }

    async fn pay_owners(&self) -> payouts::PayReport {
        payouts::pay_owners_once(&self.app.state).await.unwrap()
    }

    /// `POST path` as `sub` (a fresh session).
    async fn posts_as(&self, sub: &str, path: &str) -> Reply {
        let session = self.app.session_for(sub).await;
        self.app
            .request(Method::POST, path, Some(&session), None)
            .await
    }

    /// An owner with a host whose instance ran from `start()` until December, invoiced and
    /// paid in December, their Stripe account connected and (with `onboarded`) able to take
    /// transfers: (the owner, their account, what the invoice took for their host).
    async fn owner_paid_in_december(&self, onboarded: bool) -> (User, String, i64) {
        self.chargeable().await;
        let (vm, owner) = self.running_on_a_host_of("earning").await;
        let r = self.posts_as(&owner.sub, "/api/me/payouts/connect").await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        let account = self
            .db()
            .payout_account(&owner.sub)
            .await
            .unwrap()
            .expect("connected")
            .stripe_account_id;
        if onboarded {
            self.fake.lock().unwrap().finish_onboarding(&account);
        }
        self.december();
        let r = self.bill().await;
        assert_eq!((r.invoiced, r.invoices_paid), (1, 1), "{r:?}");
        let invoiced: i64 = self
            .db()
            .usage_charges(&vm)
            .await
            .unwrap()
            .iter()
            .map(|c| i64::from(c.amount_cents))
            .sum();
        (owner, account, invoiced)
    }

    fn transfers(&self) -> Vec<Value> {
        self.fake.lock().unwrap().transfers.clone()
    }

    fn invoice_items(&self) -> Vec<Value> {
        self.fake.lock().unwrap().invoice_items.clone()
    }
}

fn code(r: &Reply) -> String {
    r.json()["error"].as_str().unwrap_or_default().to_owned()
}

// ------------------------------------------------------------------ the webhook's refusals

async fn webhook_with_a_bad_signature_is_refused_and_changes_nothing(w: World) {
    w.booking("pb-1", &w.customer.sub).await;
    let event = fake_stripe::event(
        "evt_1",
        "checkout.session.completed",
        w.paid_session("pb-1", &w.customer.sub),
        w.clock.now().timestamp(),
    );
    let body = serde_json::to_vec(&event).unwrap();
    let now = w.clock.now().timestamp();
    let before = w.dump().await;
    // Signed with another secret; a payload changed after signing; no v1; no header at all.
    let tampered = {
        let mut e = event.clone();
        e["data"]["object"]["metadata"]["prebooking_id"] = json!("pb-other");
        serde_json::to_vec(&e).unwrap()
    };
    let cases: Vec<(Option<String>, Vec<u8>)> = vec![
        (
            Some(fake_stripe::signature("whsec_wrong", now, &body)),
            body.clone(),
        ),
        (
            Some(fake_stripe::signature(WEBHOOK_SECRET, now, &body)),
            tampered,
        ),
        (Some(format!("t={now}")), body.clone()),
        (None, body.clone()),
    ];
    for (sig, payload) in cases {
        let r = w.webhook_raw(sig.as_deref(), &payload).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
        assert_eq!(code(&r), "bad_signature");
    }
    assert_eq!(w.dump().await, before, "a refused webhook changes nothing");
    assert_eq!(w.paid_at("pb-1").await, None);
    assert_eq!(w.db().stripe_event_count().await.unwrap(), 0);
}

async fn webhook_with_a_stale_timestamp_is_refused_and_changes_nothing(w: World) {
    w.booking("pb-1", &w.customer.sub).await;
    let event = fake_stripe::event(
        "evt_1",
        "checkout.session.completed",
        w.paid_session("pb-1", &w.customer.sub),
        w.clock.now().timestamp(),
    );
    let body = serde_json::to_vec(&event).unwrap();
    let now = w.clock.now().timestamp();
    let before = w.dump().await;
    for t in [now - 301, now + 301] {
        let sig = fake_stripe::signature(WEBHOOK_SECRET, t, &body);
        let r = w.webhook_raw(Some(&sig), &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
        assert_eq!(code(&r), "stale_signature");
    }
    assert_eq!(w.dump().await, before, "a stale webhook changes nothing");
    assert_eq!(w.paid_at("pb-1").await, None);
    // At the edge of the tolerance it is accepted.
    let sig = fake_stripe::signature(WEBHOOK_SECRET, now - 300, &body);
    assert_eq!(
        w.webhook_raw(Some(&sig), &body).await.status,
        StatusCode::OK
    );
    assert_eq!(w.paid_at("pb-1").await, Some(w.clock.now()));
}

/// A correctly signed payload that is not an event Stripe could send (not JSON, no id or
/// type, an empty id, an id or type past 255 characters) is refused as `invalid_event`
/// and changes nothing, not even the events seen; 255 characters are accepted.
async fn a_signed_event_without_a_usable_id_or_type_is_refused_and_changes_nothing(w: World) {
    let now = w.clock.now().timestamp();
    let long = "e".repeat(256);
    let object = json!({"object": "customer"});
    let mut bodies = vec![b"not json".to_vec()];
    for event in [
        json!({"type": "customer.created", "data": {"object": object}}),
        json!({"id": "evt_no_type", "data": {"object": object}}),
        fake_stripe::event("", "customer.created", object.clone(), now),
        fake_stripe::event(&long, "customer.created", object.clone(), now),
        fake_stripe::event("evt_long_type", &long, object.clone(), now),
    ] {
        bodies.push(serde_json::to_vec(&event).unwrap());
    }
    let before = w.dump().await;
    for body in bodies {
        let sig = fake_stripe::signature(WEBHOOK_SECRET, now, &body);
        let r = w.webhook_raw(Some(&sig), &body).await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{}: {}",
            String::from_utf8_lossy(&body),
            r.text()
        );
        assert_eq!(code(&r), "invalid_event");
    }
    assert_eq!(w.dump().await, before, "a refused event changes nothing");
    assert_eq!(w.db().stripe_event_count().await.unwrap(), 0);
    let edge = "e".repeat(255);
    let r = w
        .webhook(&fake_stripe::event(&edge, &edge, object, now))
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.db().stripe_event_count().await.unwrap(), 1);
}

async fn checkout_completed_writes_paid_at_once_and_a_replay_changes_nothing(w: World) {
    w.booking("pb-1", &w.customer.sub).await;
    let event = fake_stripe::event(
        "evt_paid",
        "checkout.session.completed",
        w.paid_session("pb-1", &w.customer.sub),
        w.clock.now().timestamp(),
    );
    let first = w.webhook(&event).await;
    assert_eq!(first.status, StatusCode::OK, "{}", first.text());
    assert_eq!(first.json()["replayed"], false);
    let paid = w.clock.now();
    assert_eq!(w.paid_at("pb-1").await, Some(paid));

    // Stripe delivers the same event again, later, freshly signed.
    w.clock.advance(TimeDelta::minutes(5));
    let before = w.dump().await;
    let again = w.webhook(&event).await;
    assert_eq!(again.status, StatusCode::OK, "{}", again.text());
    assert_eq!(again.json()["replayed"], true);
    assert_eq!(w.dump().await, before, "a replayed event changes nothing");
    assert_eq!(w.paid_at("pb-1").await, Some(paid));

    // Another event paying the same booking: recorded, but paid_at keeps the first payment.
    let other = fake_stripe::event(
        "evt_paid_2",
        "checkout.session.completed",
        w.paid_session("pb-1", &w.customer.sub),
        w.clock.now().timestamp(),
    );
    assert_eq!(w.webhook(&other).await.status, StatusCode::OK);
    assert_eq!(w.paid_at("pb-1").await, Some(paid));
}

async fn a_payment_for_an_unknown_or_unpaid_or_foreign_booking_writes_nothing(w: World) {
    w.booking("pb-1", &w.customer.sub).await;
    let other = w.app.customer("other@example.com").await;
    let before = w.dump().await;
    // Unknown booking: 200 (Stripe must not retry), logged, nothing written but the event.
    let unknown = fake_stripe::event(
        "evt_unknown",
        "checkout.session.completed",
        w.paid_session("pb-missing", &w.customer.sub),
        w.clock.now().timestamp(),
    );
    assert_eq!(w.webhook(&unknown).await.status, StatusCode::OK);
    // Not paid yet (an asynchronous method); another account's payment for this booking.
    let mut unpaid = w.paid_session("pb-1", &w.customer.sub);
    unpaid["payment_status"] = json!("unpaid");
    let unpaid = fake_stripe::event(
        "evt_unpaid",
        "checkout.session.completed",
        unpaid,
        w.clock.now().timestamp(),
    );
    assert_eq!(w.webhook(&unpaid).await.status, StatusCode::OK);
    let foreign = fake_stripe::event(
        "evt_foreign",
        "checkout.session.completed",
        w.paid_session("pb-1", &other.sub),
        w.clock.now().timestamp(),
    );
    assert_eq!(w.webhook(&foreign).await.status, StatusCode::OK);
    assert_eq!(w.paid_at("pb-1").await, None);
    let changed: Vec<_> = w
        .dump()
        .await
        .into_iter()
        .filter(|v| !before.contains(v))
        .map(|(t, _, _)| t)
        .collect();
    assert!(
        changed.iter().all(|t| t == "stripe_events"),
        "only the events were recorded: {changed:?}"
    );
}

// ------------------------------------------------------------- checkout and the live check

/// Issue #40 (3): one billing gate for every create a customer asks for. With billing on
/// and no payment method, a dashboard create (which would queue: no host exists), a booking
/// and the page's create form are refused 402 `payment_required`, saying why and where to
/// fix it (the page links to /billing), and nothing is written anywhere. A Stripe outage
/// refuses too, as an error, and writes nothing. Once a card is on file the same requests
/// pass the gate (the create queues; the booking goes on to its own rules).
async fn e_one_billing_gate_for_every_create_and_booking(w: World) {
    let r = w
        .customer
        .post(
            "/api/ssh-keys",
            json!({"name": "laptop", "public_key": byo_core::keylist_testing::public_key_line()}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
    let key = r.json()["id"].as_str().unwrap().to_owned();
    let create = json!({"gpu_type": "spark-1", "ssh_key_id": key});
    let book = json!({"gpu_type": "spark-1", "start_date": "2026-11-10T00:00:00Z",
                      "end_date": "2026-11-11T00:00:00Z"});
    let before = w.dump().await;
    for (path, body) in [("/api/vms", &create), ("/api/prebookings", &book)] {
        let r = w.customer.post(path, body.clone()).await;
        assert_eq!(
            r.status,
            StatusCode::PAYMENT_REQUIRED,
            "{path}: {}",
            r.text()
        );
        assert_eq!(r.json()["error"], "payment_required", "{path}");
        let message = r.json()["message"].as_str().unwrap().to_owned();
        assert!(
            message.starts_with("no payment method")
                && message.contains("Nothing was created, queued or booked")
                && message.contains("/billing"),
            "{path}: {message}"
        );
    }
    let r = w
        .customer
        .post_form(
            "/instances",
            &[("gpu_type", "spark-1"), ("ssh_key_id", &key)],
        )
        .await;
    assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());
    assert!(r.text().contains("href=\"/billing\""), "{}", r.text());
    assert!(r.text().contains("Add a payment method"));
    assert_eq!(w.dump().await, before, "a refusal writes nothing");

    // A card on file: the gate lets both through.
    w.chargeable().await;
    let r = w.customer.post("/api/vms", create.clone()).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "queued: {}", r.text());
    let r = w.customer.post("/api/prebookings", book.clone()).await;
    assert_ne!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());

    // Stripe not answering: no create on an unverified account, and nothing written.
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::GET,
        path_prefix: "/v1/customers".into(),
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: true,
    });
    let before = w.dump().await;
    let r = w.customer.post("/api/vms", create.clone()).await;
    assert!(r.status.is_server_error(), "{}", r.text());
    assert_eq!(w.dump().await, before);
}

async fn the_live_check_allows_a_customer_with_a_default_card(w: World) {
    assert_eq!(
        w.may_charge().await,
        Charge::Refused {
            reason: "no payment method: add one on the Billing page".into()
        },
        "no Stripe customer yet"
    );
    let r = w.customer.post_empty("/api/billing/payment-method").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(
        r.json()["url"]
            .as_str()
            .unwrap()
            .starts_with("https://checkout.stripe.test/")
    );
    {
        // Stripe sends the person back to the Billing page, told the card was added.
        let f = w.fake.lock().unwrap();
        let s = f.sessions.values().last().unwrap();
        assert_eq!(s["mode"], "setup");
        assert_eq!(s["success_url"], "http://localhost:8080/billing?added=1");
        assert_eq!(s["cancel_url"], "http://localhost:8080/billing");
    }
    let cus = w
        .db()
        .stripe_customer(&w.customer.sub)
        .await
        .unwrap()
        .unwrap();
    {
        let f = w.fake.lock().unwrap();
        assert_eq!(
            f.customers[&cus]["metadata"]["user_sub"],
            json!(w.customer.sub)
        );
        let session = f.sessions.values().last().unwrap();
        assert_eq!(session["mode"], "setup");
        assert_eq!(session["customer"], json!(cus));
    }
    // A customer, but no card yet.
    assert!(matches!(w.may_charge().await, Charge::Refused { .. }));
    // A second request reuses the customer.
    w.customer.post_empty("/api/billing/payment-method").await;
    assert_eq!(w.fake.lock().unwrap().customers.len(), 1);

    let (session, pm) = w.fake.lock().unwrap().completed_setup(&cus);
    let e = fake_stripe::event(
        "evt_setup",
        "checkout.session.completed",
        session,
        w.clock.now().timestamp(),
    );
    // Stripe is down while the event is processed: 5xx, the event left unfinished …
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::GET,
        path_prefix: "/v1/setup_intents/".into(),
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: false,
    });
    assert_eq!(
        w.webhook(&e).await.status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert!(matches!(w.may_charge().await, Charge::Refused { .. }));
    // … so Stripe's retry processes it.
    let r = w.webhook(&e).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["replayed"], false);
    assert_eq!(
        w.fake.lock().unwrap().customers[&cus]["invoice_settings"]["default_payment_method"],
        json!(pm)
    );
    assert_eq!(w.may_charge().await, Charge::Allowed);
    // A replay after that asks nothing of Stripe.
    let calls = w.fake.lock().unwrap().requests.len();
    let r = w.webhook(&e).await;
    assert_eq!(r.json()["replayed"], true);
    assert_eq!(w.fake.lock().unwrap().requests.len(), calls);
    let view = w.customer.get("/api/billing").await.json();
    assert_eq!(
        view,
        json!({"enabled": true, "chargeable": true,
               "payment_method": "visa ending 4242, expires 12/2099",
               "this_month": {"since": "2026-11-01T00:00:00Z", "currency": "usd",
                              "total_cents": 0, "instances": []}})
    );
    let page = w.customer.page("/billing").await;
    assert!(page.contains("billing-ok"), "{page}");
}

async fn the_live_check_refuses_declined_expired_and_missing_customers(w: World) {
    let cus = w.chargeable().await;
    assert_eq!(w.may_charge().await, Charge::Allowed);
    // The last payment was declined: Stripe marks the customer delinquent.
    w.fake.lock().unwrap().customers.get_mut(&cus).unwrap()["delinquent"] = json!(true);
    let Charge::Refused { reason } = w.may_charge().await else {
        panic!("a delinquent customer may not be charged")
    };
    assert!(reason.contains("declined"), "{reason}");
    let page = w.customer.page("/billing").await;
    assert!(
        page.contains("billing-refused") && page.contains("declined"),
        "{page}"
    );
    // An expired card.
    {
        let mut f = w.fake.lock().unwrap();
        f.customers.get_mut(&cus).unwrap()["delinquent"] = json!(false);
        let pm = f.add_card(&cus, (2025, 6));
        f.set_default(&cus, &pm);
    }
    let Charge::Refused { reason } = w.may_charge().await else {
        panic!("an expired card may not be charged")
    };
    assert!(reason.contains("expired"), "{reason}");
    // The customer is gone at Stripe: 404 resource_missing.
    w.fake.lock().unwrap().customers.remove(&cus);
    let Charge::Refused { reason } = w.may_charge().await else {
        panic!("a missing customer may not be charged")
    };
    assert!(reason.contains("no longer exists"), "{reason}");
    // Stripe is down: not a refusal but an error, so the drain leaves its row queued.
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::GET,
        path_prefix: "/v1/customers/".into(),
        status: StatusCode::INTERNAL_SERVER_ERROR,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: true,
    });
    assert!(
        w.app
            .state
            .billing
            .may_charge(&w.customer.sub)
            .await
            .is_err()
    );
}

async fn a_booking_checkout_charges_its_window_at_the_hourly_price(w: World) {
    w.booking("pb-1", &w.customer.sub).await;
    let r = w
        .customer
        .post_empty("/api/prebookings/pb-1/checkout")
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    {
        let f = w.fake.lock().unwrap();
        let s = f.sessions.values().last().unwrap();
        assert_eq!(s["mode"], "payment");
        // 2026-11-10 00:00 → 2026-11-12 12:00: 60 hours at $1.20.
        assert_eq!(s["amount_total"], json!(60 * i64::from(PRICE)));
        assert_eq!(s["metadata"]["prebooking_id"], "pb-1");
        assert_eq!(s["metadata"]["user_sub"], json!(w.customer.sub));
        assert_eq!(s["success_url"], "http://localhost:8080/billing?paid=1");
        assert_eq!(s["cancel_url"], "http://localhost:8080/billing");
    }
    // Someone else's booking is not found; nothing is made at Stripe for it.
    let other = w.app.customer("other@example.com").await;
    let sessions = w.fake.lock().unwrap().sessions.len();
    let r = other.post_empty("/api/prebookings/pb-1/checkout").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(w.fake.lock().unwrap().sessions.len(), sessions);
    // Paid: refused.
    w.db()
        .mark_prebooking_paid("pb-1", w.clock.now())
        .await
        .unwrap();
    let r = w
        .customer
        .post_empty("/api/prebookings/pb-1/checkout")
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(code(&r), "already_paid");
    assert_eq!(w.fake.lock().unwrap().sessions.len(), sessions);
    // Unpaid but closed: cancelled before its window, or its window over. Each is
    // refused on its own, nothing made at Stripe and nothing written.
    w.booking("pb-cancelled", &w.customer.sub).await;
    w.db()
        .execute_unchecked(
            "update prebookings set closed_at = '2026-11-01T21:00:00Z', closed_reason = 'cancelled' where id = 'pb-cancelled'",
        )
        .await
        .unwrap();
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at)
             values ('pb-over', '{}', 'spark-1', '2026-10-20T00:00:00Z', '2026-11-01T22:00:00Z', '2026-10-01T00:00:00Z')",
            w.customer.sub
        ))
        .await
        .unwrap();
    let before = w.dump().await;
    for id in ["pb-cancelled", "pb-over"] {
        let r = w
            .customer
            .post_empty(&format!("/api/prebookings/{id}/checkout"))
            .await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{id}: {}", r.text());
        assert_eq!(code(&r), "booking_closed", "{id}");
    }
    assert_eq!(w.fake.lock().unwrap().sessions.len(), sessions);
    assert_eq!(w.dump().await, before);
}

async fn stripe_errors_keep_their_envelope(w: World) {
    let config = w.app.state.config.billing.clone().unwrap();
    let client = StripeClient::new(&config);
    // A decline, as Stripe answers a card error.
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::POST,
        path_prefix: "/v1/customers".into(),
        status: StatusCode::PAYMENT_REQUIRED,
        kind: "card_error".into(),
        code: Some("card_declined".into()),
        decline_code: Some("insufficient_funds".into()),
        sticky: false,
    });
    let e = client
        .create_customer("sub-1", "a@example.com")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StripeError::Api { status: 402, kind, code: Some(c), decline_code: Some(d), .. }
            if kind == "card_error" && c == "card_declined" && d == "insufficient_funds"),
        "{e:?}"
    );
    assert!(!e.is_outage());
    // The same Idempotency-Key (a customer per account) replays the first answer …
    let a = client
        .create_customer("sub-1", "a@example.com")
        .await
        .unwrap();
    let b = client
        .create_customer("sub-1", "a@example.com")
        .await
        .unwrap();
    assert_eq!(a.id, b.id);
    assert_eq!(w.fake.lock().unwrap().customers.len(), 1);
    // … and with other parameters is Stripe's idempotency_error.
    let e = client
        .create_customer("sub-1", "b@example.com")
        .await
        .unwrap_err();
    assert!(
        matches!(&e, StripeError::Api { status: 400, kind, .. } if kind == "idempotency_error"),
        "{e:?}"
    );
    // resource_missing.
    let e = client.retrieve_customer("cus_nope").await.unwrap_err();
    assert_eq!(e.code(), Some("resource_missing"));
    // Every POST carried a key.
    assert!(
        w.fake
            .lock()
            .unwrap()
            .requests
            .iter()
            .filter(|(m, _, _)| m == "POST")
            .all(|(_, _, k)| k.is_some())
    );
}

// ------------------------------------------------------------------------------ usage

async fn usage_is_charged_from_the_four_timestamps(w: World) {
    let cus = w.chargeable().await;
    // Created at 22:00 on Nov 1 (step 44's stamp), running.
    let vm = w.vm("kept", start()).await;
    w.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
    // A create that failed bills nothing.
    let failed = w.vm("never", start()).await;
    w.db()
        .mark_vm_creation_failed(&failed, start() + TimeDelta::minutes(1))
        .await
        .unwrap();

    // Nov 2, 01:00: Nov 1 is final (2 h); Nov 2 is still running.
    w.clock.advance(TimeDelta::hours(3));
    let r = w.bill().await;
    assert_eq!((r.charged, r.closed), (1, 0));
    let items = w.invoice_items();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["customer"], json!(cus));
    assert_eq!(items[0]["amount"], json!(2 * i64::from(PRICE)));
    assert_eq!(items[0]["metadata"]["vm_id"], json!(vm));
    assert!(w.db().usage_charges(&failed).await.unwrap().is_empty());

    // Deleted at 03:00, confirmed only at 05:00: a stuck delete (past 10 minutes).
    w.db()
        .request_vm_delete(&vm, start() + TimeDelta::hours(5))
        .await
        .unwrap();
    w.clock.advance(TimeDelta::hours(4)); // 05:00
    w.db().confirm_vm_deleted(&vm, w.clock.now()).await.unwrap();
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (1, 1, 1));
    let items = w.invoice_items();
    assert_eq!(items.len(), 3);
    // Nov 2: 00:00 → 05:00, billed until deleted_at (G.1) …
    assert_eq!(items[1]["amount"], json!(5 * i64::from(PRICE)));
    // … and the two hours from the customer's request to the host's confirmation credited.
    assert_eq!(items[2]["amount"], json!(-2 * i64::from(PRICE)));
    assert_eq!(items[2]["metadata"]["kind"], "stuck_delete_refund");
    let refund = w.db().refund_for(&vm).await.unwrap().unwrap();
    assert_eq!(refund.from_at, start() + TimeDelta::hours(5));
    assert_eq!(refund.to_at, start() + TimeDelta::hours(7));
    assert_eq!(refund.amount_cents, 2 * i32::try_from(PRICE).unwrap());
    assert!(w.db().billing_closed(&vm).await.unwrap());
    // Nothing more to do.
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (0, 0, 0));
    assert_eq!(w.invoice_items().len(), 3);
}

async fn a_prompt_delete_is_not_refunded(w: World) {
    w.chargeable().await;
    let vm = w
        .deleted_vm("quick", TimeDelta::minutes(30), TimeDelta::minutes(31))
        .await;
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (1, 0, 1));
    // 31 minutes at $1.20/h = 62 cents.
    assert_eq!(w.invoice_items()[0]["amount"], json!(62));
    assert!(w.db().refund_for(&vm).await.unwrap().is_none());
}

async fn a_retried_job_never_charges_twice(w: World) {
    w.chargeable().await;
    let vm = w.vm("kept", start()).await;
    w.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
    w.clock.advance(TimeDelta::days(2));
    let r = w.bill().await;
    assert_eq!(r.charged, 2, "Nov 1 and Nov 2");
    let charged = w.invoice_items();
    // The run again: nothing new.
    assert_eq!(w.bill().await.charged, 0);
    assert_eq!(w.invoice_items(), charged);
    // A run that reached Stripe but died before recording it: the retry sends the same
    // Idempotency-Key, Stripe answers the first item, nothing is charged twice.
    w.db()
        .execute_unchecked("delete from usage_charges")
        .await
        .unwrap();
    assert_eq!(w.bill().await.charged, 2);
    assert_eq!(w.invoice_items(), charged, "no second invoice item");
    let rows = w.db().usage_charges(&vm).await.unwrap();
    let ids: Vec<_> = rows
        .iter()
        .map(|r| json!(r.stripe_invoice_item_id))
        .collect();
    let first: Vec<_> = charged.iter().map(|i| i["id"].clone()).collect();
    assert_eq!(ids, first, "the rows name the first items");
    // A Stripe outage part-way leaves the instance for later, and the run is a failure.
    w.clock.advance(TimeDelta::days(1));
    assert_eq!(
        run_in_an_outage(&w).await,
        "charged 0, refunded 0, closed 0, invoiced 0, 1 failed (first: stripe: 503 api_error: injected by the fake)"
    );
    assert_eq!(w.db().usage_charges(&vm).await.unwrap().len(), 2);
    assert_eq!(w.bill().await.charged, 1);
    assert_eq!(w.invoice_items().len(), 3);
}

/// A run during which Stripe answers the next invoice item 503: the run's error message,
/// which counts what it did and what failed.
async fn run_in_an_outage(w: &World) -> String {
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::POST,
        path_prefix: "/v1/invoiceitems".into(),
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: false,
    });
    failed_run(w).await
}

/// A run that ends in an error: its message, which counts what it did and what failed.
async fn failed_run(w: &World) -> String {
    match billing::bill_usage_once(&w.app.state).await {
        Err(byo_server::error::AppError::Internal(e)) => e.to_string(),
        other => panic!("expected the run to fail, got {other:?}"),
    }
}

/// Deleted within its first day and confirmed late: the period and the credit in one run,
/// the credit taken from the charge this run made.
async fn a_stuck_delete_is_charged_and_credited_in_one_run(w: World) {
    w.chargeable().await;
    let vm = w
        .deleted_vm("brief", TimeDelta::minutes(30), TimeDelta::hours(1))
        .await;
    w.clock.advance(TimeDelta::minutes(90));
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (1, 1, 1));
    assert_eq!(
        w.db().refund_for(&vm).await.unwrap().unwrap().amount_cents,
        i32::try_from(PRICE / 2).unwrap()
    );
    let amounts: Vec<_> = w
        .invoice_items()
        .iter()
        .map(|i| i["amount"].clone())
        .collect();
    assert_eq!(amounts, [json!(PRICE), json!(-i64::from(PRICE) / 2)]);
}

/// At a cent an hour, twelve minutes are worth nothing (half a cent rounds up only from
/// 30 minutes): the period and the stuck delete's credit are recorded at 0, and Stripe is
/// sent no item of 0 for either.
async fn a_period_or_credit_worth_nothing_is_recorded_and_not_sent(w: World) {
    w.chargeable().await;
    let vm = w
        .deleted_vm("blink", TimeDelta::minutes(1), TimeDelta::minutes(12))
        .await;
    w.clock.advance(TimeDelta::minutes(13));
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (1, 1, 1));
    assert!(w.invoice_items().is_empty(), "{:?}", w.invoice_items());
    let rows = w.db().usage_charges(&vm).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].seconds, rows[0].amount_cents), (720, 0));
    assert_eq!(rows[0].stripe_invoice_item_id, None);
    let refund = w.db().refund_for(&vm).await.unwrap().unwrap();
    assert_eq!((refund.seconds, refund.amount_cents), (660, 0));
    assert_eq!(refund.stripe_credit_id, None);
}

mod a_period_or_credit_worth_nothing_is_recorded_and_not_sent {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite() {
        if let Some(w) = super::world_at(byo_db::Backend::Sqlite, 1).await {
            super::a_period_or_credit_worth_nothing_is_recorded_and_not_sent(w).await
        }
    }
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn postgres() {
        if let Some(w) = super::world_at(byo_db::Backend::Postgres, 1).await {
            super::a_period_or_credit_worth_nothing_is_recorded_and_not_sent(w).await
        }
    }
}

/// The credit failing at Stripe (its periods charged in an earlier run) fails the run,
/// counted, and leaves the instance open for the next run, which credits it once.
async fn a_failed_credit_is_counted_and_left_for_the_next_run(w: World) {
    w.chargeable().await;
    // Created 22:00, delete asked 23:00, confirmed exactly at midnight: Nov 1 is all it
    // used, charged before the confirmation; the later run has only the credit to send.
    let vm = w.vm("late", start()).await;
    w.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
    w.db()
        .request_vm_delete(&vm, start() + TimeDelta::hours(1))
        .await
        .unwrap();
    w.clock.advance(TimeDelta::hours(2));
    assert_eq!(w.bill().await.charged, 1);
    w.db()
        .confirm_vm_deleted(&vm, start() + TimeDelta::hours(2))
        .await
        .unwrap();
    assert_eq!(
        run_in_an_outage(&w).await,
        "charged 0, refunded 0, closed 0, invoiced 0, 1 failed (first: stripe: 503 api_error: injected by the fake)"
    );
    assert!(w.db().refund_for(&vm).await.unwrap().is_none());
    assert!(!w.db().billing_closed(&vm).await.unwrap());
    let r = w.bill().await;
    assert_eq!((r.charged, r.refunded, r.closed), (0, 1, 1));
    let amounts: Vec<_> = w
        .invoice_items()
        .iter()
        .map(|i| i["amount"].clone())
        .collect();
    assert_eq!(
        amounts,
        [json!(2 * i64::from(PRICE)), json!(-i64::from(PRICE))]
    );
}

async fn usage_waits_for_an_account_without_a_customer(w: World) {
    let vm = w.vm("kept", start()).await;
    w.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
    w.clock.advance(TimeDelta::hours(3)); // Nov 1 is final
    let r = w.bill().await;
    assert_eq!((r.charged, r.no_customer), (0, 1));
    // Once the account has a customer, the owed days are charged.
    w.chargeable().await;
    assert_eq!(w.bill().await.charged, 1);
}

// ---------------------------------------------------------------------------- invoices

/// The one invoice at the fake, and our row of it.
async fn the_invoice(w: &World) -> (Value, byo_db::invoices::InvoiceRow) {
    let invoices: Vec<Value> = w.fake.lock().unwrap().invoices.values().cloned().collect();
    assert_eq!(invoices.len(), 1, "{invoices:?}");
    let sid = invoices[0]["id"].as_str().unwrap();
    let row = w.db().invoice_by_stripe_id(sid).await.unwrap().unwrap();
    (invoices[0].clone(), row)
}

/// POSTs the fake saw to a path ending with `suffix`, with their keys.
fn posts_to(w: &World, suffix: &str) -> Vec<Option<String>> {
    w.fake
        .lock()
        .unwrap()
        .requests
        .iter()
        .filter(|(m, p, _)| m == "POST" && p.ends_with(suffix))
        .map(|(_, _, k)| k.clone())
        .collect()
}

async fn usage_is_invoiced_at_the_threshold_and_when_its_month_ends(w: World) {
    let cus = w.chargeable().await;
    let vm = w.vm("kept", start()).await;
    w.db().mark_vm_running(&vm, Some(2222)).await.unwrap();
    // Nov 5, 01:00: Nov 1 (2 h) and three full days, $88.80, under the $100 threshold.
    w.clock.advance(TimeDelta::hours(3 + 72));
    let r = w.bill().await;
    assert_eq!((r.charged, r.invoiced), (4, 0));
    assert!(w.fake.lock().unwrap().invoices.is_empty());
    // Nov 6, 01:00: one more day, $117.60: invoiced now, paid with the default card.
    w.clock.advance(TimeDelta::days(1));
    let r = w.bill().await;
    assert_eq!(
        (r.charged, r.invoiced, r.invoices_paid, r.payments_failed),
        (1, 1, 1, 0)
    );
    let (inv, row) = the_invoice(&w).await;
    assert_eq!(inv["customer"], json!(cus));
    assert_eq!(inv["status"], "paid");
    assert_eq!(inv["total"], json!(11_760));
    assert_eq!(inv["auto_advance"], json!(false));
    assert_eq!(inv["metadata"]["invoice_id"], json!(row.id));
    assert_eq!(inv["lines"]["data"].as_array().unwrap().len(), 5);
    assert_eq!(
        (
            row.reason.as_str(),
            row.amount_cents,
            row.stripe_total_cents
        ),
        ("threshold", 11_760, Some(11_760))
    );
    assert_eq!(row.status, byo_wire::states::InvoiceStatus::Paid);
    assert_eq!(row.paid_at, Some(w.clock.now()));
    assert_eq!(row.pay_attempted_at, Some(w.clock.now()));
    assert_eq!(
        row.hosted_invoice_url,
        inv["hosted_invoice_url"].as_str().map(str::to_owned)
    );
    for c in w.db().usage_charges(&vm).await.unwrap() {
        assert_eq!(c.invoice_id.as_deref(), Some(row.id.as_str()));
    }
    // Each call under the key derived from our invoice's id.
    assert_eq!(
        posts_to(&w, "/v1/invoices"),
        [Some(format!("invoice-{}", row.id))]
    );
    assert_eq!(
        posts_to(&w, "/finalize"),
        [Some(format!("finalize-{}", row.id))]
    );
    assert_eq!(posts_to(&w, "/pay"), [Some(format!("pay-{}", row.id))]);
    // The customer sees it, paid, with Stripe's page.
    let page = w.now_sees("/billing").await.text();
    assert!(
        page.contains("117.60 USD")
            && page.contains("usage reached the threshold")
            && page.contains(&format!(
                "https://invoice.stripe.test/i/{}",
                inv["id"].as_str().unwrap()
            )),
        "{page}"
    );
    let api = w.now_sees("/api/billing").await.json();
    assert_eq!(api["invoices"][0]["status"], "paid");
    assert_eq!(api["invoices"][0]["amount_cents"], json!(11_760));
    // The next run has nothing to invoice.
    assert_eq!(w.bill().await.invoiced, 0);
    assert_eq!(posts_to(&w, "/pay").len(), 1);

    // Deleted at 02:00: two hours, $2.40, under the threshold and waiting for December …
    w.db()
        .request_vm_delete(&vm, w.clock.now() + TimeDelta::hours(1))
        .await
        .unwrap();
    w.db()
        .confirm_vm_deleted(&vm, w.clock.now() + TimeDelta::minutes(61))
        .await
        .unwrap();
    w.clock.advance(TimeDelta::hours(2));
    let r = w.bill().await;
    assert_eq!((r.charged, r.closed, r.invoiced), (1, 1, 0));
    // … when the month that had it is over.
    w.december();
    let r = w.bill().await;
    assert_eq!((r.invoiced, r.invoices_paid), (1, 1));
    let rows = w.db().invoices_for(&w.customer.sub, 10).await.unwrap();
    assert_eq!(rows.len(), 2);
    assert_eq!(
        (rows[0].reason.as_str(), rows[0].amount_cents),
        ("month_end", 242)
    );
    assert_eq!(w.fake.lock().unwrap().invoices.len(), 2);
}

/// A run that dies after any call finishes on the next: the same keys, one invoice, one
/// payment.
async fn an_invoicing_run_that_dies_between_calls_finishes_without_a_second_invoice(w: World) {
    w.chargeable().await;
    w.deleted_vm("hour", TimeDelta::minutes(60), TimeDelta::minutes(61))
        .await;
    w.december();
    // Created at Stripe; the finalize finds Stripe down.
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::POST,
        path_prefix: "/v1/invoices/".into(),
        status: StatusCode::SERVICE_UNAVAILABLE,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: false,
    });
    assert_eq!(
        failed_run(&w).await,
        "charged 1, refunded 0, closed 1, invoiced 1, 1 failed (first: stripe: 503 api_error: injected by the fake)"
    );
    let (inv, row) = the_invoice(&w).await;
    assert_eq!(
        (inv["status"].as_str(), row.status.as_str()),
        (Some("draft"), "draft")
    );
    // The run died before it recorded Stripe's answer to the create: the next sends the
    // same key and Stripe answers the same invoice.
    w.db()
        .execute_unchecked("update invoices set status = 'pending', stripe_invoice_id = null")
        .await
        .unwrap();
    let r = w.bill().await;
    assert_eq!((r.invoiced, r.invoices_paid), (0, 1));
    let (inv, row) = the_invoice(&w).await;
    assert_eq!(
        (inv["status"].as_str(), row.status.as_str()),
        (Some("paid"), "paid")
    );
    assert_eq!(row.amount_cents, 122);
    // The run died before it recorded the payment: the same key, no second charge.
    w.db()
        .execute_unchecked(
            "update invoices set status = 'open', pay_attempted_at = null, paid_at = null",
        )
        .await
        .unwrap();
    assert_eq!(w.bill().await.invoices_paid, 1);
    let (inv, _) = the_invoice(&w).await;
    assert_eq!(inv["attempt_count"], json!(1), "paid once");
    let key = Some(format!("pay-{}", row.id));
    assert_eq!(posts_to(&w, "/pay"), [key.clone(), key]);
    assert_eq!(
        posts_to(&w, "/v1/invoices").len(),
        2,
        "the create, and its replay"
    );
}

/// A decline leaves the invoice open and the account refused by the live check; the
/// webhooks Stripe sends then — in any order, replayed or not — leave the latest state, and
/// the payment made later on Stripe's page closes it.
async fn a_declined_invoice_stays_open_until_paid_whatever_order_the_webhooks_come_in(w: World) {
    let cus = w.chargeable().await;
    w.fake.lock().unwrap().declining.insert(cus.clone());
    w.deleted_vm("hour", TimeDelta::minutes(60), TimeDelta::minutes(61))
        .await;
    w.december();
    let r = w.bill().await;
    assert_eq!((r.invoiced, r.invoices_paid, r.payments_failed), (1, 0, 1));
    let (inv, row) = the_invoice(&w).await;
    assert_eq!(
        (inv["status"].as_str(), row.status.as_str()),
        (Some("open"), "open")
    );
    assert_eq!(row.payment_failed_at, Some(w.clock.now()));
    assert!(
        row.last_error
            .as_deref()
            .unwrap_or("")
            .contains("card_declined"),
        "{row:?}"
    );
    let Charge::Refused { reason } = w.may_charge().await else {
        panic!("a customer whose invoice was declined may not be charged")
    };
    assert!(reason.contains("declined"), "{reason}");
    let page = w.now_sees("/billing").await.text();
    assert!(page.contains("payment declined"), "{page}");
    // Operators see the account held, what it owes and when its instances stop.
    let op = w.app.operator("op@example.com").await;
    let ops = w.sees_as(&op.sub, "/api/admin/billing").await.json();
    assert_eq!(ops["held"].as_array().unwrap().len(), 1, "{ops}");
    assert_eq!(ops["held"][0]["email"], "payer@example.com");
    assert_eq!(ops["held"][0]["stopped_instances"], json!(0));
    assert_eq!(
        ops["held"][0]["stop_at"],
        json!(
            (w.clock.now() + TimeDelta::hours(72))
                .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
        )
    );
    assert_eq!(ops["invoices"][0]["invoice"]["id"], json!(row.id));
    let page = w.sees_as(&op.sub, "/admin/billing").await.text();
    assert!(
        page.contains("id=\"held\"") && page.contains("payer@example.com"),
        "{page}"
    );
    // No second attempt by the job: the webhooks and the customer carry it on.
    assert_eq!(w.bill().await.payments_failed, 0);
    assert_eq!(posts_to(&w, "/pay").len(), 1);

    let sid = inv["id"].as_str().unwrap().to_owned();
    // What Stripe sends on a decline.
    for (id, kind) in [
        ("evt_f", "invoice.finalized"),
        ("evt_pf", "invoice.payment_failed"),
    ] {
        let r = w.send_event(id, kind, inv.clone()).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    assert_eq!(the_invoice(&w).await.1.status.as_str(), "open");
    // Paid later on the hosted page.
    w.clock.advance(TimeDelta::hours(5));
    let paid = w.pays_on_hosted_page(&sid).await;
    let row = the_invoice(&w).await.1;
    assert_eq!(row.status.as_str(), "paid");
    assert_eq!(row.paid_at, Some(w.clock.now()));
    assert_eq!(w.may_charge().await, Charge::Allowed);
    // A late finalized (still saying open) and a replay change nothing.
    let before = w.dump().await;
    let late = w
        .send_event("evt_late", "invoice.finalized", inv.clone())
        .await;
    assert_eq!(late.status, StatusCode::OK);
    let replay = w.send_event("evt_p", "invoice.paid", paid.clone()).await;
    assert_eq!(replay.json()["replayed"], json!(true));
    let changed = w.tables_changed_since(&before).await;
    assert!(
        changed.iter().all(|t| t == "stripe_events"),
        "only the late event's own record: {changed:?}"
    );
    // An invoice this installation never made: recorded, nothing written.
    let foreign = json!({"id": "in_foreign", "object": "invoice", "status": "paid",
                         "total": 999, "metadata": {}});
    let before = w.dump().await;
    assert_eq!(
        w.send_event("evt_foreign", "invoice.paid", foreign)
            .await
            .status,
        StatusCode::OK
    );
    let changed = w.tables_changed_since(&before).await;
    assert!(changed.iter().all(|t| t == "stripe_events"), "{changed:?}");
}

/// Stripe's `invoice.*` events can arrive before the create's answer was recorded (the
/// run died in between): the event finds the row by `metadata.invoice_id`, unless the row
/// already names another Stripe invoice. A decline heard only from the webhook is stamped.
async fn an_invoice_event_finds_its_invoice_by_metadata_when_it_overtakes_the_answer(w: World) {
    w.chargeable().await;
    w.deleted_vm("hour", TimeDelta::minutes(60), TimeDelta::minutes(61))
        .await;
    w.december();
    assert_eq!(w.bill().await.invoices_paid, 1);
    let (inv, row) = the_invoice(&w).await;
    // As if the run had died before it recorded the create's answer.
    w.db()
        .execute_unchecked(
            "update invoices set status = 'pending', stripe_invoice_id = null, \
             hosted_invoice_url = null, finalized_at = null, pay_attempted_at = null, paid_at = null",
        )
        .await
        .unwrap();
    let mut open = inv.clone();
    open["status"] = json!("open");
    let r = w
        .send_event("evt_fin", "invoice.finalized", open.clone())
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let got = w.db().invoice(&row.id).await.unwrap().unwrap();
    assert_eq!(got.status.as_str(), "open");
    assert_eq!(got.stripe_invoice_id.as_deref(), inv["id"].as_str());
    assert_eq!(
        got.payment_failed_at, None,
        "a finalized invoice has not failed"
    );
    // Another Stripe invoice naming our row is not ours to write, once the row names its own.
    let mut impostor = open.clone();
    impostor["id"] = json!("in_impostor");
    impostor["status"] = json!("void");
    let before = w.dump().await;
    w.send_event("evt_imp", "invoice.voided", impostor).await;
    let changed = w.tables_changed_since(&before).await;
    assert!(changed.iter().all(|t| t == "stripe_events"), "{changed:?}");
    // A decline Stripe reports only by webhook (its own retry, or the hosted page).
    w.clock.advance(TimeDelta::minutes(3));
    w.send_event("evt_pf", "invoice.payment_failed", open).await;
    let got = w.db().invoice(&row.id).await.unwrap().unwrap();
    assert_eq!(got.payment_failed_at, Some(w.clock.now()));
    assert!(
        got.last_error
            .as_deref()
            .unwrap_or("")
            .contains("invoice.payment_failed"),
        "{got:?}"
    );
    w.send_event("evt_paid", "invoice.paid", inv).await;
    assert_eq!(
        w.db()
            .invoice(&row.id)
            .await
            .unwrap()
            .unwrap()
            .status
            .as_str(),
        "paid"
    );
}

/// Issue #40, 2, through what Stripe sends on a decline and a later success: the account is
/// held at once (no create, queue, booking or start), told once with the time its instances
/// stop; past the grace its running instances are stopped on their hosts, never deleted (one
/// it had stopped itself is left alone); paid on Stripe's page, they start again, and every
/// transition is audited.
async fn a_declined_payment_holds_the_account_and_stops_its_instances_until_it_pays(w: World) {
    let cus = w.chargeable().await;
    w.fake.lock().unwrap().declining.insert(cus.clone());
    let kept = w.running_on_a_host("kept").await;
    let parked = w.running_on_a_host("parked").await;
    w.db()
        .set_vm_power(&parked, byo_wire::states::VmStatus::Stopped)
        .await
        .unwrap();
    // December: November's usage invoiced (a full month of two instances: past the
    // threshold long before, but the run comes only now) and declined.
    w.december();
    let r = w.bill().await;
    assert_eq!((r.invoiced, r.payments_failed, r.unpaid_stopped), (1, 1, 0));
    let (inv, row) = the_invoice(&w).await;
    let declined_at = w.clock.now();
    assert_eq!(row.payment_failed_at, Some(declined_at));
    assert_eq!(
        w.audited(&row.id).await,
        ["billing.payment_failed"],
        "the decline is audited"
    );
    let notices = w.notices().await;
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0].0, "billing.payment_failed");

    // Held: the gate refuses with the invoice's words, whatever Stripe says of the card.
    w.fake.lock().unwrap().customers.get_mut(&cus).unwrap()["delinquent"] = json!(false);
    let Charge::Refused { reason } = w.may_charge().await else {
        panic!("an account with a declined, unpaid invoice may not be charged")
    };
    assert!(
        reason.contains("unpaid") && reason.contains("/billing"),
        "{reason}"
    );
    let r = w.start(&parked).await;
    assert_eq!(r.status, StatusCode::PAYMENT_REQUIRED, "{}", r.text());
    assert_eq!(code(&r), "payment_required");
    assert_eq!(
        w.status_of(&parked).await,
        byo_wire::states::VmStatus::Stopped
    );

    // Within the grace nothing stops, the notice is not repeated, and December's usage —
    // past the threshold by now — waits: a held account is not invoiced again.
    w.clock.advance(TimeDelta::hours(71));
    let r = w.bill().await;
    assert_eq!((r.unpaid_stopped, r.invoiced), (0, 0));
    assert_eq!(w.fake.lock().unwrap().invoices.len(), 1);
    assert!(w.power_calls().is_empty());
    assert_eq!(w.notices().await.len(), 1);
    // Past it: the running instance is stopped on its host, once; the parked one untouched.
    w.clock.advance(TimeDelta::hours(1));
    let r = w.bill().await;
    assert_eq!(r.unpaid_stopped, 1);
    assert_eq!(
        w.power_calls(),
        [("kept".to_owned(), byo_wire::vm::VmAction::Stop)]
    );
    assert_eq!(
        w.status_of(&kept).await,
        byo_wire::states::VmStatus::Stopped
    );
    assert_eq!(
        w.db().payment_stop(&kept).await.unwrap(),
        Some(row.id.clone())
    );
    assert_eq!(w.db().payment_stop(&parked).await.unwrap(), None);
    assert_eq!(w.audited(&kept).await, ["billing.instance_stopped"]);
    let kinds: Vec<_> = w.notices().await.into_iter().map(|n| n.0).collect();
    assert!(
        kinds.contains(&"billing.instances_stopped".to_owned()),
        "{kinds:?}"
    );
    assert!(
        w.db()
            .vm(&kept)
            .await
            .unwrap()
            .unwrap()
            .deleted_at
            .is_none()
    );
    let op = w.app.operator("op@example.com").await;
    let ops = w.sees_as(&op.sub, "/api/admin/billing").await.json();
    assert_eq!(ops["held"][0]["stopped_instances"], json!(1), "{ops}");
    assert_eq!(w.bill().await.unpaid_stopped, 0, "stopped once");
    assert_eq!(w.power_calls().len(), 1);

    // What Stripe sends: the failure, then — paid on the hosted page — the success.
    let sid = inv["id"].as_str().unwrap().to_owned();
    let failed = w.fake.lock().unwrap().invoices[&sid].clone();
    let r = w
        .send_event("evt_pf", "invoice.payment_failed", failed)
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        w.status_of(&kept).await,
        byo_wire::states::VmStatus::Stopped
    );
    w.clock.advance(TimeDelta::hours(2));
    w.pays_on_hosted_page(&sid).await;
    // Started again at once, by the webhook's release.
    w.until_running(&kept).await;
    assert_eq!(
        w.power_calls(),
        [
            ("kept".to_owned(), byo_wire::vm::VmAction::Stop),
            ("kept".to_owned(), byo_wire::vm::VmAction::Start)
        ]
    );
    assert_eq!(w.db().payment_stop(&kept).await.unwrap(), None);
    assert_eq!(
        w.audited(&kept).await,
        ["billing.instance_stopped", "billing.instance_started"]
    );
    assert_eq!(
        w.audited(&row.id).await,
        ["billing.payment_failed", "billing.invoice_paid"]
    );
    assert_eq!(
        w.status_of(&parked).await,
        byo_wire::states::VmStatus::Stopped
    );
    assert_eq!(w.may_charge().await, Charge::Allowed);
    let ops = w.sees_as(&op.sub, "/api/admin/billing").await.json();
    assert_eq!(ops["held"], json!([]), "paid: held no more");
    // The next run has nothing to start.
    let r = w.bill().await;
    assert_eq!((r.unpaid_stopped, r.unpaid_started), (0, 0));
    assert_eq!(w.power_calls().len(), 2);
    // Paid, the account is invoiced again: December's usage that waited.
    assert_eq!(r.invoiced, 1);
    let r = w.start(&parked).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

/// The customer replaces the card on /billing: the declined invoice is paid again with the
/// new one, once per card; a card that declines too leaves it open, one that works pays it
/// and the stopped instance starts again.
async fn a_new_card_pays_the_declined_invoice_and_starts_what_it_stopped(w: World) {
    let cus = w.chargeable().await;
    w.fake.lock().unwrap().declining.insert(cus.clone());
    let kept = w.running_on_a_host("kept").await;
    w.december();
    assert_eq!(w.bill().await.payments_failed, 1);
    w.clock.advance(TimeDelta::hours(73));
    assert_eq!(w.bill().await.unpaid_stopped, 1);
    let (_, row) = the_invoice(&w).await;
    let new_card = |n: &'static str| {
        let (session, pm) = w.fake.lock().unwrap().completed_setup(&cus);
        (
            fake_stripe::event(
                n,
                "checkout.session.completed",
                session,
                w.clock.now().timestamp(),
            ),
            pm,
        )
    };
    // Another card that declines.
    let (event, first) = new_card("evt_card1");
    assert_eq!(w.webhook(&event).await.status, StatusCode::OK);
    let got = w.db().invoice(&row.id).await.unwrap().unwrap();
    assert_eq!(got.status.as_str(), "open");
    assert!(got.last_error.unwrap().contains("card_declined"));
    assert_eq!(
        w.status_of(&kept).await,
        byo_wire::states::VmStatus::Stopped
    );
    // One that works.
    w.fake.lock().unwrap().declining.remove(&cus);
    w.clock.advance(TimeDelta::minutes(5));
    let (event, second) = new_card("evt_card2");
    assert_eq!(w.webhook(&event).await.status, StatusCode::OK);
    let got = w.db().invoice(&row.id).await.unwrap().unwrap();
    assert_eq!(got.status.as_str(), "paid");
    assert_eq!(got.paid_at, Some(w.clock.now()));
    assert_eq!(
        posts_to(&w, "/pay"),
        [
            Some(format!("pay-{}", row.id)),
            Some(format!("pay-{}-{first}", row.id)),
            Some(format!("pay-{}-{second}", row.id)),
        ]
    );
    w.until_running(&kept).await;
    assert_eq!(
        w.audited(&row.id).await,
        ["billing.payment_failed", "billing.invoice_paid"]
    );
    // The same card's event again (Stripe's retry) pays nothing twice.
    let replay = w.webhook(&event).await;
    assert_eq!(replay.json()["replayed"], json!(true));
    assert_eq!(posts_to(&w, "/pay").len(), 3);
}

/// Issue #40, 4: the Billing page shows the card on file, this month's usage so far per
/// instance (live, from the four timestamps), and the credits for stuck deletes.
async fn the_billing_page_shows_the_card_this_months_usage_and_the_credits(w: World) {
    let none = w.now_sees("/api/billing").await.json();
    assert_eq!(none["payment_method"], Value::Null);
    assert_eq!(none["this_month"]["total_cents"], json!(0));
    w.chargeable().await;
    let kept = w.vm("kept", start()).await;
    w.db().mark_vm_running(&kept, Some(2222)).await.unwrap();
    // Deleted at 22:30, confirmed only at 23:00: a stuck delete, credited.
    let brief = w
        .deleted_vm("brief", TimeDelta::minutes(30), TimeDelta::minutes(60))
        .await;
    w.clock.advance(TimeDelta::hours(3)); // Nov 2, 01:00
    w.bill().await;
    let api = w.now_sees("/api/billing").await.json();
    assert_eq!(api["payment_method"], "visa ending 4242, expires 12/2099");
    let month = &api["this_month"];
    assert_eq!(month["since"], "2026-11-01T00:00:00Z");
    let lines = month["instances"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "{month}");
    let line = |vm: &str| {
        lines
            .iter()
            .find(|l| l["vm_id"] == json!(vm))
            .cloned()
            .unwrap()
    };
    // 22:00 to 01:00: two hours of Nov 1 and one of Nov 2, each day priced.
    assert_eq!(
        (
            line(&kept)["seconds"].clone(),
            line(&kept)["amount_cents"].clone()
        ),
        (json!(3 * 3600), json!(3 * PRICE))
    );
    assert_eq!(line(&brief)["amount_cents"], json!(PRICE));
    assert_eq!(month["total_cents"], json!(4 * PRICE));
    let credits = api["credits"].as_array().unwrap();
    assert_eq!(credits.len(), 1);
    assert_eq!(credits[0]["vm_id"], json!(brief));
    assert_eq!(credits[0]["amount_cents"], json!(PRICE / 2));
    let page = w.now_sees("/billing").await.text();
    for want in [
        "visa ending 4242, expires 12/2099",
        "Replace the payment method",
        "4.80 USD",
        "kept",
        "-0.60 USD",
        "id=\"credits\"",
    ] {
        assert!(page.contains(want), "{want}: {page}");
    }
}

/// A booking paid through Checkout: the completed session Stripe sends, with its payment
/// intent, for `amount`.
async fn paid_through_checkout(w: &World, booking: &str, pi: &str, amount: i64) {
    w.fake
        .lock()
        .unwrap()
        .payment_intents
        .insert(pi.to_owned(), amount);
    let session = json!({"id": format!("cs_{booking}"), "object": "checkout.session",
        "mode": "payment", "payment_status": "paid", "status": "complete",
        "amount_total": amount, "currency": "usd", "payment_intent": pi,
        "metadata": {"prebooking_id": booking, "user_sub": w.customer.sub}});
    let r = w
        .send_event(
            &format!("evt_{booking}"),
            "checkout.session.completed",
            session,
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(w.paid_at(booking).await.is_some());
}

/// Issue #40, 5: the stated rule — a paid booking cancelled before its window opens is
/// refunded in full, once; from the opening on it is neither refunded nor cancelled by its
/// booker; a superadmin refunds any Checkout payment with a reason; an off-band payment is
/// not refunded here. A retried refund (its record lost) refunds nothing twice.
async fn a_paid_booking_is_refunded_before_its_window_and_by_operators_with_a_reason(w: World) {
    w.chargeable().await;
    w.booking("pb-1", &w.customer.sub).await;
    let page = w.now_sees("/prebookings").await.text();
    assert!(
        page.contains("/prebookings/pb-1/checkout") && page.contains(">Pay<"),
        "the booking page has its checkout: {page}"
    );
    paid_through_checkout(&w, "pb-1", "pi_1", 7200).await;
    let page = w.now_sees("/prebookings").await.text();
    assert!(
        page.contains("Cancel and refund") && page.contains("refunded in full"),
        "{page}"
    );
    let r = w.customer.post_empty("/api/prebookings/pb-1/cancel").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["state"], "closed");
    let refunds = w.fake.lock().unwrap().refunds.clone();
    assert_eq!(refunds.len(), 1);
    assert_eq!(
        (
            refunds[0]["payment_intent"].clone(),
            refunds[0]["amount"].clone()
        ),
        (json!("pi_1"), json!(7200))
    );
    assert_eq!(
        posts_to(&w, "/v1/refunds"),
        [Some("refund-booking-pb-1".into())]
    );
    let row = w.db().booking_refund("pb-1").await.unwrap().unwrap();
    assert_eq!(
        (row.amount_cents, row.refunded_by.as_deref()),
        (7200, Some(w.customer.sub.as_str()))
    );
    let mut audited = w.audited("pb-1").await;
    audited.sort();
    assert_eq!(audited, ["prebooking.cancelled", "prebooking.refunded"]);
    let r = w.customer.post_empty("/api/prebookings/pb-1/cancel").await;
    assert_eq!(code(&r), "booking_closed");
    assert_eq!(w.fake.lock().unwrap().refunds.len(), 1);

    // Its window has opened: the booker neither cancels nor is refunded.
    w.db()
        .execute_unchecked(&format!(
            "insert into prebookings (id, user_sub, gpu_type, start_date, end_date, created_at)
             values ('pb-2', '{}', 'spark-1', '2026-11-01T20:00:00Z', '2026-11-03T00:00:00Z', '2026-10-01T00:00:00Z')",
            w.customer.sub
        ))
        .await
        .unwrap();
    paid_through_checkout(&w, "pb-2", "pi_2", 3600).await;
    let admin = w.app.superadmin("root@example.com").await;
    let before = w.dump().await;
    let r = w.customer.post_empty("/api/prebookings/pb-2/cancel").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(code(&r), "window_open");
    assert_eq!(w.dump().await, before, "refused: nothing changed");
    assert_eq!(w.fake.lock().unwrap().refunds.len(), 1);
    // A superadmin may, with a reason.
    let r = admin
        .post("/api/admin/prebookings/pb-2/refund", json!({"reason": " "}))
        .await;
    assert_eq!(code(&r), "reason_required");
    assert_eq!(w.dump().await, before);
    let r = admin
        .post(
            "/api/admin/prebookings/pb-2/refund",
            json!({"reason": "the host failed for the first day"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.fake.lock().unwrap().refunds.len(), 2);
    let audit = w.db().audit_log(50).await.unwrap();
    let refunded = audit
        .iter()
        .find(|a| a.action == "prebooking.refunded" && a.target.as_deref() == Some("pb-2"))
        .unwrap();
    assert_eq!(
        refunded.details.0["reason"],
        "the host failed for the first day"
    );
    assert_eq!(refunded.actor_sub.as_deref(), Some(admin.sub.as_str()));
    let r = admin
        .post(
            "/api/admin/prebookings/pb-2/refund",
            json!({"reason": "again"}),
        )
        .await;
    assert_eq!(code(&r), "already_refunded");
    // The refund's record lost (a crash after Stripe answered): the retry's key replays it.
    w.db()
        .execute_unchecked("delete from booking_refunds where prebooking_id = 'pb-2'")
        .await
        .unwrap();
    let r = admin
        .post(
            "/api/admin/prebookings/pb-2/refund",
            json!({"reason": "retried"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(w.fake.lock().unwrap().refunds.len(), 2, "refunded once");

    // Paid off-band (by hand, with a reason): returned off-band, not here.
    w.booking("pb-3", &w.customer.sub).await;
    let r = admin
        .post(
            "/api/admin/prebookings/pb-3/paid",
            json!({"reason": "paid by bank transfer"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let r = w.customer.post_empty("/api/prebookings/pb-3/cancel").await;
    assert_eq!(code(&r), "booking_paid");
    let r = admin
        .post("/api/admin/prebookings/pb-3/refund", json!({"reason": "x"}))
        .await;
    assert_eq!(code(&r), "not_paid_by_checkout");
    assert_eq!(w.fake.lock().unwrap().refunds.len(), 2);
}

/// Issue #40, 6: a customer's month on two owners' hosts, invoiced and paid; each owner sees
/// what their host sold, and every cent invoiced is the owner's share or the platform's — to
/// the cent, a stuck delete's credit included — by month on the API and the page, and line by
/// line in the CSV.
async fn an_owners_earnings_split_every_invoiced_cent_exactly(w: World) {
    w.chargeable().await;
    let (kept, kept_owner) = w.running_on_a_host_of("kept").await;
    let (brief, brief_owner) = w.running_on_a_host_of("brief").await;
    // brief: deleted at 22:30, confirmed at 23:00: charged an hour, credited half of it.
    w.db()
        .request_vm_delete(&brief, start() + TimeDelta::minutes(30))
        .await
        .unwrap();
    w.db()
        .confirm_vm_deleted(&brief, start() + TimeDelta::minutes(60))
        .await
        .unwrap();
    w.december();
    let r = w.bill().await;
    assert_eq!((r.invoiced, r.invoices_paid), (1, 1));
    let (_, invoice) = the_invoice(&w).await;

    let share = |amount: i64| amount * 7_000 / 10_000;
    let mut total = 0;
    for (owner, vm, host, lines) in [
        (&kept_owner, &kept, "kept-host", 30),
        (&brief_owner, &brief, "brief-host", 2),
    ] {
        let e = w.sees_as(&owner.sub, "/api/me/earnings").await.json();
        assert_eq!(e["owner_share_bps"], json!(7_000));
        let months = e["months"].as_array().unwrap();
        assert_eq!(months.len(), 1, "{e}");
        let m = &months[0];
        assert_eq!(
            (m["month"].as_str(), m["host_slug"].as_str()),
            (Some("2026-11"), Some(host))
        );
        // The owner's share, line by line from the rows this test reads itself.
        let charges = w.db().usage_charges(vm).await.unwrap();
        let credit = w.db().refund_for(vm).await.unwrap();
        let mut amount: i64 = charges.iter().map(|c| i64::from(c.amount_cents)).sum();
        let mut owner_cents: i64 = charges
            .iter()
            .map(|c| share(i64::from(c.amount_cents)))
            .sum();
        if let Some(c) = &credit {
            amount -= i64::from(c.amount_cents);
            owner_cents += share(-i64::from(c.amount_cents));
        }
        assert_eq!(m["amount_cents"], json!(amount), "{host}");
        assert_eq!(m["owner_cents"], json!(owner_cents), "{host}");
        assert_eq!(m["platform_cents"], json!(amount - owner_cents), "{host}");
        assert_eq!(
            m["owner_paid_cents"],
            json!(owner_cents),
            "the invoice is paid"
        );
        total += amount;
        // The CSV: a line per instance-day and per credit, each split exactly.
        let csv = w.sees_as(&owner.sub, "/hosts/earnings.csv").await.text();
        let rows: Vec<Vec<&str>> = csv
            .lines()
            .skip(1)
            .map(|l| l.split(',').collect())
            .collect();
        assert_eq!(rows.len(), lines, "{csv}");
        let cents = |r: &Vec<&str>, i: usize| r[i].parse::<i64>().unwrap();
        for r in &rows {
            assert_eq!(cents(r, 6) + cents(r, 7), cents(r, 5), "{r:?}");
            assert_eq!(r[9], invoice.id);
        }
        assert_eq!(rows.iter().map(|r| cents(r, 5)).sum::<i64>(), amount);
        assert_eq!(rows.iter().map(|r| cents(r, 6)).sum::<i64>(), owner_cents);
        let page = w.sees_as(&owner.sub, "/hosts").await.text();
        assert!(
            page.contains("id=\"earnings-months\"") && page.contains(host),
            "{page}"
        );
    }
    // Every cent invoiced is one owner's share or the platform's.
    assert_eq!(total, i64::from(invoice.amount_cents));
    // A customer with no hosts has no earnings.
    let mine = w.now_sees("/api/me/earnings").await.json();
    assert_eq!(mine["months"], json!([]));
}

/// Issue #40, 6 (payouts): an owner connects a Stripe account from their page (one account
/// however often they ask, each time a fresh onboarding link); nothing is transferred while
/// it cannot take transfers, nor before the month in which the customer paid has ended; then
/// one payout of exactly their share — every line split as the earnings page splits it — is
/// transferred once, and every later run transfers nothing.
async fn an_owner_is_paid_their_share_once_the_month_the_customer_paid_in_ends(w: World) {
    let (owner, account, invoiced) = w.owner_paid_in_december(false).await;
    let again = w
        .posts_as(&owner.sub, "/api/me/payouts/connect")
        .await
        .json();
    assert!(
        again["url"].as_str().unwrap().contains(&account),
        "a second connect continues the same account's onboarding: {again}"
    );
    {
        let f = w.fake.lock().unwrap();
        assert_eq!(f.accounts.len(), 1, "one account per owner");
        assert_eq!(
            f.accounts[&account]["metadata"]["user_sub"],
            json!(owner.sub)
        );
        assert_eq!(f.account_links.len(), 2, "a fresh link each time");
        let link = &f.account_links[1];
        assert_eq!(link["account"], json!(account));
        assert_eq!(link["refresh_url"], "http://localhost:8080/hosts#payouts");
        assert_eq!(
            link["return_url"],
            "http://localhost:8080/hosts?connected=1#payouts"
        );
    }
    assert_eq!(
        w.audited(&owner.sub).await,
        ["payouts.account_connected"],
        "connected once"
    );
    let p = w.sees_as(&owner.sub, "/api/me/payouts").await.json();
    assert_eq!(p["account"]["transfers_active"], json!(false), "{p}");
    let page = w.sees_as(&owner.sub, "/hosts").await.text();
    assert!(page.contains("cannot take transfers yet"), "{page}");

    // December: the invoice was paid in December, so nothing is due before December ends.
    w.clock.advance(TimeDelta::hours(1));
    assert_eq!(w.pay_owners().await, payouts::PayReport::default());
    w.january();
    // Not onboarded: the owner waits, nothing is made or sent.
    let r = w.pay_owners().await;
    assert_eq!((r.waiting, r.opened, r.paid), (1, 0, 0), "{r:?}");
    assert!(w.db().payouts_for(&owner.sub, 10).await.unwrap().is_empty());
    assert!(w.transfers().is_empty());

    w.fake.lock().unwrap().finish_onboarding(&account);
    let p = w.sees_as(&owner.sub, "/api/me/payouts").await.json();
    assert_eq!(
        p["account"]["transfers_active"],
        json!(true),
        "asked live: {p}"
    );
    let r = w.pay_owners().await;
    assert_eq!(
        (r.waiting, r.opened, r.paid, r.failed),
        (0, 1, 1, 0),
        "{r:?}"
    );
    let share = |c: i64| c * 7_000 / 10_000;
    let owed: i64 = w
        .db()
        .earning_lines(Some(&owner.sub))
        .await
        .unwrap()
        .iter()
        .map(|l| share(l.amount_cents))
        .sum();
    let e = w.sees_as(&owner.sub, "/api/me/earnings").await.json();
    assert_eq!(e["months"][0]["owner_cents"], json!(owed), "{e}");
    let payout = w.db().payouts_for(&owner.sub, 10).await.unwrap().remove(0);
    assert_eq!(
        (payout.month.as_str(), payout.amount_cents, payout.status),
        ("2026-12", owed, byo_wire::states::PayoutStatus::Paid)
    );
    let transfers = w.transfers();
    assert_eq!(transfers.len(), 1);
    let t = &transfers[0];
    assert_eq!(t["amount"], json!(owed));
    assert_eq!(t["destination"], json!(account));
    assert_eq!(t["transfer_group"], json!(format!("payout-{}", payout.id)));
    let gets = w
        .fake
        .lock()
        .unwrap()
        .requests
        .iter()
        .filter(|(m, p, _)| m == "GET" && p == "/v1/transfers")
        .count();
    assert_eq!(
        gets, 0,
        "a first attempt looks for nothing before it transfers"
    );
    assert_eq!(payout.stripe_transfer_id.as_deref(), t["id"].as_str());
    // Every cent invoiced for the host is the owner's payout or the platform's.
    assert!(owed > 0 && owed < invoiced);
    let csv = w.sees_as(&owner.sub, "/hosts/earnings.csv").await.text();
    assert!(
        csv.lines()
            .skip(1)
            .all(|l| l.ends_with(&format!(",{}", payout.id))),
        "every line names the payout that paid it: {csv}"
    );
    let page = w.sees_as(&owner.sub, "/hosts").await.text();
    assert!(
        page.contains("id=\"payouts-list\"")
            && page.contains(&payout.id)
            && page.contains(t["id"].as_str().unwrap()),
        "{page}"
    );
    // Made and paid in one run, at one instant of the manual clock: compared as a set.
    let mut audited = w.audited(&owner.sub).await;
    audited.sort();
    assert_eq!(
        audited,
        ["payout.made", "payout.paid", "payouts.account_connected"]
    );

    // Later runs, this month and the next: nothing more to pay.
    w.clock.advance(TimeDelta::hours(2));
    assert_eq!(w.pay_owners().await, payouts::PayReport::default());
    w.clock.advance(TimeDelta::days(31));
    assert_eq!(w.pay_owners().await, payouts::PayReport::default());
    assert_eq!(w.transfers().len(), 1, "transferred once");
}

/// Issue #40, 6: a transfer Stripe refuses (the platform's balance is short) is shown to the
/// owner and the operators and tried again after an hour, then two — each attempt under its
/// own key, since Stripe answers a key's first result again, errors included — until it is
/// taken, once; and an attempt whose answer was lost is found in the payout's transfer group
/// rather than made again.
async fn a_refused_transfer_is_retried_with_backoff_and_paid_once(w: World) {
    let (owner, _, _) = w.owner_paid_in_december(true).await;
    w.fake.lock().unwrap().balance = Some(0);
    w.january();
    let r = w.pay_owners().await;
    assert_eq!((r.opened, r.paid, r.failed), (1, 0, 1), "{r:?}");
    let p = w.db().payouts_for(&owner.sub, 10).await.unwrap().remove(0);
    assert_eq!(
        (p.status, p.attempts),
        (byo_wire::states::PayoutStatus::Pending, 1)
    );
    assert!(
        p.last_error
            .as_deref()
            .unwrap()
            .contains("balance_insufficient"),
        "{p:?}"
    );
    assert_eq!(p.next_attempt_at, w.clock.now() + TimeDelta::hours(1));
    let mine = w.sees_as(&owner.sub, "/api/me/payouts").await.json();
    assert_eq!(mine["payouts"][0]["attempts"], json!(1), "{mine}");
    let page = w.sees_as(&owner.sub, "/hosts").await.text();
    assert!(page.contains("Stripe refused the transfer"), "{page}");
    let admin = w.app.operator("ops@example.com").await;
    let ops = w.sees_as(&admin.sub, "/api/admin/billing").await.json();
    assert_eq!(
        ops["pending_payouts"][0]["payout"]["id"],
        json!(p.id),
        "{ops}"
    );
    assert_eq!(
        ops["pending_payouts"][0]["email"],
        json!("earning-owner@example.com")
    );
    let ops_page = w.sees_as(&admin.sub, "/admin/billing").await.text();
    assert!(ops_page.contains("balance_insufficient"), "{ops_page}");

    // Not due yet: nothing is asked of Stripe.
    let posts = |w: &World| posts_to(w, "/v1/transfers");
    w.clock.advance(TimeDelta::minutes(59));
    assert_eq!(w.pay_owners().await, payouts::PayReport::default());
    assert_eq!(posts(&w).len(), 1);
    w.clock.advance(TimeDelta::minutes(1));
    assert_eq!(w.pay_owners().await.failed, 1);
    let p = w.db().payout(&p.id).await.unwrap().unwrap();
    assert_eq!(p.attempts, 2);
    assert_eq!(p.next_attempt_at, w.clock.now() + TimeDelta::hours(2));

    w.fake.lock().unwrap().balance = None;
    w.clock.advance(TimeDelta::hours(2));
    assert_eq!(w.pay_owners().await.paid, 1);
    let want: Vec<Option<String>> = (0..3)
        .map(|a| Some(format!("payout-{}-{a}", p.id)))
        .collect();
    assert_eq!(posts(&w), want, "a key per attempt");
    let transfers = w.transfers();
    assert_eq!(transfers.len(), 1);
    let p = w.db().payout(&p.id).await.unwrap().unwrap();
    assert_eq!(p.stripe_transfer_id.as_deref(), transfers[0]["id"].as_str());
    assert_eq!(p.last_error, None, "a paid payout shows no refusal");
    let ops = w.sees_as(&admin.sub, "/api/admin/billing").await.json();
    assert_eq!(ops["pending_payouts"], json!([]));
}

/// Issue #40, 6: Stripe made the transfer but its answer never arrived; the next attempt finds
/// it in the payout's transfer group and records it, and transfers nothing more.
async fn a_transfer_whose_answer_was_lost_is_found_not_made_again(w: World) {
    let (owner, account, _) = w.owner_paid_in_december(true).await;
    w.fake.lock().unwrap().faults.push(Fault {
        method: Method::POST,
        path_prefix: "/v1/transfers".into(),
        status: StatusCode::BAD_GATEWAY,
        kind: "api_error".into(),
        code: None,
        decline_code: None,
        sticky: false,
    });
    w.january();
    assert_eq!(w.pay_owners().await.failed, 1);
    let p = w.db().payouts_for(&owner.sub, 10).await.unwrap().remove(0);
    // What the lost answer carried: Stripe made it after all.
    let made = w.fake.lock().unwrap().transfer_answered_to_nobody(
        p.amount_cents,
        &account,
        &format!("payout-{}", p.id),
    );
    w.clock.advance(TimeDelta::hours(1));
    assert_eq!(w.pay_owners().await.paid, 1);
    assert_eq!(posts_to(&w, "/v1/transfers").len(), 1, "not made again");
    assert_eq!(w.transfers().len(), 1);
    let p = w.db().payout(&p.id).await.unwrap().unwrap();
    assert_eq!(p.stripe_transfer_id, Some(made));
}

/// Issue #40, 6: connecting is for owners. An account that never had a host is refused in
/// words, and nothing is made at Stripe or here.
async fn connecting_payouts_without_a_host_is_refused_and_changes_nothing(w: World) {
    let session = w.app.session_for(&w.customer.sub).await;
    let before = w.dump().await;
    let r = w
        .app
        .request(
            Method::POST,
            "/api/me/payouts/connect",
            Some(&session),
            None,
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text());
    assert_eq!(code(&r), "not_an_owner");
    assert!(r.text().contains("add a GPU"), "{}", r.text());
    assert!(w.fake.lock().unwrap().accounts.is_empty());
    assert_eq!(w.tables_changed_since(&before).await, Vec::<String>::new());
    let p = w.now_sees("/api/me/payouts").await.json();
    assert_eq!(p, json!({"enabled": true, "account": null, "payouts": []}));
}

with_world!(
    an_owner_is_paid_their_share_once_the_month_the_customer_paid_in_ends,
    a_refused_transfer_is_retried_with_backoff_and_paid_once,
    a_transfer_whose_answer_was_lost_is_found_not_made_again,
    connecting_payouts_without_a_host_is_refused_and_changes_nothing,
    an_owners_earnings_split_every_invoiced_cent_exactly,
    a_paid_booking_is_refunded_before_its_window_and_by_operators_with_a_reason,
    the_billing_page_shows_the_card_this_months_usage_and_the_credits,
    a_new_card_pays_the_declined_invoice_and_starts_what_it_stopped,
    a_declined_payment_holds_the_account_and_stops_its_instances_until_it_pays,
    an_invoice_event_finds_its_invoice_by_metadata_when_it_overtakes_the_answer,
    usage_is_invoiced_at_the_threshold_and_when_its_month_ends,
    an_invoicing_run_that_dies_between_calls_finishes_without_a_second_invoice,
    a_declined_invoice_stays_open_until_paid_whatever_order_the_webhooks_come_in,
);

with_world!(
    e_one_billing_gate_for_every_create_and_booking,
    webhook_with_a_bad_signature_is_refused_and_changes_nothing,
    webhook_with_a_stale_timestamp_is_refused_and_changes_nothing,
    a_signed_event_without_a_usable_id_or_type_is_refused_and_changes_nothing,
    checkout_completed_writes_paid_at_once_and_a_replay_changes_nothing,
    a_payment_for_an_unknown_or_unpaid_or_foreign_booking_writes_nothing,
    the_live_check_allows_a_customer_with_a_default_card,
    the_live_check_refuses_declined_expired_and_missing_customers,
    a_booking_checkout_charges_its_window_at_the_hourly_price,
    stripe_errors_keep_their_envelope,
    usage_is_charged_from_the_four_timestamps,
    a_prompt_delete_is_not_refunded,
    a_retried_job_never_charges_twice,
    a_stuck_delete_is_charged_and_credited_in_one_run,
    a_failed_credit_is_counted_and_left_for_the_next_run,
    usage_waits_for_an_account_without_a_customer,
);

// ------------------------------------------------------------------------- billing off

async fn billing_off_pages_say_so(app: TestApp) {
    let customer = app.customer("someone@example.com").await;
    assert!(!app.state.billing.enabled());
    for page in ["/billing", "/instances"] {
        let html = customer.page(page).await;
        assert!(html.contains(BILLING_OFF), "{page} says billing is off");
    }
    let r = customer.post_empty("/api/billing/payment-method").await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(code(&r), "billing_off");
    assert_eq!(
        customer.get("/api/billing").await.json(),
        json!({"enabled": false, "chargeable": true})
    );
    // No webhook endpoint without a secret to check it with.
    let r = app
        .send(
            Request::builder()
                .method(Method::POST)
                .uri("/api/stripe/webhook")
                .header("stripe-signature", "t=1,v1=00")
                .body(Body::from("{}"))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    // And bill-usage does nothing.
    assert_eq!(
        billing::bill_usage_once(&app.state).await.unwrap(),
        billing::BillReport::default()
    );
}

on_each_backend!(billing_off_pages_say_so);

// ---------------------------------------------------------------------- configuration

/// `[billing]` from the file turns billing on; a zero price or a currency that is not a
/// lower-case ISO code is refused at load; the secrets never print.
#[test]
#[allow(clippy::result_large_err)] // figment::Jail's closures return figment::Error
fn billing_is_configured_by_its_section_and_validated() {
    figment::Jail::expect_with(|jail| {
        jail.create_file(
            "byo.toml",
            r#"
            [billing]
            stripe_secret_key = "sk_test_abc"
            stripe_webhook_secret = "whsec_abc"
            price_cents_per_hour = 250
            "#,
        )?;
        let c = Config::load(Some(std::path::Path::new("byo.toml"))).expect("loads");
        let b = c.billing.as_ref().expect("billing on");
        assert_eq!(
            (
                b.price_cents_per_hour,
                b.currency.as_str(),
                b.api_base.as_str()
            ),
            (250, "usd", "https://api.stripe.com")
        );
        let printed = format!("{c:?}");
        assert!(!printed.contains("sk_test_abc") && !printed.contains("whsec_abc"));
        assert!(Config::load(None).unwrap().billing.is_none(), "absent: off");
        for bad in [
            "price_cents_per_hour = 0\ncurrency = \"usd\"",
            "price_cents_per_hour = 1\ncurrency = \"USD\"",
        ] {
            jail.create_file(
                "bad.toml",
                &format!(
                    "[billing]\nstripe_secret_key = \"k\"\nstripe_webhook_secret = \"w\"\n{bad}\n"
                ),
            )?;
            assert!(
                Config::load(Some(std::path::Path::new("bad.toml"))).is_err(),
                "{bad}"
            );
        }
        Ok(())
    });
}

// ------------------------------------------------------------------- against localstripe

/// localstripe (PyPI, issue #40, 7): a Stripe emulator we did not write, started on loopback.
struct LocalStripe {
    child: std::process::Child,
    base: String,
}

impl LocalStripe {
    fn start() -> Option<LocalStripe> {
        if !byo_core::testing::have_tools(&["localstripe"]) {
            return None;
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new("localstripe")
            .args(["--port", &port.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("localstripe runs");
        let mut ls = LocalStripe {
            child,
            base: format!("http://127.0.0.1:{port}"),
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Some(ls);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let _ = ls.child.kill();
        panic!("localstripe did not start on 127.0.0.1:{port}");
    }

    fn config(&self) -> byo_server::providers::stripe::BillingConfig {
        byo_server::providers::stripe::BillingConfig {
            stripe_secret_key: "sk_test_localstripe".to_owned().into(),
            stripe_webhook_secret: WEBHOOK_SECRET.to_owned().into(),
            api_base: self.base.clone(),
            price_cents_per_hour: PRICE,
            currency: "usd".into(),
            invoice_threshold_cents: 10_000,
            payment_grace_hours: 72,
            owner_share_bps: 7_000,
        }
    }

    /// A card attached to `customer`, as a finished Checkout setup leaves it (Checkout's part,
    /// not ours, so made directly).
    async fn card_for(&self, customer: &str) -> String {
        let http = reqwest::Client::new();
        let pm: Value = http
            .post(format!("{}/v1/payment_methods", self.base))
            .bearer_auth("sk_test_localstripe")
            .form(&[
                ("type", "card"),
                ("card[number]", "4242424242424242"),
                ("card[exp_month]", "12"),
                ("card[exp_year]", "2030"),
                ("card[cvc]", "123"),
            ])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = pm["id"].as_str().expect("a payment method").to_owned();
        let attached = http
            .post(format!("{}/v1/payment_methods/{id}/attach", self.base))
            .bearer_auth("sk_test_localstripe")
            .form(&[("customer", customer)])
            .send()
            .await
            .unwrap();
        assert!(attached.status().is_success());
        id
    }
}

impl Drop for LocalStripe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Our Stripe client and the live check, against localstripe: a customer made with its
/// metadata, a card made its default, the check allowing it with the card expanded and
/// described, a missing customer refused, Stripe's error envelope read as an API error. What
/// localstripe lacks — and so what runs only against our fake — is in docs/billing.md.
mod against_localstripe {
    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_customer_and_the_live_check_run_against_a_stripe_we_did_not_write() {
        let Some(ls) = LocalStripe::start() else {
            return;
        };
        let Some(db) = byo_db::testing::fresh(Backend::Sqlite).await else {
            return;
        };
        let now = Utc.with_ymd_and_hms(2026, 11, 1, 22, 0, 0).unwrap();
        let user = db
            .store
            .create_user(
                byo_db::users::NewUser {
                    email: "payer@example.com",
                    display_name: "",
                    password_hash: "$argon2id$x",
                },
                now,
            )
            .await
            .unwrap();
        let config = ls.config();
        let client = StripeClient::new(&config);
        let cus = client
            .create_customer(&user.sub, &user.email)
            .await
            .unwrap();
        assert!(cus.id.starts_with("cus_"), "{cus:?}");
        assert!(!cus.delinquent && !cus.deleted);
        let billing = byo_server::billing::StripeBilling::new(config, db.store.clone());
        // No customer on record yet: refused without asking Stripe.
        let charge = billing.check(&user.sub, now).await.unwrap();
        assert!(matches!(charge, Charge::Refused { .. }), "{charge:?}");
        db.store
            .keep_stripe_customer(&user.sub, &cus.id, now)
            .await
            .unwrap();
        // A customer with no default card: refused.
        let charge = billing.check(&user.sub, now).await.unwrap();
        assert!(
            matches!(&charge, Charge::Refused { reason } if reason.contains("no payment method")),
            "{charge:?}"
        );
        // Checkout's part (a card attached), then ours: made the default.
        let pm = ls.card_for(&cus.id).await;
        let updated = client
            .set_default_payment_method(&cus.id, &pm)
            .await
            .unwrap();
        assert_eq!(
            updated.invoice_settings.default_payment_method,
            Some(json!(pm))
        );
        let (charge, card) = billing.inspect(&user.sub, now).await.unwrap();
        assert_eq!(charge, Charge::Allowed);
        assert_eq!(card.as_deref(), Some("visa ending 4242, expires 12/2030"));
        // Stripe's error envelope, from a server that is not our fake.
        let e = client
            .retrieve_customer("cus_nonexistent")
            .await
            .unwrap_err();
        assert!(matches!(&e, StripeError::Api { status: 404, .. }), "{e:?}");
        assert!(!e.is_outage());
    }
}
