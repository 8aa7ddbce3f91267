//! host-report: what the host's agent tells the backend about its preparation, step by
//! step, authenticated by the host token it received at redeem. Progress is what the owner
//! watches and what the operator reads before approving (D).

use byo_core::tokens::SecretToken;
use byo_wire::prepare::HostReport;

use crate::error::{AppError, AppResult};
use crate::state::AppState;

/// What a call authenticated by a host token came to.
#[derive(Debug, PartialEq, Eq)]
pub enum HostCall {
    Recorded,
    /// The token is no live host's: the one answer for that, whatever the body.
    InvalidToken,
}

/// Record one prepare step's progress (node 0, or a satellite by its index). `report` is
/// the body, or why it could not be read; a caller that is not a host hears only that.
pub async fn record(
    state: &AppState,
    token: &SecretToken,
    report: Result<HostReport, String>,
) -> AppResult<HostCall> {
    let Some(host_id) = state.store.host_id_by_token(&token.hash()).await? else {
        return Ok(HostCall::InvalidToken);
    };
    let report = report.map_err(|why| AppError::bad_request("invalid_report", why))?;
    let node = i32::try_from(report.node)
        .map_err(|_| AppError::bad_request("invalid_report", "no such node"))?;
    let value = serde_json::to_value(&report.state).map_err(anyhow::Error::from)?;
    let now = state.clock.now();
    if !state
        .store
        .record_prepare_state(&host_id, node, &value, report.completed && node == 0, now)
        .await?
    {
        return Err(AppError::bad_request(
            "unknown_node",
            format!("this host has no node {}", report.node),
        ));
    }
    Ok(HostCall::Recorded)
}
