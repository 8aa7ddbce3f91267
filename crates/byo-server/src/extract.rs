//! The one JSON extractor every API route takes a body through: axum's `Json`, its
//! rejections (413, 415, 400, 422) answered in the `{error, message}` shape, and the
//! body's [`Bounded`] check run before a handler sees it — so a field past its limit is
//! refused at the wire type, naming the field and the limit, on every route alike.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use byo_wire::limits::Bounded;
use serde::de::DeserializeOwned;

use crate::error::AppError;

/// The largest body any route reads; larger ones are 413 before they are read.
pub const BODY_LIMIT: usize = 256 * 1024;

/// A JSON body that parsed and is within its bounds.
#[derive(Debug, Clone)]
pub struct Checked<T>(pub T);

impl From<JsonRejection> for AppError {
    fn from(rejection: JsonRejection) -> Self {
        AppError::rejected(rejection.status(), rejection.body_text())
    }
}

impl<S, T> FromRequest<S> for Checked<T>
where
    T: DeserializeOwned + Bounded,
    S: Send + Sync,
{
    type Rejection = AppError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let Json(value) = Json::<T>::from_request(req, state).await?;
        value.check_bounds().map_err(AppError::out_of_bounds)?;
        Ok(Checked(value))
    }
}
