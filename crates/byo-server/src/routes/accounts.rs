//! Signing up, in and out, and the caller's own account.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum_extra::extract::CookieJar;
use axum_extra::extract::cookie::Cookie;
use byo_db::users::UserRow;
use byo_wire::api::{ErrorBody, LoginRequest, PasswordChange, SignupRequest, UserView};
use serde_json::json;

use crate::accounts::{self, check_password, normalize_email, user_view};
use crate::auth::CurrentUser;
use crate::auth::session::{end_session, start_session};
use crate::error::{AppError, AppResult};
use crate::metrics::OutcomeLabels;
use crate::state::AppState;

/// Create an account (when sign-up is open) and sign in as it.
#[utoipa::path(post, path = "/api/auth/signup", tag = "accounts", request_body = SignupRequest,
    responses((status = 201, body = UserView), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn signup(
    State(state): State<AppState>,
    jar: CookieJar,
    Json(req): Json<SignupRequest>,
) -> AppResult<(StatusCode, CookieJar, Json<UserView>)> {
    if !state.config.allow_signup {
        return Err(AppError::Forbidden(
            "sign-up is closed on this installation",
        ));
    }
    let user =
        accounts::create_account(&state, &req.email, &req.password, &req.display_name).await?;
    state
        .store
        .audit(
            Some(&user.sub),
            "user.signup",
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    let cookie = start_session(&state, &user.sub).await?;
    Ok((
        StatusCode::CREATED,
        jar.add(cookie),
        Json(user_view(&state, user).await?),
    ))
}

/// Record how `user` signed in (`user.signup`, `user.login`) and open their session.
pub async fn open_session(
    state: &AppState,
    user: &UserRow,
    action: &str,
) -> AppResult<Cookie<'static>> {
    state
        .store
        .audit(
            Some(&user.sub),
            action,
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    start_session(state, &user.sub).await
}

/// Sign in with email and password. Unknown emails, wrong passwords and disabled
/// accounts get the same answer, in the same time.
pub async fn password_sign_in(
    state: &AppState,
    email: &str,
    password: &str,
) -> AppResult<byo_db::users::UserRow> {
    let Ok(email) = normalize_email(email) else {
        return Err(AppError::InvalidCredentials);
    };
    let user = state.store.user_by_email(&email).await?;
    let ok = state
        .passwords
        .verify(
            user.as_ref().map(|u| u.password_hash.clone()),
            password.to_owned(),
        )
        .await?;
    let outcome = match &user {
        Some(u) if ok && u.disabled_at.is_none() => "success",
        _ => "refused",
    };
    state
        .metrics
        .logins
        .get_or_create(&OutcomeLabels { outcome })
        .inc();
    match user {
        Some(u) if outcome == "success" => Ok(u),
        _ => {
            tracing::info!(outcome, "sign-in refused");
            Err(AppError::InvalidCredentials)
        }
    }
}

#[utoipa::path(post, path = "/api/auth/login", tag = "accounts", request_body = LoginRequest,
    responses((status = 200, body = UserView), (status = 401, body = ErrorBody)))]
pub async fn login(
    State(state): State<AppState>,
    jar: CookieJar,
    Json(req): Json<LoginRequest>,
) -> AppResult<(CookieJar, Json<UserView>)> {
    let user = password_sign_in(&state, &req.email, &req.password).await?;
    state
        .store
        .audit(
            Some(&user.sub),
            "user.login",
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    let cookie = start_session(&state, &user.sub).await?;
    Ok((jar.add(cookie), Json(user_view(&state, user).await?)))
}

/// End this session.
#[utoipa::path(post, path = "/api/auth/logout", tag = "accounts",
    responses((status = 204), (status = 401, body = ErrorBody)))]
pub async fn logout(
    State(state): State<AppState>,
    _user: CurrentUser,
    jar: CookieJar,
) -> AppResult<(StatusCode, CookieJar)> {
    let cleared = end_session(&state, &jar).await?;
    Ok((StatusCode::NO_CONTENT, jar.add(cleared)))
}

/// The signed-in user.
#[utoipa::path(get, path = "/api/me", tag = "accounts",
    responses((status = 200, body = UserView), (status = 401, body = ErrorBody)))]
pub async fn me(State(state): State<AppState>, user: CurrentUser) -> AppResult<Json<UserView>> {
    Ok(Json(user_view(&state, user.user).await?))
}

/// Change your password. Every other session of yours ends; this one is renewed.
#[utoipa::path(put, path = "/api/me/password", tag = "accounts", request_body = PasswordChange,
    responses((status = 204), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn change_password(
    State(state): State<AppState>,
    user: CurrentUser,
    jar: CookieJar,
    Json(req): Json<PasswordChange>,
) -> AppResult<(StatusCode, CookieJar)> {
    let ok = state
        .passwords
        .verify(Some(user.user.password_hash.clone()), req.current_password)
        .await?;
    if !ok {
        return Err(AppError::bad_request(
            "wrong_password",
            "the current password is wrong",
        ));
    }
    check_password(&req.new_password)?;
    let hash = state.passwords.hash(req.new_password).await?;
    state.store.set_password_hash(&user.user.sub, &hash).await?;
    state.store.delete_sessions_of(&user.user.sub).await?;
    state
        .store
        .audit(
            Some(&user.user.sub),
            "user.password_changed",
            Some(&user.user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    let cookie = start_session(&state, &user.user.sub).await?;
    Ok((StatusCode::NO_CONTENT, jar.add(cookie)))
}
