//! Bodies of the control plane's HTTP API (`/api/...`).

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

use crate::Role;

/// Every error the API returns has this body. `error` is a stable machine-readable code;
/// `message` is for people. A 5xx never carries internals, only `request_id` to quote.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ErrorBody {
    pub error: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_id: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Healthz {
    pub status: String,
    pub database: String,
    pub version: String,
}

#[derive(Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LoginRequest {
    pub email: String,
    pub password: String,
}

// Hand-written so a password never reaches a log line through `{:?}`.
impl std::fmt::Debug for LoginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginRequest")
            .field("email", &self.email)
            .field("password", &"<redacted>")
            .finish()
    }
}

#[derive(Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignupRequest {
    pub email: String,
    pub password: String,
    #[serde(default)]
    pub display_name: String,
}

impl std::fmt::Debug for SignupRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SignupRequest")
            .field("email", &self.email)
            .field("password", &"<redacted>")
            .field("display_name", &self.display_name)
            .finish()
    }
}

/// The link a sign-up mailed (its `token`) and the password chosen at sign-up.
#[derive(Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ConfirmSignup {
    pub token: String,
    pub password: String,
}

impl std::fmt::Debug for ConfirmSignup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConfirmSignup { <redacted> }")
    }
}

/// What sign-up answers, the same for a new address and one that had an account.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignedUp {
    pub message: String,
}

#[derive(Clone, Deserialize, Serialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PasswordChange {
    pub current_password: String,
    pub new_password: String,
}

impl std::fmt::Debug for PasswordChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PasswordChange { <redacted> }")
    }
}

/// A user as the API shows them: to themselves (`/api/me`) and to operators.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct UserView {
    /// The user's subject id (`user_sub` in the tables).
    pub sub: String,
    pub email: String,
    pub display_name: String,
    pub roles: Vec<Role>,
    /// Hosts this user owns (not retired).
    pub hosts_owned: i64,
    pub created_at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct AuditEntry {
    pub id: String,
    pub at: DateTime<Utc>,
    pub actor_sub: Option<String>,
    pub action: String,
    pub target: Option<String>,
    pub details: serde_json::Value,
    /// The API token the action was taken through (its name), if it was not a session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via_token: Option<String>,
}

/// One background job as /admin/jobs shows it (issue #13): its period and its newest runs,
/// newest first (the first is its last run).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobView {
    pub name: String,
    pub every_secs: u64,
    pub runs: Vec<JobRunView>,
}

/// One recorded run of a job: `outcome` is `ok` or `failed`; `summary` on success, `error`
/// on failure, each bounded to 1,000 characters.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct JobRunView {
    pub started_at: DateTime<Utc>,
    pub duration_ms: i32,
    pub outcome: String,
    pub summary: Option<String>,
    pub error: Option<String>,
}

/// The operator-key list as the operators' page shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyListView {
    pub version: i32,
    pub state: crate::states::KeyListState,
    pub issued_at: DateTime<Utc>,
    pub expires: DateTime<Utc>,
    pub keys: Vec<OperatorKeyView>,
    /// The exact bytes that are (or will be) signed.
    pub body: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperatorKeyView {
    pub user_sub: String,
    /// The operator's email as the server knows it now, to name them by (the list itself
    /// binds the account id; `None` for an account gone since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    pub label: String,
    pub fingerprint: String,
    pub public_key: String,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyChangeView {
    pub user_sub: String,
    pub action: String,
    pub fingerprint: String,
    pub label: String,
    pub at: DateTime<Utc>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostKeyStatus {
    pub host_id: String,
    pub slug: String,
    /// The list version the host holds, as far as the backend knows.
    pub version: Option<i32>,
    pub attempted_at: Option<DateTime<Utc>>,
    /// Why the last push failed; none when it succeeded.
    pub error: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct OperatorKeysView {
    pub environment: String,
    /// Fingerprints of the signing keys hosts pin.
    pub signing_keys: Vec<String>,
    pub published: Option<KeyListView>,
    /// The published list's signed envelope, exactly as hosts hold it: `byo keys sign`
    /// verifies it against the keys it holds before showing a diff against it.
    #[serde(default)]
    pub published_envelope: Option<String>,
    /// The version waiting for a signature, with who changed what.
    pub draft: Option<KeyListView>,
    pub draft_changes: Vec<KeyChangeView>,
    pub hosts: Vec<HostKeyStatus>,
}

/// One change to the draft: an operator adds or removes their own key; a superadmin also
/// removes anyone's (I: a departure) and names the next signing keys (M.13).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "action", rename_all = "snake_case")]
pub enum KeyChangeRequest {
    Add {
        public_key: String,
        label: String,
    },
    Remove {
        fingerprint: String,
    },
    /// Superadmin only: every list after the one this drafts is signed by these keys, and
    /// by them alone. The draft must be signed by the current key and by these.
    RotateSigningKeys {
        signing_keys: Vec<String>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SignatureUpload {
    /// An armored SSHSIG (`ssh-keygen -Y sign -n operator-keys@byo`) over the draft's body.
    pub signature: String,
    /// More signatures over the same body: a rotation carries its successors' too.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_signatures: Vec<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PushOutcome {
    pub version: i32,
    pub delivered: usize,
    pub failed: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct KeyOwner {
    pub user_sub: String,
    pub email: Option<String>,
    pub label: String,
    pub fingerprint: String,
    pub listed_at: DateTime<Utc>,
    pub removed_at: Option<DateTime<Utc>>,
}

impl crate::limits::Bounded for LoginRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{EMAIL, PASSWORD, text};
        text("email", &self.email, EMAIL)?;
        text("password", &self.password, PASSWORD)
    }
}

impl crate::limits::Bounded for ConfirmSignup {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{PASSWORD, SHORT, text};
        text("token", &self.token, SHORT)?;
        text("password", &self.password, PASSWORD)
    }
}

impl crate::limits::Bounded for SignupRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{EMAIL, NAME_CHARS, PASSWORD, chars, text};
        text("email", &self.email, EMAIL)?;
        text("password", &self.password, PASSWORD)?;
        chars("display_name", &self.display_name, NAME_CHARS)
    }
}

impl crate::limits::Bounded for NewApiToken {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::chars("name", &self.name, crate::limits::KEY_NAME_CHARS)
    }
}

