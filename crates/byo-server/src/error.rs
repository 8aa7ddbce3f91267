//! The one error type every handler returns. Clients get a stable code and a message meant
//! for them; a 5xx body carries only the request id, and the cause goes to the log.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use byo_db::DbError;
use byo_wire::api::ErrorBody;

tokio::task_local! {
    /// The id of the request being served, set by [`crate::telemetry::request_id`].
    pub static REQUEST_ID: String;
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{message}")]
    BadRequest { code: &'static str, message: String },
    #[error("sign in first")]
    Unauthenticated,
    /// One set of words for an unknown address, a wrong password, a disabled account and a
    /// sign-up not confirmed yet (whose account does not exist until it is), so sign-in
    /// tells none of them apart.
    #[error(
        "that email and password do not match an account (after signing up, follow the link \
         mailed to you first)"
    )]
    InvalidCredentials,
    #[error("{0}")]
    Forbidden(&'static str),
    /// An API token that does not authenticate (malformed, unknown, expired, revoked; issue
    /// #43): 401 with the code that says which, so a script's operator knows what to renew.
    #[error("{message}")]
    TokenRefused { code: &'static str, message: String },
    /// A caller the gate knows but that may not do this (a token out of its scope, a route
    /// that needs a session): 403 with its own code.
    #[error("{message}")]
    Denied { code: &'static str, message: String },
    #[error("not found")]
    NotFound,
    #[error("{message}")]
    Conflict { code: &'static str, message: String },
    /// A host's agent refused (502) or never answered (504). The message is the
    /// customer's to read: what happened and what it cost them.
    #[error("{message}")]
    Host {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
    /// A request the framework turned away before any rule saw it (a body too large, not
    /// JSON, a shape that does not parse, a method or path that does not exist), or a field
    /// past its bound: the status it chose, in our shape.
    #[error("{message}")]
    Rejected {
        status: StatusCode,
        code: &'static str,
        message: String,
    },
    /// Too many attempts at a door that checks a secret (#16): 429, with when to come back.
    #[error("too many attempts; try again in {retry_after_secs} s")]
    TooManyRequests { retry_after_secs: u64 },
    #[error(transparent)]
    Internal(#[from] anyhow::Error),
}

pub type AppResult<T> = Result<T, AppError>;

impl AppError {
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        AppError::BadRequest {
            code,
            message: message.into(),
        }
    }

    pub fn conflict(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Conflict {
            code,
            message: message.into(),
        }
    }

    /// A status the framework chose (or a bound), with the code that names it.
    pub fn rejected(status: StatusCode, message: impl Into<String>) -> Self {
        let code = match status {
            StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
            StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
            StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
            StatusCode::NOT_FOUND => "not_found",
            StatusCode::UNPROCESSABLE_ENTITY | StatusCode::BAD_REQUEST => "invalid_request",
            s if s.is_server_error() => "internal",
            _ => "rejected",
        };
        AppError::Rejected {
            status,
            code,
            message: message.into(),
        }
    }

    /// An outside system (GCP, Cloudflare) failed part way (502): nothing more was recorded,
    /// and the same action run again carries on.
    pub fn provider_failed(message: impl Into<String>) -> Self {
        AppError::Host {
            status: StatusCode::BAD_GATEWAY,
            code: "provider_failed",
            message: message.into(),
        }
    }

    /// What this caller may never have (403), with the code that names why.
    pub fn refused(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Rejected {
            status: StatusCode::FORBIDDEN,
            code,
            message: message.into(),
        }
    }

    /// What needs paying for first (402), with the code that names it.
    pub fn payment_required(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Rejected {
            status: StatusCode::PAYMENT_REQUIRED,
            code,
            message: message.into(),
        }
    }

    /// A service this needs is not there (503): no mail to confirm a sign-up with.
    pub fn unavailable(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Rejected {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code,
            message: message.into(),
        }
    }

    /// A field past its bound: 400, naming the field and the limit.
    pub fn out_of_bounds(breach: byo_wire::limits::OutOfBounds) -> Self {
        AppError::Rejected {
            status: StatusCode::BAD_REQUEST,
            code: if breach.is_nul() {
                "invalid_character"
            } else {
                "too_long"
            },
            message: breach.to_string(),
        }
    }

    /// The host answered with a refusal.
    pub fn host_refused(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Host {
            status: StatusCode::BAD_GATEWAY,
            code,
            message: message.into(),
        }
    }

    /// The host never answered.
    pub fn host_silent(code: &'static str, message: impl Into<String>) -> Self {
        AppError::Host {
            status: StatusCode::GATEWAY_TIMEOUT,
            code,
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            AppError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            AppError::Unauthenticated | AppError::InvalidCredentials => StatusCode::UNAUTHORIZED,
            AppError::Forbidden(_) | AppError::Denied { .. } => StatusCode::FORBIDDEN,
            AppError::TokenRefused { .. } => StatusCode::UNAUTHORIZED,
            AppError::NotFound => StatusCode::NOT_FOUND,
            AppError::Conflict { .. } => StatusCode::CONFLICT,
            AppError::Host { status, .. } | AppError::Rejected { status, .. } => *status,
            AppError::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            AppError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            AppError::BadRequest { code, .. }
            | AppError::Conflict { code, .. }
            | AppError::Host { code, .. }
            | AppError::Rejected { code, .. }
            | AppError::TokenRefused { code, .. }
            | AppError::Denied { code, .. } => code,
            AppError::Unauthenticated => "unauthenticated",
            AppError::InvalidCredentials => "invalid_credentials",
            AppError::Forbidden(_) => "forbidden",
            AppError::NotFound => "not_found",
            AppError::TooManyRequests { .. } => "too_many_requests",
            AppError::Internal(_) => "internal",
        }
    }
}

impl From<crate::password::PasswordError> for AppError {
    fn from(e: crate::password::PasswordError) -> Self {
        match e {
            // The argon2 queue is full: shed the load, the client retries in a moment.
            crate::password::PasswordError::Busy => AppError::TooManyRequests {
                retry_after_secs: 1,
            },
            crate::password::PasswordError::Failed(e) => AppError::Internal(e),
        }
    }
}

impl From<DbError> for AppError {
    fn from(e: DbError) -> Self {
        match e {
            DbError::NotFound => AppError::NotFound,
            DbError::Conflict(what) => {
                AppError::conflict("conflict", format!("already exists ({what})"))
            }
            DbError::Refused(rule) => {
                AppError::conflict("refused", format!("refused by the rule {rule}"))
            }
            // Every product path checks what it removes first; this is the answer when a
            // row written by hand (or a path not yet guarded) meets the key instead.
            DbError::ForeignKey(key) => AppError::conflict(
                "still_referenced",
                format!(
                    "other records still refer to this, or it names one that does not exist                      ({key}); nothing was changed"
                ),
            ),
            other => AppError::Internal(other.into()),
        }
    }
}

pub fn current_request_id() -> Option<String> {
    REQUEST_ID.try_with(Clone::clone).ok()
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        let status = self.status();
        let request_id = current_request_id();
        let message = match &self {
            AppError::Internal(cause) => {
                // The cause is for operators; the client gets an id to quote.
                tracing::error!(
                    request_id = request_id.as_deref().unwrap_or("-"),
                    error = format!("{cause:#}"),
                    "internal error"
                );
                "something went wrong on our side; quote the request id if you report it".to_owned()
            }
            other => other.to_string(),
        };
        let body = ErrorBody {
            error: self.code().to_owned(),
            message,
            request_id: if status.is_server_error() {
                request_id
            } else {
                None
            },
        };
        let retry_after = match &self {
            AppError::TooManyRequests { retry_after_secs } => Some(*retry_after_secs),
            _ => None,
        };
        let mut response = (status, Json(body)).into_response();
        if let Some(secs) = retry_after {
            response
                .headers_mut()
                .insert(axum::http::header::RETRY_AFTER, secs.into());
        }
        response
    }
}

/// The status a delete answers with, on the API and the pages alike: 200 once the host
/// confirmed, 202 while the delete is only requested (G). Here with the other mappings of
/// an outcome to HTTP, so the rules (`app`) never name a status.
pub fn deletion_status(d: &byo_wire::vm::InstanceDeletion) -> StatusCode {
    match d.state {
        byo_wire::vm::DeletionState::Deleted => StatusCode::OK,
        byo_wire::vm::DeletionState::Requested => StatusCode::ACCEPTED,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue #39 (6): a foreign key met by a write is a worded 409 that says nothing was
    /// changed, never a bare "refused by the rule FOREIGN KEY constraint failed".
    #[test]
    fn a_foreign_key_is_answered_in_words() {
        let e = AppError::from(DbError::ForeignKey("FOREIGN KEY constraint failed".into()));
        assert_eq!(e.status(), StatusCode::CONFLICT);
        assert_eq!(e.code(), "still_referenced");
        let message = e.to_string();
        assert!(
            message.contains("still refer to this") && message.contains("nothing was changed"),
            "{message}"
        );
    }
}
