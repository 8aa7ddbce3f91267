//! Who is calling: sessions, API tokens, role gates, the host token and the cross-site check. Password
//! hashing is [`crate::password`]'s: the state holds the hasher, and the state is what
//! these extractors read.

pub mod api_token;
pub mod csrf;
pub mod host_token;
pub mod session;

pub use session::{CurrentUser, Operator, Superadmin};
