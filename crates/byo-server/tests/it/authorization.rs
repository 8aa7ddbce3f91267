//! Who may call what: for every API route (read from the generated OpenAPI document, so a
//! new route cannot be missed) and every page, which of anonymous / customer / owner /
//! community host / operator / superadmin may call it. Allowed means the gate let the
//! caller through (not 401/403); denied means 401 for anonymous and 403 for the rest. The page
//! routes are read from the pages router's source, so a new page cannot be missed either.

use crate::on_each_backend;
use crate::support;

use std::collections::BTreeSet;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use byo_wire::Role;
use serde_json::{Value, json};
use support::{PASSWORD, Reply, TestApp};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Actor {
    Anonymous,
    Customer,
    Owner,
    CommunityHost,
    Operator,
    Superadmin,
}

use Actor::*;

const EVERYONE: &[Actor] = &[
    Anonymous,
    Customer,
    Owner,
    CommunityHost,
    Operator,
    Superadmin,
];
const SIGNED_IN: &[Actor] = &[Customer, Owner, CommunityHost, Operator, Superadmin];
const OPERATORS: &[Actor] = &[Operator, Superadmin];
const SUPERADMIN: &[Actor] = &[Superadmin];
/// Adding a GPU: an owner granted community_host, or a superadmin (A note 4).
const HOSTERS: &[Actor] = &[CommunityHost, Superadmin];

/// Routes authenticated by a token, not a session: a session grants nothing there, so every
/// actor without the token gets the same answer.
fn token_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::POST,
            path: "/api/enroll",
            allowed: &[],
            body: |_| Some(json!({"node_index": 0})),
        },
        Row {
            method: Method::POST,
            path: "/api/host/report",
            allowed: &[],
            body: |_| Some(json!({"node": 0})),
        },
        Row {
            method: Method::POST,
            path: "/api/host/rails",
            allowed: &[],
            body: |_| Some(json!({"node": 0, "ports": []})),
        },
        Row {
            method: Method::POST,
            path: "/api/host/uninstalled",
            allowed: &[],
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/host/relay",
            allowed: &[],
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/relay/secrets",
            allowed: &[],
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/api/host/operator-keys",
            allowed: &[],
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/api/host/heartbeat",
            allowed: &[],
            body: |_| {
                Some(
                    json!({"agent_version": "0.1.0", "lxd": "ok", "relay": "ok", "tunnel": "ok",
                            "gpu": "ok", "storage": "ok", "instances": 0}),
                )
            },
        },
    ]
}

struct Row {
    method: Method,
    path: &'static str,
    allowed: &'static [Actor],
    /// A JSON body; for a page, a JSON string is sent as the form it holds.
    body: fn(n: usize) -> Option<Value>,
}

fn none(_: usize) -> Option<Value> {
    None
}

/// Exact statuses, in [`EVERYONE`]'s order: anonymous, customer, owner, community host,
/// operator, superadmin.
type Statuses = [u16; 6];

/// One API route and the exact status each actor gets (#16 item 8). `expect` is for the
/// path with real rows from [`Fixture`] (hosts and an enrolment owned by the owner; an
/// instance, an SSH key, a booking and a queue row owned by the customer), made afresh for
/// every request so no answer depends on an earlier one; `missing`, for a path with ids,
/// is for ids that do not exist. Where a signed-in caller gets 404 for a real row (someone
/// else's), the whole answer must be the one a row that does not exist gets.
struct ApiRow {
    method: Method,
    path: &'static str,
    expect: Statuses,
    missing: Option<Statuses>,
    body: fn(n: usize) -> Option<Value>,
}

/// The real rows one request is made against: the owner's host (bookable, never heard
/// from), the owner's second host with its pending enrolment, and the customer's instance,
/// SSH key, booking (on the first host) and queue row.
struct Fixture {
    host: String,
    enrollment: String,
    vm: String,
    key: String,
    booking: String,
    queued: String,
    /// The customer's API token (the one [`Actors`] made).
    token: String,
}

