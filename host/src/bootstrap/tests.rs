use super::*;

#[test]
fn root_spec_parses_ids_and_addresses() {
    let id = UniqueId::random("127.0.0.1:4000".parse().unwrap());
    assert_eq!(
        id.to_string().parse::<BootstrapRoot>().unwrap(),
        BootstrapRoot::Id(id)
    );
    assert_eq!(
        " 10.0.0.1:29500 ".parse::<BootstrapRoot>().unwrap(),
        BootstrapRoot::Addr("10.0.0.1:29500".parse().unwrap())
    );
    assert_eq!(
        "[::1]:5".parse::<BootstrapRoot>().unwrap(),
        BootstrapRoot::Addr("[::1]:5".parse().unwrap())
    );
    match "localhost:6000".parse::<BootstrapRoot>().unwrap() {
        BootstrapRoot::Addr(a) => assert_eq!((a.ip().is_loopback(), a.port()), (true, 6000)),
        other => panic!("{other:?}"),
    }
    for bad in ["", "no-port", "1.2.3.4:99999", &"z".repeat(256)] {
        let err = bad.parse::<BootstrapRoot>().unwrap_err();
        assert!(
            matches!(err, BootstrapError::InvalidArgument(_)),
            "{bad:?}: {err}"
        );
    }
    // 256 hex digits with a bad magic: named as a unique id problem.
    let err = "0".repeat(256).parse::<BootstrapRoot>().unwrap_err();
    assert!(err.to_string().contains("bad magic"), "{err}");
}

#[test]
fn host_ids_are_bounded() {
    let long = "é".repeat(MAX_HOST_ID_LEN);
    let cut = truncate(long);
    assert!(cut.len() <= MAX_HOST_ID_LEN && !cut.is_empty());
    assert!(default_host_id().len() <= MAX_HOST_ID_LEN);
    assert!(!default_host_id().is_empty());
}

#[test]
fn config_builders_set_fields() {
    let ip: IpAddr = "127.0.0.2".parse().unwrap();
    let c = BootstrapConfig::new()
        .with_timeout(Duration::from_millis(1500))
        .with_max_message_size(77)
        .with_host_id("n1")
        .with_listen_ip(ip);
    assert_eq!(c.timeout, Duration::from_millis(1500));
    assert_eq!(c.max_message_size, 77);
    assert_eq!(c.host_id.as_deref(), Some("n1"));
    assert_eq!(c.listen_ip, Some(ip));
    assert_eq!(BootstrapConfig::default().timeout, Duration::from_secs(30));
}
