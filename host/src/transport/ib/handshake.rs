//! What two ranks exchange to connect their queue pairs, and its validating decoder.
//!
//! Wire format: 4 bytes [`HANDSHAKE_MAGIC`], 2 bytes [`HANDSHAKE_VERSION`] (little endian),
//! then the bincode (standard config) of [`IbHandshake`], nothing after it. The decoder
//! refuses anything else, and every field a peer could get wrong is checked.

use serde::{Deserialize, Serialize};

use super::IbError;
use super::staging::CONTROL_BYTES;

/// First bytes of a handshake: "MIBH".
pub const HANDSHAKE_MAGIC: [u8; 4] = *b"MIBH";
/// Version of the handshake format.
pub const HANDSHAKE_VERSION: u16 = 2;
/// Largest handshake accepted (the encoding is well under 100 bytes).
const MAX_HANDSHAKE: usize = 256;

/// A queue pair's address as its peer needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IbEndpoint {
    /// Local identifier of the port (InfiniBand; 0 on RoCE).
    pub lid: u16,
    /// GID of the port (all zero when only the LID is used).
    pub gid: [u8; 16],
    /// Active MTU of the port in bytes (256, 512, 1024, 2048 or 4096).
    pub mtu: u32,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// Starting packet sequence number (24 bits).
    pub psn: u32,
}

/// Registered memory as the peer addresses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RdmaRegion {
    /// Address in the owner's registration (virtual address).
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key.
    pub rkey: u32,
}

/// Everything one side of an IB connection tells the other.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IbHandshake {
    /// The sender's queue pair for this connection.
    pub endpoint: IbEndpoint,
    /// The sender's buffer (the peer's puts land there).
    pub buffer: RdmaRegion,
    /// Where the peer's flag writes land (8 bytes, aligned): the sender's inbound counter,
    /// or, when the sender is staged, the epoch word of its control block.
    pub flag: RdmaRegion,
    /// Whether the sender's buffer goes through host staging: `buffer` is then its host
    /// mirror, and the peer writes a record per put and a count per signal into `control`.
    pub staged: bool,
    /// The sender's staging control block ([`CONTROL_BYTES`], aligned): staged senders
    /// receive records, counts and epochs there; every sender receives credits there.
    pub control: RdmaRegion,
}

impl IbHandshake {
    /// Checks every field a peer could get wrong.
    pub fn validate(&self) -> Result<(), IbError> {
        let bad = |s: String| Err(IbError::BadHandshake(s));
        let e = &self.endpoint;
        if e.qpn > 0xff_ffff || e.qpn < 2 {
            return bad(format!(
                "queue pair number {:#x} is not a 24-bit RC queue pair number",
                e.qpn
            ));
        }
        if e.psn > 0xff_ffff {
            return bad(format!(
                "packet sequence number {:#x} exceeds 24 bits",
                e.psn
            ));
        }
        if ![256, 512, 1024, 2048, 4096].contains(&e.mtu) {
            return bad(format!("MTU {} is not an InfiniBand MTU", e.mtu));
        }
        if e.lid == 0 && e.gid == [0; 16] {
            return bad("neither a LID nor a GID: the peer has no address".into());
        }
        for (what, r) in [
            ("buffer", &self.buffer),
            ("flag", &self.flag),
            ("control", &self.control),
        ] {
            if r.len == 0 {
                return bad(format!("{what} region of 0 bytes"));
            }
            if r.addr.checked_add(r.len).is_none() {
                return bad(format!(
                    "{what} region {:#x} + {} wraps around",
                    r.addr, r.len
                ));
            }
        }
        if self.flag.len != 8 || !self.flag.addr.is_multiple_of(8) {
            return bad(format!(
                "flag region {:#x} + {} is not one aligned 8-byte word",
                self.flag.addr, self.flag.len
            ));
        }
        if self.control.len != CONTROL_BYTES || !self.control.addr.is_multiple_of(8) {
            return bad(format!(
                "staging control block {:#x} + {} is not an aligned block of {CONTROL_BYTES} \
                 bytes",
                self.control.addr, self.control.len
            ));
        }
        if self.staged && self.flag.addr != self.control.addr {
            return bad("a staged side's flag must be its control block's epoch word".into());
        }
        Ok(())
    }
}

/// Encodes a handshake for the bootstrap.
pub fn encode_handshake(h: &IbHandshake) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&HANDSHAKE_MAGIC);
    out.extend_from_slice(&HANDSHAKE_VERSION.to_le_bytes());
    // Encoding plain integers and arrays into a Vec cannot fail.
    let body = bincode::serde::encode_to_vec(h, bincode::config::standard()).unwrap_or_default();
    out.extend_from_slice(&body);
    out
}

/// Decodes and validates a peer's handshake; garbage is an error, never a panic.
pub fn decode_handshake(bytes: &[u8]) -> Result<IbHandshake, IbError> {
    let bad = |s: String| IbError::BadHandshake(s);
    if bytes.len() > MAX_HANDSHAKE {
        return Err(bad(format!(
            "{} bytes (at most {MAX_HANDSHAKE})",
            bytes.len()
        )));
    }
    if bytes.len() < 6 || bytes[..4] != HANDSHAKE_MAGIC {
        return Err(bad("not an InfiniBand handshake (wrong magic)".into()));
    }
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != HANDSHAKE_VERSION {
        return Err(bad(format!(
            "handshake version {version}, this build speaks {HANDSHAKE_VERSION} (mixed \
             library versions?)"
        )));
    }
    let config = bincode::config::standard().with_limit::<MAX_HANDSHAKE>();
    let (h, used): (IbHandshake, usize) = bincode::serde::decode_from_slice(&bytes[6..], config)
        .map_err(|e| bad(format!("undecodable: {e}")))?;
    if used != bytes.len() - 6 {
        return Err(bad(format!("{} trailing byte(s)", bytes.len() - 6 - used)));
    }
    h.validate()?;
    Ok(h)
}
