use super::*;

/// Settings from (name, value) pairs.
fn of(vars: &[(&str, &str)]) -> Result<Settings, SettingsError> {
    Settings::from_vars(vars.iter().copied())
}

#[test]
fn unset_variables_give_the_defaults() {
    let s = of(&[]).unwrap();
    assert_eq!(s, Settings::default());
    assert_eq!(s.tcp_conns, None);
    assert_eq!(s.tcp_chunk, 512 * 1024);
    assert_eq!(s.tcp_timeout, Duration::from_secs(10));
    assert_eq!(s.coll_scratch_bytes, 256 * 1024 * 1024);
    assert_eq!(s.p2p_peers, PeerList::All);
    assert!(s.nccl_setup_fallback && !s.proxy_stats);
    assert!(s.unknown().is_empty());
}

#[test]
fn values_are_read_into_their_types() {
    let s = of(&[
        ("MSCCLPP_TCP_CONNS", " 4 "),
        ("MSCCLPP_TCP_CHUNK", "64K"),
        ("MSCCLPP_TCP_TIMEOUT_MS", "250"),
        ("MSCCLPP_TCP_CONGESTION", " cubic "),
        ("MSCCLPP_DEVICE_TIMEOUT", "2.5"),
        ("MSCCLPP_COLL_SCRATCH_BYTES", "1048576"),
        ("MSCCLPP_P2P_PACKET_MAX_BYTES", "0"),
        ("MSCCLPP_PROXY_CHUNK_BYTES", "auto"),
        ("MSCCLPP_PROXY_LANES", "3"),
        ("MSCCLPP_P2P_PEERS", "13, +8,-8"),
        ("MSCCLPP_ALLREDUCE_ALGO", "Two-Shot"),
        ("MSCCLPP_PDL", "0"),
        ("MSCCLPP_PROXY_FLAG", " CPU "),
        ("MSCCLPP_IB_STAGING", "always"),
        ("MSCCLPP_DEBUG", "trace"),
        ("MSCCLPP_NCCL_FALLBACK", "allreduce; sendrecv broadcast"),
        ("MSCCLPP_NCCL_LIB", "OFF"),
        ("MSCCLPP_NCCL_SETUP_FALLBACK", "no"),
        ("MSCCLPP_LAUNCH_STACKS", "1"),
        ("MSCCLPP_HOST_ID", "node-a"),
        ("NCCL_SOCKET_IFNAME", " eth "),
    ])
    .unwrap();
    assert_eq!(s.tcp_conns, Some(4));
    assert_eq!(s.tcp_chunk, 65536);
    assert_eq!(s.tcp_timeout, Duration::from_millis(250));
    assert_eq!(
        s.tcp_congestion.map(|c| c.to_string()).as_deref(),
        Some("cubic")
    );
    assert_eq!(s.device_timeout, Some(Duration::from_millis(2500)));
    assert_eq!(s.coll_scratch_bytes, 1 << 20);
    assert_eq!(s.p2p_packet_max_bytes, 0);
    assert_eq!(s.proxy_chunk_bytes, None);
    assert_eq!(s.proxy_lanes, Some(3));
    assert_eq!(
        s.p2p_peers,
        PeerList::Ranks(vec![
            PeerRank::Absolute(13),
            PeerRank::Relative(8),
            PeerRank::Relative(-8)
        ])
    );
    assert_eq!(s.allreduce_algo, AllReduceAlgo::TwoShot);
    assert_eq!(s.pdl, PdlMode::Off);
    assert_eq!(s.proxy_flag, Some(ProxyFlagMode::Cpu));
    assert_eq!(s.ib_staging, Some(StagingMode::Always));
    assert_eq!(s.debug, DebugLevel::Info);
    assert_eq!(s.nccl_fallback, ["allreduce", "sendrecv", "broadcast"]);
    assert_eq!(s.nccl_lib, NcclLib::Off);
    assert!(!s.nccl_setup_fallback && s.launch_stacks);
    assert_eq!(s.host_id.as_deref(), Some("node-a"));
    assert_eq!(s.nccl_socket_ifname.as_deref(), Some("eth"));
}

#[test]
fn blank_values_count_as_unset() {
    let s = of(&[
        ("MSCCLPP_TCP_CONNS", "7"),
        ("MSCCLPP_TCP_CONNS", "  "),
        ("MSCCLPP_HOST_ID", ""),
        ("MSCCLPP_PDL", ""),
    ])
    .unwrap();
    assert_eq!(s, Settings::default());
}

