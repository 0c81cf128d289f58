//! Property tests of the bootstrap's byte decoders: frames and unique ids.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use mscclpp::host::bootstrap::UniqueId;
use mscclpp::host::bootstrap::wire::{
    self, Channel, Frame, FrameLimits, Hello, MAGIC, Message, PREFIX_LEN, PROTOCOL_VERSION,
    decode_frame, encode_frame,
};
use proptest::prelude::*;

fn socket_addr() -> impl Strategy<Value = SocketAddr> {
    prop_oneof![
        (any::<[u8; 4]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V4(Ipv4Addr::from(ip)), port)),
        (any::<[u8; 16]>(), any::<u16>())
            .prop_map(|(ip, port)| SocketAddr::new(IpAddr::V6(Ipv6Addr::from(ip)), port)),
    ]
}

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        any::<u64>().prop_map(|t| Message::Data {
            channel: Channel::User(t)
        }),
        (any::<u64>(), any::<u32>()).prop_map(|(seq, step)| Message::Data {
            channel: Channel::Collective { seq, step }
        }),
        Just(Message::Goodbye),
        Just(Message::GoodbyeIdle),
        any::<u64>().prop_map(|calls| Message::GoodbyeAfter { calls }),
        Just(Message::HelloAck),
        Just(Message::Welcome),
        (any::<u32>(), ".{0,64}").prop_map(|(rank, detail)| Message::PeerLost { rank, detail }),
        (any::<u32>(), ".{0,64}", ".{0,64}").prop_map(|(rank, op, seen)| Message::PeerStalled {
            rank,
            op,
            seen
        }),
        (any::<u32>(), any::<u64>(), ".{0,64}").prop_map(|(rank, collectives, why)| {
            Message::PeerClosed {
                rank,
                collectives,
                why,
            }
        }),
        (any::<[u8; 32]>(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
            |(secret, nranks, from, to)| Message::Hello(Hello {
                magic: MAGIC,
                version: PROTOCOL_VERSION,
                secret,
                nranks,
                from,
                to,
            })
        ),
    ]
}

proptest! {
    #[test]
    fn frames_round_trip(msg in message(), payload in proptest::collection::vec(any::<u8>(), 0..512)) {
        let bytes = encode_frame(&msg, &payload).unwrap();
        let limits = FrameLimits::with_max_payload(512);
        let (frame, used) = decode_frame(&bytes, &limits).unwrap().unwrap();
        prop_assert_eq!(used, bytes.len());
        prop_assert_eq!(frame, Frame { message: msg, payload });
    }

    #[test]
    fn every_strict_prefix_is_incomplete(msg in message(), payload in proptest::collection::vec(any::<u8>(), 0..64), cut in any::<prop::sample::Index>()) {
        let bytes = encode_frame(&msg, &payload).unwrap();
        let cut = cut.index(bytes.len());
        let limits = FrameLimits::with_max_payload(64);
        prop_assert!(decode_frame(&bytes[..cut], &limits).unwrap().is_none());
    }

    #[test]
    fn back_to_back_frames_decode_in_order(msgs in proptest::collection::vec(message(), 1..6)) {
        let mut stream = Vec::new();
        for (i, m) in msgs.iter().enumerate() {
            stream.extend(encode_frame(m, &vec![i as u8; i]).unwrap());
        }
        let limits = FrameLimits::with_max_payload(16);
        let mut rest = stream.as_slice();
        for (i, m) in msgs.iter().enumerate() {
            let (frame, used) = decode_frame(rest, &limits).unwrap().unwrap();
            prop_assert_eq!(&frame.message, m);
            prop_assert_eq!(frame.payload, vec![i as u8; i]);
            rest = &rest[used..];
        }
        prop_assert!(rest.is_empty());
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        for limits in [FrameLimits::HANDSHAKE, FrameLimits::with_max_payload(1 << 20)] {
            if let Ok(Some((frame, used))) = decode_frame(&bytes, &limits) {
                prop_assert!(used <= bytes.len());
                prop_assert!(frame.payload.len() <= limits.max_payload);
            }
        }
    }

    #[test]
    fn corrupted_frames_never_panic(msg in message(), flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4)) {
        let mut bytes = encode_frame(&msg, b"payload").unwrap();
        for (at, x) in flips {
            let i = at.index(bytes.len());
            bytes[i] ^= x;
        }
        let limits = FrameLimits::with_max_payload(64);
        let _ = decode_frame(&bytes, &limits);
        // The prefix check alone bounds what a reader would allocate.
        let prefix: [u8; PREFIX_LEN] = bytes[..PREFIX_LEN].try_into().unwrap();
        if let Ok((h, p)) = wire::parse_prefix(&prefix, &limits) {
            prop_assert!(h <= limits.max_header && p <= limits.max_payload);
        }
    }

    #[test]
    fn unique_ids_round_trip(addr in socket_addr(), secret in any::<[u8; 32]>()) {
        let id = UniqueId::new(addr, secret);
        prop_assert_eq!(id.root_addr(), addr);
        prop_assert_eq!(id.secret(), secret);
        prop_assert_eq!(id.to_string().parse::<UniqueId>().unwrap(), id);
        prop_assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
    }

    #[test]
    fn unique_id_parsing_never_panics(s in ".{0,300}", bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = s.parse::<UniqueId>();
        let _ = UniqueId::from_bytes(&bytes);
    }
}
