//! Server-rendered pages: sign-in and sign-up, the signed-in home, the operator's users
//! page, and (in submodules) GPUs and hosts, instances and SSH keys. Plain HTML forms, so every page works without JavaScript; forms POST to page
//! routes that call the same code as the API.

use axum::Form;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum_extra::extract::CookieJar;
use byo_wire::Role;
use maud::{DOCTYPE, Markup, html};
use serde::Deserialize;

use crate::app::accounts::{self, open_session, password_sign_in};
use crate::app::operator_keys;
use crate::app::users::change_grant;
use crate::auth::session::end_session;
use crate::auth::{CurrentUser, Operator, Superadmin};
use crate::error::{AppError, current_request_id};
use crate::state::AppState;

mod account;
mod admin_fleet;
mod admin_instances;
mod admin_jobs;
mod billing;
mod notices;
// The queue (E2, issue #13).
mod admin_queue;
mod admin_releases;
mod host_detail;
mod hosts;
pub mod install;
mod instances;
mod prebookings;

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/", get(home))
        .route("/login", get(login_page).post(login_submit))
        .route("/signup", get(signup_page).post(signup_submit))
        .route("/signup/confirm", get(confirm_page).post(confirm_submit))
        .route("/logout", post(logout_submit))
        .route("/account", get(account::page))
        .route("/account/tokens", post(account::create))
        .route("/account/tokens/{token_id}/revoke", post(account::revoke))
        .route("/admin/users", get(users_page))
        .route(
            "/admin/users/{sub}/roles/{role}/{action}",
            post(users_grant_submit),
        )
        .route("/install.sh", get(install::install_sh))
        .route("/agent/{file}", get(install::agent_file))
        .route("/relay/{file}", get(install::relay_file))
        .route("/cloudflared/{file}", get(install::cloudflared_file))
        .route("/hosts", get(hosts::gpus).post(hosts::add_gpu))
        .route("/hosts/{host_id}/progress", get(hosts::progress))
        .route("/hosts/earnings.csv", get(hosts::earnings_csv))
        .route("/hosts/payouts/connect", post(hosts::connect_payouts))
        .route("/admin", get(admin_fleet::page))
        .route("/admin/hosts", get(hosts::admin_hosts))
        .route("/admin/hosts/{host_id}", get(host_detail::show))
        .route("/admin/hosts/{host_id}/depool", post(host_detail::depool))
        .route("/admin/hosts/{host_id}/revoke", post(host_detail::revoke))
        .route("/admin/hosts/{host_id}/retire", post(host_detail::retire))
        .route("/admin/hosts/{host_id}/reboot", post(host_detail::reboot))
        .route(
            "/admin/hosts/{host_id}/replace-relay",
            post(host_detail::replace_relay),
        )
        .route("/hosts/{host_id}/stop", post(hosts::stop_hosting))
        .route("/hosts/{host_id}/cancel", post(hosts::cancel_allocation))
        .route("/admin/hosts/{host_id}/activate", post(hosts::activate))
        .route("/admin/hosts/{host_id}/walk", post(host_detail::walk))
        .route(
            "/admin/enrollments/{enrollment_id}/revoke",
            post(hosts::revoke),
        )
        .route("/instances", get(instances::page).post(instances::create))
        .route("/instances/ssh-keys", post(instances::add_key))
        .route(
            "/instances/ssh-keys/{key_id}/remove",
            post(instances::remove_key),
        )
        .route(
            "/instances/{vm_id}/delete",
            get(instances::confirm_delete).post(instances::delete),
        )
        .route("/instances/{vm_id}/state", post(instances::power))
        // The queue (E2, issue #13).
        .route(
            "/instances/queue/{queue_id}/cancel",
            post(instances::cancel_queued),
        )
        .route(
            "/instances/queue/{queue_id}/extend",
            post(instances::extend_queued),
        )
        .route("/admin/queue", get(admin_queue::page))
        .route("/admin/queue/{queue_id}/place", post(admin_queue::place))
        .route("/admin/queue/{queue_id}/close", post(admin_queue::close))
        .route("/admin/instances", get(admin_instances::page))
        .route("/admin/jobs", get(admin_jobs::page))
        .route("/admin/outbox", get(notices::outbox))
        .route("/admin/billing", get(billing::admin))
        .route("/notices", get(notices::mine).post(notices::switch))
        .route("/admin/releases", get(admin_releases::page))
        .route(
            "/admin/fleet-upgrades/{run_id}/halt",
            post(admin_releases::halt),
        )
        .route(
            "/admin/fleet-upgrades/{run_id}/close",
            post(admin_releases::close),
        )
        .route("/billing", get(billing::page))
        .route("/billing/payment-method", post(billing::add_payment_method))
        .route(
            "/admin/instances/{vm_id}/delete",
            get(admin_instances::confirm_delete).post(admin_instances::delete),
        )
        .route("/admin/operator-keys", get(keys_page))
        .route("/admin/operator-keys/changes", post(keys_change_submit))
        .route("/admin/operator-keys/withdraw", post(keys_withdraw_submit))
        .route(
            "/admin/operator-keys/hosts/{host_id}/send",
            post(keys_send_submit),
        )
        .route(
            "/prebookings",
            get(prebookings::page).post(prebookings::book),
        )
        .route(
            "/prebookings/{prebooking_id}/cancel",
            post(prebookings::cancel),
        )
        .route(
            "/prebookings/{prebooking_id}/checkout",
            post(prebookings::checkout),
        )
        .route("/admin/prebookings", get(prebookings::admin_page))
        .route(
            "/admin/prebookings/{prebooking_id}/paid",
            post(prebookings::record_payment),
        )
        .route(
            "/admin/prebookings/{prebooking_id}/refund",
            post(prebookings::refund),
        )
        .route(
            "/admin/prebookings/{prebooking_id}/launch",
            post(prebookings::launch),
        )
        .route(
            "/admin/prebookings/{prebooking_id}/reassign",
            post(prebookings::reassign),
        )
        .route("/assets/style.css", get(stylesheet))
        .route("/assets/app.js", get(script))
}

