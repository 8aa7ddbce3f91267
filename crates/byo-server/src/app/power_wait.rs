//! The wait on every power call a host is asked to carry out (a customer's start, stop or
//! reboot, a billing hold's stop and start, an operator's or a pair's reboot): the host's
//! answer within [`POWER_WAIT`], our words for a refusal or silence. A floor: it imports no
//! other rule, so the instance, the host lifecycle and billing's hold all stand on it.

use std::time::Duration;

use crate::agents::AgentError;
use crate::error::{AppError, AppResult};

/// How long a start, stop or reboot may take the host.
pub const POWER_WAIT: Duration = Duration::from_secs(60);

/// A power call to a host (an instance's start, stop or reboot, a host's reboot) within
/// [`POWER_WAIT`]: a refusal is 502 with the host's reason, silence 504; nothing changed.
pub(crate) async fn within_power_wait<T>(
    call: impl std::future::Future<Output = Result<T, AgentError>>,
) -> AppResult<T> {
    match tokio::time::timeout(POWER_WAIT, call).await {
        Ok(Ok(t)) => Ok(t),
        // Our words to the caller; the agent's own reason to the log (issue #36, 8).
        Ok(Err(e @ (AgentError::Refused { .. } | AgentError::Occupied(_)))) => {
            tracing::warn!(error = %e, "a power call was refused");
            Err(AppError::host_refused(
                "host_refused",
                format!("the host refused: {}", e.in_our_words()),
            ))
        }
        Ok(Err(e @ AgentError::Unreachable(_))) => {
            tracing::warn!(error = %e, "a power call was not answered");
            Err(AppError::host_silent("host_silent", e.in_our_words()))
        }
        Err(_) => Err(AppError::host_silent(
            "host_silent",
            format!("the host did not answer within {} s", POWER_WAIT.as_secs()),
        )),
    }
}
