use thiserror::Error;

pub type Result<T, E = DbError> = std::result::Result<T, E>;

/// What the database refused, or could not do. Constraint refusals name the constraint,
/// because the schema's constraint names are the design's rules.
#[derive(Debug, Error)]
pub enum DbError {
    #[error("not found")]
    NotFound,
    /// A unique constraint: the thing already exists.
    #[error("conflict: {0}")]
    Conflict(String),
    /// A check constraint (or a trigger naming its rule) refused the write.
    #[error("refused by {0}")]
    Refused(String),
    /// A foreign key refused the write: a row it names does not exist, or a row being
    /// removed is still named by another. Nothing was written.
    #[error("still referenced ({0})")]
    ForeignKey(String),
    #[error("configuration: {0}")]
    Config(String),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("database error: {0}")]
    Backend(sqlx::Error),
}

impl From<sqlx::Error> for DbError {
    fn from(e: sqlx::Error) -> Self {
        use sqlx::error::ErrorKind;
        if let sqlx::Error::RowNotFound = e {
            return DbError::NotFound;
        }
        if let Some(db) = e.as_database_error() {
            let name = db
                .constraint()
                .map(str::to_owned)
                .unwrap_or_else(|| constraint_from_message(db.message()));
            match db.kind() {
                ErrorKind::UniqueViolation => return DbError::Conflict(name),
                ErrorKind::ForeignKeyViolation => return DbError::ForeignKey(name),
                ErrorKind::CheckViolation | ErrorKind::NotNullViolation => {
                    return DbError::Refused(name);
                }
                // SQLite's RAISE(ABORT, '<rule>') in a trigger (SQLITE_CONSTRAINT_TRIGGER):
                // the rule's name is the whole message.
                _ if db.code().as_deref() == Some("1811") => {
                    return DbError::Refused(db.message().to_owned());
                }
                _ => {}
            }
        }
        DbError::Backend(e)
    }
}

/// SQLite reports the constraint only in its message: "CHECK constraint failed: name" or
/// "UNIQUE constraint failed: table.col".
fn constraint_from_message(msg: &str) -> String {
    msg.split_once("failed: ")
        .map(|(_, rest)| rest.trim().to_owned())
        .unwrap_or_else(|| msg.to_owned())
}

/// A rule the schema enforces that the rules above it act on, named once here from the
/// constraints (checks, unique indexes, triggers) that enforce it on both databases: callers
/// match a `Rule`, never a constraint's name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Two open bookings of one host overlap.
    HostDoubleBooked,
    /// A customer holds as many unpaid bookings as they may.
    UnpaidBookingCap,
    /// No host can take a booking's window.
    NoHostForWindow,
    /// A booking holds a live instance already.
    OneLiveInstancePerBooking,
    /// The booking is closed.
    BookingClosed,
    /// An active host must have finished preparation.
    ActiveHostPrepared,
    /// A retired host is never active.
    RetiredHostInactive,
    /// The relay address pool is at its cap.
    AllocationCap,
    /// The last superadmin keeps the role.
    LastSuperadmin,
    /// One fleet upgrade is open at a time.
    OneFleetUpgradeOpen,
}

impl Rule {
    pub const ALL: [Rule; 10] = [
        Rule::HostDoubleBooked,
        Rule::UnpaidBookingCap,
        Rule::NoHostForWindow,
        Rule::OneLiveInstancePerBooking,
        Rule::BookingClosed,
        Rule::ActiveHostPrepared,
        Rule::RetiredHostInactive,
        Rule::AllocationCap,
        Rule::LastSuperadmin,
        Rule::OneFleetUpgradeOpen,
    ];

    /// The refusal for a rule byo-db checks in its own code (inside the write's transaction)
    /// rather than through a constraint.
    pub(crate) fn refused(self) -> DbError {
        DbError::Refused(self.constraints()[0].to_owned())
    }

    /// The constraints that enforce the rule (PostgreSQL's and SQLite's names where they
    /// differ).
    fn constraints(self) -> &'static [&'static str] {
        match self {
            Rule::HostDoubleBooked => &["prebookings_host_not_double_booked"],
            Rule::UnpaidBookingCap => &["prebookings_unpaid_cap"],
            Rule::NoHostForWindow => &["no_host_for_window"],
            Rule::OneLiveInstancePerBooking => &["vms_one_live_per_prebooking"],
            Rule::BookingClosed => &["prebooking_closed"],
            Rule::ActiveHostPrepared => &["hosts_active_prepared"],
            Rule::RetiredHostInactive => &["hosts_retired_inactive"],
            Rule::AllocationCap => &["allocation_cap"],
            Rule::LastSuperadmin => &["last_superadmin"],
            Rule::OneFleetUpgradeOpen => &["fleet_upgrades_one_open", "open_marker"],
        }
    }
}

impl DbError {
    /// Whether the database refused this write for breaking `rule`.
    pub fn breaks(&self, rule: Rule) -> bool {
        rule.constraints().iter().any(|c| self.is_constraint(c))
    }

    /// Whether a refusal names this constraint (a check, unique index or key): the schema's
    /// own tests ask this; the rules above ask [`DbError::breaks`].
    pub fn is_constraint(&self, name: &str) -> bool {
        match self {
            DbError::Conflict(n) | DbError::Refused(n) | DbError::ForeignKey(n) => n.contains(name),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule is told apart from every other (a constraint name inside another's would
    /// make one refusal read as two rules), and each that a constraint enforces is named in
    /// both databases' migrations.
    #[test]
    fn each_rule_is_its_own_and_its_constraints_exist_on_both_databases() {
        for rule in Rule::ALL {
            for other in Rule::ALL {
                assert_eq!(
                    rule.refused().breaks(other),
                    rule == other,
                    "{rule:?} / {other:?}"
                );
            }
        }
        let schema = |db: &str| {
            let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("migrations")
                .join(db);
            std::fs::read_dir(dir)
                .unwrap()
                .map(|f| std::fs::read_to_string(f.unwrap().path()).unwrap())
                .collect::<String>()
        };
        let (pg, lite) = (schema("postgres"), schema("sqlite"));
        let checked_in_code = [
            Rule::UnpaidBookingCap,
            Rule::NoHostForWindow,
            Rule::BookingClosed,
            Rule::AllocationCap,
            Rule::LastSuperadmin,
        ];
        for rule in Rule::ALL
            .into_iter()
            .filter(|r| !checked_in_code.contains(r))
        {
            for c in rule.constraints() {
                assert!(
                    pg.contains(c) && lite.contains(c),
                    "{rule:?}: {c} is in both schemas"
                );
            }
        }
    }
}
