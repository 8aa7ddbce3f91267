//! Argon2id password hashes (PHC strings). Hashing is CPU-bound, so it runs on the
//! blocking pool rather than stalling the async workers — and at most [`MAX_CONCURRENT`]
//! at once: each hash holds `memory_kib` of memory, so a few hundred parallel sign-ins
//! would otherwise exhaust it (#16). At most [`MAX_WAITING`] more wait their turn; past
//! that the answer is [`PasswordError::Busy`] at once (429 with `Retry-After`), so a flood
//! of sign-ins from many addresses sheds load instead of making every real sign-in wait
//! behind it (issue #36: a real sign-in took 4.7 s under one).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Algorithm, Argon2, Params, Version};
use rand::rngs::OsRng;

use crate::config::PasswordHashing;

/// How many hashes or verifications run at once, whatever the load.
pub const MAX_CONCURRENT: usize = 4;
/// How many more may wait for a turn before the next is turned away.
pub const MAX_WAITING: usize = 32;

/// Why a hash or a verification did not run.
#[derive(Debug, thiserror::Error)]
pub enum PasswordError {
    /// [`MAX_WAITING`] already wait: try again shortly.
    #[error("too many password checks are waiting")]
    Busy,
    #[error(transparent)]
    Failed(#[from] anyhow::Error),
}

#[derive(Clone)]
pub struct Passwords {
    params: PasswordHashing,
    turns: Arc<tokio::sync::Semaphore>,
    /// Callers waiting for a turn now, and how many may.
    waiting: Arc<AtomicUsize>,
    max_waiting: usize,
    /// The most hashes ever seen running at once (measured inside the blocking task).
    peak: Arc<Counter>,
    /// A hash of nothing anyone knows, verified against when the email is unknown so an
    /// unknown email costs the same time as a wrong password.
    decoy: Arc<OnceLock<String>>,
}

impl Passwords {
    pub fn new(params: PasswordHashing) -> Self {
        Self::with_waiting(params, MAX_WAITING)
    }

    fn with_waiting(params: PasswordHashing, max_waiting: usize) -> Self {
        Passwords {
            params,
            turns: Arc::new(tokio::sync::Semaphore::new(MAX_CONCURRENT)),
            waiting: Arc::new(AtomicUsize::new(0)),
            max_waiting,
            peak: Arc::new(Counter::default()),
            decoy: Arc::new(OnceLock::new()),
        }
    }

    fn argon2(params: PasswordHashing) -> anyhow::Result<Argon2<'static>> {
        let p = Params::new(
            params.memory_kib,
            params.iterations,
            params.parallelism,
            None,
        )
        .map_err(|e| anyhow::anyhow!("argon2 parameters: {e}"))?;
        Ok(Argon2::new(Algorithm::Argon2id, Version::V0x13, p))
    }

    fn hash_blocking(params: PasswordHashing, password: &str) -> anyhow::Result<String> {
        let salt = SaltString::generate(&mut OsRng);
        Ok(Self::argon2(params)?
            .hash_password(password.as_bytes(), &salt)
            .map_err(|e| anyhow::anyhow!("hashing a password: {e}"))?
            .to_string())
    }

    /// The most hashes or verifications that ever ran at once.
    pub fn peak(&self) -> usize {
        self.peak.peak.load(Ordering::Relaxed)
    }