const STYLE: &str = include_str!("style.css");
/// The pages' live parts (copy, countdown, progress); every page works without it.
const SCRIPT: &str = include_str!("app.js");

async fn stylesheet() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/css; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        STYLE,
    )
        .into_response()
}

async fn script() -> Response {
    (
        [
            (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        SCRIPT,
    )
        .into_response()
}

/// An error shown as a page rather than JSON.
pub struct PageError(AppError);

impl From<AppError> for PageError {
    fn from(e: AppError) -> Self {
        PageError(e)
    }
}

impl From<byo_db::DbError> for PageError {
    fn from(e: byo_db::DbError) -> Self {
        PageError(e.into())
    }
}

impl IntoResponse for PageError {
    fn into_response(self) -> Response {
        let status = self.0.status();
        if status == StatusCode::UNAUTHORIZED {
            return Redirect::to("/login").into_response();
        }
        let (title, detail) = if status.is_server_error() {
            // Let the JSON path log the cause; show only the id.
            let id = current_request_id().unwrap_or_default();
            drop(self.0.into_response());
            (
                "Something went wrong".to_owned(),
                format!("It was on our side. If you report it, quote request {id}."),
            )
        } else {
            (
                status.canonical_reason().unwrap_or("Error").to_owned(),
                self.0.to_string(),
            )
        };
        let body = layout(
            &title,
            None,
            html! {
                h1 { (title) }
                p.error { (detail) }
                p { a href="/" { "Back to the start" } }
            },
        );
        (status, body).into_response()
    }
}

pub(crate) type PageResult = Result<Response, PageError>;

/// Every page's frame: the header by role (instances, pre-bookings, billing and notices for
/// everyone signed in, "Your GPUs" for community hosts and staff, one "Operations" link for
/// staff, whose pages use [`ops_layout`]), then `content`.
pub(crate) fn layout(title: &str, viewer: Option<&CurrentUser>, content: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · byo" }
                link rel="stylesheet" href="/assets/style.css";
                script src="/assets/app.js" defer {}
            }
            body {
                header {
                    a.brand href="/" { "byo" }
                    nav {
                        @if let Some(v) = viewer {
                            a href="/instances" { "Instances" }
                            a href="/prebookings" { "Pre-bookings" }
                            @if v.has(Role::CommunityHost) || v.is_operator() {
                                a href="/hosts" { "Your GPUs" }
                            }
                            a href="/billing" { "Billing" }
                            a href="/notices" { "Notices" }
                            @if v.is_operator() {
                                a href="/admin" { "Operations" }
                            }
                            a.who href="/account" title="Your account and API tokens" { (v.user.email) }
                            form.inline method="post" action="/logout" { button type="submit" { "Sign out" } }
                        } @else {
                            a href="/login" { "Sign in" }
                            a href="/signup" { "Create an account" }
                        }
                    }
                }
                main { (content) }
            }
        }
    }
}