#[test]
fn bad_values_name_the_variable_the_value_and_the_forms() {
    let e = of(&[
        ("MSCCLPP_TCP_CONNS", "65"),
        ("MSCCLPP_PDL", "yes"),
        ("MSCCLPP_DEVICE_TIMEOUT", "-1"),
        ("MSCCLPP_TCP_CHUNK", "1K"),
        ("MSCCLPP_P2P_PEERS", "+x"),
    ])
    .unwrap_err();
    let names: Vec<&str> = e.bad.iter().map(|b| b.var.as_str()).collect();
    assert_eq!(
        names,
        [
            "MSCCLPP_DEVICE_TIMEOUT",
            "MSCCLPP_TCP_CONNS",
            "MSCCLPP_TCP_CHUNK",
            "MSCCLPP_P2P_PEERS",
            "MSCCLPP_PDL"
        ],
        "in the reference's order"
    );
    let text = e.to_string();
    for says in [
        "MSCCLPP_TCP_CONNS=\"65\": expected a whole number from 1 to 64",
        "MSCCLPP_PDL=\"yes\": expected 0 (no dependent launch), 1",
        "MSCCLPP_DEVICE_TIMEOUT=\"-1\": expected a number of seconds above 0 and at most 86400",
        "MSCCLPP_TCP_CHUNK=\"1K\": expected a byte count from 4096 to 67108864",
        "\"+x\" is not a rank",
    ] {
        assert!(text.contains(says), "{says:?} in {text}");
    }
    for (var, value) in [
        ("MSCCLPP_IB_PORT", "256"),
        ("MSCCLPP_KERNEL_IMAGE", "sass"),
        ("MSCCLPP_CROSS_BUFFER", "both"),
        ("MSCCLPP_SIMULATE_HOSTS", "0"),
        ("MSCCLPP_BOOTSTRAP_PORT", "0"),
        ("MSCCLPP_NCCL_SETUP_FALLBACK", "maybe"),
        ("MSCCLPP_DEBUG", "LOUD"),
        ("MSCCLPP_COLL_THREADS", "many"),
        ("MSCCLPP_TCP_CONGESTION", "cubic;rm"),
        ("MSCCLPP_TCP_CONGESTION", "a-name-of-16-chr"),
    ] {
        let e = of(&[(var, value)]).unwrap_err();
        assert_eq!(e.bad.len(), 1, "{var}");
        assert_eq!(
            (e.bad[0].var.as_str(), e.bad[0].value.as_str()),
            (var, value)
        );
    }
}

#[test]
fn unknown_mscclpp_names_are_kept_with_the_nearest_known_one() {
    let s = of(&[
        ("MSCCLPP_TCP_CONN", "4"),
        ("MSCCLPP_TEST_ROLE", "rank"),
        ("MSCCLPP_SHM_CLEANUP_ROLE", "victim"),
        ("MSCCLPP_REQUIRE_GPU", "1"),
        ("PATH", "/bin"),
    ])
    .unwrap();
    assert_eq!(s.unknown(), ["MSCCLPP_TCP_CONN"]);
    assert_eq!(s.tcp_conns, None);
    assert_eq!(nearest("MSCCLPP_TCP_CONN"), Some("MSCCLPP_TCP_CONNS"));
    assert_eq!(nearest("MSCCLPP_SOMETHING_ELSE"), None);
}

#[test]
fn set_applies_one_variable_as_the_environment_would() {
    let mut s = Settings::default();
    s.set("MSCCLPP_RENDEZVOUS_TIMEOUT", "90.5").unwrap();
    assert_eq!(s.rendezvous_timeout, Some(Duration::from_secs_f64(90.5)));
    let e = s.set("MSCCLPP_RENDEZVOUS_TIMEOUT", "forever").unwrap_err();
    assert!(
        e.to_string()
            .contains("MSCCLPP_RENDEZVOUS_TIMEOUT=\"forever\""),
        "{e}"
    );
    assert_eq!(
        s.rendezvous_timeout,
        Some(Duration::from_secs_f64(90.5)),
        "kept"
    );
    s.set("MSCCLPP_RENDEZVOUS_TIMEOUT", "").unwrap();
    assert_eq!(s.rendezvous_timeout, None);
}

#[test]
fn lookup_asks_for_every_field() {
    let s =
        Settings::from_lookup(|name| (name == "MSCCLPP_JOB_ID").then(|| "j7".to_string())).unwrap();
    assert_eq!(s.job_id.as_deref(), Some("j7"));
}

