use super::*;

/// The config a real split or shrink gets: blocking whatever the caller asked, the
/// caller's other settings kept; NCCL's initializer without one; a short (older) config
/// grown to hold the field.
#[test]
fn a_real_childs_config_is_blocking() {
    let c = ConfigCopy::NONE.blocking();
    assert_eq!((c.blocking, c.magic, c.size), (1, 0xcafe_beef, 80));
    assert_eq!(c.min_ctas, crate::types::CONFIG_UNDEF_INT);
    let mut mine = NcclConfig::initializer();
    mine.blocking = 0;
    mine.min_ctas = 4;
    // SAFETY: a live config of its size.
    let c = unsafe { ConfigCopy::new(&mine) }.blocking();
    assert_eq!((c.blocking, c.min_ctas, c.size), (1, 4, 80));
    mine.size = 16;
    // SAFETY: as above (16 bytes are read).
    let c = unsafe { ConfigCopy::new(&mine) }.blocking();
    assert_eq!((c.blocking, c.min_ctas, c.size), (1, 0, 20));
}

/// A split or shrink without a config passes on the parent's (as NCCL's children inherit
/// it), kept without its strings; with one, the caller's.
#[test]
fn a_child_without_a_config_inherits_the_parents() {
    let mut parent = NcclConfig::initializer();
    parent.min_ctas = 8;
    parent.comm_name = c"trainer".as_ptr();
    // SAFETY: a live config of its size.
    let kept = unsafe { ConfigCopy::new(&parent) }.without_strings();
    // SAFETY: NULL: the parent's.
    let c = unsafe { ConfigCopy::for_child(std::ptr::null(), kept) }.blocking();
    assert_eq!((c.min_ctas, c.blocking), (8, 1));
    assert!(c.comm_name.is_null() && c.net_name.is_null());
    let mut mine = NcclConfig::initializer();
    mine.min_ctas = 2;
    // SAFETY: a live config of its size.
    let c = unsafe { ConfigCopy::for_child(&mine, kept) }.blocking();
    assert_eq!(c.min_ctas, 2);
    assert_eq!(
        ConfigCopy::NONE.without_strings().blocking().min_ctas,
        crate::types::CONFIG_UNDEF_INT
    );
}

#[test]
fn communicators_wait_long_for_late_ranks_unless_told_otherwise() {
    let of = |pairs: &[(&str, &str)]| {
        bootstrap_config_of(&Settings::from_vars(pairs.iter().copied()).unwrap())
    };
    let c = of(&[]);
    assert_eq!(c.timeout, Duration::from_secs(30));
    assert_eq!(c.rendezvous_wait(), Duration::from_secs(1800));
    let c = of(&[
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "12"),
        ("MSCCLPP_RENDEZVOUS_TIMEOUT", "90.5"),
    ]);
    assert_eq!(c.timeout, Duration::from_secs(12));
    assert_eq!(c.rendezvous_wait(), Duration::from_millis(90_500));
    assert_eq!(c.late_wait(), Duration::from_millis(90_500));
    // A rendezvous bound below the bootstrap timeout never shortens the waits for late
    // ranks at teardown, split and shrink.
    let c = of(&[
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "12"),
        ("MSCCLPP_RENDEZVOUS_TIMEOUT", "5"),
    ]);
    assert_eq!(c.late_wait(), Duration::from_secs(12));
    for (var, bad) in [
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "0"),
        ("MSCCLPP_RENDEZVOUS_TIMEOUT", "forever"),
    ] {
        let e = Settings::from_vars([(var, bad)]).unwrap_err().to_string();
        assert!(e.contains(&format!("{var}=\"{bad}\"")), "{e}");
    }
}

#[test]
fn color_key_roundtrip() {
    for (c, k) in [(0, 0), (-1, 7), (i32::MAX, i32::MIN)] {
        assert_eq!(decode_color_key(&encode_color_key(c, k)), Some((c, k)));
    }
    assert_eq!(decode_color_key(&[1, 2, 3]), None);
}

