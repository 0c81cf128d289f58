//! Golden tests on the embedded PTX: every kernel is an entry point, the arch primitives
//! emit the exact memory-model instructions that docs/guide/06-design.md §3 requires, and
//! ptxas accepts it all.

use mscclpp::host::ptx::{CUBIN, PTX};

const KERNELS: &[&str] = &[
    "vector_add_f32",
    "ordering_probe",
    "arch_check",
    "fifo_push_test",
    "memory_ping_pong",
    "memory_get_ping_pong",
    "memory_packet_ping_pong",
    "memory_signal_ping_pong",
    "memory_ll8_block_ping_pong",
    "memory_ll16_block_ping_pong",
    "memory_put_bench",
    "memory_get_bench",
    "proxy_ping_pong",
    "proxy_bytes_ping_pong",
    "proxy_all_gather",
    "proxy_put_bench",
];

/// Test kernels (feature `testing`) besides [`KERNELS`] and the semaphore latency variants:
/// with [`KERNELS`] and those, every entry of the test build's PTX that the shipped PTX
/// (`host/ptx/`) must not have.
const OTHER_TEST_KERNELS: &[&str] = &[
    "litmus_message_passing",
    "litmus_ll_packets",
    "litmus_fifo_publish",
    "litmus_flag_after_copy",
    "memory_relaxed_signal_ping_pong",
    "proxy_put_status",
    "proxy_push_status",
    "flag_echo",
    "user_wait_status",
];

/// The names of the `.entry` points of `ptx`.
fn entries(ptx: &str) -> std::collections::BTreeSet<&str> {
    ptx.split(".entry ")
        .skip(1)
        .map(|rest| rest.split('(').next().unwrap_or_default().trim())
        .collect()
}

/// The text of entry `name` (from its `.entry` line to the next entry or the end).
fn entry<'a>(ptx: &'a str, name: &str) -> &'a str {
    let start = ptx
        .find(&format!(".visible .entry {name}("))
        .unwrap_or_else(|| panic!("no `.visible .entry {name}(` in the PTX"));
    let rest = &ptx[start + 1..];
    let end = rest.find(".visible .entry").map_or(rest.len(), |e| e);
    &rest[..end]
}

/// The embedded PTX for sm_90.
fn sm90_ptx() -> &'static str {
    PTX.iter()
        .find(|(cc, _)| *cc == 90)
        .map(|(_, ptx)| *ptx)
        .expect("no sm_90 PTX embedded")
}

#[test]
fn sm90_ptx_is_embedded_with_its_target_line() {
    let ptx = sm90_ptx();
    assert!(ptx.contains(".target sm_90"));
    assert!(ptx.contains(".address_size 64"));
}

#[test]
fn every_kernel_is_an_exported_entry() {
    for (cc, ptx) in PTX {
        for k in KERNELS {
            let body = entry(ptx, k);
            assert!(body.contains("ret;"), "sm_{cc}: {k} has no body");
        }
    }
}

#[test]
fn the_shipped_ptx_has_every_kernel_but_the_test_kernels() {
    use mscclpp_device::kernels::latency::VARIANTS;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/host/ptx/mscclpp_device.sm_90.ptx"
    );
    let shipped = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read the shipped PTX {path}: {e}"));
    let shipped = entries(&shipped);
    // This test build has feature `testing`, so its PTX has the test kernels too.
    let built = entries(sm90_ptx());
    let test_kernels: std::collections::BTreeSet<&str> = KERNELS
        .iter()
        .chain(OTHER_TEST_KERNELS)
        .copied()
        .chain(VARIANTS.iter().map(|v| v.kernel))
        .collect();
    let unknown: Vec<_> = test_kernels.difference(&built).collect();
    assert!(
        unknown.is_empty(),
        "test kernels not in the PTX: {unknown:?}"
    );
    let leaked: Vec<_> = shipped.intersection(&test_kernels).collect();
    assert!(
        leaked.is_empty(),
        "test kernels in the shipped PTX: {leaked:?}"
    );
    let unshipped: Vec<_> = built
        .difference(&shipped)
        .filter(|k| !test_kernels.contains(*k))
        .collect();
    let foreign: Vec<_> = shipped.difference(&built).collect();
    assert!(
        unshipped.is_empty() && foreign.is_empty(),
        "the shipped PTX lacks {unshipped:?} and has {foreign:?} beyond this build's; \
         scripts/update-ptx.sh refreshes it"
    );
}

