//! Signing up, in and out, and the caller's own account. The rules are
//! [`crate::app::accounts`]'s.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum_extra::extract::CookieJar;
use byo_wire::api::{
    ConfirmSignup, ErrorBody, LoginRequest, PasswordChange, SignedUp, SignupRequest, UserView,
};

use crate::app::accounts::{self, user_view};
use crate::auth::CurrentUser;
use crate::auth::session::end_session;
use crate::error::AppResult;
use crate::extract::Checked;
use crate::rate_limit::Source;
use crate::state::AppState;

/// Sign up (when sign-up is open). A mail goes to the address, holding a link that makes
/// the account (`POST /api/auth/signup/confirm`); under `byo up` the account is made at
/// once. The answer is the same whether the address was new or already had an account,
/// and opens no session.
#[utoipa::path(post, path = "/api/auth/signup", tag = "accounts", request_body = SignupRequest,
    responses((status = 202, body = SignedUp), (status = 400, body = ErrorBody),
              (status = 403, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn signup(
    State(state): State<AppState>,
    Checked(req): Checked<SignupRequest>,
) -> AppResult<(StatusCode, Json<SignedUp>)> {
    accounts::sign_up(&state, &req.email, &req.password, &req.display_name).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(SignedUp {
            message: accounts::signed_up_message(&state).to_owned(),
        }),
    ))
}

/// Make the account a sign-up's mailed link stands for, with the password chosen at
/// sign-up, and sign in to it.
#[utoipa::path(post, path = "/api/auth/signup/confirm", tag = "accounts",
    request_body = ConfirmSignup,
    responses((status = 200, body = UserView), (status = 400, body = ErrorBody),
              (status = 409, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn confirm_signup(
    State(state): State<AppState>,
    Source(source): Source,
    jar: CookieJar,
    Checked(req): Checked<ConfirmSignup>,
) -> AppResult<(CookieJar, Json<UserView>)> {
    let user = accounts::confirm_sign_up(&state, &req.token, &req.password, source).await?;
    let cookie = accounts::open_session(&state, &user, "user.signup").await?;
    Ok((jar.add(cookie), Json(user_view(&state, user).await?)))
}

#[utoipa::path(post, path = "/api/auth/login", tag = "accounts", request_body = LoginRequest,
    responses((status = 200, body = UserView), (status = 401, body = ErrorBody)))]
pub async fn login(
    State(state): State<AppState>,
    Source(source): Source,
    jar: CookieJar,
    Checked(req): Checked<LoginRequest>,
) -> AppResult<(CookieJar, Json<UserView>)> {
    let user = accounts::password_sign_in(&state, &req.email, &req.password, source).await?;
    let cookie = accounts::open_session(&state, &user, "user.login").await?;
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
    Source(source): Source,
    jar: CookieJar,
    Checked(req): Checked<PasswordChange>,
) -> AppResult<(StatusCode, CookieJar)> {
    let cookie = accounts::change_password(
        &state,
        &user.user,
        source,
        req.current_password,
        req.new_password,
    )
    .await?;
    Ok((StatusCode::NO_CONTENT, jar.add(cookie)))
}