#[test]
fn every_variable_is_listed_once_and_documented() {
    let mut names: Vec<&str> = VARS.iter().chain(OTHER_VARS).map(|v| v.name).collect();
    let n = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), n, "a variable is listed twice");
    for v in VARS.iter().chain(OTHER_VARS) {
        assert!(
            !v.meaning.trim().is_empty() && !v.reader.is_empty(),
            "{}",
            v.name
        );
        assert!(
            v.name.starts_with("MSCCLPP_") || v.name.starts_with("NCCL_"),
            "{}",
            v.name
        );
    }
    // Each field's variable parses its documented default where that is a plain value.
    let mut s = Settings::default();
    for v in VARS {
        assert!(s.apply(v.name, "x").is_some(), "{} has no field", v.name);
        assert!(s.reset_field(v.name), "{}", v.name);
    }
}

#[test]
fn byte_counts_take_suffixes_and_zero() {
    assert_eq!(parse_bytes("0"), Ok(0));
    assert_eq!(parse_bytes("1.5K"), Ok(1536));
    assert_eq!(parse_bytes("16 MiB"), Ok(16 << 20));
    assert!(parse_bytes("1.2.3").is_err());
    assert!(
        parse_bytes("4Q")
            .unwrap_err()
            .contains("unknown size suffix")
    );
    assert!(
        parse_bytes("99999999999T")
            .unwrap_err()
            .contains("too large")
    );
}

/// The guide's reference is the one these settings write
/// (`cargo run -p mscclpp-host --example settings_reference > docs/guide/08-settings.md`).
#[test]
fn reference_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/guide/08-settings.md");
    let on_disk = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        on_disk == reference_markdown(),
        "{path} is not current: regenerate it with \
         `cargo run -p mscclpp-host --example settings_reference > docs/guide/08-settings.md`"
    );
    for v in VARS.iter().chain(OTHER_VARS) {
        assert!(on_disk.contains(&format!("| `{}` |", v.name)), "{}", v.name);
    }
}

/// Set in the child of the tests below: check the process's settings instead of starting one.
const INIT_CHILD: &str = "MSCCLPP_TEST_SETTINGS_CHILD";

/// Runs the test `name` of this binary again as a child process with `env` (the settings
/// are read once per process); fails unless it printed `settings child: ok`. Its stderr.
fn run_child(name: &str, env: &[(&str, &str)]) -> String {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(INIT_CHILD, "1")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(
        out.status.success() && stdout.contains("settings child: ok"),
        "{stdout}{stderr}"
    );
    stderr.into_owned()
}

/// In a process of its own (the settings are read once per process): `init` applies its
/// values over the environment's, only before the first read; the first read names an
/// unknown variable on stderr with the nearest known name.
#[test]
fn init_sets_values_over_the_environment_once() {
    if std::env::var_os(INIT_CHILD).is_some() {
        let s = Settings::init(|s| s.tcp_chunk = 8192).expect("the first read");
        assert_eq!(s.tcp_chunk, 8192, "the API wins over the environment");
        assert_eq!(
            s.tcp_conns,
            Some(3),
            "the environment wins over the default"
        );
        assert_eq!(s.tcp_timeout, Duration::from_secs(10), "the default");
        assert_eq!(
            Settings::init(|s| s.tcp_conns = Some(1)),
            Err(InitError::AlreadyRead)
        );
        assert_eq!(Settings::global().unwrap().tcp_conns, Some(3));
        println!("settings child: ok");
        return;
    }
    let stderr = run_child(
        "settings::tests::init_sets_values_over_the_environment_once",
        &[
            ("MSCCLPP_TCP_CONNS", "3"),
            ("MSCCLPP_TCP_CHUNK", "65536"),
            ("MSCCLPP_TCP_CONN", "4"),
        ],
    );
    assert!(
        stderr.contains("MSCCLPP_TCP_CONN is set but is no setting")
            && stderr.contains("did you mean MSCCLPP_TCP_CONNS?"),
        "{stderr}"
    );
}

/// A bad value reaches every caller of `global` as the same error.
#[test]
fn a_bad_environment_fails_every_read_with_the_same_error() {
    if std::env::var_os(INIT_CHILD).is_some() {
        let e = Settings::global().unwrap_err();
        assert_eq!(Settings::global().unwrap_err(), e);
        assert!(matches!(
            Settings::init(|_| ()),
            Err(InitError::AlreadyRead)
        ));
        assert!(e.to_string().contains("MSCCLPP_IB_PORT=\"x\""), "{e}");
        assert_eq!(Settings::global_or_default().ib_port, 1);
        println!("settings child: ok");
        return;
    }
    let stderr = run_child(
        "settings::tests::a_bad_environment_fails_every_read_with_the_same_error",
        &[("MSCCLPP_IB_PORT", "x")],
    );
    assert!(stderr.contains("using the defaults for now"), "{stderr}");
}