impl crate::limits::Bounded for PasswordChange {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{PASSWORD, text};
        text("current_password", &self.current_password, PASSWORD)?;
        text("new_password", &self.new_password, PASSWORD)
    }
}

impl crate::limits::Bounded for KeyChangeRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        use crate::limits::{NAME_CHARS, PUBLIC_KEY, SHORT, chars, text};
        match self {
            KeyChangeRequest::Add { public_key, label } => {
                text("public_key", public_key, PUBLIC_KEY)?;
                chars("label", label, NAME_CHARS)
            }
            KeyChangeRequest::Remove { fingerprint } => text("fingerprint", fingerprint, SHORT),
            KeyChangeRequest::RotateSigningKeys { signing_keys } => {
                crate::limits::count("signing_keys", signing_keys.len(), 8)?;
                signing_keys
                    .iter()
                    .try_for_each(|k| text("signing_keys[]", k, PUBLIC_KEY))
            }
        }
    }
}

impl crate::limits::Bounded for SignatureUpload {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::text("signature", &self.signature, crate::limits::SIGNATURE)?;
        crate::limits::count("more_signatures", self.more_signatures.len(), 8)?;
        self.more_signatures
            .iter()
            .try_for_each(|s| crate::limits::text("more_signatures[]", s, crate::limits::SIGNATURE))
    }
}

/// Where an activated host takes customers (D): the shared spark-1 pool, or one owner's
/// own use. A closed set; the schema holds `hosts.placement` to the same two words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(tag = "placement", rename_all = "snake_case")]
pub enum Placement {
    Shared,
    /// Reserved for one user (`dedicated_to`, their subject id).
    Dedicated {
        dedicated_to: String,
    },
}

impl Placement {
    /// The word `hosts.placement` stores.
    pub fn as_str(&self) -> &'static str {
        match self {
            Placement::Shared => "shared",
            Placement::Dedicated { .. } => "dedicated",
        }
    }

    pub fn dedicated_to(&self) -> Option<&str> {
        match self {
            Placement::Shared => None,
            Placement::Dedicated { dedicated_to } => Some(dedicated_to),
        }
    }
}

/// `POST /api/admin/hosts/{id}/activate`: the single flag, plus the placement chosen with
/// it. Activating a host that is already active changes its placement, and only when the
/// request says so (`change: true`). A host whose customer path has not been walked since its
/// preparation is walked first; one whose walk failed is activated only with
/// `walk_override`, the operator's reason, kept in the audit (issue #38, 4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ActivateRequest {
    #[serde(flatten)]
    pub placement: Placement,
    #[serde(default)]
    pub change: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub walk_override: Option<String>,
}

impl crate::limits::Bounded for ActivateRequest {
    fn check_bounds(&self) -> Result<(), crate::limits::OutOfBounds> {
        crate::limits::opt_text("walk_override", &self.walk_override, crate::limits::MESSAGE)?;
        match &self.placement {
            Placement::Shared => Ok(()),
            Placement::Dedicated { dedicated_to } => {
                crate::limits::text("dedicated_to", dedicated_to, crate::limits::SHORT)
            }
        }
    }
}

/// A walk of a host's customer path (issue #38, 4): `POST /api/admin/hosts/{id}/walk`
/// answers the one it ran, and a host's view carries its newest.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct PathWalkView {
    pub id: String,
    /// The scratch instance it made.
    pub vm_name: String,
    pub started_at: DateTime<Utc>,
    pub finished_at: Option<DateTime<Utc>>,
    /// None while it runs.
    pub passed: Option<bool>,
    /// Where a failed walk stopped: `create`, `ssh` or `delete`.
    pub stage: Option<String>,
    pub error: Option<String>,
    pub create_ms: Option<i32>,
    pub ssh_ms: Option<i32>,
    pub delete_ms: Option<i32>,
}

/// `POST /api/me/tokens` (issue #43): a named API token with one scope. `expires_in_days`
/// defaults to 90 and is at most 365.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(deny_unknown_fields)]
pub struct NewApiToken {
    pub name: String,
    pub scope: crate::states::ApiScope,
    #[serde(default)]
    pub expires_in_days: Option<u32>,
}

/// One of your API tokens as listed: never its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ApiTokenView {
    pub id: String,
    pub name: String,
    pub scope: crate::states::ApiScope,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Past `expires_at`: kept in the list until revoked, refused when presented.
    pub expired: bool,
    pub last_used_at: Option<DateTime<Utc>>,
    /// The address it was last used from.
    pub last_used_from: Option<String>,
}

/// A token just made: its secret, shown this once and never again, and its listing.
#[derive(Clone, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct CreatedApiToken {
    /// `byo_api_…`: send it as `Authorization: Bearer <token>`.
    pub token: String,
    pub api_token: ApiTokenView,
}

impl std::fmt::Debug for CreatedApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CreatedApiToken")
            .field("token", &"<redacted>")
            .field("api_token", &self.api_token)
            .finish()
    }
}