impl Fixture {
    async fn new(app: &TestApp, actors: &Actors, n: usize) -> Fixture {
        let now = app.state.clock.now();
        let owner = actors.sub(Owner);
        let customer = actors.sub(Customer);
        let host = app
            .db
            .insert_host(
                byo_db::hosts::NewHost {
                    slug: &format!("fixture-{n}"),
                    owner_sub: owner,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                now,
            )
            .await
            .unwrap()
            .id;
        // Bookable (active, prepared, reachable, shared) but never heard from, so no create
        // is placed on it.
        let sealed = app.state.sealer.as_ref().unwrap().seal(
            &byo_server::seal::SealedAt::agent_token(&host),
            "agent-token",
        );
        app.db
            .execute_unchecked(&format!(
                "update hosts set agent_token = '{sealed}' where id = '{host}'"
            ))
            .await
            .unwrap();
        app.db
            .record_relay(
                &host,
                Some("10.8.0.1"),
                byo_wire::states::RelayState::Ready,
                None,
            )
            .await
            .unwrap();
        app.db.mark_host_prepared(&host, now).await.unwrap();
        app.db
            .activate_host(&host, "shared", None, false, actors.sub(Operator), now)
            .await
            .unwrap();
        // The enrolment is a second host's, still waiting to redeem, as a fresh allocation's.
        let enrolling = app
            .db
            .insert_host(
                byo_db::hosts::NewHost {
                    slug: &format!("enrolling-{n}"),
                    owner_sub: owner,
                    profile_id: "gb10-spark-1",
                    gpu_type: "spark-1",
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let enrollment = app
            .db
            .create_enrollment(
                byo_db::enrollments::NewEnrollment {
                    host_id: &enrolling,
                    owner_sub: owner,
                    profile_id: "gb10-spark-1",
                    token_hash: &byo_core::tokens::SecretToken::generate(
                        byo_core::tokens::TokenKind::Enrollment,
                    )
                    .hash(),
                    token_expires_at: now + chrono::Duration::hours(1),
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let vm = app
            .db
            .create_vm(
                byo_db::vms::NewVm {
                    user_sub: customer,
                    host_id: None,
                    name: &format!("fixture-{n}"),
                    gpu_type: "spark-1",
                    ssh_hostname: None,
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let key = app
            .db
            .insert_ssh_key(
                byo_db::ssh_keys::NewSshKey {
                    user_sub: customer,
                    name: "laptop",
                    public_key: FIXTURE_KEY,
                    fingerprint: &format!("SHA256:fixture{n}"),
                },
                now,
            )
            .await
            .unwrap()
            .id;
        let booking = app
            .db
            .book_prebooking(
                byo_db::prebookings::NewPrebooking {
                    user_sub: customer,
                    gpu_type: "spark-1",
                    start_date: now + chrono::Duration::days(2),
                    end_date: now + chrono::Duration::days(4),
                },
                1_000,
                now,
            )
            .await
            .unwrap()
            .id;
        let queued = app
            .db
            .enqueue_vm(
                byo_db::queue::NewQueued {
                    user_sub: customer,
                    gpu_type: "spark-1",
                    ssh_key_id: &key,
                    expires_at: now + chrono::TimeDelta::hours(72),
                },
                now,
                1_000,
            )
            .await
            .unwrap()
            .id;
        // One token for every fixture: a customer holds at most 50 live ones.
        let token = actors.customer_token.clone();
        Fixture {
            host,
            enrollment,
            vm,
            key,
            booking,
            queued,
            token,
        }
    }
}

const FIXTURE_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl fixture";

/// Every API route. The test fails if the OpenAPI document lists one not here. Statuses in
/// the order anonymous, customer, owner, community host, operator, superadmin; `expect` on
/// the fixture's real rows, `missing` on ids that do not exist. Where a body is refused
/// (400), the caller got past every gate and the rule judged the body.
fn api_table() -> Vec<ApiRow> {
    vec![
        ApiRow {
            method: Method::GET,
            path: "/healthz",
            expect: [200, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/auth/signup",
            expect: [202, 202, 202, 202, 202, 202],
            missing: None,
            body: |n| Some(json!({"email": format!("new{n}@example.com"), "password": PASSWORD})),
        },
        // Anyone holding a mailed link; a link that names no sign-up is judged by the rule.
        ApiRow {
            method: Method::POST,
            path: "/api/auth/signup/confirm",
            expect: [400, 400, 400, 400, 400, 400],
            missing: None,
            body: |_| Some(json!({"token": "byo_cnf_none", "password": PASSWORD})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/auth/login",
            expect: [200, 200, 200, 200, 200, 200],
            missing: None,
            body: |_| Some(json!({"email": "login@example.com", "password": PASSWORD})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/auth/logout",
            expect: [401, 204, 204, 204, 204, 204],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/me",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/billing",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/me/earnings",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/me/payouts",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/me/payouts/connect",
            expect: [401, 409, 409, 409, 409, 409],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/me/notices",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::PUT,
            path: "/api/me/notices",
            expect: [401, 204, 204, 204, 204, 204],
            missing: None,
            body: |_| Some(json!({"kind": "queue.placed", "on": false})),
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/outbox",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::PUT,
            path: "/api/me/password",
            expect: [401, 204, 204, 204, 204, 204],
            missing: None,
            body: |_| {
                Some(
                    json!({"current_password": PASSWORD, "new_password": "a different long password"}),
                )
            },
        },
        ApiRow {
            method: Method::GET,
            path: "/api/me/tokens",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/me/tokens",
            expect: [401, 201, 201, 201, 201, 201],
            missing: None,
            body: |n| Some(json!({"name": format!("token-{n}"), "scope": "read"})),
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/me/tokens/{token_id}",
            expect: [401, 204, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/users",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::PUT,
            path: "/api/admin/users/{sub}/roles/{role}",
            expect: [401, 403, 403, 403, 200, 200],
            missing: Some([401, 403, 403, 403, 200, 200]),
            body: none,
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/admin/users/{sub}/roles/{role}",
            expect: [401, 403, 403, 403, 200, 200],
            missing: Some([401, 403, 403, 403, 200, 200]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/audit",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/jobs",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        // Releases and the fleet upgrade (issue #14, 1 and 5): publishing and upgrading are a
        // superadmin's; operators read the list. Past the gate: a publish without its
        // version is 400, a build nobody published 409, a run that does not exist 404.
        ApiRow {
            method: Method::POST,
            path: "/api/admin/releases/{arch}",
            expect: [401, 403, 403, 403, 403, 400],
            missing: Some([401, 403, 403, 403, 403, 400]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/releases",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/fleet-upgrades",
            expect: [401, 403, 403, 403, 403, 409],
            missing: None,
            body: |_| Some(json!({"build": "abcdefabcdef"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/fleet-upgrades/{run_id}/advance",
            expect: [401, 403, 403, 403, 403, 404],
            missing: Some([401, 403, 403, 403, 403, 404]),
            body: |_| Some(json!({})),
        },
        ApiRow {
            method: Method::GET,
            path: "/api/hosts",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/hosts",
            expect: [401, 403, 403, 409, 403, 409],
            missing: None,
            body: |_| Some(json!({"profile_id": "gb10-spark-1"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/activate",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: |_| Some(json!({"placement": "shared"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/walk",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/enrollments/{enrollment_id}/revoke",
            expect: [401, 403, 403, 403, 204, 204],
            missing: Some([401, 403, 403, 403, 409, 409]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/depool",
            expect: [401, 403, 403, 403, 204, 204],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: |_| Some(json!({"reason": "maintenance"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/revoke",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/retire",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/replace-relay",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        // The gate is a session; whose host it is is the owner-action table's check below.
        ApiRow {
            method: Method::POST,
            path: "/api/hosts/{host_id}/stop",
            expect: [401, 404, 409, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/hosts/{host_id}/cancel",
            // The fixture's host has no open enrolment: the owner is let through and refused.
            expect: [401, 404, 409, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/operator-keys",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/operator-keys/changes",
            expect: [401, 403, 403, 403, 400, 400],
            missing: None,
            body: |_| Some(json!({"action": "remove", "fingerprint": "SHA256:none"})),
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/admin/operator-keys/draft",
            expect: [401, 403, 403, 403, 400, 400],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/operator-keys/{version}/signatures",
            expect: [401, 403, 403, 403, 403, 409],
            missing: Some([401, 403, 403, 403, 403, 409]),
            body: |_| Some(json!({"signature": "-----BEGIN SSH SIGNATURE-----"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/operator-keys/hosts/{host_id}/send",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/operator-keys/owner?fingerprint=SHA256:x",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/ssh-keys",
            expect: [401, 400, 400, 400, 400, 400],
            missing: None,
            body: |_| Some(json!({"name": "laptop", "public_key": "ssh-ed25519 not-a-key"})),
        },
        ApiRow {
            method: Method::GET,
            path: "/api/ssh-keys",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/ssh-keys/{key_id}",
            expect: [401, 204, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/vms",
            expect: [401, 400, 400, 400, 400, 400],
            missing: None,
            body: |_| Some(json!({"gpu_type": "spark-1", "ssh_key_id": "no-such-key"})),
        },
        ApiRow {
            method: Method::GET,
            path: "/api/vms",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/vms/{vm_id}",
            expect: [401, 200, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/vms/{vm_id}",
            expect: [401, 409, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/vms/{vm_id}/state",
            expect: [401, 409, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: |_| Some(json!({"action": "stop"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/vms/{vm_id}/delete",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/stuck-deletes",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/fleet",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/worklist",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/hosts/{host_id}/placement",
            expect: [401, 403, 403, 403, 200, 200],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/hosts/{host_id}/placement/clear",
            expect: [401, 403, 403, 403, 200, 200],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: none,
        },
        // Billing (issue #13, 4). Stripe's webhook has no session gate: Stripe-Signature is
        // its gate (400 without a valid one, 404 with billing off; tests/it/billing.rs).
        ApiRow {
            method: Method::POST,
            path: "/api/stripe/webhook",
            expect: [404, 404, 404, 404, 404, 404],
            missing: None,
            body: |_| Some(json!({"id": "evt_1", "type": "checkout.session.completed"})),
        },
        ApiRow {
            method: Method::GET,
            path: "/api/billing",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/billing/payment-method",
            expect: [401, 409, 409, 409, 409, 409],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/prebookings/{prebooking_id}/checkout",
            expect: [401, 409, 409, 409, 409, 409],
            missing: Some([401, 409, 409, 409, 409, 409]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/prebookings",
            expect: [401, 400, 400, 400, 400, 400],
            missing: None,
            body: |_| {
                Some(
                    json!({"gpu_type": "spark-1", "start_date": "2020-01-01T00:00:00Z",
                            "end_date": "2020-01-01T01:00:00Z"}),
                )
            },
        },
        ApiRow {
            method: Method::GET,
            path: "/api/prebookings",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/prebookings/{prebooking_id}/cancel",
            expect: [401, 200, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/prebookings",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/prebookings/{prebooking_id}/paid",
            expect: [401, 403, 403, 403, 403, 200],
            missing: Some([401, 403, 403, 403, 403, 404]),
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/prebookings/{prebooking_id}/refund",
            // Billing is off here: the superadmin passes the gate and meets billing_off.
            expect: [401, 403, 403, 403, 403, 409],
            missing: Some([401, 403, 403, 403, 403, 404]),
            body: |_| Some(json!({"reason": "a goodwill refund"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/prebookings/{prebooking_id}/launch",
            expect: [401, 403, 403, 403, 403, 409],
            missing: Some([401, 403, 403, 403, 403, 404]),
            body: |_| Some(json!({"force": true})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/prebookings/{prebooking_id}/reassign",
            expect: [401, 403, 403, 403, 400, 400],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: |_| Some(json!({"host_id": "no-such-host"})),
        },
        // The queue (E2, issue #13).
        ApiRow {
            method: Method::GET,
            path: "/api/queue",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/queue/ended",
            expect: [401, 200, 200, 200, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/queue/{queue_id}/extend",
            expect: [401, 200, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::DELETE,
            path: "/api/queue/{queue_id}",
            expect: [401, 204, 404, 404, 404, 404],
            missing: Some([401, 404, 404, 404, 404, 404]),
            body: none,
        },
        ApiRow {
            method: Method::GET,
            path: "/api/admin/queue",
            expect: [401, 403, 403, 403, 200, 200],
            missing: None,
            body: none,
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/queue/{queue_id}/place",
            expect: [401, 403, 403, 403, 409, 409],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: |_| Some(json!({"host_id": "no-such-host"})),
        },
        ApiRow {
            method: Method::POST,
            path: "/api/admin/queue/{queue_id}/close",
            expect: [401, 403, 403, 403, 204, 204],
            missing: Some([401, 403, 403, 403, 404, 404]),
            body: |_| Some(json!({"reason": "testing the gate"})),
        },
    ]
}

/// Pages: a page denies anonymous callers by sending them to /login.
fn page_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::GET,
            path: "/openapi.json",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/login",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/signup",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/signup/confirm",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/signup/confirm",
            allowed: EVERYONE,
            body: |_| {
                Some(json!(
                    "token=byo_cnf_none&password=correct+horse+battery+staple"
                ))
            },
        },
        Row {
            method: Method::GET,
            path: "/assets/style.css",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/assets/app.js",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/login",
            allowed: EVERYONE,
            body: |_| {
                Some(json!(
                    "email=login%40example.com&password=correct+horse+battery+staple"
                ))
            },
        },
        Row {
            method: Method::POST,
            path: "/signup",
            allowed: EVERYONE,
            body: |n| {
                Some(json!(format!(
                    "email=page{n}%40example.com&password=correct+horse+battery+staple"
                )))
            },
        },
        Row {
            method: Method::GET,
            path: "/agent/{file}",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/relay/{file}",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/cloudflared/{file}",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/users",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/jobs",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/releases",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/fleet-upgrades/{run_id}/halt",
            allowed: SUPERADMIN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/fleet-upgrades/{run_id}/close",
            allowed: SUPERADMIN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/users/{sub}/roles/{role}/grant",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/users/{sub}/roles/{role}/revoke",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/hosts",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/hosts/earnings.csv",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/hosts",
            allowed: HOSTERS,
            body: |_| Some(json!("profile_id=gb10-spark-1")),
        },
        Row {
            method: Method::GET,
            path: "/install.sh",
            allowed: EVERYONE,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/hosts",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/activate",
            allowed: OPERATORS,
            body: |_| Some(json!("placement=shared")),
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/walk",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/enrollments/{enrollment_id}/revoke",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/hosts/{host_id}",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/depool",
            allowed: OPERATORS,
            body: |_| Some(json!("reason=maintenance")),
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/revoke",
            allowed: OPERATORS,
            body: |_| Some(json!("confirm=no-such-host")),
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/reboot",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/retire",
            allowed: OPERATORS,
            body: |_| Some(json!("confirm=no-such-host")),
        },
        Row {
            method: Method::POST,
            path: "/admin/hosts/{host_id}/replace-relay",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/operator-keys/changes",
            allowed: OPERATORS,
            body: |_| Some(json!("action=remove&fingerprint=SHA256%3Anone")),
        },
        Row {
            method: Method::GET,
            path: "/admin/operator-keys",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/operator-keys/withdraw",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/operator-keys/hosts/{host_id}/send",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/instances",
            allowed: SIGNED_IN,
            body: none,
        },
        // Billing (issue #13, 4).
        Row {
            method: Method::GET,
            path: "/billing",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/notices",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/account",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/account/tokens",
            allowed: SIGNED_IN,
            body: |n| {
                Some(json!(format!(
                    "name=page-token-{n}&scope=read&expires_in_days=30"
                )))
            },
        },
        Row {
            method: Method::POST,
            path: "/account/tokens/{token_id}/revoke",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/notices",
            allowed: SIGNED_IN,
            body: |_| Some(json!("kind=queue.placed&on=false")),
        },
        Row {
            method: Method::GET,
            path: "/admin/outbox",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/billing/payment-method",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/hosts/payouts/connect",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/instances",
            allowed: SIGNED_IN,
            body: |_| Some(json!("gpu_type=spark-1&ssh_key_id=no-such-key")),
        },
        Row {
            method: Method::POST,
            path: "/instances/ssh-keys",
            allowed: SIGNED_IN,
            body: |_| Some(json!("name=laptop&public_key=ssh-ed25519+not-a-key")),
        },
        Row {
            method: Method::POST,
            path: "/instances/ssh-keys/{key_id}/remove",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/instances/{vm_id}/delete",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/instances/{vm_id}/delete",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/instances/{vm_id}/state",
            allowed: SIGNED_IN,
            body: |_| Some(json!("action=stop")),
        },
        Row {
            method: Method::GET,
            path: "/admin/instances",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/instances/{vm_id}/delete",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/instances/{vm_id}/delete",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/prebookings",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/prebookings",
            allowed: SIGNED_IN,
            body: |_| {
                Some(json!(
                    "gpu_type=spark-1&start=2020-01-01T00:00&end=2020-01-01T01:00"
                ))
            },
        },
        Row {
            method: Method::POST,
            path: "/prebookings/{prebooking_id}/cancel",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/prebookings/{prebooking_id}/checkout",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/prebookings",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/billing",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/prebookings/{prebooking_id}/paid",
            allowed: SUPERADMIN,
            body: |_| Some(json!("reason=")),
        },
        Row {
            method: Method::POST,
            path: "/admin/prebookings/{prebooking_id}/refund",
            allowed: SUPERADMIN,
            body: |_| Some(json!("reason=a+goodwill+refund")),
        },
        Row {
            method: Method::POST,
            path: "/admin/prebookings/{prebooking_id}/launch",
            allowed: SUPERADMIN,
            body: |_| Some(json!("force=true")),
        },
        Row {
            method: Method::POST,
            path: "/admin/prebookings/{prebooking_id}/reassign",
            allowed: OPERATORS,
            body: |_| Some(json!("host_id=no-such-host")),
        },
        // The queue (E2, issue #13).
        Row {
            method: Method::POST,
            path: "/instances/queue/{queue_id}/cancel",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/instances/queue/{queue_id}/extend",
            allowed: SIGNED_IN,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin/queue",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::GET,
            path: "/admin",
            allowed: OPERATORS,
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/admin/queue/{queue_id}/place",
            allowed: OPERATORS,
            body: |_| Some(json!("host_id=no-such-host")),
        },
        Row {
            method: Method::POST,
            path: "/admin/queue/{queue_id}/close",
            allowed: OPERATORS,
            body: |_| Some(json!("reason=testing")),
        },
    ]
}

/// Pages whose answer does not depend on who asks (signing out ends whatever session there
/// is and sends everyone to sign in).
fn same_for_everyone_page_table() -> Vec<Row> {
    vec![Row {
        method: Method::POST,
        path: "/logout",
        allowed: EVERYONE,
        body: none,
    }]
}

/// Pages about one host: its owner and operators read them; anyone else signed in is told
/// the host does not exist (404, the same answer as for a host that does not), so a host's
/// existence is not revealed; anonymous callers are sent to sign in. `{host_id}` is the
/// owner's host.
fn host_page_table() -> Vec<Row> {
    vec![Row {
        method: Method::GET,
        path: "/hosts/{host_id}/progress",
        allowed: &[Owner, Operator, Superadmin],
        body: none,
    }]
}

/// Actions on one host that only its owner may take (stopping hosting, issue #12; cancelling
/// the allocation before it enrolled, issue #39): the
/// owner gets past every gate; anyone else signed in — operators included, whose tools are
/// de-pool and revoke — gets exactly what a host that does not exist gets; anonymous
/// callers are refused (401, or sent to sign in from a page). `{host_id}` is the owner's.
fn owner_action_table() -> Vec<Row> {
    vec![
        Row {
            method: Method::POST,
            path: "/api/hosts/{host_id}/stop",
            allowed: &[Owner],
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/hosts/{host_id}/stop",
            allowed: &[Owner],
            body: |_| Some(json!("")),
        },
        Row {
            method: Method::POST,
            path: "/api/hosts/{host_id}/cancel",
            allowed: &[Owner],
            body: none,
        },
        Row {
            method: Method::POST,
            path: "/hosts/{host_id}/cancel",
            allowed: &[Owner],
            body: |_| Some(json!("")),
        },
    ]
}

async fn owner_actions_are_the_owners_alone(app: TestApp) {
    let actors = actors(&app).await;
    let mut failures = Vec::new();
    for row in owner_action_table() {
        let page = !row.path.starts_with("/api/");
        let real = row.path.replace("{host_id}", &actors.owned_host);
        let none = row.path.replace("{host_id}", "no-such-host");
        for actor in EVERYONE {
            let session = actors.session(&app, *actor).await;
            let r = send(
                &app,
                row.method.clone(),
                &real,
                session.as_deref(),
                (row.body)(0),
            )
            .await;
            let missing = send(
                &app,
                row.method.clone(),
                &none,
                session.as_deref(),
                (row.body)(0),
            )
            .await;
            let ok = if row.allowed.contains(actor) {
                // The owner's host never enrolled, so the action itself refuses (409).
                !matches!(
                    r.status,
                    StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::NOT_FOUND
                ) && missing.status == StatusCode::NOT_FOUND
            } else if *actor == Anonymous {
                if page {
                    sent_to_login(&r) && sent_to_login(&missing)
                } else {
                    r.status == StatusCode::UNAUTHORIZED
                        && missing.status == StatusCode::UNAUTHORIZED
                }
            } else {
                r.status == StatusCode::NOT_FOUND && r.as_seen() == missing.as_seen()
            };
            if !ok {
                failures.push(format!(
                    "{} {} as {actor:?}: {} {} (a host that does not exist: {})",
                    row.method,
                    row.path,
                    r.status,
                    r.text(),
                    missing.status
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "owner actions reveal or admit wrongly:\n{}",
        failures.join("\n")
    );
}

struct Actors {
    subs: Vec<(Actor, String)>,
    target: String,
    /// The host the owner owns.
    owned_host: String,
    /// An API token of the customer's (its id).
    customer_token: String,
}

async fn actors(app: &TestApp) -> Actors {
    let mut subs = Vec::new();
    for (actor, email, roles) in [
        (Customer, "customer@example.com", &[][..]),
        (Owner, "owner@example.com", &[][..]),
        (
            CommunityHost,
            "host@example.com",
            &[Role::CommunityHost][..],
        ),
        (Operator, "operator@example.com", &[Role::Operator][..]),
        (
            Superadmin,
            "superadmin@example.com",
            &[Role::Superadmin][..],
        ),
    ] {
        let (sub, _) = app.user_with(email, roles).await;
        subs.push((actor, sub));
    }
    let owner = &subs.iter().find(|(a, _)| *a == Owner).unwrap().1;
    app.give_host(owner, "spark-1").await;
    let owned_host = app
        .db
        .agent_targets()
        .await
        .unwrap()
        .into_iter()
        .find(|h| h.slug == "spark-1")
        .unwrap()
        .id;
    app.user_with("login@example.com", &[]).await;
    let (target, _) = app.user_with("target@example.com", &[]).await;
    let customer = &subs.iter().find(|(a, _)| *a == Customer).unwrap().1;
    let customer_token = app
        .db
        .insert_api_token(
            byo_db::api_tokens::NewApiToken {
                user_sub: customer,
                name: "fixture",
                scope: byo_wire::states::ApiScope::Read,
                token_hash: &byo_core::tokens::SecretToken::generate(
                    byo_core::tokens::TokenKind::Api,
                )
                .hash(),
                expires_at: app.state.clock.now() + chrono::Duration::days(30),
            },
            app.state.clock.now(),
        )
        .await
        .unwrap()
        .id;
    Actors {
        subs,
        target,
        owned_host,
        customer_token,
    }
}

impl Actors {
    fn sub(&self, actor: Actor) -> &str {
        &self.subs.iter().find(|(a, _)| *a == actor).unwrap().1
    }

    /// `path` with its placeholders filled: the fixture's rows, or ids that do not exist.
    fn path(&self, path: &str, fx: Option<&Fixture>) -> String {
        let id = |real: fn(&Fixture) -> &str, missing: &'static str| -> String {
            fx.map_or(missing.to_owned(), |f| real(f).to_owned())
        };
        path.replace("{sub}", &self.target)
            .replace("{role}", "community_host")
            .replace("{version}", "1")
            .replace("{arch}", "x86_64")
            .replace("{run_id}", "no-such-run")
            .replace("{host_id}", &id(|f| &f.host, "no-such-host"))
            .replace(
                "{enrollment_id}",
                &id(|f| &f.enrollment, "no-such-enrollment"),
            )
            .replace("{vm_id}", &id(|f| &f.vm, "no-such-vm"))
            .replace("{key_id}", &id(|f| &f.key, "no-such-key"))
            .replace("{prebooking_id}", &id(|f| &f.booking, "no-such-booking"))
            .replace("{queue_id}", &id(|f| &f.queued, "no-such-queued"))
            .replace("{token_id}", &id(|f| &f.token, "no-such-token"))
    }

    async fn session(&self, app: &TestApp, actor: Actor) -> Option<String> {
        match self.subs.iter().find(|(a, _)| *a == actor) {
            Some((_, sub)) => Some(app.session_for(sub).await),
            None => None,
        }
    }
}

/// Send one row's request: JSON for the API, a form for a page when its body is a string.
async fn send(
    app: &TestApp,
    method: Method,
    path: &str,
    session: Option<&str>,
    body: Option<Value>,
) -> Reply {
    let Some(Value::String(form)) = body else {
        return app.request(method, path, session, body).await;
    };
    let mut req = Request::builder()
        .method(method)
        .uri(path)
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(s) = session {
        req = req.header(header::COOKIE, format!("__Host-byo_session={s}"));
    }
    app.send(req.body(Body::from(form)).unwrap()).await
}

fn sent_to_login(reply: &Reply) -> bool {
    reply.status.is_redirection()
        && reply
            .headers
            .get(header::LOCATION)
            .is_some_and(|l| l == "/login")
}

async fn check(app: &TestApp, actors: &Actors, rows: &[Row], page: bool) {
    let mut n = 0;
    let mut failures = Vec::new();
    for row in rows {
        let path = row
            .path
            .replace("{sub}", &actors.target)
            .replace("{role}", "community_host")
            .replace("{version}", "1")
            .replace("{host_id}", "no-such-host")
            .replace("{enrollment_id}", "no-such-enrollment")
            .replace("{file}", "byo-agent-aarch64")
            .replace("{vm_id}", "no-such-vm")
            .replace("{key_id}", "no-such-key")
            .replace("{prebooking_id}", "no-such-booking")
            .replace("{queue_id}", "no-such-queued")
            .replace("{token_id}", "no-such-token");
        for actor in EVERYONE {
            n += 1;
            let session = actors.session(app, *actor).await;
            let reply = send(
                app,
                row.method.clone(),
                &path,
                session.as_deref(),
                (row.body)(n),
            )
            .await;
            let allowed = row.allowed.contains(actor);
            let ok = match (allowed, *actor, page) {
                (true, _, _) => {
                    let gated = matches!(
                        reply.status,
                        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
                    );
                    let sent_to_login = reply
                        .headers
                        .get(header::LOCATION)
                        .is_some_and(|l| l == "/login");
                    let denied_by_page = page && sent_to_login;
                    !(gated || denied_by_page)
                }
                (false, Anonymous, false) => reply.status == StatusCode::UNAUTHORIZED,
                (false, Anonymous, true) => sent_to_login(&reply),
                (false, _, _) => reply.status == StatusCode::FORBIDDEN,
            };
            if !ok {
                failures.push(format!(
                    "{} {} as {actor:?}: expected {}, got {} {}",
                    row.method,
                    row.path,
                    if allowed { "allowed" } else { "denied" },
                    reply.status,
                    reply.text()
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "authorisation table violated:\n{}",
        failures.join("\n")
    );
}

async fn every_api_route_has_an_authorisation_row(app: TestApp) {
    let doc = app.get("/openapi.json", None).await.json();
    let mut documented = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            if ["get", "post", "put", "delete", "patch"].contains(&method.as_str()) {
                documented.insert((method.to_uppercase(), path.clone()));
            }
        }
    }
    let tabled: BTreeSet<_> = api_table()
        .iter()
        .map(|r| (&r.method, r.path))
        .chain(token_table().iter().map(|r| (&r.method, r.path)))
        .map(|(method, path)| {
            (
                method.to_string(),
                path.split('?').next().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        documented, tabled,
        "the OpenAPI document and the authorisation table disagree"
    );
}

/// #16 item 8: every API route, every actor, real rows and ids that do not exist, and the
/// exact status each gets. `BYO_PRINT_MATRIX=1` prints what was seen as the table's arrays.
async fn api_routes_answer_each_role_exactly_as_the_table_says(app: TestApp) {
    let actors = actors(&app).await;
    let mut n = 0;
    let mut failures = Vec::new();
    let mut seen_table = String::new();
    for row in api_table() {
        let mut seen = [0u16; 6];
        let mut seen_missing = [0u16; 6];
        let has_ids = row.path.contains('{');
        for (i, actor) in EVERYONE.iter().enumerate() {
            n += 1;
            let fx = Fixture::new(&app, &actors, n).await;
            let session = actors.session(&app, *actor).await;
            let real = actors.path(row.path, Some(&fx));
            let reply = send(
                &app,
                row.method.clone(),
                &real,
                session.as_deref(),
                (row.body)(n),
            )
            .await;
            seen[i] = reply.status.as_u16();
            if seen[i] != row.expect[i] {
                failures.push(format!(
                    "{} {} as {actor:?} on real rows: expected {}, got {} {}",
                    row.method,
                    row.path,
                    row.expect[i],
                    reply.status,
                    reply.text()
                ));
            }
            if !has_ids {
                continue;
            }
            n += 1;
            let missing = send(
                &app,
                row.method.clone(),
                &actors.path(row.path, None),
                session.as_deref(),
                (row.body)(n),
            )
            .await;
            seen_missing[i] = missing.status.as_u16();
            if let Some(want) = row.missing
                && seen_missing[i] != want[i]
            {
                failures.push(format!(
                    "{} {} as {actor:?} on ids that do not exist: expected {}, got {} {}",
                    row.method,
                    row.path,
                    want[i],
                    missing.status,
                    missing.text()
                ));
            }
            if *actor != Anonymous
                && reply.status == StatusCode::NOT_FOUND
                && reply.as_seen() != missing.as_seen()
            {
                failures.push(format!(
                    "{} {} as {actor:?}: someone else's row answers {} but one that does not exist {}",
                    row.method,
                    row.path,
                    reply.text(),
                    missing.text()
                ));
            }
        }
        if row.missing.is_none() && has_ids {
            failures.push(format!(
                "{} {}: no `missing` statuses",
                row.method, row.path
            ));
        }
        seen_table.push_str(&format!(
            "{} {} expect: {seen:?}, missing: {}\n",
            row.method,
            row.path,
            if has_ids {
                format!("Some({seen_missing:?})")
            } else {
                "None".into()
            }
        ));
    }
    if std::env::var_os("BYO_PRINT_MATRIX").is_some() {
        eprintln!("MATRIX\n{seen_table}MATRIX");
    }
    assert!(
        failures.is_empty(),
        "the role matrix is violated:\n{}",
        failures.join("\n")
    );
}

async fn pages_admit_exactly_the_roles_in_the_table(app: TestApp) {
    let actors = actors(&app).await;
    check(&app, &actors, &page_table(), true).await;
}

async fn sign_out_answers_everyone_alike(app: TestApp) {
    let actors = actors(&app).await;
    for row in same_for_everyone_page_table() {
        for actor in EVERYONE {
            let session = actors.session(&app, *actor).await;
            let reply = send(
                &app,
                row.method.clone(),
                row.path,
                session.as_deref(),
                (row.body)(0),
            )
            .await;
            assert!(
                sent_to_login(&reply),
                "{} {} as {actor:?}: {}",
                row.method,
                row.path,
                reply.status
            );
        }
    }
}

/// The per-role check of the host pages: the owner and operators get the page; anyone else
/// gets exactly what a host that does not exist gets; anonymous callers go to sign in.
async fn host_pages_show_a_host_only_to_its_owner_and_operators(app: TestApp) {
    let actors = actors(&app).await;
    let mut failures = Vec::new();
    for row in host_page_table() {
        let real = row.path.replace("{host_id}", &actors.owned_host);
        let none = row.path.replace("{host_id}", "no-such-host");
        for actor in EVERYONE {
            let session = actors.session(&app, *actor).await;
            let get = |path: String| {
                let session = session.clone();
                let body = (row.body)(0);
                let method = row.method.clone();
                let app = &app;
                async move { send(app, method, &path, session.as_deref(), body).await }
            };
            let (r, missing) = (get(real.clone()).await, get(none.clone()).await);
            let ok = if row.allowed.contains(actor) {
                r.status == StatusCode::OK && missing.status == StatusCode::NOT_FOUND
            } else if *actor == Anonymous {
                sent_to_login(&r) && sent_to_login(&missing)
            } else {
                r.status == StatusCode::NOT_FOUND && r.as_seen() == missing.as_seen()
            };
            if !ok {
                failures.push(format!(
                    "{} {} as {actor:?}: {} {} (a host that does not exist: {})",
                    row.method,
                    row.path,
                    r.status,
                    r.text(),
                    missing.status
                ));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "host pages reveal or refuse wrongly:\n{}",
        failures.join("\n")
    );
}

/// The routes of the pages router, read from its source: (METHOD, pattern).
fn page_routes() -> BTreeSet<(String, String)> {
    let src = include_str!("../../src/pages/mod.rs");
    let start = src.find("pub fn router()").expect("pages::router");
    let body = &src[start..start + src[start..].find("\n}\n").unwrap()];
    let mut routes = BTreeSet::new();
    for chunk in body.split(".route(").skip(1) {
        let path = chunk.trim_start().strip_prefix('"').unwrap();
        let path = &path[..path.find('"').unwrap()];
        let bytes = chunk.as_bytes();
        for method in ["get", "post", "put", "patch", "delete"] {
            let call = format!("{method}(");
            let called = chunk.match_indices(&call).any(|(i, _)| {
                i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || b"_:".contains(&bytes[i - 1]))
            });
            if called {
                routes.insert((method.to_uppercase(), path.to_owned()));
            }
        }
    }
    assert!(routes.len() > 10, "read the router: {routes:?}");
    routes
}

/// Whether a table path (placeholders or literal segments) is one of `pattern`'s.
fn matches(pattern: &str, path: &str) -> bool {
    let path = path.split('?').next().unwrap();
    let (p, q): (Vec<_>, Vec<_>) = (pattern.split('/').collect(), path.split('/').collect());
    p.len() == q.len()
        && p.iter()
            .zip(&q)
            .all(|(a, b)| a == b || (a.starts_with('{') && a.ends_with('}')))
}

#[test]
fn every_page_route_has_an_authorisation_row() {
    let rows: Vec<Row> = page_table()
        .into_iter()
        .chain(same_for_everyone_page_table())
        .chain(host_page_table())
        .chain(
            owner_action_table()
                .into_iter()
                .filter(|r| !r.path.starts_with("/api/")),
        )
        .collect();
    let routes = page_routes();
    let untabled: Vec<_> = routes
        .iter()
        .filter(|(m, pattern)| {
            !rows
                .iter()
                .any(|r| r.method.as_str() == m && matches(pattern, r.path))
        })
        .collect();
    assert!(
        untabled.is_empty(),
        "page routes without a row in the authorisation table: {untabled:?}"
    );
    let stale: Vec<_> = rows
        .iter()
        .filter(|r| r.path != "/openapi.json")
        .filter(|r| {
            !routes
                .iter()
                .any(|(m, pattern)| r.method.as_str() == m && matches(pattern, r.path))
        })
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(stale.is_empty(), "rows for no page route: {stale:?}");
}

async fn token_routes_give_every_session_the_same_answer(app: TestApp) {
    let actors = actors(&app).await;
    for row in token_table() {
        let mut answers = BTreeSet::new();
        for actor in EVERYONE {
            let session = match actors.subs.iter().find(|(a, _)| a == actor) {
                Some((_, sub)) => Some(app.session_for(sub).await),
                None => None,
            };
            let reply = app
                .request(
                    row.method.clone(),
                    row.path,
                    session.as_deref(),
                    (row.body)(0),
                )
                .await;
            assert_eq!(
                reply.status,
                StatusCode::UNAUTHORIZED,
                "{} as {actor:?}",
                row.path
            );
            answers.insert(reply.as_seen());
        }
        assert_eq!(answers.len(), 1, "{}: one answer whoever asks", row.path);
    }
}

async fn operators_cannot_grant_operator_or_superadmin(app: TestApp) {
    let actors = actors(&app).await;
    let op = &actors.subs.iter().find(|(a, _)| *a == Operator).unwrap().1;
    let session = app.session_for(op).await;
    for role in ["operator", "superadmin"] {
        let path = format!("/api/admin/users/{}/roles/{role}", actors.target);
        let reply = app.request(Method::PUT, &path, Some(&session), None).await;
        assert_eq!(reply.status, StatusCode::FORBIDDEN, "{role}");
    }
    assert!(
        app.db.roles_of(&actors.target).await.unwrap().is_empty(),
        "nothing was granted"
    );

    let sa = &actors
        .subs
        .iter()
        .find(|(a, _)| *a == Superadmin)
        .unwrap()
        .1;
    let session = app.session_for(sa).await;
    let path = format!("/api/admin/users/{}/roles/operator", actors.target);
    let reply = app.request(Method::PUT, &path, Some(&session), None).await;
    assert_eq!(reply.status, StatusCode::OK);
    assert_eq!(reply.json()["roles"], json!(["operator"]));
}

/// Which API tokens reach a route (issue #43), stated route by route as docs/api-tokens.md
/// gives the rule, apart from the server's own statement of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TokenReach {
    /// The route authenticates no person: a token changes nothing.
    NoPerson,
    /// Only a signed-in session reaches it.
    SessionOnly,
    /// These scopes reach it; any other is out of scope.
    Scopes(&'static [&'static str]),
}

fn token_reach(method: &Method, path: &str) -> TokenReach {
    const CUSTOMER: &[(&str, &str)] = &[
        ("GET", "/api/vms"),
        ("POST", "/api/vms"),
        ("GET", "/api/vms/{vm_id}"),
        ("DELETE", "/api/vms/{vm_id}"),
        ("POST", "/api/vms/{vm_id}/state"),
        ("GET", "/api/ssh-keys"),
        ("POST", "/api/ssh-keys"),
        ("DELETE", "/api/ssh-keys/{key_id}"),
        ("GET", "/api/queue"),
        ("GET", "/api/queue/ended"),
        ("DELETE", "/api/queue/{queue_id}"),
        ("POST", "/api/queue/{queue_id}/extend"),
        ("GET", "/api/prebookings"),
        ("POST", "/api/prebookings"),
        ("POST", "/api/prebookings/{prebooking_id}/cancel"),
        ("POST", "/api/prebookings/{prebooking_id}/checkout"),
        ("GET", "/api/billing"),
    ];
    const OWNER: &[(&str, &str)] = &[
        ("GET", "/api/hosts"),
        ("POST", "/api/hosts"),
        ("POST", "/api/hosts/{host_id}/cancel"),
        ("POST", "/api/hosts/{host_id}/stop"),
        ("GET", "/api/me/earnings"),
        ("GET", "/api/me/payouts"),
    ];
    let m = method.as_str();
    let is = |list: &[(&str, &str)]| list.iter().any(|(lm, lp)| *lm == m && *lp == path);
    let get = *method == Method::GET;
    match (m, path) {
        ("GET", "/healthz")
        | ("POST", "/api/auth/signup")
        | ("POST", "/api/auth/signup/confirm")
        | ("POST", "/api/auth/login")
        | ("POST", "/api/stripe/webhook") => TokenReach::NoPerson,
        ("POST", "/api/auth/logout")
        | ("PUT", "/api/me/password")
        | ("PUT", "/api/me/notices")
        | ("POST", "/api/billing/payment-method")
        | ("POST", "/api/me/payouts/connect")
        | (_, "/api/me/tokens")
        | (_, "/api/me/tokens/{token_id}") => TokenReach::SessionOnly,
        ("GET", "/api/me") | ("GET", "/api/me/notices") => {
            TokenReach::Scopes(&["read", "instances", "hosts", "admin"])
        }
        _ if path.starts_with("/api/admin/") => TokenReach::Scopes(&["admin"]),
        _ if is(CUSTOMER) && get => TokenReach::Scopes(&["read", "instances", "admin"]),
        _ if is(CUSTOMER) => TokenReach::Scopes(&["instances", "admin"]),
        _ if is(OWNER) && get => TokenReach::Scopes(&["read", "hosts", "admin"]),
        _ if is(OWNER) => TokenReach::Scopes(&["hosts", "admin"]),
        _ => panic!("{m} {path}: say which tokens reach it"),
    }
}

/// Issue #43: every API route, a token of each scope, and exactly the answer the session of
/// the same person gets where the scope reaches the route — 403 `out_of_scope` where it
/// does not, 403 `session_only` where only a session does, and 401 on the hosts' doors. The
/// person is the first the role table lets through (a superadmin for `admin`, which only
/// staff may hold).
async fn api_tokens_reach_exactly_their_scope(app: TestApp) {
    use byo_wire::states::ApiScope;
    let actors = actors(&app).await;
    let mut tokens = std::collections::HashMap::new();
    for (i, actor) in EVERYONE.iter().enumerate().skip(1) {
        for scope in ApiScope::ALL {
            let secret = app
                .api_token_for(actors.sub(*actor), &format!("matrix-{scope}"), *scope, 30)
                .await;
            tokens.insert((i, *scope), secret);
        }
    }
    let mut n = 10_000;
    let mut failures = Vec::new();
    for row in api_table() {
        let route = row.path.split('?').next().unwrap();
        let reach = token_reach(&row.method, route);
        let first_admitted = (1..6)
            .find(|i| ![401, 403].contains(&row.expect[*i]))
            .unwrap_or(5);
        for scope in ApiScope::ALL {
            let i = if *scope == ApiScope::Admin {
                5
            } else {
                first_admitted
            };
            n += 1;
            let fx = Fixture::new(&app, &actors, n).await;
            let reply = app
                .request_with_token(
                    row.method.clone(),
                    &actors.path(row.path, Some(&fx)),
                    &tokens[&(i, *scope)],
                    (row.body)(n),
                )
                .await;
            let (want, code) = match reach {
                TokenReach::NoPerson => (row.expect[i], None),
                TokenReach::SessionOnly => (403, Some("session_only")),
                TokenReach::Scopes(s) if s.contains(&scope.as_str()) => (row.expect[i], None),
                TokenReach::Scopes(_) => (403, Some("out_of_scope")),
            };
            let got_code = serde_json::from_slice::<Value>(&reply.body)
                .ok()
                .and_then(|b| b["error"].as_str().map(str::to_owned));
            if reply.status.as_u16() != want || code.is_some_and(|c| got_code.as_deref() != Some(c))
            {
                failures.push(format!(
                    "{} {} with a {scope} token of {:?}: expected {want} {}, got {} {}",
                    row.method,
                    row.path,
                    EVERYONE[i],
                    code.unwrap_or(""),
                    reply.status,
                    reply.text()
                ));
            }
        }
    }
    // The hosts' doors take their own tokens: a person's is not one of them.
    for row in token_table() {
        let reply = app
            .request_with_token(
                row.method.clone(),
                row.path,
                &tokens[&(5, ApiScope::Admin)],
                (row.body)(0),
            )
            .await;
        if reply.status != StatusCode::UNAUTHORIZED {
            failures.push(format!(
                "{} {} with an admin token: expected 401, got {} {}",
                row.method,
                row.path,
                reply.status,
                reply.text()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "API tokens reach more or less than their scope:\n{}",
        failures.join("\n")
    );
}

on_each_backend!(
    every_api_route_has_an_authorisation_row,
    api_routes_answer_each_role_exactly_as_the_table_says,
    pages_admit_exactly_the_roles_in_the_table,
    operators_cannot_grant_operator_or_superadmin,
    token_routes_give_every_session_the_same_answer,
    sign_out_answers_everyone_alike,
    host_pages_show_a_host_only_to_its_owner_and_operators,
    owner_actions_are_the_owners_alone,
    api_tokens_reach_exactly_their_scope,
);
