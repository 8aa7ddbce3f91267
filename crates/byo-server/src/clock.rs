//! Time, passed in. Handlers read it here once per request and hand it to the store and
//! the pure cores, so tests can move it.

use std::sync::{Arc, Mutex};

use chrono::{DateTime, DurationRound, TimeDelta, Utc};

#[derive(Clone, Debug, Default)]
pub enum Clock {
    #[default]
    System,
    /// A clock tests set by hand.
    Manual(Arc<Mutex<DateTime<Utc>>>),
}

impl Clock {
    pub fn manual(at: DateTime<Utc>) -> Self {
        Clock::Manual(Arc::new(Mutex::new(at)))
    }

    /// Now, at the microsecond precision both databases keep.
    pub fn now(&self) -> DateTime<Utc> {
        let t = match self {
            Clock::System => Utc::now(),
            Clock::Manual(t) => *t.lock().expect("clock lock"),
        };
        t.duration_trunc(TimeDelta::microseconds(1)).unwrap_or(t)
    }

    /// Move a manual clock forward; the system clock cannot be moved.
    pub fn advance(&self, by: TimeDelta) {
        if let Clock::Manual(t) = self {
            *t.lock().expect("clock lock") += by;
        }
    }
}
