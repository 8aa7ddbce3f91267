//! Cross-site request refusal. The session cookie is SameSite=Lax, which already keeps it
//! off cross-site POSTs; this is the second lock: a state-changing request that a browser
//! marks as coming from another origin is refused before any handler runs. Requests with
//! no Origin (curl, the CLI) are not browser-forged and pass, and so do requests that
//! present an API token: they are judged by the token alone, which no browser adds itself.

use axum::extract::{Request, State};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use crate::error::AppError;
use crate::state::AppState;

pub async fn refuse_cross_site(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Response {
    let safe = matches!(
        *request.method(),
        Method::GET | Method::HEAD | Method::OPTIONS
    );
    if !safe && !super::api_token::presents_api_token(request.headers()) {
        let headers = request.headers();
        let cross_site = headers
            .get("sec-fetch-site")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v == "cross-site");
        let foreign_origin = headers
            .get("origin")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|origin| !state.config.accepts_origin(origin));
        if cross_site || foreign_origin {
            return AppError::Forbidden("cross-site request refused").into_response();
        }
    }
    next.run(request).await
}
