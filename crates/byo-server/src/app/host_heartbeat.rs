//! The heartbeat (step 133): node0's agent reports its subsystems on the one schedule
//! serving keeps, authenticated by the host token, and the backend keeps the latest as the
//! host's host_status row with `seen_at` from its own clock. An unknown or retired host's
//! token gets the same 401 as host-report's, whatever the body.

use byo_core::tokens::SecretToken;
use byo_wire::vm::Heartbeat;

use crate::app::host_report::HostCall;
use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// How large `details` may be, serialised.
pub const MAX_DETAILS_BYTES: usize = 16 * 1024;

fn check(beat: &Heartbeat) -> AppResult<()> {
    let v = &beat.agent_version;
    if v.is_empty() || v.len() > 64 || v.chars().any(char::is_control) {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            "agent_version is 1 to 64 printable characters",
        ));
    }
    if !(beat.details.is_null() || beat.details.is_object()) {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            "details is a JSON object",
        ));
    }
    if beat.details.to_string().len() > MAX_DETAILS_BYTES {
        return Err(AppError::bad_request(
            "invalid_heartbeat",
            format!("details is at most {MAX_DETAILS_BYTES} bytes"),
        ));
    }
    Ok(())
}

/// Keep the host's health as its host_status row. `beat` is the body, or why it could not
/// be read; a caller that is not a host hears only that.
pub async fn record(
    state: &AppState,
    token: &SecretToken,
    beat: Result<Heartbeat, String>,
) -> AppResult<HostCall> {
    let hash = token.hash();
    let beat = match beat.and_then(|b| {
        check(&b).map_err(|e| e.to_string())?;
        Ok(b)
    }) {
        Ok(beat) => beat,
        Err(why) => {
            // A body we cannot use is the host's to hear about only if it is a host.
            if state.store.host_id_by_token(&hash).await?.is_none() {
                return Ok(HostCall::InvalidToken);
            }
            return Err(AppError::bad_request("invalid_heartbeat", why));
        }
    };
    // The token lookup and the upsert are one statement: one round trip per beat.
    match state
        .store
        .record_heartbeat(&hash, &beat, state.clock.now())
        .await?
    {
        Some(_) => Ok(HostCall::Recorded),
        None => Ok(HostCall::InvalidToken),
    }
}