/// The operations pages, in the sub-navigation every one of them carries (issue #42, 2): the
/// header keeps what every signed-in person uses, staff reach these through "Operations".
pub const OPERATIONS: &[(&str, &str)] = &[
    ("/admin", "Fleet"),
    ("/admin/hosts", "Hosts"),
    ("/admin/instances", "All instances"),
    ("/admin/queue", "Queue"),
    ("/admin/prebookings", "Bookings"),
    ("/admin/billing", "Billing"),
    ("/admin/users", "Users"),
    ("/admin/operator-keys", "Operator keys"),
    ("/admin/releases", "Releases"),
    ("/admin/jobs", "Jobs"),
    ("/admin/outbox", "Outbox"),
];

/// [`layout`] for an operations page: its content under the operations sub-navigation.
pub(crate) fn ops_layout(title: &str, viewer: Option<&CurrentUser>, content: Markup) -> Markup {
    layout(
        title,
        viewer,
        html! {
            nav.ops aria-label="Operations" {
                @for (href, label) in OPERATIONS { a href=(href) { (label) } }
            }
            (content)
        },
    )
}

async fn home(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let Some(v) = viewer else {
        return Ok(Redirect::to("/login").into_response());
    };
    let hosts = state.store.hosts_owned(&v.user.sub).await?;
    let roles: Vec<&str> = v.roles.iter().map(|r| r.as_str()).collect();
    Ok(layout("Home", Some(&v), html! {
        h1 { "Welcome, " (if v.user.display_name.is_empty() { &v.user.email } else { &v.user.display_name }) }
        dl {
            dt { "Signed in as" } dd { (v.user.email) }
            dt { "Grants" } dd { @if roles.is_empty() { "none (customer)" } @else { (roles.join(", ")) } }
            dt { "Hosts you own" } dd { (hosts) }
        }
        p { a #home-instances href="/instances" { "Your instances and SSH keys" } ": create an instance and connect to it with ssh." }
        @if v.is_operator() {
            p { "Operators: " a href="/admin/users" { "manage users and grants" } ", "
                a href="/admin/instances" { "every live instance and the stuck deletes" } "." }
        }
    }).into_response())
}

#[derive(Deserialize)]
struct LoginForm {
    email: String,
    password: String,
}

fn login_form(email: &str, error: Option<&str>) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/login" {
                label { "Email" input type="email" name="email" value=(email) required autofocus autocomplete="username"; }
                label { "Password" input type="password" name="password" required autocomplete="current-password"; }
                button type="submit" { "Sign in" }
            }
            p { "No account yet? " a href="/signup" { "Create one" } "." }
        },
    )
}

async fn login_page(viewer: Option<CurrentUser>) -> Response {
    if viewer.is_some() {
        return Redirect::to("/").into_response();
    }
    login_form("", None).into_response()
}