    /// A turn to hash: at once if one is free, after a wait if fewer than `max_waiting`
    /// already wait, or [`PasswordError::Busy`].
    async fn turn(&self) -> Result<tokio::sync::SemaphorePermit<'_>, PasswordError> {
        if let Ok(turn) = self.turns.try_acquire() {
            return Ok(turn);
        }
        let ahead = self.waiting.fetch_add(1, Ordering::SeqCst);
        let _queued = Waiting(&self.waiting);
        if ahead >= self.max_waiting {
            return Err(PasswordError::Busy);
        }
        Ok(self.turns.acquire().await.context("password hashing")?)
    }

    pub async fn hash(&self, password: String) -> Result<String, PasswordError> {
        let params = self.params;
        let _turn = self.turn().await?;
        let peak = self.peak.clone();
        Ok(tokio::task::spawn_blocking(move || {
            let _running = peak.enter();
            Self::hash_blocking(params, &password)
        })
        .await
        .context("password hashing task")??)
    }

    /// Check `password` against a stored hash, or against the decoy when there is none.
    /// Returns true only for a stored hash that matches.
    pub async fn verify(
        &self,
        stored: Option<String>,
        password: String,
    ) -> Result<bool, PasswordError> {
        let params = self.params;
        let decoy = self.decoy.clone();
        let _turn = self.turn().await?;
        let peak = self.peak.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            let _running = peak.enter();
            let known = stored.is_some();
            let phc = match stored {
                Some(h) => h,
                None => match decoy.get() {
                    Some(h) => h.clone(),
                    None => {
                        let h = Self::hash_blocking(params, "decoy: no account has this")?;
                        decoy.get_or_init(|| h).clone()
                    }
                },
            };
            let parsed =
                PasswordHash::new(&phc).map_err(|e| anyhow::anyhow!("stored hash: {e}"))?;
            // Verification uses the parameters recorded in the hash itself.
            let ok = Argon2::default()
                .verify_password(password.as_bytes(), &parsed)
                .is_ok();
            anyhow::Ok(known && ok)
        })
        .await
        .context("password verification task")??;
        Ok(verdict)
    }
}

/// One caller counted as waiting while it is held.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Hashes running now, and the most ever.
#[derive(Default)]
struct Counter {
    now: AtomicUsize,
    peak: AtomicUsize,
}

struct Running<'a>(&'a Counter);

impl Counter {
    fn enter(&self) -> Running<'_> {
        let n = self.now.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(n, Ordering::Relaxed);
        Running(self)
    }
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.now.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHEAP: PasswordHashing = PasswordHashing {
        memory_kib: 256,
        iterations: 1,
        parallelism: 1,
    };

    #[tokio::test]
    async fn a_hash_verifies_its_password_only() {
        let p = Passwords::new(CHEAP);
        let h = p.hash("correct horse battery".into()).await.unwrap();
        assert!(h.starts_with("$argon2id$"));
        assert!(!h.contains("correct horse"));
        assert!(
            p.verify(Some(h.clone()), "correct horse battery".into())
                .await
                .unwrap()
        );
        assert!(
            !p.verify(Some(h), "correct horse battery!".into())
                .await
                .unwrap()
        );
        assert!(
            !p.verify(None, "decoy: no account has this".into())
                .await
                .unwrap()
        );
    }

    /// #16: a flood of sign-ins runs at most MAX_CONCURRENT hashes at once; the rest wait.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_hashes_are_bounded() {
        let p = Passwords::new(PasswordHashing {
            memory_kib: 4096,
            iterations: 2,
            parallelism: 1,
        });
        let all: Vec<_> = (0..MAX_CONCURRENT + MAX_WAITING)
            .map(|i| {
                let p = p.clone();
                tokio::spawn(async move { p.verify(None, format!("guess {i}")).await })
            })
            .collect();
        for h in all {
            assert!(!h.await.unwrap().unwrap());
        }
        assert!(
            p.peak() >= 1 && p.peak() <= MAX_CONCURRENT,
            "peak {}",
            p.peak()
        );
    }

    /// #36: past MAX_CONCURRENT running and `max_waiting` waiting, a caller is turned away
    /// at once (Busy) rather than queued; those admitted all finish, and once the flood has
    /// drained a check runs again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_flood_past_the_queue_is_turned_away_at_once() {
        let p = Passwords::with_waiting(
            PasswordHashing {
                memory_kib: 8192,
                iterations: 4,
                parallelism: 1,
            },
            3,
        );
        let all: Vec<_> = (0..40)
            .map(|i| {
                let p = p.clone();
                tokio::spawn(async move { p.verify(None, format!("guess {i}")).await })
            })
            .collect();
        let (mut busy, mut checked) = (0, 0);
        for h in all {
            match h.await.unwrap() {
                Err(PasswordError::Busy) => busy += 1,
                Ok(false) => checked += 1,
                other => panic!("{other:?}"),
            }
        }
        assert!(checked >= MAX_CONCURRENT, "{checked} checked");
        assert!(
            busy > 0 && busy + checked == 40,
            "{busy} busy, {checked} checked"
        );
        assert_eq!(
            p.waiting.load(Ordering::SeqCst),
            0,
            "every waiter left the count"
        );
        assert!(!p.verify(None, "after".into()).await.unwrap());
    }
}
