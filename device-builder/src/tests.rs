use super::*;
use crate::nested_build::dep_info_sources;
use shipped::{Stamp, StampedPtx};

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

#[test]
fn pinned_nightly_is_the_workspace_toolchain() {
    // The stamp of the shipped PTX names PINNED_NIGHTLY while scripts/update-ptx.sh builds
    // with the workspace's toolchain: they must be one. (No file in a packaged crate.)
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../rust-toolchain.toml");
    let Ok(text) = fs::read_to_string(&path) else {
        return;
    };
    let channel = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("channel"))
        .and_then(|r| r.trim_start().strip_prefix('='))
        .map(|v| v.trim().trim_matches('"'))
        .expect("no channel in rust-toolchain.toml");
    assert_eq!(channel, PINNED_NIGHTLY, "{}", path.display());
}

#[test]
fn fnv1a_128_matches_the_published_vector() {
    let mut h = shipped::Fnv128::new();
    assert_eq!(h.hex(), "fnv1a128:6c62272e07bb014262b821756295c58d");
    h.bytes_for_test(b"a");
    assert_eq!(h.hex(), "fnv1a128:d228cb696f1a8caf78912b704e4a8964");
}

#[test]
fn build_mode_parses_its_three_values_only() {
    assert_eq!(BuildMode::parse("").unwrap(), BuildMode::Auto);
    assert_eq!(BuildMode::parse("auto").unwrap(), BuildMode::Auto);
    assert_eq!(BuildMode::parse(" shipped ").unwrap(), BuildMode::Shipped);
    assert_eq!(BuildMode::parse("nightly").unwrap(), BuildMode::Nightly);
    let err = BuildMode::parse("stable").unwrap_err();
    assert!(matches!(err, BuildError::BadSetting { .. }), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("MSCCLPP_DEVICE_BUILD") && text.contains("stable"),
        "{text}"
    );
}

#[test]
fn stamp_round_trips_and_rejects_malformed_lines() {
    let stamp = Stamp {
        toolchain: "nightly-2026-01-01".into(),
        rustc: "1.90.0-nightly (abc 2025-12-31)".into(),
        inputs: "fnv1a128:00".into(),
        ptx: vec![StampedPtx {
            arch: "sm_90".into(),
            file: "k.sm_90.ptx".into(),
            hash: "fnv1a128:11".into(),
        }],
    };
    let path = Path::new("stamp.txt");
    assert_eq!(Stamp::parse(&stamp.to_text(), path).unwrap(), stamp);
    let good = stamp.to_text();
    for (bad, why) in [
        (good.replace("inputs fnv1a128:00\n", ""), "no `inputs`"),
        (format!("{good}colour blue\n"), "unknown key"),
        (format!("{good}ptx sm_80 k.sm_80.ptx\n"), "expected `ptx"),
        (
            format!("{good}ptx sm_80 ../k.ptx fnv1a128:22\n"),
            "bare file name",
        ),
    ] {
        let err = Stamp::parse(&bad, path).unwrap_err();
        assert!(matches!(err, BuildError::BadStamp { .. }), "{err}");
        assert!(err.to_string().contains(why), "{why}: {err}");
    }
}

/// A PTX module that ptxas accepts (the tests compile it when a ptxas is found).
const EMPTY_PTX: &str = ".version 7.8\n.target sm_90\n.address_size 64\n";

/// A kernel crate, its shipped-PTX directory and an out dir in a fresh temporary directory.
struct Shipping {
    root: PathBuf,
}