#[test]
fn arch_primitives_emit_their_memory_model_instructions() {
    let required = [
        "atom.add.relaxed.gpu.u64",
        "atom.add.relaxed.sys.u64",
        "atom.add.release.sys.u64",
        "st.volatile.global.v2.u64",
        "st.release.sys.u64",
        "ld.acquire.sys.u64",
        "st.release.sys.u32",
        "ld.acquire.sys.u32",
        "ld.relaxed.sys.u64",
        "fence.acq_rel.sys;",
        "fence.sc.sys;",
        "%globaltimer",
        "bar.sync",
    ];
    for (cc, ptx) in PTX {
        let body = entry(ptx, "arch_check");
        for instr in required {
            assert!(body.contains(instr), "sm_{cc}: arch_check lacks `{instr}`");
        }
    }
}

#[test]
fn ordering_probe_publishes_with_release_and_waits_with_acquire() {
    for (cc, ptx) in PTX {
        let body = entry(ptx, "ordering_probe");
        for instr in [
            "st.release.sys.u64",
            "ld.acquire.sys.u64",
            "%globaltimer",
            "bar.sync",
            "cvta.shared.u64",
        ] {
            assert!(
                body.contains(instr),
                "sm_{cc}: ordering_probe lacks `{instr}`"
            );
        }
        // No plain (orderless) atomics sneaked in where a protocol access was meant.
        assert!(
            !body.contains("atom.global"),
            "sm_{cc}: ordering_probe uses a plain atomic"
        );
        // Static shared memory is a module-scope .shared variable.
        assert!(
            ptx.contains(".shared .align 16 .b8 __mscclpp_smem_"),
            "sm_{cc}: no .shared array"
        );
    }
}

#[test]
fn memory_channel_kernels_use_their_memory_model_instructions() {
    // Signals are posted reductions (`red`): an `atom` to peer memory waits for its result.
    // A wait takes its ticket with a GPU-scope add to the expected word, so that waits from
    // several threads at once each take a signal of their own.
    let signal_wait = [
        "red.release.sys.global.add.u64",
        "ld.acquire.sys.u64",
        "%globaltimer",
        "atom.add.relaxed.gpu.u64",
    ];
    let copies = ["ld.v2.u64", "st.v2.u64", "bar.sync"];
    let packets = [
        "st.volatile.global.v2.u64",
        "ld.volatile.global.v2.u64",
        "%globaltimer",
    ];
    let cases: [(&str, &[&str]); 5] = [
        (
            "memory_ping_pong",
            &[&signal_wait[..], &copies[..]].concat(),
        ),
        (
            "memory_get_ping_pong",
            &[&signal_wait[..], &copies[..]].concat(),
        ),
        (
            "memory_put_bench",
            &[&signal_wait[..], &copies[..]].concat(),
        ),
        ("memory_signal_ping_pong", &signal_wait),
        ("memory_packet_ping_pong", &packets),
    ];
    for (cc, ptx) in PTX {
        for (k, required) in cases {
            let body = entry(ptx, k);
            for instr in required {
                assert!(body.contains(instr), "sm_{cc}: {k} lacks `{instr}`");
            }
            // Protocol atomics are explicit PTX with their ordering, never plain atomics.
            assert!(
                !body.contains("atom.global"),
                "sm_{cc}: {k} uses a plain atomic"
            );
            assert!(
                !body.contains("atom.add.u64"),
                "sm_{cc}: {k} uses a plain atomic"
            );
        }
        // The signal ping-pong touches memory only through the semaphore: no plain load or
        // store of the expected word (the wait after its signal writes nothing).
        let body = entry(ptx, "memory_signal_ping_pong");
        for plain in ["ld.b64", "st.b64", "ld.u64", "st.u64"] {
            assert!(
                !body.contains(&format!("\t{plain} ")),
                "sm_{cc}: memory_signal_ping_pong has a plain `{plain}`"
            );
        }
        // Packets need no fence and no signal: the flag travels with the data.
        let body = entry(ptx, "memory_packet_ping_pong");
        for absent in ["fence.", "atom.add.release", "red.release", "bar.sync"] {
            assert!(
                !body.contains(absent),
                "sm_{cc}: packet ping-pong has `{absent}`"
            );
        }
    }
}

