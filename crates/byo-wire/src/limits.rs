//! Bounds on every field that crosses the boundary from outside (a host, an owner, a
//! customer, an operator) and is stored or rendered. One mechanism: each request shape
//! implements [`Bounded`], and the server's one JSON extractor calls it before a handler
//! sees the value. A breach names the field and its limit. `docs/security.md` lists every
//! limit with its value and its test.

use std::fmt;

/// Identifiers and short machine-reported words: ids, profile ids, gpu types, os ids,
/// versions, machine and hardware ids, interface names, step names.
pub const SHORT: usize = 128;
/// A person's or a key's name, in characters (display names, key labels).
pub const NAME_CHARS: usize = 100;
/// An SSH key's name, in characters.
pub const KEY_NAME_CHARS: usize = 64;
/// An email address (RFC 5321's path limit).
pub const EMAIL: usize = 254;
/// A password, in bytes: enough for any passphrase, short enough that hashing it is cheap.
pub const PASSWORD: usize = 1024;
/// A message a host reports (a prepare step's error).
pub const MESSAGE: usize = 2048;
/// An OpenSSH public key line.
pub const PUBLIC_KEY: usize = 8192;
/// An armored SSHSIG.
pub const SIGNATURE: usize = 16384;
/// The heartbeat's `details` (`vm::BeatDetails`), serialised.
pub const DETAILS: usize = 8192;
/// Machines in one enrolment request besides node0 (a ring has three).
pub const PEERS: usize = 8;
/// RDMA ports one machine reports.
pub const RAILS: usize = 8;

/// A field past its limit, or holding a NUL (which no database column can store).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutOfBounds {
    /// The field's path in the request, e.g. `peers[1].rails[0].iface`.
    pub field: String,
    pub limit: usize,
    /// `bytes`, `characters`, `entries`, `bytes serialised`; `nul` for a NUL character.
    pub unit: &'static str,
}

impl OutOfBounds {
    fn nul(field: &str) -> Self {
        OutOfBounds {
            field: field.to_owned(),
            limit: 0,
            unit: "nul",
        }
    }

    /// Whether the field holds a NUL rather than being too long.
    pub fn is_nul(&self) -> bool {
        self.unit == "nul"
    }
}

impl fmt::Display for OutOfBounds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_nul() {
            return write!(f, "{} holds a NUL character", self.field);
        }
        write!(
            f,
            "{} is longer than its limit of {} {}",
            self.field, self.limit, self.unit
        )
    }
}

impl std::error::Error for OutOfBounds {}

/// A request shape whose every stored or rendered field has a bound.
pub trait Bounded {
    fn check_bounds(&self) -> Result<(), OutOfBounds>;
}

/// At most `limit` bytes, and no NUL.
pub fn text(field: &str, value: &str, limit: usize) -> Result<(), OutOfBounds> {
    if value.contains('\0') {
        return Err(OutOfBounds::nul(field));
    }
    if value.len() > limit {
        return Err(OutOfBounds {
            field: field.to_owned(),
            limit,
            unit: "bytes",
        });
    }
    Ok(())
}

/// At most `limit` characters (names, where a byte count would punish non-Latin scripts),
/// and no NUL.
pub fn chars(field: &str, value: &str, limit: usize) -> Result<(), OutOfBounds> {
    if value.contains('\0') {
        return Err(OutOfBounds::nul(field));
    }
    if value.chars().count() > limit {
        return Err(OutOfBounds {
            field: field.to_owned(),
            limit,
            unit: "characters",
        });
    }
    Ok(())
}

pub fn opt_text(field: &str, value: &Option<String>, limit: usize) -> Result<(), OutOfBounds> {
    value.as_deref().map_or(Ok(()), |v| text(field, v, limit))
}

/// At most `limit` entries.
pub fn count(field: &str, len: usize, limit: usize) -> Result<(), OutOfBounds> {
    if len > limit {
        return Err(OutOfBounds {
            field: field.to_owned(),
            limit,
            unit: "entries",
        });
    }
    Ok(())
}

/// A free-form JSON value, bounded by its serialised size, with no NUL in any string or key.
pub fn json(field: &str, value: &serde_json::Value, limit: usize) -> Result<(), OutOfBounds> {
    fn has_nul(v: &serde_json::Value) -> bool {
        match v {
            serde_json::Value::String(s) => s.contains('\0'),
            serde_json::Value::Array(items) => items.iter().any(has_nul),
            serde_json::Value::Object(map) => {
                map.iter().any(|(k, v)| k.contains('\0') || has_nul(v))
            }
            _ => false,
        }
    }
    if has_nul(value) {
        return Err(OutOfBounds::nul(field));
    }
    let size = serde_json::to_vec(value).map_or(usize::MAX, |v| v.len());
    if size > limit {
        return Err(OutOfBounds {
            field: field.to_owned(),
            limit,
            unit: "bytes serialised",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_field_at_its_limit_passes_and_one_past_names_the_field_and_the_limit() {
        assert!(text("step", &"a".repeat(SHORT), SHORT).is_ok());
        let err = text("step", &"a".repeat(SHORT + 1), SHORT).unwrap_err();
        assert_eq!(
            err.to_string(),
            "step is longer than its limit of 128 bytes"
        );
        assert!(chars("name", &"é".repeat(NAME_CHARS), NAME_CHARS).is_ok());
        assert!(chars("name", &"é".repeat(NAME_CHARS + 1), NAME_CHARS).is_err());
        assert!(count("peers", PEERS, PEERS).is_ok());
        assert!(count("peers", PEERS + 1, PEERS).is_err());
        let nul = text("step", "a\0b", SHORT).unwrap_err();
        assert_eq!(nul.to_string(), "step holds a NUL character");
        assert!(
            json("details", &serde_json::json!({"k": "\0"}), DETAILS)
                .unwrap_err()
                .is_nul()
        );
    }
}
