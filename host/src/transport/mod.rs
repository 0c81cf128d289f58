//! Transports: how bytes and flags move between ranks.
//!
//! - `shm`: POSIX shared memory, the memory of the Host transport.

pub mod shm;
