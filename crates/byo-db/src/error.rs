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

impl DbError {
    /// Whether a refusal names this constraint (a check, unique index or key).
    pub fn is_constraint(&self, name: &str) -> bool {
        match self {
            DbError::Conflict(n) | DbError::Refused(n) | DbError::ForeignKey(n) => n.contains(name),
            _ => false,
        }
    }
}
