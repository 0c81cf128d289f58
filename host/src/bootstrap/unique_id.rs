//! [`UniqueId`]: the 128-byte token that names one bootstrap rendezvous.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::wire::{MAGIC, PROTOCOL_VERSION};

/// Size of a [`UniqueId`] in bytes (the seed's `MSCCLPP_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;
/// Size of the secret inside a [`UniqueId`].
pub const SECRET_BYTES: usize = 32;

// Layout (all integers little endian):
//   0..8    magic
//   8..12   protocol version
//   12      address family (4 or 6)
//   13      reserved (0)
//   14..16  root port
//   16..32  root ip (IPv4 in the first 4 bytes)
//   32..64  secret
//   64..128 reserved (0)
const OFF_VERSION: usize = 8;
const OFF_FAMILY: usize = 12;
const OFF_PORT: usize = 14;
const OFF_IP: usize = 16;
const OFF_SECRET: usize = 32;

/// Names one bootstrap rendezvous: magic, protocol version, the root's address and a random
/// secret that every rank presents on every connection.
///
/// Create one with [`create_unique_id`](super::create_unique_id) on one process, pass it to
/// the others (its [`Display`](fmt::Display) form is 256 hex digits, fit for an environment
/// variable or a command-line flag, and [`FromStr`] reads it back), then call
/// [`Bootstrap::init`](super::Bootstrap::init) everywhere. `Debug` hides the secret.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UniqueId {
    bytes: [u8; UNIQUE_ID_BYTES],
}

/// Why bytes or a string are not a [`UniqueId`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UniqueIdError {
    /// Wrong length.
    #[error("a unique id is {expected} bytes ({} hex digits), got {got}", expected * 2)]
    Length {
        /// Expected length in bytes.
        expected: usize,
        /// Length found (bytes, or hex digits for a string).
        got: usize,
    },
    /// A character that is not a hex digit.
    #[error("a unique id is hex digits; found {found:?} at position {position}")]
    NotHex {
        /// Offending character.
        found: char,
        /// Its position.
        position: usize,
    },
    /// The magic does not match.
    #[error("not an mscclpp unique id (bad magic)")]
    BadMagic,
    /// Made by another protocol version.
    #[error("unique id of protocol version {found}; this build speaks version {supported}")]
    Version {
        /// Version in the id.
        found: u32,
        /// Version of this build.
        supported: u32,
    },
    /// Unknown address family byte.
    #[error("unique id has an unknown address family {0}")]
    Family(u8),
}

impl UniqueId {
    /// An id for a root at `root` with the given secret.
    pub fn new(root: SocketAddr, secret: [u8; SECRET_BYTES]) -> UniqueId {
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        bytes[..8].copy_from_slice(&MAGIC);
        bytes[OFF_VERSION..OFF_VERSION + 4].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        bytes[OFF_PORT..OFF_PORT + 2].copy_from_slice(&root.port().to_le_bytes());
        match root.ip() {
            IpAddr::V4(ip) => {
                bytes[OFF_FAMILY] = 4;
                bytes[OFF_IP..OFF_IP + 4].copy_from_slice(&ip.octets());
            }
            IpAddr::V6(ip) => {
                bytes[OFF_FAMILY] = 6;
                bytes[OFF_IP..OFF_IP + 16].copy_from_slice(&ip.octets());
            }
        }
        bytes[OFF_SECRET..OFF_SECRET + SECRET_BYTES].copy_from_slice(&secret);
        UniqueId { bytes }
    }

    /// An id for a root at `root` with a fresh random secret.
    pub fn random(root: SocketAddr) -> UniqueId {
        UniqueId::new(root, rand::random())
    }

    /// The id of the seed's `"ip:port"` form without a shared secret: rank 0 runs the root
    /// at `root`, and the secret is all zeros. Unauthenticated: anyone who can reach the port
    /// can join as a rank that has not joined yet. Prefer a random id, or
    /// [`for_address_with_secret`](Self::for_address_with_secret).
    pub fn for_address(root: SocketAddr) -> UniqueId {
        UniqueId::new(root, [0; SECRET_BYTES])
    }

    /// The id of the `"ip:port"` form with a shared secret string (what
    /// `MSCCLPP_BOOTSTRAP_SECRET` holds): the secret is SHA-256 of a fixed prefix and
    /// `secret`, so every rank given the same string derives the same id, and joins or
    /// connections without it are refused.
    pub fn for_address_with_secret(root: SocketAddr, secret: &str) -> UniqueId {
        let mut input = b"mscclpp bootstrap secret v1\0".to_vec();
        input.extend_from_slice(secret.as_bytes());
        use sha2::Digest;
        UniqueId::new(root, sha2::Sha256::digest(&input).into())
    }

