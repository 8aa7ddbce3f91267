//! `/account`: who you are and your API tokens (issue #43) — make one (its secret shown on
//! the page that answers, once), see when and where each was last used, revoke one. The
//! rules are `app::api_tokens`', as the API's.

use axum::Form;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Redirect};
use byo_wire::api::{ApiTokenView, CreatedApiToken, NewApiToken};
use byo_wire::states::ApiScope;
use maud::{Markup, html};
use serde::Deserialize;

use super::instances::at;
use super::{PageResult, layout, signed_in};
use crate::app::api_tokens::{self, DEFAULT_DAYS, MAX_DAYS};
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::state::AppState;

/// What each scope reaches, in the words the form offers it with.
fn scope_label(scope: ApiScope) -> &'static str {
    match scope {
        ApiScope::Read => "read — look at everything you can see, change nothing",
        ApiScope::Instances => {
            "instances — rent, reach and release instances; your SSH keys, queue and bookings"
        }
        ApiScope::Hosts => "hosts — your machines, their earnings and payouts",
        ApiScope::Admin => "admin — everything your staff roles allow (staff only)",
    }
}

#[derive(Default)]
struct Shown<'a> {
    created: Option<&'a CreatedApiToken>,
    refusal: Option<String>,
    form: Option<&'a TokenForm>,
}

async fn render(
    state: &AppState,
    me: &CurrentUser,
    status: StatusCode,
    shown: Shown<'_>,
) -> PageResult {
    let tokens = api_tokens::list(state, me).await?;
    let scopes: Vec<ApiScope> = ApiScope::ALL
        .iter()
        .copied()
        .filter(|s| *s != ApiScope::Admin || me.is_operator())
        .collect();
    let chosen = shown
        .form
        .and_then(|f| f.scope.parse::<ApiScope>().ok())
        .unwrap_or(ApiScope::Read);
    let body = html! {
        h1 { "Your account" }
        dl {
            dt { "Signed in as" } dd { (me.user.email) }
        }
        h2 #api-tokens { "API tokens" }
        p { "A token lets a script act as you, within its scope: "
            "send it as " code { "Authorization: Bearer byo_api_…" } ". "
            "It reaches the API only, never these pages, and never your password, your payment method or other tokens. "
            "Revoke one the moment you no longer trust where it is kept." }
        @if let Some(c) = shown.created {
            section.created #new-token role="status" {
                h3 { "Token “" (c.api_token.name) "” made" }
                p { strong { "Copy it now: it is shown this once and never again." } " We keep only its hash." }
                pre #new-token-secret { (c.token) }
                p { "Try it: " code { "curl -H 'Authorization: Bearer …' " (state.config.public_url.trim_end_matches('/')) "/api/me" } }
                p { "Or keep it for the " code { "byo" } " command line: "
                    code #try-cli { "byo login --server " (state.config.public_url.trim_end_matches('/')) }
                    ", and paste it when asked." }
            }
        }
        @if let Some(r) = &shown.refusal {
            p.refusal #token-refusal role="alert" { (r) }
        }
        (tokens_table(&tokens))
        h3 { "Make a token" }
        form #new-token-form method="post" action="/account/tokens" {
            label { "Name (where it is used)"
                input type="text" name="name" required maxlength="64" placeholder="laptop, ci-deploy"
                    value=(shown.form.map_or("", |f| f.name.as_str()));
            }
            fieldset {
                legend { "Scope" }
                @for s in &scopes {
                    label.choice {
                        input type="radio" name="scope" value=(s.as_str()) checked[*s == chosen];
                        " " (scope_label(*s))
                    }
                }
            }
            label { "Expires in (days, 1 to " (MAX_DAYS) ")"
                input type="number" name="expires_in_days" min="1" max=(MAX_DAYS)
                    value=(shown.form.map_or(DEFAULT_DAYS.to_string(), |f| f.expires_in_days.clone()));
            }
            button type="submit" { "Make the token" }
        }
    };
    Ok((status, layout("Your account", Some(me), body)).into_response())
}

fn tokens_table(tokens: &[ApiTokenView]) -> Markup {
    html! {
        @if tokens.is_empty() {
            p.empty #no-tokens { "No tokens yet." }
        } @else {
            div.scroll { table #tokens {
                thead { tr { th { "Name" } th { "Scope" } th { "Made" } th { "Expires" } th { "Last used" } th {} } }
                tbody { @for t in tokens {
                    tr.token #{ "token-" (t.id) } {
                        td.name { (t.name) }
                        td.scope { (t.scope) }
                        td { (at(t.created_at)) }
                        td.expires {
                            @if t.expired { strong { "expired " } }
                            (at(t.expires_at))
                        }
                        td.last-used {
                            @match (t.last_used_at, &t.last_used_from) {
                                (Some(when), Some(from)) => { (at(when)) " from " (from) }
                                (Some(when), None) => { (at(when)) }
                                _ => { "never" }
                            }
                        }
                        td {
                            form.inline method="post" action={ "/account/tokens/" (t.id) "/revoke" } {
                                button type="submit" { "Revoke" }
                            }
                        }
                    }
                } }
            } }
        }
    }
}

/// `GET /account`.
pub async fn page(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let me = signed_in(viewer)?;
    render(&state, &me, StatusCode::OK, Shown::default()).await
}

#[derive(Deserialize)]
pub struct TokenForm {
    name: String,
    scope: String,
    #[serde(default)]
    expires_in_days: String,
}

/// `POST /account/tokens`: as `POST /api/me/tokens`; the page that answers shows the secret.
pub async fn create(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<TokenForm>,
) -> PageResult {
    let me = signed_in(viewer)?;
    let refused = |e: AppError| (e.status(), e.to_string());
    let req = form
        .scope
        .parse::<ApiScope>()
        .map_err(|_| AppError::bad_request("invalid_scope", "choose one of the scopes offered"))
        .and_then(|scope| {
            let days = form.expires_in_days.trim();
            let expires_in_days = if days.is_empty() {
                None
            } else {
                Some(days.parse::<u32>().map_err(|_| {
                    AppError::bad_request(
                        "invalid_expiry",
                        format!("a token expires in 1 to {MAX_DAYS} days"),
                    )
                })?)
            };
            Ok(NewApiToken {
                name: form.name.clone(),
                scope,
                expires_in_days,
            })
        });
    let made = match req {
        Ok(req) => api_tokens::create(&state, &me, &req).await,
        Err(e) => Err(e),
    };
    match made {
        Ok(created) => {
            let shown = Shown {
                created: Some(&created),
                ..Shown::default()
            };
            render(&state, &me, StatusCode::CREATED, shown).await
        }
        Err(e @ AppError::Internal(_)) => Err(e.into()),
        Err(e) => {
            let (status, message) = refused(e);
            let shown = Shown {
                refusal: Some(message),
                form: Some(&form),
                ..Shown::default()
            };
            render(&state, &me, status, shown).await
        }
    }
}

/// `POST /account/tokens/{token_id}/revoke`: as `DELETE /api/me/tokens/{token_id}`.
pub async fn revoke(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Path(token_id): Path<String>,
) -> PageResult {
    let me = signed_in(viewer)?;
    api_tokens::revoke(&state, &me, &token_id).await?;
    Ok(Redirect::to("/account").into_response())
}
