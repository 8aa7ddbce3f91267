//! The pass at the server's start that binds the sealed values written before issue #36 (8)
//! to their place: every `sealed:v1:` value of every sealed column is re-sealed in place as
//! `sealed:v2:`, for its own column and row (`seal::SealedAt`). `serve` runs it before it
//! answers anything or starts a job, so `byo-server serve` and `byo up` both do.
//!
//! Once. The pass records that it finished (`sealed_v2`, migration 0026) and never runs
//! again, so a v1 value written later — copied from an old dump into another host's row —
//! stays v1 and never opens. Until it has finished it is idempotent: each value is replaced
//! only while its row still holds it, so two servers starting together, or a start cut short
//! and run again, write each value once. A v1 value that does not open with this key is left
//! as it is and keeps the pass open (the next start tries again): an installation started
//! with the wrong `secret_key` must not lose its values for good.

use byo_db::GuardedWrite;
use byo_db::sealed::SealedColumn;

use crate::error::AppResult;
use crate::seal::{SealedAt, V1_PREFIX};
use crate::state::AppState;

/// What one pass did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resealed {
    /// v1 values this pass wrote again as v2.
    pub resealed: usize,
    /// v1 values that do not open with this server's key, left as they are.
    pub unopened: usize,
    /// Whether the pass had already finished before (then it read nothing).
    pub already_done: bool,
}

/// Re-seal every `sealed:v1:` value in place, once per installation.
pub async fn reseal_at_start(state: &AppState) -> AppResult<Resealed> {
    // Without a key nothing was ever sealed, and nothing could be opened to re-seal.
    let Some(sealer) = &state.sealer else {
        return Ok(Resealed::default());
    };
    if state.store.sealed_values_resealed_at().await?.is_some() {
        return Ok(Resealed {
            already_done: true,
            ..Resealed::default()
        });
    }
    let mut done = Resealed::default();
    for column in SealedColumn::ALL {
        for v in state.store.sealed_values(column, V1_PREFIX).await? {
            let at = SealedAt::new(column, &v.row);
            match sealer.reseal_v1(&at, &v.sealed) {
                Ok(v2) => {
                    // Another server's pass may have written it first; either way it is v2.
                    let wrote = state
                        .store
                        .replace_sealed(column, &v.row, &v.sealed, &v2)
                        .await?;
                    if wrote == GuardedWrite::Written {
                        done.resealed += 1;
                    }
                }
                Err(e) => {
                    tracing::error!(column = column.name(), row = %v.row, error = %e,
                        "a sealed:v1: value does not open with this secret_key; left as it is");
                    done.unopened += 1;
                }
            }
        }
    }
    if done.unopened == 0 {
        state
            .store
            .mark_sealed_values_resealed(state.clock.now())
            .await?;
    }
    tracing::info!(
        resealed = done.resealed,
        unopened = done.unopened,
        "sealed values bound to their table, column and row"
    );
    Ok(done)
}
