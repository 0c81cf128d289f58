//! Feeds arbitrary bytes to every decoder that reads bytes from the network: the frame
//! decoder (as a stream of back-to-back frames, under handshake and data limits), the peer
//! table, and the unique id. None may panic, hang or allocate beyond its limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mscclpp_host::bootstrap::UniqueId;
use mscclpp_host::bootstrap::wire::{FrameLimits, decode_frame, decode_peer_table};

fuzz_target!(|data: &[u8]| {
    for limits in [FrameLimits::HANDSHAKE, FrameLimits::with_max_payload(1 << 16)] {
        let mut rest = data;
        while let Ok(Some((frame, used))) = decode_frame(rest, &limits) {
            assert!(used > 0 && used <= rest.len());
            assert!(frame.payload.len() <= limits.max_payload);
            rest = &rest[used..];
        }
    }
    let _ = decode_peer_table(data);
    let _ = UniqueId::from_bytes(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = text.parse::<UniqueId>();
    }
});