#[test]
fn latency_variants_use_exactly_their_instructions() {
    use mscclpp_device::kernels::latency::{Signal, VARIANTS, Wait};
    for (cc, ptx) in PTX {
        for v in VARIANTS {
            let body = entry(ptx, v.kernel);
            let k = v.kernel;
            // What the signal must emit, and what it must not (another variant's publish).
            let (has, lacks): (&[&str], &[&str]) = match v.signal {
                Signal::RedRelease => (
                    &["red.release.sys.global.add.u64"],
                    &["red.relaxed.sys", "st.release.sys"],
                ),
                Signal::RedRelaxed => (
                    &["red.relaxed.sys.global.add.u64"],
                    &["red.release", "fence.", "st.release"],
                ),
                Signal::FenceRedRelaxed => (
                    &["fence.acq_rel.sys;", "red.relaxed.sys.global.add.u64"],
                    &["red.release", "st.release"],
                ),
                Signal::FenceStRelaxed => (
                    &["fence.acq_rel.sys;", "st.relaxed.sys.u64"],
                    &["red.", "st.release"],
                ),
                Signal::StRelease => (&["st.release.sys.u64"], &["red.", "fence."]),
                Signal::StRelaxed => (&["st.relaxed.sys.u64"], &["red.", "fence.", "st.release"]),
                Signal::AtomRelease => (&["atom.add.release.sys.u64"], &["red.", "fence."]),
                Signal::EachThreadFence => (
                    &[
                        "fence.acq_rel.sys;",
                        "red.relaxed.sys.global.add.u64",
                        "bar.sync",
                    ],
                    &["red.release"],
                ),
            };
            for i in has {
                assert!(body.contains(i), "sm_{cc}: {k} lacks `{i}`");
            }
            for i in lacks {
                assert!(!body.contains(i), "sm_{cc}: {k} has `{i}`");
            }
            let clock = body.contains("%globaltimer");
            match v.wait {
                Wait::Library | Wait::ClockEveryPoll => {
                    assert!(
                        body.contains("ld.acquire.sys.u64") && clock,
                        "sm_{cc}: {k}: wait"
                    )
                }
                Wait::NoClock => assert!(
                    body.contains("ld.acquire.sys.u64") && !clock,
                    "sm_{cc}: {k}: wait"
                ),
                Wait::RelaxedPollFence => assert!(
                    body.contains("ld.relaxed.sys.u64") && !body.contains("ld.acquire") && clock,
                    "sm_{cc}: {k}: wait"
                ),
                Wait::RelaxedNoClock => assert!(
                    !body.contains("ld.acquire") && !clock && !body.contains("fence."),
                    "sm_{cc}: {k}: wait"
                ),
            }
            assert_eq!(body.contains("bar.sync"), v.block, "sm_{cc}: {k}: barriers");
            assert!(
                !body.contains("atom.global"),
                "sm_{cc}: {k} uses a plain atomic"
            );
        }
        for (k, st, ld) in [
            (
                "memory_ll8_block_ping_pong",
                "st.volatile.global.u64",
                "ld.volatile.global.u64",
            ),
            (
                "memory_ll16_block_ping_pong",
                "st.volatile.global.v2.u64",
                "ld.volatile.global.v2.u64",
            ),
        ] {
            let body = entry(ptx, k);
            for i in [st, ld, "bar.sync"] {
                assert!(body.contains(i), "sm_{cc}: {k} lacks `{i}`");
            }
            // Packets need no fence and no signal (the error count is a GPU-scope add).
            for absent in ["fence.", "red.", "atom.add.release", "atom.add.relaxed.sys"] {
                assert!(!body.contains(absent), "sm_{cc}: {k} has `{absent}`");
            }
        }
    }
}