    /// Reads an id from its 128 bytes, checking magic, version and address family.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId, UniqueIdError> {
        let bytes: [u8; UNIQUE_ID_BYTES] = bytes.try_into().map_err(|_| UniqueIdError::Length {
            expected: UNIQUE_ID_BYTES,
            got: bytes.len(),
        })?;
        if bytes[..8] != MAGIC {
            return Err(UniqueIdError::BadMagic);
        }
        let mut v = [0u8; 4];
        v.copy_from_slice(&bytes[OFF_VERSION..OFF_VERSION + 4]);
        let version = u32::from_le_bytes(v);
        if version != PROTOCOL_VERSION {
            return Err(UniqueIdError::Version {
                found: version,
                supported: PROTOCOL_VERSION,
            });
        }
        match bytes[OFF_FAMILY] {
            4 | 6 => Ok(UniqueId { bytes }),
            other => Err(UniqueIdError::Family(other)),
        }
    }

    /// The 128 bytes.
    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.bytes
    }

    /// The root's address.
    pub fn root_addr(&self) -> SocketAddr {
        let port = u16::from_le_bytes([self.bytes[OFF_PORT], self.bytes[OFF_PORT + 1]]);
        let ip = if self.bytes[OFF_FAMILY] == 6 {
            let mut o = [0u8; 16];
            o.copy_from_slice(&self.bytes[OFF_IP..OFF_IP + 16]);
            IpAddr::V6(Ipv6Addr::from(o))
        } else {
            let mut o = [0u8; 4];
            o.copy_from_slice(&self.bytes[OFF_IP..OFF_IP + 4]);
            IpAddr::V4(Ipv4Addr::from(o))
        };
        SocketAddr::new(ip, port)
    }

    /// The secret.
    pub fn secret(&self) -> [u8; SECRET_BYTES] {
        let mut s = [0u8; SECRET_BYTES];
        s.copy_from_slice(&self.bytes[OFF_SECRET..OFF_SECRET + SECRET_BYTES]);
        s
    }

    /// Whether `secret` equals this id's secret, compared in constant time.
    pub fn secret_matches(&self, secret: &[u8; SECRET_BYTES]) -> bool {
        let ours = &self.bytes[OFF_SECRET..OFF_SECRET + SECRET_BYTES];
        ours.iter()
            .zip(secret)
            .fold(0u8, |acc, (a, b)| acc | (a ^ b))
            == 0
    }
}

impl fmt::Display for UniqueId {
    /// 256 lowercase hex digits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.bytes {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UniqueId")
            .field("root", &self.root_addr())
            .field("secret", &"<hidden>")
            .finish()
    }
}

impl FromStr for UniqueId {
    type Err = UniqueIdError;

    fn from_str(s: &str) -> Result<UniqueId, UniqueIdError> {
        let s = s.trim();
        if s.len() != UNIQUE_ID_BYTES * 2 {
            return Err(UniqueIdError::Length {
                expected: UNIQUE_ID_BYTES,
                got: s.chars().count(),
            });
        }
        let mut bytes = [0u8; UNIQUE_ID_BYTES];
        let digits = s.as_bytes();
        for (i, out) in bytes.iter_mut().enumerate() {
            let hi = hex_value(digits[2 * i]).ok_or_else(|| not_hex(s, 2 * i))?;
            let lo = hex_value(digits[2 * i + 1]).ok_or_else(|| not_hex(s, 2 * i + 1))?;
            *out = (hi << 4) | lo;
        }
        UniqueId::from_bytes(&bytes)
    }
}

/// Characters of a value shown by [`redacted`] where it may hold a secret: the id's magic
/// and version, never its secret (bytes 32..64, characters 64..128 of the hex form).
const SHOWN_PREFIX_CHARS: usize = 16;

/// `value`, a bootstrap root as given (a unique id, `ip:port` or `host:port`), as an error
/// may show it: where it may hold a unique id's secret (64 hex digits or more, as a
/// malformed id does) only its first 16 characters and its length; else the value, cut
/// to 200 characters. No message shows a secret this way.
pub(crate) fn redacted(value: &str) -> String {
    let hex_digits = value.chars().filter(char::is_ascii_hexdigit).count();
    let chars = value.chars().count();
    if hex_digits >= SECRET_BYTES * 2 {
        let prefix: String = value.chars().take(SHOWN_PREFIX_CHARS).collect();
        format!("{prefix}... ({chars} characters; the rest, which may hold a secret, is not shown)")
    } else if chars > 200 {
        let prefix: String = value.chars().take(200).collect();
        format!("{prefix}... ({chars} characters)")
    } else {
        value.to_string()
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn not_hex(s: &str, byte_pos: usize) -> UniqueIdError {
    // The string has the right byte length but may hold multi-byte characters.
    let (position, found) = s
        .char_indices()
        .enumerate()
        .find(|(_, (idx, c))| *idx <= byte_pos && byte_pos < idx + c.len_utf8())
        .map(|(n, (_, c))| (n, c))
        .unwrap_or((byte_pos, '?'));
    UniqueIdError::NotHex { found, position }
}

impl Serialize for UniqueId {
    /// A hex string in human-readable formats, 128 raw bytes otherwise.
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.collect_str(self)
        } else {
            serializer.serialize_bytes(&self.bytes)
        }
    }
}

impl<'de> Deserialize<'de> for UniqueId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<UniqueId, D::Error> {
        struct IdVisitor;
        impl<'de> Visitor<'de> for IdVisitor {
            type Value = UniqueId;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a unique id: 256 hex digits or 128 bytes")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<UniqueId, E> {
                v.parse().map_err(E::custom)
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<UniqueId, E> {
                UniqueId::from_bytes(v).map_err(E::custom)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueId, A::Error> {
                let mut bytes = [0u8; UNIQUE_ID_BYTES];
                for (i, b) in bytes.iter_mut().enumerate() {
                    *b = seq
                        .next_element()?
                        .ok_or_else(|| de::Error::invalid_length(i, &self))?;
                }
                if seq.next_element::<u8>()?.is_some() {
                    return Err(de::Error::invalid_length(UNIQUE_ID_BYTES + 1, &self));
                }
                UniqueId::from_bytes(&bytes).map_err(de::Error::custom)
            }
        }
        if deserializer.is_human_readable() {
            deserializer.deserialize_str(IdVisitor)
        } else {
            deserializer.deserialize_bytes(IdVisitor)
        }
    }
}

#[cfg(test)]
mod tests;
