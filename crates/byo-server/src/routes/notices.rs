//! Notices (issue #38, 3): the operators' outbox, and each person's own notices and the
//! kinds they turned off.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use byo_wire::api::ErrorBody;
use byo_wire::notices::{MyNotices, NoticeSwitch, NoticeView};

use crate::app::notices;
use crate::auth::{CurrentUser, Operator};
use crate::error::AppResult;
use crate::extract::Checked;
use crate::state::AppState;

/// Every notice raised, newest first, with how far its delivery got.
#[utoipa::path(get, path = "/api/admin/outbox", tag = "admin",
    responses((status = 200, body = Vec<NoticeView>), (status = 401, body = ErrorBody),
              (status = 403, body = ErrorBody)))]
pub async fn get_outbox(
    State(state): State<AppState>,
    _op: Operator,
) -> AppResult<Json<Vec<NoticeView>>> {
    Ok(Json(notices::outbox(&state, notices::OUTBOX_LIMIT).await?))
}

/// The kinds of notice I receive, whether each is on, and my latest notices.
#[utoipa::path(get, path = "/api/me/notices", tag = "accounts",
    responses((status = 200, body = MyNotices), (status = 401, body = ErrorBody)))]
pub async fn get_my_notices(
    State(state): State<AppState>,
    user: CurrentUser,
) -> AppResult<Json<MyNotices>> {
    Ok(Json(
        notices::mine(&state, &user.user.sub, &user.roles).await?,
    ))
}

/// Turn one kind of my notices on or off; a kind not sent to me is refused (400 `not_yours`).
#[utoipa::path(put, path = "/api/me/notices", tag = "accounts", request_body = NoticeSwitch,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn put_my_notices(
    State(state): State<AppState>,
    user: CurrentUser,
    Checked(req): Checked<NoticeSwitch>,
) -> AppResult<StatusCode> {
    notices::switch(&state, &user.user.sub, &user.roles, req.kind, req.on).await?;
    Ok(StatusCode::NO_CONTENT)
}
