//! The states the design names, as enums. Their text form (the spelling the design uses) is
//! what crosses the wire and what the database stores; code compares variants, never text.
//! `byo-db` reads them with `#[sqlx(try_from = "String")]`, so a row holding a spelling
//! this build does not know is an error rather than a silent fallback.

/// An enum whose variants each have one spelling, with serde, `as_str`, `Display`,
/// `FromStr` and `TryFrom<String>` derived from that one list.
macro_rules! text_enum {
    ($(#[$meta:meta])* pub enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
        #[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
        pub enum $name {
            $($(#[$vmeta])* #[serde(rename = $text)] $variant,)+
        }

        impl $name {
            /// Every state, in the order the design lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling on the wire and in the database.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($name::$variant),)+
                    other => Err(format!(concat!("{:?} is not a ", stringify!($name)), other)),
                }
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;
            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
    };
}

text_enum! {
    /// `vms.status`: where an instance is in its life. Live rows are `creating`, `running`
    /// and `stopped`; `failed` is a create that never completed, `deleted` a confirmed delete.
    pub enum VmStatus {
        Creating = "creating",
        Running = "running",
        Stopped = "stopped",
        Failed = "failed",
        Deleted = "deleted",
    }
}

/// Where an instance is in its life, judged once from its four facts — its status,
/// `creation_failed_at`, `delete_requested_at`, `deleted_at` — for every page, answer and job
/// that asks (issue #37, 2). A confirmed delete wins over everything, a create that never
/// completed over a delete asked, and a delete asked (not yet confirmed) over the status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InstancePhase {
    Creating,
    Running,
    Stopped,
    /// Asked to go, not yet confirmed gone by its host: still billed, still on its host (G).
    Deleting,
    Deleted,
    /// A create that never completed: never billed.
    NeverCreated,
}

impl InstancePhase {
    pub fn of(
        status: VmStatus,
        creation_failed: bool,
        delete_requested: bool,
        deleted: bool,
    ) -> InstancePhase {
        if deleted {
            InstancePhase::Deleted
        } else if creation_failed {
            InstancePhase::NeverCreated
        } else if delete_requested {
            InstancePhase::Deleting
        } else {
            match status {
                VmStatus::Creating => InstancePhase::Creating,
                VmStatus::Running => InstancePhase::Running,
                VmStatus::Stopped => InstancePhase::Stopped,
                VmStatus::Failed => InstancePhase::NeverCreated,
                VmStatus::Deleted => InstancePhase::Deleted,
            }
        }
    }

    /// Billed and holding its host: neither confirmed deleted nor a create that never was
    /// (by their facts; a status alone closes nothing).
    pub fn is_live(self) -> bool {
        !matches!(self, InstancePhase::Deleted | InstancePhase::NeverCreated)
    }

    /// The word the CLI and the API's readers use.
    pub fn as_str(self) -> &'static str {
        match self {
            InstancePhase::Creating => "creating",
            InstancePhase::Running => "running",
            InstancePhase::Stopped => "stopped",
            InstancePhase::Deleting => "deleting",
            InstancePhase::Deleted => "deleted",
            InstancePhase::NeverCreated => "failed",
        }
    }
}

impl VmStatus {
    /// Running or stopped: what start, stop and reboot act on.
    pub fn is_powered_state(self) -> bool {
        matches!(self, VmStatus::Running | VmStatus::Stopped)
    }
}

text_enum! {
    /// `host_enrollments.state` (A, B, H): pending until the relay is up, ready to redeem,
    /// then one of the endings.
    pub enum EnrollmentState {
        Pending = "pending",
        Ready = "ready",
        Enrolled = "enrolled",
        Rejected = "rejected",
        Revoked = "revoked",
        Expired = "expired",
        Released = "released",
    }
}

impl EnrollmentState {
    /// Pending or ready: the token can still be redeemed, and the enrolment revoked.
    pub fn is_open(self) -> bool {
        matches!(self, EnrollmentState::Pending | EnrollmentState::Ready)
    }

    /// Rejected, revoked, expired or released: the allocation is (being) handed back.
    pub fn is_ended(self) -> bool {
        matches!(
            self,
            EnrollmentState::Rejected
                | EnrollmentState::Revoked
                | EnrollmentState::Expired
                | EnrollmentState::Released
        )
    }
}

text_enum! {
    /// `hosts.relay_state`: relay-provision's progress (A.3).
    pub enum RelayState {
        Provisioning = "provisioning",
        Ready = "ready",
        Failed = "failed",
    }
}

text_enum! {
    /// `hosts.revoke_step`: how far the revoke of an enrolled host got (H.1: de-pool,
    /// drain, then remove access). A revoke that stopped is resumed from here.
    pub enum RevokeStep {
        /// De-pooled; its instances are being deleted (G) and not all are confirmed.
        Draining = "draining",
        /// Drained; the relay, tunnel and DNS are being removed.
        RemovingAccess = "removing_access",
        /// Done: access removed, the host's tokens and secrets cleared.
        Revoked = "revoked",
    }
}

text_enum! {
    /// `operator_key_lists.state` (M): a draft waits for a signature; published is signed.
    pub enum KeyListState {
        Draft = "draft",
        Published = "published",
    }
}

text_enum! {
    /// `api_tokens.scope` (issue #43): what an API token reaches. `read` every GET but the
    /// operations' and the account's own; `instances` a customer's rentals, keys, queue and
    /// bookings; `hosts` an owner's machines and earnings; `admin` (staff only) everything a
    /// token may reach. No scope reaches what needs a session (docs/api-tokens.md).
    pub enum ApiScope {
        Read = "read",
        Instances = "instances",
        Hosts = "hosts",
        Admin = "admin",
    }
}

#[cfg(test)]
mod tests {
    /// A confirmed delete wins over everything, a create that never was over a delete asked,
    /// a delete asked over the status; only the first two close an instance.
    #[test]
    fn an_instances_phase_is_judged_from_its_four_facts_in_one_order() {
        use InstancePhase::*;
        let of = InstancePhase::of;
        assert_eq!(of(VmStatus::Running, false, false, false), Running);
        assert_eq!(of(VmStatus::Stopped, false, false, false), Stopped);
        assert_eq!(of(VmStatus::Creating, false, false, false), Creating);
        assert_eq!(of(VmStatus::Running, false, true, false), Deleting);
        assert_eq!(of(VmStatus::Running, false, true, true), Deleted);
        assert_eq!(of(VmStatus::Failed, true, true, false), NeverCreated);
        assert_eq!(of(VmStatus::Deleted, true, true, true), Deleted);
        for live in [Creating, Running, Stopped, Deleting] {
            assert!(live.is_live(), "{live:?}");
        }
        for closed in [Deleted, NeverCreated] {
            assert!(!closed.is_live(), "{closed:?}");
        }
        assert_eq!(Deleting.as_str(), "deleting");
        assert_eq!(NeverCreated.as_str(), "failed");
    }

    use super::*;

    #[test]
    fn each_state_reads_back_from_its_spelling_on_the_wire_and_in_the_database() {
        fn round_trip<T>(all: &[T])
        where
            T: Copy
                + std::fmt::Debug
                + PartialEq
                + std::fmt::Display
                + std::str::FromStr
                + serde::Serialize
                + serde::de::DeserializeOwned,
            <T as std::str::FromStr>::Err: std::fmt::Debug,
        {
            for s in all {
                let text = s.to_string();
                assert_eq!(text.parse::<T>().unwrap(), *s);
                assert_eq!(serde_json::to_value(s).unwrap(), text.as_str());
                assert_eq!(
                    serde_json::from_value::<T>(text.clone().into()).unwrap(),
                    *s
                );
            }
        }
        round_trip(VmStatus::ALL);
        round_trip(EnrollmentState::ALL);
        round_trip(RelayState::ALL);
        round_trip(KeyListState::ALL);
        round_trip(RevokeStep::ALL);
        round_trip(FleetRunState::ALL);
        round_trip(FleetHostState::ALL);
        round_trip(NoticeKind::ALL);
        round_trip(InvoiceStatus::ALL);
        round_trip(PayoutStatus::ALL);
        round_trip(ApiScope::ALL);
        assert!("Running".parse::<VmStatus>().is_err());
        assert!(VmStatus::try_from("unknown".to_owned()).is_err());
    }

    #[test]
    fn an_invoice_status_only_goes_forward() {
        use InvoiceStatus::*;
        // Every pair, against the lifecycle written out once more by hand.
        let forward = [
            (Pending, Draft),
            (Pending, Open),
            (Pending, Paid),
            (Pending, Uncollectible),
            (Pending, Void),
            (Draft, Open),
            (Draft, Paid),
            (Draft, Uncollectible),
            (Draft, Void),
            (Open, Paid),
            (Open, Uncollectible),
            (Open, Void),
            (Uncollectible, Paid),
            (Uncollectible, Void),
        ];
        for &a in InvoiceStatus::ALL {
            for &b in InvoiceStatus::ALL {
                let want = a == b || forward.contains(&(a, b));
                assert_eq!(a.may_become(b), want, "{a} -> {b}");
            }
        }
        assert!(Paid.is_final() && Void.is_final());
        assert!(!Open.is_final() && !Uncollectible.is_final());
    }
}

text_enum! {
    /// `fleet_upgrades.state` (issue #14, 5): a fleet upgrade runs, is halted (by its first
    /// failure or by a superadmin; `byo fleet upgrade --resume` picks it up again), or is
    /// closed (every host judged, or closed by hand). One run is open at a time.
    pub enum FleetRunState {
        Running = "running",
        Halted = "halted",
        Closed = "closed",
    }
}

text_enum! {
    /// `fleet_upgrade_hosts.state`: one host's place in a fleet upgrade. `waiting` for its
    /// wave, `upgrading` from the moment the one-liner was started on it until its heartbeat
    /// judges it, then `healthy` (the heartbeat reports the build, healthy), `failed` (with
    /// the reason; the run halts) or `skipped` (mid-create, de-pooled: the reason says which).
    pub enum FleetHostState {
        Waiting = "waiting",
        Upgrading = "upgrading",
        Healthy = "healthy",
        Failed = "failed",
        Skipped = "skipped",
    }
}

text_enum! {
    /// `notices.kind` (issue #38, 3): what a notice is about. A person turns notices off by
    /// kind; which kinds reach whom is the server's (`app::notices`).
    pub enum NoticeKind {
        HostUnreachable = "host.unreachable",
        HostRollback = "host.rollback",
        HostPrepareStopped = "host.prepare_stopped",
        HostRetired = "host.retired",
        DeleteStuck = "delete.stuck",
        FleetUpgradeHalted = "fleet_upgrade.halted",
        JobFailing = "job.failing",
        KeyListExpiring = "key_list.expiring",
        QueuePlaced = "queue.placed",
        QueueExpired = "queue.expired",
        BookingLaunched = "booking.launched",
        BillingPaymentFailed = "billing.payment_failed",
        BillingInstancesStopped = "billing.instances_stopped",
        InstanceEnded = "instance.ended",
    }
}

text_enum! {
    /// `invoices.status` (issue #40, 1): Stripe's invoice statuses, and `pending` before
    /// Stripe has the invoice.
    pub enum InvoiceStatus {
        Pending = "pending",
        Draft = "draft",
        Open = "open",
        Paid = "paid",
        Uncollectible = "uncollectible",
        Void = "void",
    }
}

text_enum! {
    /// `payouts.status` (issue #40, 6): an owner's payout made here and not yet taken by
    /// Stripe (tried again with backoff), or transferred.
    pub enum PayoutStatus {
        Pending = "pending",
        Paid = "paid",
    }
}

impl InvoiceStatus {
    /// Whether an invoice at `self` may be moved to `next`. Stripe's lifecycle only goes
    /// forward (draft → open → paid, uncollectible or void; uncollectible → paid or void),
    /// and its webhooks arrive in any order, so a late `invoice.finalized` never reopens a
    /// paid invoice. Staying put is allowed (a replayed answer writes the same status).
    pub fn may_become(self, next: InvoiceStatus) -> bool {
        use InvoiceStatus::*;
        self == next
            || match self {
                Pending => next != Pending,
                Draft => matches!(next, Open | Paid | Uncollectible | Void),
                Open => matches!(next, Paid | Uncollectible | Void),
                Uncollectible => matches!(next, Paid | Void),
                Paid | Void => false,
            }
    }

    /// Paid or void: nothing more happens to it.
    pub fn is_final(self) -> bool {
        matches!(self, InvoiceStatus::Paid | InvoiceStatus::Void)
    }
}
