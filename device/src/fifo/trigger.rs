//! The 16-byte trigger: what a GPU thread asks the proxy to do, packed into two `u64` words
//! that one 16-byte store publishes.

use core::fmt;
use core::ops::BitOr;

/// Bits of the operation field of a [`Trigger`]; any combination is legal, none included
/// (a trigger with no operation bit is delivered like any other: the proxy decides what it
/// means).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct TriggerOp(u8);

impl TriggerOp {
    /// No operation bit.
    pub const NONE: TriggerOp = TriggerOp(0);
    /// Copy `size` bytes from the source offset to the destination offset.
    pub const DATA: TriggerOp = TriggerOp(1);
    /// Raise the receiver's inbound flag after every earlier copy has landed.
    pub const FLAG: TriggerOp = TriggerOp(2);
    /// The GPU will wait for this trigger's completion (`sync`/`flush`).
    pub const SYNC: TriggerOp = TriggerOp(4);
    /// Every bit that has a meaning.
    pub const ALL: TriggerOp = TriggerOp(7);

    /// The operation with these bits, or `None` when a bit outside [`TriggerOp::ALL`] is
    /// set.
    pub const fn from_bits(bits: u8) -> Option<TriggerOp> {
        if bits & !Self::ALL.0 == 0 {
            Some(TriggerOp(bits))
        } else {
            None
        }
    }

    /// The raw bits (at most [`OP_BITS`] of them).
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: TriggerOp) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of both sets of bits.
    pub const fn union(self, other: TriggerOp) -> TriggerOp {
        TriggerOp(self.0 | other.0)
    }
}

impl BitOr for TriggerOp {
    type Output = TriggerOp;
    fn bitor(self, rhs: TriggerOp) -> TriggerOp {
        self.union(rhs)
    }
}

impl fmt::Debug for TriggerOp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (bit, name) in [
            (TriggerOp::DATA, "DATA"),
            (TriggerOp::FLAG, "FLAG"),
            (TriggerOp::SYNC, "SYNC"),
        ] {
            if self.contains(bit) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("NONE")?;
        }
        Ok(())
    }
}

/// Width of the source and destination offset fields.
pub const OFFSET_BITS: u32 = 32;
/// Width of the size field.
pub const SIZE_BITS: u32 = 32;
/// Width of the connection id field.
pub const CONNECTION_ID_BITS: u32 = 10;
/// Width of the operation field ([`TriggerOp`]).
pub const OP_BITS: u32 = 3;

/// Largest source or destination offset, in bytes: offsets address buffers of up to 4 GiB.
pub const MAX_OFFSET: u64 = (1 << OFFSET_BITS) - 1;
/// Largest size of one copy, in bytes (4 GiB - 1); larger copies are split by the caller.
pub const MAX_SIZE: u64 = (1 << SIZE_BITS) - 1;
/// Largest connection id: 1024 connections per FIFO.
pub const MAX_CONNECTION_ID: u32 = (1 << CONNECTION_ID_BITS) - 1;

// Bit positions; the layout table is in the `fifo` module documentation.
const SRC_SHIFT: u32 = 0;
const DST_SHIFT: u32 = 32;
const SIZE_SHIFT: u32 = 0;
const CONN_SHIFT: u32 = 32;
const OP_SHIFT: u32 = CONN_SHIFT + CONNECTION_ID_BITS;
const RESERVED_SHIFT: u32 = OP_SHIFT + OP_BITS;
/// Bit of the high word that holds the commit (lap parity) bit.
pub const COMMIT_BIT: u32 = 63;
/// Mask of the high word's reserved bits (45..=62): zero in every valid trigger.
pub const RESERVED_MASK: u64 = ((1 << COMMIT_BIT) - 1) & !((1 << RESERVED_SHIFT) - 1);

const OFFSET_MASK: u64 = MAX_OFFSET;

/// A field of a [`Trigger`], to name the one that does not fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerField {
    /// The connection id ([`MAX_CONNECTION_ID`]).
    ConnectionId,
    /// The destination offset ([`MAX_OFFSET`]).
    DstOffset,
    /// The source offset ([`MAX_OFFSET`]).
    SrcOffset,
    /// The size ([`MAX_SIZE`]).
    Size,
}

impl TriggerField {
    /// The field's name as the documentation spells it.
    pub const fn name(self) -> &'static str {
        match self {
            TriggerField::ConnectionId => "connection id",
            TriggerField::DstOffset => "destination offset",
            TriggerField::SrcOffset => "source offset",
            TriggerField::Size => "size",
        }
    }

    /// The largest value the field holds.
    pub const fn max(self) -> u64 {
        match self {
            TriggerField::ConnectionId => MAX_CONNECTION_ID as u64,
            TriggerField::DstOffset | TriggerField::SrcOffset => MAX_OFFSET,
            TriggerField::Size => MAX_SIZE,
        }
    }

    /// The field's width in bits.
    pub const fn bits(self) -> u32 {
        match self {
            TriggerField::ConnectionId => CONNECTION_ID_BITS,
            TriggerField::DstOffset | TriggerField::SrcOffset => OFFSET_BITS,
            TriggerField::Size => SIZE_BITS,
        }
    }
}

/// Why a [`Trigger`] could not be built or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TriggerError {
    /// A value is larger than its field holds.
    FieldTooLarge {
        /// The field.
        field: TriggerField,
        /// The value given.
        value: u64,
    },
    /// Raw words with reserved bits (or the commit bit, which only the FIFO sets) set.
    ReservedBits {
        /// The high word given.
        hi: u64,
    },
}

