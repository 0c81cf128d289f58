use super::*;

#[test]
fn arch_list_defaults_to_sm90_and_splits_on_commas_and_spaces() {
    assert_eq!(parse_arch_list(""), vec!["sm_90"]);
    assert_eq!(parse_arch_list(" , "), vec!["sm_90"]);
    assert_eq!(parse_arch_list("sm_90,sm_80"), vec!["sm_90", "sm_80"]);
    assert_eq!(parse_arch_list("sm_80 sm_90a"), vec!["sm_80", "sm_90a"]);
}

#[test]
fn compute_capability_parses_and_rejects() {
    assert_eq!(compute_capability("sm_90").unwrap(), 90);
    assert_eq!(compute_capability("sm_90a").unwrap(), 90);
    assert_eq!(compute_capability("sm_100").unwrap(), 100);
    for bad in ["90", "sm_", "sm_x0", "compute_90", "sm_9000", "sm_61"] {
        let err = compute_capability(bad).unwrap_err();
        assert!(matches!(err, BuildError::BadArch(_)), "{bad}: {err}");
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
}

#[test]
fn dep_info_lists_every_source_with_escaped_spaces() {
    let dir = std::env::temp_dir().join(format!("mscclpp-depinfo-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let d = dir.join("k.d");
    fs::write(
        &d,
        "/t/k.ptx: /src/lib.rs /src/my\\ dir/a.rs\n\n/src/lib.rs:\n/src/my\\ dir/a.rs:\n",
    )
    .unwrap();
    let got = dep_info_sources(&d);
    assert_eq!(
        got,
        vec![
            PathBuf::from("/src/lib.rs"),
            PathBuf::from("/src/my dir/a.rs")
        ]
    );
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn package_name_is_read_from_the_package_table_only() {
    let dir = std::env::temp_dir().join(format!("mscclpp-pkgname-{}", std::process::id()));
    fs::create_dir_all(&dir).unwrap();
    let m = dir.join("Cargo.toml");
    fs::write(
        &m,
        "[lib]\nname = \"wrong\"\n[package]\nversion = \"0.1.0\"\nname = \"my-kernels\"\n",
    )
    .unwrap();
    assert_eq!(package_name(&m).unwrap(), "my_kernels");
    fs::write(&m, "[lib]\nname = \"x\"\n").unwrap();
    assert!(package_name(&m).is_err());
    fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_manifest_is_reported_with_its_path() {
    let err = DeviceBuilder::new("/definitely/not/here")
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::NoManifest(_)));
    assert!(err.to_string().contains("/definitely/not/here"), "{err}");
}

#[test]
fn errors_say_how_to_install_what_is_missing() {
    let e = BuildError::MissingComponent {
        component: "llvm-tools",
        toolchain: "nightly-x".into(),
        looked_for: PathBuf::from("/x/llc"),
    };
    assert!(
        e.to_string()
            .contains("rustup component add llvm-tools --toolchain nightly-x")
    );
    let e = BuildError::NoPtxas {
        searched: vec!["PATH".into()],
    };
    assert!(e.to_string().contains("pip install nvidia-cuda-nvcc"));
    let e = BuildError::NoNightly {
        detail: "rustc is 1.95.0".into(),
    };
    assert!(e.to_string().contains("rustup toolchain install"));
}