impl Shipping {
    fn new(tag: &str) -> Shipping {
        let root = env::temp_dir().join(format!("mscclpp-shipped-{tag}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("kernels/src/sub")).unwrap();
        fs::create_dir_all(root.join("out")).unwrap();
        fs::write(
            root.join("kernels/Cargo.toml"),
            "[package]\nname = \"k\"\nversion = \"0.1.0\"\n",
        )
        .unwrap();
        fs::write(root.join("kernels/src/lib.rs"), "#![no_std]\nmod sub;\n").unwrap();
        fs::write(root.join("kernels/src/sub/mod.rs"), "pub fn f() {}\n").unwrap();
        Shipping { root }
    }

    fn kernels(&self) -> PathBuf {
        self.root.join("kernels")
    }

    fn shipped(&self) -> PathBuf {
        self.root.join("shipped")
    }

    /// Writes the shipped directory as a nightly build of the kernels would, with one PTX
    /// per arch.
    fn ship(&self, arches: &[&str]) {
        let out = self.root.join("out");
        let ptx = arches
            .iter()
            .map(|arch| {
                let path = out.join(format!("k.{arch}.ptx"));
                fs::write(&path, EMPTY_PTX.replace("sm_90", arch)).unwrap();
                PtxArtifact {
                    arch: arch.to_string(),
                    compute_capability: compute_capability(arch).unwrap(),
                    path,
                    cubin: None,
                }
            })
            .collect();
        let artifacts = DeviceArtifacts {
            ptx,
            origin: PtxOrigin::Built,
            out_dir: out,
            provenance: Some(Provenance {
                toolchain: expected_toolchain(),
                rustc: "1.0.0-nightly (test)".into(),
                inputs: shipped::inputs_hash(
                    &self.kernels(),
                    &expected_toolchain(),
                    &recipe(),
                    &[],
                )
                .unwrap(),
            }),
        };
        artifacts.write_shipped(self.shipped()).unwrap();
    }

    fn builder(&self, mode: BuildMode) -> DeviceBuilder {
        DeviceBuilder::new(self.kernels())
            .shipped_ptx(self.shipped(), "refresh-the-ptx")
            .mode(mode)
            .arches(["sm_90"])
            .require_ptxas(false)
            .out_dir(self.root.join("out"))
    }

    /// The error of a build that must not use the shipped PTX, as text.
    fn refused(&self, builder: DeviceBuilder) -> String {
        let err = builder.build().unwrap_err();
        assert!(matches!(err, BuildError::ShippedUnusable { .. }), "{err}");
        err.to_string()
    }
}

impl Drop for Shipping {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

#[test]
fn up_to_date_shipped_ptx_is_used_without_a_nightly() {
    let s = Shipping::new("fresh");
    s.ship(&["sm_90"]);
    for mode in [BuildMode::Auto, BuildMode::Shipped] {
        let a = s.builder(mode).build().unwrap();
        assert_eq!(a.origin, PtxOrigin::Shipped);
        assert_eq!(a.ptx.len(), 1);
        assert_eq!(a.ptx[0].path, s.shipped().join("k.sm_90.ptx"));
        assert_eq!(a.ptx[0].compute_capability, 90);
        // Only what a nightly built can be shipped again.
        assert!(a.write_shipped(s.root.join("again")).is_err());
    }
}

#[test]
fn any_source_edit_makes_the_shipped_ptx_stale() {
    type Edit = fn(&Path);
    let edits: [(&str, Edit); 3] = [
        ("nested module", |k| {
            fs::write(k.join("src/sub/mod.rs"), "pub fn g() {}\n").unwrap()
        }),
        ("new file", |k| {
            fs::write(k.join("src/sub/data.bin"), [0u8]).unwrap()
        }),
        ("manifest", |k| {
            let m = k.join("Cargo.toml");
            let text = fs::read_to_string(&m).unwrap();
            fs::write(m, text + "[features]\nx = []\n").unwrap()
        }),
    ];
    for (what, edit) in edits {
        let s = Shipping::new("stale");
        s.ship(&["sm_90"]);
        edit(&s.kernels());
        let err = s.refused(s.builder(BuildMode::Shipped));
        assert!(err.contains("stale"), "{what}: {err}");
        assert!(err.contains("refresh-the-ptx"), "{what}: {err}");
        assert!(err.contains("MSCCLPP_DEVICE_BUILD"), "{what}: {err}");
    }
}

#[test]
fn a_shipped_ptx_unlike_its_stamp_is_refused() {
    let s = Shipping::new("tampered");
    s.ship(&["sm_90"]);
    let ptx = s.shipped().join("k.sm_90.ptx");
    fs::write(&ptx, EMPTY_PTX.replace("7.8", "8.0")).unwrap();
    let err = s.refused(s.builder(BuildMode::Shipped));
    assert!(err.contains("does not match its stamp"), "{err}");
    fs::remove_file(s.shipped().join(STAMP_FILE)).unwrap();
    let err = s.refused(s.builder(BuildMode::Shipped));
    assert!(err.contains(STAMP_FILE), "{err}");
}

#[test]
fn without_the_kernel_sources_the_shipped_ptx_is_all_there_is() {
    let s = Shipping::new("packaged");
    s.ship(&["sm_90"]);
    // As in a packaged crate: the kernel crate is not there, so it cannot be compared...
    fs::remove_dir_all(s.kernels()).unwrap();
    let a = s.builder(BuildMode::Auto).build().unwrap();
    assert_eq!(a.origin, PtxOrigin::Shipped);
    // ...nor built, and an arch that was not shipped cannot be had.
    let err = s.refused(s.builder(BuildMode::Nightly));
    assert!(err.contains("no kernel crate"), "{err}");
    let err = s.refused(s.builder(BuildMode::Auto).arches(["sm_80"]));
    assert!(err.contains("no PTX for sm_80"), "{err}");
}

#[test]
fn shipping_again_drops_the_ptx_of_arches_no_longer_built() {
    let s = Shipping::new("arches");
    s.ship(&["sm_80", "sm_90"]);
    assert!(s.shipped().join("k.sm_80.ptx").is_file());
    let a = s
        .builder(BuildMode::Shipped)
        .arches(["sm_80"])
        .build()
        .unwrap();
    assert_eq!(a.ptx[0].compute_capability, 80);
    s.ship(&["sm_90"]);
    assert!(!s.shipped().join("k.sm_80.ptx").exists());
    let err = s.refused(s.builder(BuildMode::Shipped).arches(["sm_80"]));
    assert!(err.contains("no PTX for sm_80"), "{err}");
}

#[test]
fn the_shipped_mode_refuses_to_compile_a_crate_that_ships_nothing() {
    let s = Shipping::new("unshipped");
    let err = DeviceBuilder::new(s.kernels())
        .mode(BuildMode::Shipped)
        .require_ptxas(false)
        .out_dir(s.root.join("out"))
        .build()
        .unwrap_err();
    assert!(matches!(err, BuildError::BadSetting { .. }), "{err}");
}

#[test]
fn inputs_hash_covers_toolchain_recipe_and_features() {
    let s = Shipping::new("inputs");
    let k = s.kernels();
    let base = shipped::inputs_hash(&k, "nightly-a", "r", &[]).unwrap();
    assert_eq!(
        base,
        shipped::inputs_hash(&k, "nightly-a", "r", &[]).unwrap()
    );
    assert_ne!(
        base,
        shipped::inputs_hash(&k, "nightly-b", "r", &[]).unwrap()
    );
    assert_ne!(
        base,
        shipped::inputs_hash(&k, "nightly-a", "r2", &[]).unwrap()
    );
    assert_ne!(
        base,
        shipped::inputs_hash(&k, "nightly-a", "r", &["f".to_string()]).unwrap()
    );
    // A file moved to another name has the same bytes but is another input.
    fs::rename(k.join("src/sub/mod.rs"), k.join("src/sub.rs")).unwrap();
    assert_ne!(
        base,
        shipped::inputs_hash(&k, "nightly-a", "r", &[]).unwrap()
    );
}