async fn login_submit(
    State(state): State<AppState>,
    crate::rate_limit::Source(source): crate::rate_limit::Source,
    jar: CookieJar,
    Form(form): Form<LoginForm>,
) -> PageResult {
    match password_sign_in(&state, &form.email, &form.password, source).await {
        Ok(user) => {
            let cookie = open_session(&state, &user, "user.login").await?;
            Ok((jar.add(cookie), Redirect::to("/")).into_response())
        }
        Err(AppError::InvalidCredentials) => Ok((
            StatusCode::UNAUTHORIZED,
            login_form(&form.email, Some(&AppError::InvalidCredentials.to_string())),
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct SignupForm {
    email: String,
    password: String,
    #[serde(default)]
    display_name: String,
}

fn signup_form(form: Option<&SignupForm>, error: Option<&str>) -> Markup {
    layout(
        "Create an account",
        None,
        html! {
            h1 { "Create an account" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            form method="post" action="/signup" {
                label { "Email" input type="email" name="email" value=(form.map_or("", |f| &f.email)) required autocomplete="username"; }
                label { "Name (optional)" input type="text" name="display_name" value=(form.map_or("", |f| &f.display_name)) maxlength="100"; }
                label { "Password (at least " (accounts::MIN_PASSWORD_CHARS) " characters)"
                    input type="password" name="password" required minlength=(accounts::MIN_PASSWORD_CHARS) autocomplete="new-password"; }
                button type="submit" { "Create account" }
            }
        },
    )
}

async fn signup_page(State(state): State<AppState>) -> PageResult {
    match accounts::signup_open(&state) {
        Ok(()) => Ok(signup_form(None, None).into_response()),
        // No mail to confirm an address with: said in words, not as our fault.
        Err(e @ AppError::Rejected { .. }) => Ok((
            e.status(),
            layout(
                "Sign-up is not open",
                None,
                html! {
                    h1 { "Sign-up is not open" }
                    p.error role="alert" { (e) }
                    p { a href="/login" { "Sign in" } }
                },
            ),
        )
            .into_response()),
        Err(e) => Err(e.into()),
    }
}

async fn signup_submit(State(state): State<AppState>, Form(form): Form<SignupForm>) -> PageResult {
    match accounts::sign_up(&state, &form.email, &form.password, &form.display_name).await {
        // The same page either way (docs/security.md): sign-up tells no one which
        // addresses have accounts.
        Ok(_) if state.config.signup_without_mail => Ok(layout(
            "Signed up",
            None,
            html! {
                h1 { "Signed up" }
                p.notice role="status" { (accounts::SIGNED_UP) }
                p { a href="/login" { "Sign in" } }
            },
        )
        .into_response()),
        Ok(_) => Ok(layout(
            "Check your mail",
            None,
            html! {
                h1 { "Check your mail" }
                p.notice role="status" { (accounts::CHECK_YOUR_MAIL) }
                p { "Nothing came? Look in the spam folder, then "
                    a href="/signup" { "sign up again" } " with the same address." }
            },
        )
        .into_response()),
        Err(
            e @ (AppError::BadRequest { .. }
            | AppError::Conflict { .. }
            | AppError::Rejected { .. }),
        ) => Ok((e.status(), signup_form(Some(&form), Some(&e.to_string()))).into_response()),
        Err(e) => Err(e.into()),
    }
}

#[derive(Deserialize)]
struct ConfirmQuery {
    #[serde(default)]
    token: String,
}

#[derive(Deserialize)]
struct ConfirmForm {
    token: String,
    password: String,
}

/// The page a sign-up's mailed link opens. Opening it changes nothing (a mail scanner
/// that follows links makes no account); the password chosen at sign-up, posted, does.
fn confirm_form(token: &str, error: Option<&str>) -> Markup {
    layout(
        "Confirm your address",
        None,
        html! {
            h1 { "Confirm your address" }
            @if let Some(e) = error { p.error role="alert" { (e) } }
            p { "Give the password you chose when you signed up, and your account is made." }
            form method="post" action="/signup/confirm" {
                input type="hidden" name="token" value=(token);
                label { "Password"
                    input type="password" name="password" required autocomplete="current-password"; }
                button type="submit" { "Make my account" }
            }
            p { "Link too old? " a href="/signup" { "Sign up again" } " for a new one." }
        },
    )
}

async fn confirm_page(Query(q): Query<ConfirmQuery>) -> PageResult {
    Ok(confirm_form(&q.token, None).into_response())
}

async fn confirm_submit(
    State(state): State<AppState>,
    crate::rate_limit::Source(source): crate::rate_limit::Source,
    jar: CookieJar,
    Form(form): Form<ConfirmForm>,
) -> PageResult {
    match accounts::confirm_sign_up(&state, &form.token, &form.password, source).await {
        Ok(user) => {
            let cookie = open_session(&state, &user, "user.signup").await?;
            Ok((jar.add(cookie), Redirect::to("/")).into_response())
        }
        Err(e @ (AppError::BadRequest { .. } | AppError::Conflict { .. })) => {
            Ok((e.status(), confirm_form(&form.token, Some(&e.to_string()))).into_response())
        }
        Err(e) => Err(e.into()),
    }
}

async fn logout_submit(State(state): State<AppState>, jar: CookieJar) -> PageResult {
    let cleared = end_session(&state, &jar).await?;
    Ok((jar.add(cleared), Redirect::to("/login")).into_response())
}

async fn users_page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let Some(v) = viewer else {
        return Ok(Redirect::to("/login").into_response());
    };
    if !v.is_operator() {
        return Err(AppError::Forbidden("operators only").into());
    }
    let users = state.store.users_overview().await?;
    Ok(ops_layout("Users", Some(&v), html! {
        h1 { "Users" }
        p { "Grant " strong { "community_host" } " to let an owner add GPUs. Only a superadmin changes operator and superadmin grants." }
        div.scroll { table {
            thead { tr { th { "Email" } th { "Name" } th { "Grants" } th { "Hosts" } th { "Since" } th { "Change" } } }
            tbody {
                @for u in &users {
                    tr {
                        td { (u.user.email) }
                        td { (u.user.display_name) }
                        td { @for r in &u.roles { span.badge { (r.as_str()) } " " } }
                        td { (u.hosts_owned) }
                        td { (u.user.created_at.format("%Y-%m-%d")) }
                        td {
                            @for role in Role::ALL.iter().rev() {
                                @if v.may_grant(*role) {
                                    @let held = u.roles.contains(role);
                                    form.inline method="post" action={ "/admin/users/" (u.user.sub) "/roles/" (role.as_str()) "/" (if held { "revoke" } else { "grant" }) } {
                                        button type="submit" { (if held { "Revoke " } else { "Grant " }) (role.as_str()) }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        } }
    }).into_response())
}

/// The gate for a signed-in person's pages: anonymous callers are sent to sign in.
pub(crate) fn signed_in(viewer: Option<CurrentUser>) -> Result<CurrentUser, PageError> {
    viewer.ok_or_else(|| AppError::Unauthenticated.into())
}

/// The superadmin gate for pages: anonymous callers are sent to sign in.
pub(crate) fn require_superadmin(viewer: Option<CurrentUser>) -> Result<Superadmin, PageError> {
    match viewer {
        None => Err(AppError::Unauthenticated.into()),
        Some(v) if v.has(Role::Superadmin) => Ok(Superadmin(v)),
        Some(_) => Err(AppError::Forbidden("superadmins only").into()),
    }
}

/// The operator gate for pages: anonymous callers are sent to sign in.
pub(crate) fn require_operator(viewer: Option<CurrentUser>) -> Result<Operator, PageError> {
    match viewer {
        None => Err(AppError::Unauthenticated.into()),
        Some(v) if v.is_operator() => Ok(Operator(v)),
        Some(_) => Err(AppError::Forbidden("operators only").into()),
    }
}

async fn users_grant_submit(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path((sub, role, action)): Path<(String, String, String)>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let grant = match action.as_str() {
        "grant" => true,
        "revoke" => false,
        _ => return Err(AppError::NotFound.into()),
    };
    change_grant(&state, &op, &sub, &role, grant).await?;
    Ok(Redirect::to("/admin/users").into_response())
}

fn list_table(
    list: &byo_wire::api::KeyListView,
    emails: &std::collections::HashMap<String, String>,
    mine: Option<&str>,
    superadmin: bool,
) -> Markup {
    html! {
        p { "Version " (list.version) ", issued " (list.issued_at.format("%Y-%m-%d %H:%M UTC")) ", expires " (list.expires.format("%Y-%m-%d")) "." }
        div.scroll { table {
            thead { tr { th { "Operator" } th { "Machine" } th { "Fingerprint" } @if mine.is_some() { th { "" } } } }
            tbody {
                @for k in &list.keys {
                    tr {
                        td { (emails.get(&k.user_sub).map_or(k.user_sub.as_str(), String::as_str)) }
                        td { (k.label) }
                        td { code { (k.fingerprint) } }
                        @if let Some(me) = mine {
                            td {
                                @if k.user_sub == me || superadmin {
                                    form.inline method="post" action="/admin/operator-keys/changes" {
                                        input type="hidden" name="action" value="remove";
                                        input type="hidden" name="fingerprint" value=(k.fingerprint);
                                        button type="submit" { @if k.user_sub == me { "Remove my key" } @else { "Remove this key" } }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        } }
    }
}

/// `error` is a refusal to show; `typed` the key form as it was sent, when the refusal was
/// of an added key: then the reason is shown at the form and what was typed is kept.
async fn render_keys_page(
    state: &AppState,
    op: &Operator,
    error: Option<&str>,
    typed: Option<&KeyChangeForm>,
) -> Result<Markup, PageError> {
    let (top_error, form_error) = match typed {
        Some(_) => (None, error),
        None => (error, None),
    };
    let view = operator_keys::overview(state).await?;
    let emails: std::collections::HashMap<String, String> = state
        .store
        .users_overview()
        .await?
        .into_iter()
        .map(|u| (u.user.sub, u.user.email))
        .collect();
    let me = op.0.user.sub.as_str();
    let superadmin = op.0.has(byo_wire::Role::Superadmin);
    Ok(ops_layout(
        "Operator keys",
        Some(&op.0),
        html! {
            h1 { "Operator keys" }
            p { "Every operator logs in to hosts as " code { "spark" } " with their own key. A change is collected in one draft; a superadmin signs it on their own machine with "
                code { "byo keys sign --server " (state.config.public_url) " --email you@example.com" } ", which publishes it to every host." }
            @if let Some(e) = top_error { p.error role="alert" { (e) } }
            @if let Some(p) = &view.published
                && let Some(step) = crate::app::host_problems::expiry_warning(p.expires, state.clock.now())
            {
                p.error role="alert" {
                    @if step == 0 {
                        "The published list (version " (p.version) ") expired " (p.expires.format("%Y-%m-%d %H:%M UTC")) ": every host refuses operator logins, and a host enrolling now stops at operator-access. Sign the waiting draft now."
                    } @else {
                        "The published list (version " (p.version) ") expires " (p.expires.format("%Y-%m-%d %H:%M UTC")) " — within " (step) " day(s). Sign the renewal draft before then, or every host refuses operator logins."
                    }
                }
            }
            p { "Signing key hosts trust: "
                @if view.signing_keys.is_empty() { strong.error { "none configured (operator_keys.signing_keys)" } }
                @for fp in &view.signing_keys { code { (fp) } " " } }
            h2 { "Waiting for a signature" }
            @if let Some(draft) = &view.draft {
                (list_table(draft, &emails, Some(me), superadmin))
                h3 { "Who changed what" }
                ul {
                    @for c in &view.draft_changes {
                        li { (c.at.format("%Y-%m-%d %H:%M")) " — " (emails.get(&c.user_sub).map_or(c.user_sub.as_str(), String::as_str)) " "
                            @match c.action.as_str() {
                                "add" => { "added " code { (c.fingerprint) } @if !c.label.is_empty() { " (" (c.label) ")" } }
                                "remove" => { "removed " code { (c.fingerprint) } }
                                "depart" => { "took every key of " (emails.get(&c.label).map_or(c.label.as_str(), String::as_str)) " off the list (their operator role was revoked)" }
                                "rotate" => { "handed signing to " code { (c.fingerprint) } }
                                "renew" => { "renewal of " (c.fingerprint) " drafted (" (c.label) ")" }
                                other => { (other) " " code { (c.fingerprint) } }
                            } }
                    }
                }
                form.inline method="post" action="/admin/operator-keys/withdraw" { button type="submit" { "Withdraw this draft" } }
            } @else {
                p { "Nothing is waiting." }
            }
            h2 { "Add a key of yours" }
            form #add-key method="post" action="/admin/operator-keys/changes" {
                input type="hidden" name="action" value="add";
                @if let Some(e) = form_error { p.error role="alert" { (e) } }
                label { "Public key: the line of your .pub file"
                    input type="text" name="public_key" required spellcheck="false" autocomplete="off"
                        placeholder="ssh-ed25519 AAAA… you@laptop" value=(typed.map_or("", |f| f.public_key.as_str())); }
                label { "Machine (optional: the key's comment if left empty)"
                    input type="text" name="label" maxlength="128" placeholder="work laptop"
                        value=(typed.map_or("", |f| f.label.as_str())); }
                button type="submit" { "Add to the draft" }
            }
            h2 { "Published" }
            @if let Some(p) = &view.published { (list_table(p, &emails, Some(me), superadmin)) } @else { p { "No list has been published yet." } }
            @if superadmin {
                h2 { "Hand signing to a new key" }
                p { "When the person holding the signing key leaves, or the key may be known to someone who should not hold it, name its successor here. The draft must then be signed by the current key and by the successor (paste both private keys into " code { "byo keys sign" } "); once hosts apply it, only the successor signs." }
                form #rotate method="post" action="/admin/operator-keys/changes" {
                    input type="hidden" name="action" value="rotate_signing_keys";
                    label { "The successor's public key (one per line)"
                        textarea name="public_key" rows="2" required spellcheck="false" autocomplete="off" {} }
                    button type="submit" { "Draft the hand-over" }
                }
            }
            h2 { "Hosts" }
            div.scroll { table {
                thead { tr { th { "Host" } th { "Holds version" } th { "Last attempt" } th { "Failure" } th { "" } } }
                tbody {
                    @for h in &view.hosts {
                        tr {
                            td { (h.slug) }
                            td { @if let Some(v) = h.version { (v) } @else { "—" } }
                            td { @if let Some(at) = h.attempted_at { (at.format("%Y-%m-%d %H:%M")) } @else { "never" } }
                            td.error { @if let Some(e) = &h.error { (e) } }
                            td { @if view.published.is_some() {
                                form.inline method="post" action={ "/admin/operator-keys/hosts/" (h.host_id) "/send" } { button type="submit" { "Send again" } }
                            } }
                        }
                    }
                }
            } }
        },
    ))
}

async fn keys_page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    Ok(render_keys_page(&state, &op, None, None)
        .await?
        .into_response())
}

#[derive(Deserialize)]
struct KeyChangeForm {
    action: String,
    #[serde(default)]
    public_key: String,
    #[serde(default)]
    label: String,
    #[serde(default)]
    fingerprint: String,
}

/// Show a refusal on the page itself, with the status it would have had; `typed` is the
/// refused add's form, shown again as it was sent.
async fn keys_page_with(
    state: &AppState,
    op: &Operator,
    e: AppError,
    typed: Option<&KeyChangeForm>,
) -> PageResult {
    match e {
        AppError::Internal(_) => Err(e.into()),
        refused => Ok((
            refused.status(),
            render_keys_page(state, op, Some(&refused.to_string()), typed).await?,
        )
            .into_response()),
    }
}

async fn keys_change_submit(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<KeyChangeForm>,
) -> PageResult {
    let op = require_operator(viewer)?;
    let req = match form.action.as_str() {
        "add" => byo_wire::api::KeyChangeRequest::Add {
            public_key: form.public_key.clone(),
            label: form.label.clone(),
        },
        "remove" => byo_wire::api::KeyChangeRequest::Remove {
            fingerprint: form.fingerprint.clone(),
        },
        "rotate_signing_keys" => byo_wire::api::KeyChangeRequest::RotateSigningKeys {
            signing_keys: form
                .public_key
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(str::to_owned)
                .collect(),
        },
        _ => {
            return Err(
                AppError::bad_request("unknown_action", "action must be add or remove").into(),
            );
        }
    };
    match operator_keys::change_keys(&state, &op, req).await {
        Ok(_) => Ok(Redirect::to("/admin/operator-keys").into_response()),
        Err(e) => {
            let typed = (form.action == "add").then_some(&form);
            keys_page_with(&state, &op, e, typed).await
        }
    }
}

async fn keys_withdraw_submit(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match operator_keys::withdraw(&state, &op).await {
        Ok(()) => Ok(Redirect::to("/admin/operator-keys").into_response()),
        Err(e) => keys_page_with(&state, &op, e, None).await,
    }
}

async fn keys_send_submit(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(host_id): Path<String>,
) -> PageResult {
    let op = require_operator(viewer)?;
    match operator_keys::send_again(&state, &op, &host_id).await {
        Ok(_) => Ok(Redirect::to("/admin/operator-keys").into_response()),
        Err(e) => keys_page_with(&state, &op, e, None).await,
    }
}