impl fmt::Display for TriggerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            TriggerError::FieldTooLarge { field, value } => write!(
                f,
                "trigger {} {value} does not fit its {}-bit field (at most {})",
                field.name(),
                field.bits(),
                field.max()
            ),
            TriggerError::ReservedBits { hi } => write!(
                f,
                "trigger high word {hi:#018x} has reserved or commit bits set (mask {:#018x})",
                RESERVED_MASK | 1 << COMMIT_BIT
            ),
        }
    }
}

impl core::error::Error for TriggerError {}

/// One request from a GPU thread to the proxy: 16 bytes, published by one 16-byte store.
///
/// Built with [`Trigger::new`], which checks every field against its limit
/// ([`MAX_CONNECTION_ID`], [`MAX_OFFSET`], [`MAX_SIZE`]); the bit layout is in the
/// [`fifo`](crate::fifo) module documentation. A valid trigger has its reserved bits and
/// its commit bit clear: the FIFO sets the commit bit while the trigger sits in a slot and
/// the consumer clears it again, so what is popped compares equal to what was pushed. Every
/// field may be zero.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
#[repr(C, align(16))]
pub struct Trigger {
    lo: u64,
    hi: u64,
}

const _: () = assert!(core::mem::size_of::<Trigger>() == 16);
const _: () = assert!(core::mem::align_of::<Trigger>() == 16);

impl Trigger {
    /// A trigger with every field zero (legal: readiness is the commit bit, not a non-zero
    /// word).
    pub const ZERO: Trigger = Trigger { lo: 0, hi: 0 };

    /// Packs the fields, or names the first one that does not fit.
    pub const fn new(
        op: TriggerOp,
        connection_id: u32,
        dst_offset: u64,
        src_offset: u64,
        size: u64,
    ) -> Result<Trigger, TriggerError> {
        const fn too_large(field: TriggerField, value: u64) -> Result<Trigger, TriggerError> {
            Err(TriggerError::FieldTooLarge { field, value })
        }
        if connection_id > MAX_CONNECTION_ID {
            return too_large(TriggerField::ConnectionId, connection_id as u64);
        }
        if dst_offset > MAX_OFFSET {
            return too_large(TriggerField::DstOffset, dst_offset);
        }
        if src_offset > MAX_OFFSET {
            return too_large(TriggerField::SrcOffset, src_offset);
        }
        if size > MAX_SIZE {
            return too_large(TriggerField::Size, size);
        }
        Ok(Trigger {
            lo: src_offset << SRC_SHIFT | dst_offset << DST_SHIFT,
            hi: size << SIZE_SHIFT
                | (connection_id as u64) << CONN_SHIFT
                | (op.bits() as u64) << OP_SHIFT,
        })
    }

    /// The operation bits.
    pub const fn op(&self) -> TriggerOp {
        TriggerOp((self.hi >> OP_SHIFT) as u8 & TriggerOp::ALL.0)
    }

    /// The connection id (at most [`MAX_CONNECTION_ID`]).
    pub const fn connection_id(&self) -> u32 {
        (self.hi >> CONN_SHIFT) as u32 & MAX_CONNECTION_ID
    }

    /// The destination offset in bytes (at most [`MAX_OFFSET`]).
    pub const fn dst_offset(&self) -> u64 {
        (self.lo >> DST_SHIFT) & OFFSET_MASK
    }

    /// The source offset in bytes (at most [`MAX_OFFSET`]).
    pub const fn src_offset(&self) -> u64 {
        (self.lo >> SRC_SHIFT) & OFFSET_MASK
    }

    /// The size in bytes (at most [`MAX_SIZE`]).
    pub const fn size(&self) -> u64 {
        (self.hi >> SIZE_SHIFT) & MAX_SIZE
    }

    /// The two words `[lo, hi]` as they are stored (commit bit clear).
    pub const fn to_words(self) -> [u64; 2] {
        [self.lo, self.hi]
    }

    /// The trigger stored as `[lo, hi]`; refuses words with a reserved or the commit bit
    /// set.
    pub const fn from_words(words: [u64; 2]) -> Result<Trigger, TriggerError> {
        let [lo, hi] = words;
        if hi & (RESERVED_MASK | 1 << COMMIT_BIT) != 0 {
            return Err(TriggerError::ReservedBits { hi });
        }
        Ok(Trigger { lo, hi })
    }

    /// The high word with the commit bit set to `commit` (0 or 1), as the FIFO stores it.
    #[inline(always)]
    pub(crate) const fn hi_with_commit(&self, commit: u64) -> u64 {
        self.hi | commit << COMMIT_BIT
    }

    /// The trigger of a slot's words, commit bit dropped. The producer only stores valid
    /// triggers, so nothing else needs masking.
    #[inline(always)]
    pub(crate) const fn from_slot_words(lo: u64, hi: u64) -> Trigger {
        Trigger {
            lo,
            hi: hi & !(1 << COMMIT_BIT),
        }
    }
}

impl fmt::Debug for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Trigger")
            .field("op", &self.op())
            .field("connection_id", &self.connection_id())
            .field("dst_offset", &self.dst_offset())
            .field("src_offset", &self.src_offset())
            .field("size", &self.size())
            .finish()
    }
}
