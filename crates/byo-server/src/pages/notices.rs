//! `/notices` (each person: what they are sent, each kind on or off, their latest notices)
//! and `/admin/outbox` (operators: every notice and how far its delivery got), read through
//! `app::notices` as the API's. With no channel configured (`byo up`) the outbox is where
//! notices are delivered.

use axum::Form;
use axum::extract::State;
use axum::response::{IntoResponse, Redirect};
use byo_wire::notices::NoticeView;
use byo_wire::states::NoticeKind;
use maud::{Markup, html};
use serde::Deserialize;

use super::instances::at;
use super::{PageResult, layout, ops_layout, require_operator, signed_in};
use crate::app::notices;
use crate::auth::CurrentUser;
use crate::error::AppError;
use crate::state::AppState;

fn table(rows: &[NoticeView], with_recipient: bool) -> Markup {
    html! {
        @if rows.is_empty() {
            p.empty { "No notices yet." }
        } @else {
            div.scroll { table.notices {
                thead { tr {
                    th { "Raised" }
                    @if with_recipient { th { "To" } }
                    th { "Subject" } th { "Delivery" } th { "Attempts" } th { "Last error" }
                } }
                tbody { @for n in rows {
                    tr.notice #{ "notice-" (n.id) } {
                        td { (at(n.created_at)) }
                        @if with_recipient { td.to { (n.to) } }
                        td.subject {
                            details {
                                summary { (n.subject) }
                                pre.body { (n.body) }
                            }
                            @if let Some(c) = n.cleared_at { small.cleared { "cleared " (at(c)) } }
                        }
                        td.delivery { (n.delivery) }
                        td.attempts { (n.attempts) }
                        td.error { (n.last_error.as_deref().unwrap_or("")) }
                    }
                } }
            } }
        }
    }
}

/// `GET /notices`.
pub async fn mine(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let me = signed_in(viewer)?;
    let mine = notices::mine(&state, &me.user.sub, &me.roles).await?;
    Ok(layout(
        "Notices",
        Some(&me),
        html! {
            h1 { "Your notices" }
            p { "What we tell you, sent to " strong { (me.user.email) } ". Turn off what you do not want; what you turn off is not sent, and not kept here either." }
            div.scroll { table #notice-kinds {
                thead { tr { th { "Notice" } th { "Sent to you" } th {} } }
                tbody { @for p in &mine.preferences {
                    tr #{ "kind-" (p.kind.as_str()) } {
                        td { (p.label) }
                        td.on { @if p.on { "on" } @else { "off" } }
                        td {
                            form.inline method="post" action="/notices" {
                                input type="hidden" name="kind" value=(p.kind.as_str());
                                input type="hidden" name="on" value=(if p.on { "false" } else { "true" });
                                button type="submit" { @if p.on { "Turn off" } @else { "Turn on" } }
                            }
                        }
                    }
                } }
            } }
            h2 { "Lately" }
            (table(&mine.recent, false))
        },
    )
    .into_response())
}

#[derive(Deserialize)]
pub struct SwitchForm {
    kind: String,
    on: bool,
}

/// `POST /notices`: as `PUT /api/me/notices`.
pub async fn switch(
    State(state): State<AppState>,
    viewer: Option<CurrentUser>,
    Form(form): Form<SwitchForm>,
) -> PageResult {
    let me = signed_in(viewer)?;
    let kind: NoticeKind = form
        .kind
        .parse()
        .map_err(|e: String| AppError::bad_request("unknown_kind", e))?;
    notices::switch(&state, &me.user.sub, &me.roles, kind, form.on).await?;
    Ok(Redirect::to("/notices").into_response())
}

/// `GET /admin/outbox`.
pub async fn outbox(State(state): State<AppState>, viewer: Option<CurrentUser>) -> PageResult {
    let op = require_operator(viewer)?;
    let rows = notices::outbox(&state, notices::OUTBOX_LIMIT).await?;
    let channels = match (state.notifier.sends_email(), state.notifier.sends_webhook()) {
        (true, true) => "email and the webhook",
        (true, false) => "email",
        (false, true) => "the webhook",
        (false, false) => {
            "nothing: no [notices] channel is configured, so this page is where notices are read"
        }
    };
    Ok(ops_layout(
        "Outbox",
        Some(&op.0),
        html! {
            h1 { "Outbox" }
            p #channels { "Every notice raised, newest first. Sent by " (channels) "." }
            p { "A notice that could not be sent is tried again, waiting twice as long each time (30 s up to an hour), and given up after a permanent refusal or a dozen tries." }
            (table(&rows, true))
        },
    )
    .into_response())
}
