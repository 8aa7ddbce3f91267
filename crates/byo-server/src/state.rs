use std::sync::Arc;

use byo_db::Store;

use crate::auth::password::Passwords;
use crate::clock::Clock;
use crate::config::Config;
use crate::metrics::Metrics;

/// What every handler can reach. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub store: Store,
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    pub passwords: Passwords,
    pub clock: Clock,
}

impl AppState {
    pub fn new(store: Store, config: Config) -> Self {
        let passwords = Passwords::new(config.password_hashing);
        AppState {
            store,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::new()),
            passwords,
            clock: Clock::System,
        }
    }

    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }
}
