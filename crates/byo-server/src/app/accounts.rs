//! Local accounts: the rules for emails and passwords, signing up and in, changing a
//! password, and the first superadmin.

use axum_extra::extract::cookie::Cookie;
use byo_db::DbError;
use byo_db::users::{NewUser, UserRow};
use byo_wire::Role;
use byo_wire::api::UserView;
use serde_json::json;

use crate::auth::session::start_session;
use crate::error::{AppError, AppResult};
use crate::metrics::OutcomeLabels;
use crate::state::AppState;

pub const MIN_PASSWORD_CHARS: usize = 12;
const MAX_PASSWORD_BYTES: usize = 1024;

/// Lower-case and check an email address; the error says what is wrong with it.
pub fn normalize_email(raw: &str) -> AppResult<String> {
    let email = raw.trim().to_lowercase();
    let valid = email.len() <= 254
        && !email.chars().any(|c| c.is_whitespace() || c.is_control())
        && matches!(email.split_once('@'), Some((local, domain))
            if !local.is_empty() && !domain.is_empty() && !domain.contains('@'));
    if valid {
        Ok(email)
    } else {
        Err(AppError::bad_request(
            "invalid_email",
            "that does not look like an email address",
        ))
    }
}

pub fn check_password(password: &str) -> AppResult<()> {
    if password.chars().count() < MIN_PASSWORD_CHARS {
        return Err(AppError::bad_request(
            "weak_password",
            format!("a password needs at least {MIN_PASSWORD_CHARS} characters"),
        ));
    }
    if password.len() > MAX_PASSWORD_BYTES {
        return Err(AppError::bad_request(
            "invalid_password",
            "that password is too long",
        ));
    }
    Ok(())
}

fn check_display_name(name: &str) -> AppResult<String> {
    let name = name.trim();
    if name.chars().count() > 100 || name.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_display_name",
            "a display name is at most 100 printable characters",
        ));
    }
    Ok(name.to_owned())
}

/// Create a local user after checking every field.
pub async fn create_account(
    state: &AppState,
    email: &str,
    password: &str,
    display_name: &str,
) -> AppResult<UserRow> {
    let email = normalize_email(email)?;
    check_password(password)?;
    let display_name = check_display_name(display_name)?;
    let password_hash = state.passwords.hash(password.to_owned()).await?;
    let new = NewUser {
        email: &email,
        display_name: &display_name,
        password_hash: &password_hash,
    };
    match state.store.create_user(new, state.clock.now()).await {
        Ok(user) => Ok(user),
        Err(DbError::Conflict(_)) => Err(AppError::conflict(
            "email_taken",
            "an account with that email already exists",
        )),
        Err(e) => Err(e.into()),
    }
}

/// Create a user holding superadmin (the `create-superadmin` command and `byo up`).
pub async fn create_superadmin(
    state: &AppState,
    email: &str,
    password: &str,
) -> AppResult<UserRow> {
    let user = create_account(state, email, password, "Administrator").await?;
    let now = state.clock.now();
    state
        .store
        .grant_role(&user.sub, Role::Superadmin, None, now)
        .await?;
    state
        .store
        .audit(
            None,
            "role.grant",
            Some(&user.sub),
            serde_json::json!({"role": "superadmin", "via": "command"}),
            now,
        )
        .await?;
    Ok(user)
}

/// Sign-up, when it is open: the account, checked as [`create_account`] checks it.
pub async fn sign_up(
    state: &AppState,
    email: &str,
    password: &str,
    display_name: &str,
) -> AppResult<UserRow> {
    if !state.config.allow_signup {
        return Err(AppError::Forbidden(
            "sign-up is closed on this installation",
        ));
    }
    create_account(state, email, password, display_name).await
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
pub async fn password_sign_in(state: &AppState, email: &str, password: &str) -> AppResult<UserRow> {
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

/// Change `user`'s password: every session of theirs ends, and the new one is returned.
pub async fn change_password(
    state: &AppState,
    user: &UserRow,
    current_password: String,
    new_password: String,
) -> AppResult<Cookie<'static>> {
    let ok = state
        .passwords
        .verify(Some(user.password_hash.clone()), current_password)
        .await?;
    if !ok {
        return Err(AppError::bad_request(
            "wrong_password",
            "the current password is wrong",
        ));
    }
    check_password(&new_password)?;
    let hash = state.passwords.hash(new_password).await?;
    state.store.set_password_hash(&user.sub, &hash).await?;
    state.store.delete_sessions_of(&user.sub).await?;
    state
        .store
        .audit(
            Some(&user.sub),
            "user.password_changed",
            Some(&user.sub),
            json!({}),
            state.clock.now(),
        )
        .await?;
    start_session(state, &user.sub).await
}

/// A user as the API shows them.
pub async fn user_view(state: &AppState, user: UserRow) -> AppResult<UserView> {
    let roles = state.store.roles_of(&user.sub).await?;
    let hosts_owned = state.store.hosts_owned(&user.sub).await?;
    Ok(UserView {
        sub: user.sub,
        email: user.email,
        display_name: user.display_name,
        roles,
        hosts_owned,
        created_at: user.created_at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn emails_are_normalised_or_refused() {
        assert_eq!(
            normalize_email("  Ana@Example.COM ").unwrap(),
            "ana@example.com"
        );
        for bad in ["", "ana", "@x", "ana@", "a b@x", "a@b@c", "a@x\u{7}"] {
            assert!(normalize_email(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(check_password("elevenchars").is_err());
        assert!(check_password("twelve chars").is_ok());
        assert!(check_password(&"x".repeat(2000)).is_err());
    }
}