#[test]
fn foreign_and_null_handles() {
    assert!(matches!(lookup(std::ptr::null_mut()), Handle::Null));
    let x = 5u64;
    assert!(matches!(
        lookup(&x as *const u64 as Ptr),
        Handle::Foreign(_)
    ));
    assert!(unregister(&x as *const u64 as Ptr).is_none());
}

#[test]
fn ids_from_elsewhere_are_refused() {
    let e = parse_id("t", &[0u8; 128]).err().unwrap();
    assert_eq!(e.code, result::INVALID_ARGUMENT);
    let id = new_id("t").unwrap();
    assert_eq!(parse_id("t", id.as_bytes()).unwrap(), id);
}

#[test]
fn nccl_comm_id_gives_every_rank_the_same_id_and_rank_0_hosts_the_root() {
    // No secret (an empty one counts as none, whatever MSCCLPP_BOOTSTRAP_SECRET says).
    let plain_config = BootstrapConfig::default().with_secret("");
    let plain = comm_id_from("t", "127.0.0.1:50123", &plain_config).unwrap();
    // Ours on the next port: the real NCCL's root may take the one named.
    assert_eq!(plain.root_addr(), "127.0.0.1:50124".parse().unwrap());
    assert_eq!(
        plain,
        comm_id_from("t", " 127.0.0.1:50123 ", &plain_config).unwrap()
    );
    let secret = comm_id_from(
        "t",
        "127.0.0.1:50123",
        &BootstrapConfig::default().with_secret("s3"),
    )
    .unwrap();
    assert_ne!(secret, plain, "the secret enters the id");
    assert_eq!(
        secret,
        comm_id_from(
            "t",
            "127.0.0.1:50123",
            &BootstrapConfig::default().with_secret("s3")
        )
        .unwrap()
    );
    let v6 = comm_id_from("t", "[::1]:50123", &plain_config).unwrap();
    assert!(v6.root_addr().is_ipv6());
    assert!(comm_id_from("t", "localhost:50123", &plain_config).is_ok());
    for bad in [
        "127.0.0.1",
        "127.0.0.1:0",
        "127.0.0.1:99999",
        "127.0.0.1:65535",
        "",
    ] {
        let e = comm_id_from("t", bad, &plain_config).unwrap_err();
        assert_eq!(e.code, result::INVALID_ARGUMENT, "{bad}");
        assert!(e.msg.contains("NCCL_COMM_ID"), "{}", e.msg);
    }
    // Only the fixed id makes rank 0 host the root; any other id keeps its own root.
    let other = new_id("t").unwrap();
    assert_eq!(bootstrap_root(other, Some(plain)), BootstrapRoot::Id(other));
    assert_eq!(bootstrap_root(other, None), BootstrapRoot::Id(other));
    // Two ranks meet through a fixed address, rank 0 hosting the root there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let id = comm_id_from("t", &format!("127.0.0.1:{}", port - 1), &plain_config).unwrap();
    assert_eq!(id.root_addr().port(), port);
    assert_eq!(
        bootstrap_root(id, Some(id)),
        BootstrapRoot::Addr(id.root_addr())
    );
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let b = BlockingBootstrap::init(2, rank, bootstrap_root(id, Some(id))).unwrap();
                b.all_gather(&[rank as u8 + 10]).unwrap()
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap(), vec![vec![10u8], vec![11u8]]);
    }
}

#[test]
fn a_new_ids_root_listens_where_other_machines_can_reach_it_and_ranks_join() {
    let id = new_id("t").unwrap();
    // Not 127.0.0.1 unless this machine has nothing else (root_ip's own tests check
    // the order); here, where it is, two ranks meet through it.
    assert_eq!(id.root_addr().ip(), root_ip().unwrap());
    assert_ne!(id.root_addr().port(), 0);
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            std::thread::spawn(move || {
                let b = BlockingBootstrap::init(2, rank, id).unwrap();
                b.all_gather(&[rank as u8]).unwrap()
            })
        })
        .collect();
    for r in ranks {
        assert_eq!(r.join().unwrap(), vec![vec![0u8], vec![1u8]]);
    }
}
