use super::*;

fn data(tag: u64) -> Message {
    Message::Data {
        channel: Channel::User(tag),
    }
}

#[test]
fn frame_round_trips() {
    let payload: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    let bytes = encode_frame(&data(42), &payload).unwrap();
    let limits = FrameLimits::with_max_payload(4096);
    let (frame, used) = decode_frame(&bytes, &limits).unwrap().unwrap();
    assert_eq!(used, bytes.len());
    assert_eq!(
        frame,
        Frame {
            message: data(42),
            payload
        }
    );
}

#[test]
fn incomplete_frames_ask_for_more() {
    let bytes = encode_frame(&data(1), b"hello").unwrap();
    let limits = FrameLimits::with_max_payload(16);
    for cut in 0..bytes.len() {
        assert!(
            decode_frame(&bytes[..cut], &limits).unwrap().is_none(),
            "cut at {cut}"
        );
    }
}

#[test]
fn limits_are_checked_from_the_prefix_alone() {
    let bytes = encode_frame(&data(1), &[0; 100]).unwrap();
    let limits = FrameLimits::with_max_payload(99);
    // Only the 12-byte prefix is needed to refuse.
    assert!(matches!(
        decode_frame(&bytes[..PREFIX_LEN], &limits),
        Err(FrameError::PayloadTooLarge { len: 100, max: 99 })
    ));
    let mut huge = [0u8; PREFIX_LEN];
    huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        decode_frame(&huge, &limits),
        Err(FrameError::HeaderSize { .. })
    ));
    assert!(matches!(
        decode_frame(&[0u8; PREFIX_LEN], &limits),
        Err(FrameError::HeaderSize { len: 0, .. })
    ));
}

#[test]
fn garbage_headers_are_errors() {
    let mut bytes = vec![0u8; PREFIX_LEN];
    bytes[0] = 4;
    bytes.extend_from_slice(&[0xff; 4]);
    let limits = FrameLimits::HANDSHAKE;
    assert!(matches!(
        decode_frame(&bytes, &limits),
        Err(FrameError::Decode(_))
    ));

    // A valid header followed by junk inside the announced header length.
    let head = bincode::serde::encode_to_vec(Message::Goodbye, header_config()).unwrap();
    let mut bytes = vec![0u8; PREFIX_LEN];
    bytes[..4].copy_from_slice(&((head.len() + 3) as u32).to_le_bytes());
    bytes.extend_from_slice(&head);
    bytes.extend_from_slice(&[0; 3]);
    assert!(matches!(
        decode_frame(&bytes, &limits),
        Err(FrameError::TrailingBytes { .. })
    ));
}

/// A frame of message variant `variant` (rank 1, then a string) whose string claims 2^60
/// bytes: bincode's limit must refuse it before allocating.
fn assert_lying_string_length_is_refused(variant: u8) {
    let mut head = Vec::new();
    head.push(variant);
    head.push(1); // rank
    head.push(253); // u64 varint marker
    head.extend_from_slice(&(1u64 << 60).to_le_bytes());
    let mut bytes = vec![0u8; PREFIX_LEN];
    bytes[..4].copy_from_slice(&(head.len() as u32).to_le_bytes());
    bytes.extend_from_slice(&head);
    let limits = FrameLimits::with_max_payload(0);
    assert!(matches!(
        decode_frame(&bytes, &limits),
        Err(FrameError::Decode(_))
    ));
}

#[test]
fn a_lying_string_length_does_not_allocate() {
    // PeerLost's detail (variant index 7).
    assert_lying_string_length_is_refused(7);
}

#[test]
fn peer_table_round_trips() {
    let peers = vec![
        PeerInfo {
            addr: "127.0.0.1:1".parse().unwrap(),
            host_id: "a".into(),
            pid: 7,
            process_space: "m/1/pid:[2]".into(),
        },
        PeerInfo {
            addr: "[::1]:2".parse().unwrap(),
            host_id: "b".into(),
            pid: u32::MAX,
            process_space: String::new(),
        },
    ];
    let bytes = encode_peer_table(&peers).unwrap();
    assert_eq!(decode_peer_table(&bytes).unwrap(), peers);
    assert!(decode_peer_table(&bytes[..bytes.len() - 1]).is_err());
}

