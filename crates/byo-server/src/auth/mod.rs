//! Who is calling: passwords, sessions, role gates and the cross-site check.

pub mod csrf;
pub mod password;
pub mod session;

pub use session::{CurrentUser, Operator, Superadmin};