#[test]
fn every_embedded_ptx_compiles_with_ptxas() {
    let ptxas = match mscclpp_device_builder::find_ptxas() {
        Ok(p) => p,
        Err(e) if std::env::var("MSCCLPP_REQUIRE_PTXAS").is_ok_and(|v| v == "1") => {
            panic!("MSCCLPP_REQUIRE_PTXAS=1 but: {e}")
        }
        Err(e) => {
            eprintln!("skipping: {e}");
            return;
        }
    };
    let dir = std::env::temp_dir().join(format!("mscclpp-golden-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (cc, ptx) in PTX {
        let path = dir.join(format!("device.sm_{cc}.ptx"));
        std::fs::write(&path, ptx).unwrap();
        let cubin = mscclpp_device_builder::run_ptxas(&ptxas, &path, &format!("sm_{cc}"), &dir)
            .unwrap_or_else(|e| panic!("{e}"));
        // The build found a ptxas too (the same one, under CI): it embedded the machine code
        // of this very PTX, which GPUs of this arch load without a JIT. A build that found
        // none embeds none (a ptxas installed since then is not its business), unless
        // ptxas is required.
        if CUBIN.is_empty() && !std::env::var("MSCCLPP_REQUIRE_PTXAS").is_ok_and(|v| v == "1") {
            eprintln!("this build embedded no cubin (no ptxas then): not compared");
            continue;
        }
        let embedded = CUBIN
            .iter()
            .find(|(c, _)| c == cc)
            .unwrap_or_else(|| panic!("no cubin embedded for sm_{cc}"))
            .1;
        assert!(
            embedded.starts_with(b"\x7fELF"),
            "the sm_{cc} cubin is not an ELF"
        );
        assert!(
            embedded == std::fs::read(&cubin).unwrap().as_slice(),
            "the embedded sm_{cc} cubin is not ptxas's output for the embedded PTX"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn launch_bounds_reach_the_ptx_entries() {
    for (cc, ptx) in PTX {
        for (k, n) in [
            ("memory_ping_pong", 1024),
            ("memory_packet_ping_pong", 1024),
            ("memory_put_bench", 512),
            ("memory_ll8_block_ping_pong", 1024),
            ("memory_ll16_block_ping_pong", 1024),
            ("lat_sem_block_red_release", 1024),
            ("lat_sem_block_each_fence", 1024),
        ] {
            let body = entry(ptx, k);
            let header = &body[..body.find('{').unwrap_or(body.len())];
            assert!(
                header.contains(&format!(".maxntid {n}, 1, 1")),
                "sm_{cc}: {k} lacks .maxntid {n}"
            );
        }
        let header = entry(ptx, "vector_add_f32");
        assert!(
            !header[..header.find('{').unwrap()].contains(".maxntid"),
            "sm_{cc}: unbounded kernel got a bound"
        );
    }
}

/// The kernels the host launches with programmatic dependent launch (one-shot all-reduce,
/// packet all-gather, the LL paths of the other collectives, send/recv; see
/// `host/src/collectives/mod.rs`, "Launches") may start while the previous kernel on the
/// stream still runs: in the sm_90 PTX each must execute `griddepcontrol.wait` before any
/// load or store that is not a parameter read or a prefetch, and trigger its dependents only
/// after that wait.
#[test]
fn dependent_launched_kernels_wait_before_touching_memory() {
    let ptx = sm90_ptx();
    let mut names: Vec<String> = ["f32", "f16", "bf16"]
        .iter()
        .map(|t| format!("all_reduce_one_shot_{t}"))
        .collect();
    for b in ["b8", "b16", "b32", "b64"] {
        names.push(format!("all_reduce_one_shot_op_{b}"));
        names.push(format!("reduce_scatter_ll_{b}"));
        names.push(format!("reduce_ll_{b}"));
    }
    names.extend(
        [
            "all_gather_packets",
            "broadcast_ll",
            "all_to_all_ll",
            "p2p",
            "ll_exchange",
        ]
        .map(String::from),
    );
    for name in &names {
        let body = entry(ptx, name);
        let wait = body
            .find("griddepcontrol.wait")
            .unwrap_or_else(|| panic!("{name}: no griddepcontrol.wait"));
        let trigger = body
            .find("griddepcontrol.launch_dependents")
            .unwrap_or_else(|| panic!("{name}: no griddepcontrol.launch_dependents"));
        assert!(
            wait < trigger,
            "{name}: triggers its dependents before it waits"
        );
        // Before the wait: parameter reads, prefetches, stores to the block's own shared
        // memory and one 64-bit load (the context's `state` pointer, for the counters' L2
        // prefetch); nothing else reads or writes. Inline asm may group several
        // instructions on one line (`{ .reg ..; cvta..; st.shared..; }`): each is checked.
        let before = &body[..wait];
        let mut loads = 0;
        let instructions = before
            .lines()
            .flat_map(|l| l.split(';'))
            .map(|i| i.trim().trim_start_matches('{').trim());
        for ins in instructions {
            let op = ins.split_whitespace().next().unwrap_or("");
            if op == "ld.global.u64" || op == "ld.global.b64" {
                loads += 1;
                continue;
            }
            let touches = (op.starts_with("ld.") && !op.starts_with("ld.param"))
                || (op.starts_with("st.") && !op.starts_with("st.shared"))
                || op.starts_with("atom.")
                || op.starts_with("red.");
            assert!(
                !touches,
                "{name}: `{ins}` before griddepcontrol.wait (only parameter reads, shared \
                 stores, the context's state pointer and prefetches may come first)"
            );
        }
        assert!(
            loads <= 1,
            "{name}: {loads} loads before griddepcontrol.wait"
        );
    }
}
#[test]
fn the_cross_host_step_is_an_entry_of_up_to_512_threads() {
    for (cc, ptx) in PTX {
        let body = entry(ptx, "cross_step");
        let header = &body[..body.find('{').unwrap_or(body.len())];
        assert!(
            header.contains(".maxntid 512, 1, 1"),
            "sm_{cc}: cross_step lacks .maxntid 512"
        );
        // Its waits read the proxy channels' counters with acquire at system scope.
        assert!(body.contains("ld.acquire.sys"), "sm_{cc}: cross_step");
    }
}

#[test]
fn the_cross_host_send_recv_kernel_is_an_entry_of_up_to_512_threads() {
    for (cc, ptx) in PTX {
        let body = entry(ptx, "remote_p2p");
        let header = &body[..body.find('{').unwrap_or(body.len())];
        assert!(
            header.contains(".maxntid 512, 1, 1"),
            "sm_{cc}: remote_p2p lacks .maxntid 512"
        );
        // Its polls read the proxy channels' counters with acquire at system scope, and a
        // send publishes its slot with a system-scope fence before the trigger.
        assert!(body.contains("ld.acquire.sys"), "sm_{cc}: remote_p2p polls");
        assert!(
            body.contains("fence.acq_rel.sys"),
            "sm_{cc}: remote_p2p fence"
        );
    }
}
