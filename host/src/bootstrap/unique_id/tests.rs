use super::*;

fn sample() -> UniqueId {
    let secret: [u8; SECRET_BYTES] = std::array::from_fn(|i| (i * 7 + 1) as u8);
    UniqueId::new("10.1.2.3:29500".parse().unwrap(), secret)
}

#[test]
fn fields_round_trip() {
    let id = sample();
    assert_eq!(
        id.root_addr(),
        "10.1.2.3:29500".parse::<SocketAddr>().unwrap()
    );
    assert_eq!(id.secret(), std::array::from_fn(|i| (i * 7 + 1) as u8));
    assert_eq!(id.as_bytes().len(), UNIQUE_ID_BYTES);
    let v6: SocketAddr = "[fe80::1:2]:7".parse().unwrap();
    assert_eq!(UniqueId::new(v6, [1; 32]).root_addr(), v6);
}

#[test]
fn string_and_bytes_round_trip() {
    let id = sample();
    let text = id.to_string();
    assert_eq!(text.len(), 2 * UNIQUE_ID_BYTES);
    assert!(text.bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(text.parse::<UniqueId>().unwrap(), id);
    assert_eq!(text.to_uppercase().parse::<UniqueId>().unwrap(), id);
    assert_eq!(UniqueId::from_bytes(id.as_bytes()).unwrap(), id);
}

#[test]
fn serde_round_trips_through_bincode() {
    let id = sample();
    let config = bincode::config::standard();
    let bytes = bincode::serde::encode_to_vec(id, config).unwrap();
    let (back, used): (UniqueId, usize) =
        bincode::serde::decode_from_slice(&bytes, config).unwrap();
    assert_eq!((back, used), (id, bytes.len()));
}

#[test]
fn random_ids_differ_in_secret_only() {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let (a, b) = (UniqueId::random(addr), UniqueId::random(addr));
    assert_eq!(a.root_addr(), b.root_addr());
    assert_ne!(a.secret(), b.secret());
    assert!(a.secret_matches(&a.secret()));
    assert!(!a.secret_matches(&b.secret()));
}

#[test]
fn bad_input_is_rejected() {
    let id = sample();
    let text = id.to_string();
    assert!(matches!(
        text[..10].parse::<UniqueId>(),
        Err(UniqueIdError::Length { got: 10, .. })
    ));
    let mut bad = text.clone();
    bad.replace_range(5..6, "g");
    assert_eq!(
        bad.parse::<UniqueId>(),
        Err(UniqueIdError::NotHex {
            found: 'g',
            position: 5
        })
    );
    // A multi-byte character of the right byte length is not a panic.
    let mut wide = text.clone();
    wide.replace_range(0..2, "é");
    assert!(matches!(
        wide.parse::<UniqueId>(),
        Err(UniqueIdError::NotHex { .. })
    ));

    let mut bytes = *id.as_bytes();
    bytes[0] ^= 1;
    assert_eq!(UniqueId::from_bytes(&bytes), Err(UniqueIdError::BadMagic));
    let mut bytes = *id.as_bytes();
    bytes[OFF_VERSION] = bytes[OFF_VERSION].wrapping_add(1);
    assert!(matches!(
        UniqueId::from_bytes(&bytes),
        Err(UniqueIdError::Version { .. })
    ));
    let mut bytes = *id.as_bytes();
    bytes[OFF_FAMILY] = 5;
    assert_eq!(UniqueId::from_bytes(&bytes), Err(UniqueIdError::Family(5)));
    assert!(matches!(
        UniqueId::from_bytes(&[0; 3]),
        Err(UniqueIdError::Length { got: 3, .. })
    ));
}

#[test]
fn debug_hides_the_secret() {
    let id = sample();
    let debug = format!("{id:?}");
    assert!(debug.contains("10.1.2.3:29500"), "{debug}");
    let secret_hex: String = id.secret().iter().map(|b| format!("{b:02x}")).collect();
    assert!(!debug.contains(&secret_hex[..16]), "{debug}");
}
