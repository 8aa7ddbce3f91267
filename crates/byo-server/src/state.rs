//! `AppState`, what every handler reaches: the store, the config, the providers, the hosts'
//! agents and how long to wait for them, the sealer, the relay CA, the billing gate, the
//! rate limits, the notifier and step 84's hook (`queue::NudgeDrain`, which nudges the
//! `queue-drain` job). What it holds of billing, the queue and the jobs' triggers sits beside
//! it (`billing`, `queue`, `job_trigger`) so that `state` never imports `app`.

use std::sync::Arc;

use byo_db::Store;
use secrecy::ExposeSecret;

use crate::agents::{AgentWaits, HostAgents, HttpAgents};
use crate::billing::{BillingGate, BillingOff, StripeBilling, StripeGate};
use crate::providers::local::{LocalRelays, LocalTunnels};
use crate::providers::{RelayProvider, TunnelProvider};
use crate::queue::{NudgeDrain, QueueDrain};
use crate::relay_ca::RelayCaSource;
use crate::seal::Sealer;

use crate::clock::Clock;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::password::Passwords;

/// What every handler can reach: one reference-counted [`StateParts`], so the clone each
/// extractor and middleware layer makes of it is one count, not one per part (a profile of
/// the heartbeat found the clones and their drops at about 6 % of the request's CPU). A
/// change through `&mut` changes this state's own copy (`Arc::make_mut`), as a clone of
/// the parts would.
#[derive(Clone)]
pub struct AppState(Arc<StateParts>);

impl std::ops::Deref for AppState {
    type Target = StateParts;
    fn deref(&self) -> &StateParts {
        &self.0
    }
}

impl std::ops::DerefMut for AppState {
    fn deref_mut(&mut self) -> &mut StateParts {
        Arc::make_mut(&mut self.0)
    }
}

/// The parts of [`AppState`].
#[derive(Clone)]
pub struct StateParts {
    pub store: Store,
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    pub passwords: Passwords,
    pub clock: Clock,
    pub agents: Arc<dyn HostAgents>,
    pub sealer: Option<Sealer>,
    pub relays: Arc<dyn RelayProvider>,
    pub tunnels: Arc<dyn TunnelProvider>,
    /// How long a create and a delete wait for the host (G.4: 90 s for a delete).
    pub waits: AgentWaits,
    /// Step 84, run after a delete's row closes.
    pub drain: Arc<dyn QueueDrain>,
    /// The installation's relay CA: relay certificates at provisioning, the agent client's
    /// only trust.
    pub relay_ca: RelayCaSource,
    /// The live billing check (E2): [`BillingOff`] unless Stripe is configured.
    pub billing: Arc<dyn BillingGate>,
    /// Per-address and per-account limits on the doors that check a secret (#16).
    pub rate_limits: Arc<crate::rate_limit::RateLimits>,
    /// Billing on Stripe, when `[billing]` is configured (then also the gate above).
    pub stripe: Option<Arc<StripeBilling>>,
    /// Where notices go (`[notices]`): email, a webhook, or neither (the outbox only).
    pub notifier: Arc<crate::providers::notify::Notifier>,
    /// The customer's way in, taken by a path walk (`app::path_walk`): OpenSSH's `ssh`.
    pub customer_ssh: Arc<dyn crate::providers::customer_ssh::CustomerSsh>,
}

impl AppState {
    pub fn new(store: Store, config: Config) -> Self {
        let passwords = Passwords::new(config.password_hashing);
        // Config::load has validated the key; a bad one in a hand-built Config is a bug.
        let sealer = config
            .secret_key
            .as_ref()
            .map(|k| Sealer::from_hex(k.expose_secret()).expect("secret_key is valid"));
        let relay_ca = RelayCaSource::new(store.clone(), sealer.clone());
        // Config::load has validated [notices]; one that does not build is a bug.
        let notifier = Arc::new(
            crate::providers::notify::Notifier::new(&config.notices).expect("[notices] is valid"),
        );
        let config_limits = config.rate_limits.clone();
        let stripe = config
            .billing
            .clone()
            .map(|b| Arc::new(StripeBilling::new(b, store.clone())));
        let billing: Arc<dyn BillingGate> = match &stripe {
            Some(s) => Arc::new(StripeGate(s.clone(), Clock::System)),
            None => Arc::new(BillingOff),
        };
        AppState(Arc::new(StateParts {
            relays: Arc::new(LocalRelays::default()),
            tunnels: Arc::new(LocalTunnels::default()),
            agents: Arc::new(HttpAgents::new(
                sealer.clone(),
                relay_ca.clone(),
                &config.public_url,
            )),
            relay_ca,
            sealer,
            store,
            config: Arc::new(config),
            metrics: Arc::new(Metrics::new()),
            passwords,
            clock: Clock::System,
            waits: AgentWaits::default(),
            drain: Arc::new(NudgeDrain::default()),
            billing,
            stripe,
            notifier,
            customer_ssh: Arc::new(crate::providers::customer_ssh::OpenSsh::default()),
            rate_limits: Arc::new(crate::rate_limit::RateLimits::new(&config_limits)),
        }))
    }

    pub fn with_agents(mut self, agents: Arc<dyn HostAgents>) -> Self {
        self.agents = agents;
        self
    }

    pub fn with_providers(
        mut self,
        relays: Arc<dyn RelayProvider>,
        tunnels: Arc<dyn TunnelProvider>,
    ) -> Self {
        self.relays = relays;
        self.tunnels = tunnels;
        self
    }

    pub fn with_customer_ssh(
        mut self,
        ssh: Arc<dyn crate::providers::customer_ssh::CustomerSsh>,
    ) -> Self {
        self.customer_ssh = ssh;
        self
    }

    pub fn with_waits(mut self, waits: AgentWaits) -> Self {
        self.waits = waits;
        self
    }

    pub fn with_drain(mut self, drain: Arc<dyn QueueDrain>) -> Self {
        self.drain = drain;
        self
    }

    pub fn with_clock(mut self, clock: Clock) -> Self {
        if let Some(s) = &self.stripe {
            self.billing = Arc::new(StripeGate(s.clone(), clock.clone()));
        }
        self.clock = clock;
        self
    }
}