fn block_on<T>(f: impl Future<Output = T>) -> T {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn async_reader_matches_the_decoder() {
    block_on(async {
        let mut stream = Vec::new();
        let big: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
        write_frame(&mut stream, &data(1), b"small").await.unwrap();
        write_frame(&mut stream, &data(2), &big).await.unwrap();
        write_frame(&mut stream, &Message::Goodbye, &[])
            .await
            .unwrap();
        let limits = FrameLimits::with_max_payload(big.len());
        let mut reader = stream.as_slice();
        let a = read_frame(&mut reader, &limits).await.unwrap().unwrap();
        let b = read_frame(&mut reader, &limits).await.unwrap().unwrap();
        let c = read_frame(&mut reader, &limits).await.unwrap().unwrap();
        assert_eq!((a.message, a.payload.as_slice()), (data(1), &b"small"[..]));
        assert_eq!((b.message, b.payload), (data(2), big));
        assert_eq!(c.message, Message::Goodbye);
        // Clean end between frames.
        assert!(read_frame(&mut reader, &limits).await.unwrap().is_none());
    });
}

#[test]
fn async_reader_reports_truncation_and_oversize() {
    block_on(async {
        let bytes = encode_frame(&data(1), &[9; 64]).unwrap();
        let limits = FrameLimits::with_max_payload(64);
        for cut in [3, PREFIX_LEN + 1, bytes.len() - 1] {
            let mut reader = &bytes[..cut];
            let err = read_frame(&mut reader, &limits).await.unwrap_err();
            assert!(
                matches!(err, FrameError::Truncated { .. }),
                "cut {cut}: {err}"
            );
        }
        let mut reader = bytes.as_slice();
        let small = FrameLimits::with_max_payload(63);
        let err = read_frame(&mut reader, &small).await.unwrap_err();
        assert!(
            matches!(err, FrameError::PayloadTooLarge { len: 64, max: 63 }),
            "{err}"
        );
    });
}

#[test]
fn a_lying_payload_length_does_not_allocate_it() {
    block_on(async {
        // Claims 1 TiB of payload, then ends: must fail as truncated without reserving it.
        let mut bytes = encode_head(&data(1), 1 << 40).unwrap();
        bytes.extend_from_slice(&[1, 2, 3]);
        let limits = FrameLimits::with_max_payload(usize::MAX);
        let mut reader = bytes.as_slice();
        let err = read_frame(&mut reader, &limits).await.unwrap_err();
        assert!(matches!(err, FrameError::Truncated { got: 3, .. }), "{err}");
    });
}

#[test]
fn peer_stalled_round_trips() {
    for message in [
        Message::peer_stalled(1, "all_gather", ""),
        Message::peer_stalled(u32::MAX, "", ""),
        Message::peer_stalled(3, "receiving the peer's handles", ""),
    ] {
        let bytes = encode_frame(&message, &[]).unwrap();
        let limits = FrameLimits::with_max_payload(0);
        let (frame, used) = decode_frame(&bytes, &limits).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(frame.message, message);
    }
    assert_eq!(
        Message::peer_stalled(1, "barrier", ""),
        Message::PeerStalled {
            rank: 1,
            op: "barrier".into(),
            seen: String::new(),
        }
    );
}

#[test]
fn peer_stalled_op_is_bounded() {
    // Far beyond the header limit: the constructor cuts it, so the frame still encodes.
    let long = "x".repeat(MAX_HEADER_LEN * 2);
    let Message::PeerStalled { op, .. } = Message::peer_stalled(1, &long, "") else {
        unreachable!()
    };
    assert_eq!(op.len(), MAX_STALLED_OP_LEN);
    assert!(encode_frame(&Message::peer_stalled(1, &long, ""), &[]).is_ok());
    // Two-byte characters: the cut falls between characters, never inside one.
    let wide = "é".repeat(MAX_STALLED_OP_LEN);
    let Message::PeerStalled { op, .. } = Message::peer_stalled(1, &wide, "") else {
        unreachable!()
    };
    assert!(op.len() <= MAX_STALLED_OP_LEN && op.len() > MAX_STALLED_OP_LEN - 2);
    assert!(op.chars().all(|c| c == 'é'), "{op}");
    // Short names are kept whole.
    let exact = "y".repeat(MAX_STALLED_OP_LEN);
    assert_eq!(
        Message::peer_stalled(1, &exact, ""),
        Message::PeerStalled {
            rank: 1,
            op: exact,
            seen: String::new()
        }
    );
}

#[test]
fn peer_closed_why_is_bounded_and_round_trips() {
    let long = "x".repeat(MAX_HEADER_LEN * 2);
    let Message::PeerClosed { why, .. } = Message::peer_closed(1, 2, &long) else {
        unreachable!()
    };
    assert_eq!(why.len(), MAX_CLOSED_WHY_LEN);
    let wide = "é".repeat(MAX_CLOSED_WHY_LEN);
    let Message::PeerClosed { why, .. } = Message::peer_closed(1, 2, &wide) else {
        unreachable!()
    };
    assert!(why.len() <= MAX_CLOSED_WHY_LEN && why.len() > MAX_CLOSED_WHY_LEN - 2);
    assert!(why.chars().all(|c| c == 'é'), "{why}");
    for message in [
        Message::peer_closed(1, 7, ""),
        Message::peer_closed(
            u32::MAX,
            u64::MAX,
            "setting up its collectives failed on it",
        ),
        Message::peer_closed(3, 0, &long),
    ] {
        let bytes = encode_frame(&message, &[]).unwrap();
        let limits = FrameLimits::with_max_payload(0);
        let (frame, used) = decode_frame(&bytes, &limits).unwrap().unwrap();
        assert_eq!(used, bytes.len());
        assert_eq!(frame.message, message);
    }
}

#[test]
fn peer_stalled_seen_is_bounded_and_round_trips() {
    let long = "x".repeat(MAX_HEADER_LEN * 2);
    let Message::PeerStalled { seen, .. } = Message::peer_stalled(1, "barrier", &long) else {
        unreachable!()
    };
    assert_eq!(seen.len(), MAX_STALLED_OP_LEN);
    let message = Message::peer_stalled(2, "all_gather", "rank 2 (pid 42) is stopped");
    let bytes = encode_frame(&message, &[]).unwrap();
    let (frame, _) = decode_frame(&bytes, &FrameLimits::with_max_payload(0))
        .unwrap()
        .unwrap();
    assert_eq!(frame.message, message);
}

#[test]
fn a_lying_stalled_op_length_does_not_allocate() {
    // PeerStalled's op (variant index 11).
    assert_lying_string_length_is_refused(11);
    // The same header with an honest length decodes to the message.
    let honest = encode_frame(&Message::peer_stalled(1, "barrier", ""), &[]).unwrap();
    assert_eq!(honest[PREFIX_LEN], 11, "PeerStalled's variant index moved");
}

/// A version 7 [`Join`] (before `process_space`), as a build of that version sends it.
#[derive(Serialize)]
struct JoinV7 {
    magic: [u8; 8],
    version: u32,
    secret: [u8; 32],
    nranks: u32,
    rank: u32,
    listen_addr: std::net::SocketAddr,
    host_id: String,
    pid: u32,
}

/// [`Message`]'s first variant as version 7 had it.
#[derive(Serialize)]
enum MessageV7 {
    Join(JoinV7),
}

fn join_v7(magic: [u8; 8]) -> Vec<u8> {
    let join = MessageV7::Join(JoinV7 {
        magic,
        version: 7,
        secret: [3; 32],
        nranks: 2,
        rank: 1,
        listen_addr: "127.0.0.1:9".parse().unwrap(),
        host_id: "h".into(),
        pid: 42,
    });
    bincode::serde::encode_to_vec(&join, bincode::config::standard()).unwrap()
}

/// A handshake of another version, whose fields differ from ours, is told apart from a
/// broken frame: it says its version (the root and the ranks refuse it as a version
/// mismatch, as they do one whose fields happen to decode).
#[test]
fn another_versions_join_says_its_version() {
    let old = join_v7(MAGIC);
    assert_eq!(handshake_version(&old), Some(7));
    assert!(
        matches!(
            decode_header(&old),
            Err(FrameError::OtherVersion { theirs: 7 })
        ),
        "{:?}",
        decode_header(&old)
    );
    // Not our magic: a broken frame, as before.
    let alien = join_v7(*b"NOTOURS!");
    assert_eq!(handshake_version(&alien), None);
    assert!(matches!(decode_header(&alien), Err(FrameError::Decode(_))));
    // This version's handshakes decode as messages.
    let hello = Message::Hello(Hello {
        magic: MAGIC,
        version: PROTOCOL_VERSION,
        secret: [0; 32],
        nranks: 2,
        from: 0,
        to: 1,
    });
    let bytes = bincode::serde::encode_to_vec(&hello, bincode::config::standard()).unwrap();
    assert_eq!(handshake_version(&bytes), Some(PROTOCOL_VERSION));
    assert_eq!(decode_header(&bytes).unwrap(), hello);
    // Other messages have no handshake version.
    let bytes = bincode::serde::encode_to_vec(Message::Goodbye, bincode::config::standard());
    assert_eq!(handshake_version(&bytes.unwrap()), None);
}
