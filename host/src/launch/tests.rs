use super::*;
use std::collections::HashMap;

fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
    let map: HashMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |name| map.get(name).cloned()
}

fn addr(s: &str) -> BootstrapRoot {
    BootstrapRoot::Addr(s.parse().unwrap())
}

#[test]
fn our_variables() {
    let id = crate::bootstrap::UniqueId::random("127.0.0.1:9".parse().unwrap());
    let text = id.to_string();
    let launch = Launch::from_vars(vars(&[
        ("MSCCLPP_RANK", "2"),
        ("MSCCLPP_NRANKS", "4"),
        ("MSCCLPP_LOCAL_RANK", "0"),
        ("MSCCLPP_BOOTSTRAP", &text),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "2.5"),
    ]))
    .unwrap();
    assert_eq!(
        launch,
        Launch {
            rank: 2,
            nranks: 4,
            local_rank: Some(0),
            root: BootstrapRoot::Id(id),
            timeout: Some(Duration::from_millis(2500)),
            rendezvous_timeout: None,
            source: LaunchSource::Mscclpp,
        }
    );
    assert_eq!(launch.config().timeout, Duration::from_millis(2500));
}

#[test]
fn torchrun_variables() {
    let launch = Launch::from_vars(vars(&[
        ("RANK", "1"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "1"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ]))
    .unwrap();
    assert_eq!(launch.source, LaunchSource::Torchrun);
    assert_eq!(
        (launch.rank, launch.nranks, launch.local_rank),
        (1, 8, Some(1))
    );
    // MASTER_PORT is torch's own store: the root listens on the next port.
    assert_eq!(launch.root, addr("127.0.0.1:29501"));
    assert_eq!(launch.timeout, None);
    let v6 = Launch::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "::1"),
        ("MASTER_PORT", "7"),
    ]))
    .unwrap();
    assert_eq!(v6.root, addr("[::1]:8"));
}

#[test]
fn master_port_offset_and_override() {
    let torchrun = [
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "29500"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut all = torchrun.to_vec();
        all.extend_from_slice(extra);
        Launch::from_vars(vars(&all))
    };
    assert_eq!(with(&[]).unwrap().root, addr("127.0.0.1:29501"));
    assert_eq!(
        with(&[("MSCCLPP_BOOTSTRAP_PORT", "40000")]).unwrap().root,
        addr("127.0.0.1:40000")
    );
    // MSCCLPP_BOOTSTRAP wins over both.
    assert_eq!(
        with(&[
            ("MSCCLPP_BOOTSTRAP_PORT", "40000"),
            ("MSCCLPP_BOOTSTRAP", "127.0.0.3:5")
        ])
        .unwrap()
        .root,
        addr("127.0.0.3:5")
    );
    for bad in ["0", "70000", "x"] {
        let err = with(&[("MSCCLPP_BOOTSTRAP_PORT", bad)]).unwrap_err();
        assert!(
            matches!(&err, LaunchError::Settings(e) if e.bad[0].var == "MSCCLPP_BOOTSTRAP_PORT"),
            "{err}"
        );
        assert!(err.to_string().contains("from 1 to 65535"), "{err}");
    }
    let err = Launch::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "2"),
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "65535"),
    ]))
    .unwrap_err();
    let text = err.to_string();
    assert!(text.contains("MSCCLPP_BOOTSTRAP_PORT"), "{text}");
}

/// Under torchrun, torch's store already listens on MASTER_PORT; the default root address
/// must still work (every rank computes the same other port).
#[test]
fn torchrun_default_works_while_master_port_is_taken() {
    // A held port whose successor is free (retry: the successor may be someone else's).
    let (store, port) = (0..50)
        .find_map(|_| {
            let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
            let port = l.local_addr().ok()?.port();
            let next = std::net::TcpListener::bind(("127.0.0.1", port.checked_add(1)?)).ok()?;
            drop(next);
            Some((l, port))
        })
        .expect("no free port pair on 127.0.0.1");
    let port = port.to_string();
    let ranks: Vec<_> = (0..2)
        .map(|rank| {
            let launch = Launch::from_vars(vars(&[
                ("RANK", &rank.to_string()),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", &port),
                ("MSCCLPP_BOOTSTRAP_TIMEOUT", "10"),
            ]))
            .unwrap();
            std::thread::spawn(move || {
                let bs = launch.blocking_bootstrap()?;
                bs.all_gather(&[rank as u8])
            })
        })
        .collect();
    for (rank, t) in ranks.into_iter().enumerate() {
        let gathered = t.join().unwrap();
        assert_eq!(
            gathered.unwrap_or_else(|e| panic!("rank {rank}: {e}")),
            vec![vec![0u8], vec![1u8]]
        );
    }
    drop(store);
}

#[test]
fn mpich_intel_mpi_and_mvapich_variables() {
    let root = ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000");
    let hydra = Launch::from_vars(vars(&[
        ("PMI_RANK", "3"),
        ("PMI_SIZE", "4"),
        ("MPI_LOCALRANKID", "1"),
        ("PMI_LOCAL_RANK", "2"),
        root,
    ]))
    .unwrap();
    assert_eq!(hydra.source, LaunchSource::Pmi);
    assert_eq!(
        (hydra.rank, hydra.nranks, hydra.local_rank),
        (3, 4, Some(1))
    );
    let pmi = Launch::from_vars(vars(&[
        ("PMI_RANK", "2"),
        ("PMI_SIZE", "4"),
        ("PMI_LOCAL_RANK", "0"),
        root,
    ]))
    .unwrap();
    assert_eq!((pmi.rank, pmi.local_rank), (2, Some(0)));
    // mpiexec inside a Slurm batch step: every process also sees SLURM_PROCID=0.
    let in_slurm = Launch::from_vars(vars(&[
        ("PMI_RANK", "1"),
        ("PMI_SIZE", "2"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        root,
    ]))
    .unwrap();
    assert_eq!((in_slurm.source, in_slurm.rank), (LaunchSource::Pmi, 1));
    let mv2 = Launch::from_vars(vars(&[
        ("MV2_COMM_WORLD_RANK", "5"),
        ("MV2_COMM_WORLD_SIZE", "8"),
        ("MV2_COMM_WORLD_LOCAL_RANK", "1"),
        ("PMI_RANK", "5"),
        ("PMI_SIZE", "8"),
        root,
    ]))
    .unwrap();
    assert_eq!(mv2.source, LaunchSource::Mvapich);
    assert_eq!((mv2.rank, mv2.nranks, mv2.local_rank), (5, 8, Some(1)));
    let err = Launch::from_vars(vars(&[("PMI_RANK", "0"), ("PMI_SIZE", "2")])).unwrap_err();
    assert!(err.to_string().contains("mpiexec -genv"), "{err}");
}

#[test]
fn partial_launcher_variables_name_what_is_missing() {
    type Case = (
        &'static [(&'static str, &'static str)],
        &'static str,
        &'static str,
    );
    let cases: [Case; 7] = [
        (&[("PMI_RANK", "1")], "PMI_RANK", "PMI_SIZE"),
        (&[("PMI_SIZE", "2")], "PMI_SIZE", "PMI_RANK"),
        (&[("MPI_LOCALRANKID", "0")], "MPI_LOCALRANKID", "PMI_RANK"),
        (
            &[("MV2_COMM_WORLD_RANK", "1")],
            "MV2_COMM_WORLD_RANK",
            "MV2_COMM_WORLD_SIZE",
        ),
        (&[("WORLD_SIZE", "2")], "WORLD_SIZE", "RANK"),
        (&[("LOCAL_RANK", "0")], "LOCAL_RANK", "RANK"),
        (
            &[("MSCCLPP_BOOTSTRAP", "127.0.0.1:5000")],
            "MSCCLPP_BOOTSTRAP",
            "MSCCLPP_RANK",
        ),
    ];
    for (set, found, missing) in cases {
        let err = Launch::from_vars(vars(set)).unwrap_err();
        match &err {
            LaunchError::Incomplete {
                found: f,
                missing: m,
            } => {
                assert_eq!((*f, *m), (found, missing), "{set:?}: {err}")
            }
            other => panic!("{set:?}: expected a partial-set error, got: {other}"),
        }
        let text = err.to_string();
        assert!(text.contains(found) && text.contains(missing), "{text}");
    }
}

#[test]
fn port_zero_is_refused_at_once() {
    let err = Launch::from_vars(vars(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_NRANKS", "2"),
        ("MSCCLPP_BOOTSTRAP", "127.0.0.1:0"),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            err,
            LaunchError::BadRoot {
                var: "MSCCLPP_BOOTSTRAP",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("port 0"), "{err}");
}

#[test]
fn open_mpi_and_slurm_variables_with_our_root() {
    let ompi = Launch::from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "3"),
        ("OMPI_COMM_WORLD_SIZE", "4"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.1:5000"),
    ]))
    .unwrap();
    assert_eq!(ompi.source, LaunchSource::OpenMpi);
    assert_eq!((ompi.rank, ompi.nranks, ompi.local_rank), (3, 4, Some(1)));
    assert_eq!(ompi.root, addr("10.0.0.1:5000"));
    let slurm = Launch::from_vars(vars(&[
        ("SLURM_PROCID", "5"),
        ("SLURM_NTASKS", "16"),
        ("SLURM_LOCALID", "1"),
        ("MSCCLPP_BOOTSTRAP", "10.0.0.2:5001"),
    ]))
    .unwrap();
    assert_eq!(slurm.source, LaunchSource::Slurm);
    assert_eq!(
        (slurm.rank, slurm.nranks, slurm.local_rank),
        (5, 16, Some(1))
    );
}

#[test]
fn our_variables_win_over_others() {
    let launch = Launch::from_vars(vars(&[
        ("MSCCLPP_RANK", "0"),
        ("MSCCLPP_NRANKS", "2"),
        ("RANK", "7"),
        ("WORLD_SIZE", "9"),
        ("MSCCLPP_BOOTSTRAP", "127.0.0.1:1"),
        ("MASTER_ADDR", "127.0.0.2"),
        ("MASTER_PORT", "2"),
    ]))
    .unwrap();
    assert_eq!(
        (launch.rank, launch.nranks, launch.source),
        (0, 2, LaunchSource::Mscclpp)
    );
    assert_eq!(launch.root, addr("127.0.0.1:1"));
}

#[test]
fn errors_name_the_problem() {
    let err = Launch::from_vars(vars(&[])).unwrap_err();
    assert!(matches!(err, LaunchError::NotLaunched), "{err}");

    let err = Launch::from_vars(vars(&[
        ("OMPI_COMM_WORLD_RANK", "0"),
        ("OMPI_COMM_WORLD_SIZE", "2"),
    ]))
    .unwrap_err();
    assert!(matches!(
        err,
        LaunchError::MissingRoot {
            launcher: LaunchSource::OpenMpi,
            ..
        }
    ));
    let text = err.to_string();
    assert!(
        text.contains("MSCCLPP_BOOTSTRAP") && text.contains("mpirun -x"),
        "{text}"
    );

    let err = Launch::from_vars(vars(&[("RANK", "0")])).unwrap_err();
    assert!(matches!(
        err,
        LaunchError::Incomplete {
            found: "RANK",
            missing: "WORLD_SIZE"
        }
    ));

    let err =
        Launch::from_vars(vars(&[("SLURM_PROCID", "x1"), ("SLURM_NTASKS", "2")])).unwrap_err();
    assert!(err.to_string().contains("SLURM_PROCID=\"x1\""), "{err}");

    let err = Launch::from_vars(vars(&[
        ("MSCCLPP_RANK", "4"),
        ("MSCCLPP_NRANKS", "4"),
        ("MSCCLPP_BOOTSTRAP", "127.0.0.1:1"),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            err,
            LaunchError::RankOutOfRange {
                rank: 4,
                nranks: 4,
                ..
            }
        ),
        "{err}"
    );

    let base = [("RANK", "0"), ("WORLD_SIZE", "2")];
    let err =
        Launch::from_vars(vars(&[base[0], base[1], ("MASTER_ADDR", "127.0.0.1")])).unwrap_err();
    assert!(
        matches!(
            err,
            LaunchError::Incomplete {
                missing: "MASTER_PORT",
                ..
            }
        ),
        "{err}"
    );
    let err = Launch::from_vars(vars(&[
        base[0],
        base[1],
        ("MASTER_ADDR", "127.0.0.1"),
        ("MASTER_PORT", "http"),
    ]))
    .unwrap_err();
    assert!(
        matches!(
            err,
            LaunchError::BadRoot {
                var: "MASTER_PORT",
                ..
            }
        ),
        "{err}"
    );
    let err = Launch::from_vars(vars(&[base[0], base[1], ("MSCCLPP_BOOTSTRAP", "nonsense")]))
        .unwrap_err();
    assert!(
        matches!(
            err,
            LaunchError::BadRoot {
                var: "MSCCLPP_BOOTSTRAP",
                ..
            }
        ),
        "{err}"
    );
    let err = Launch::from_vars(vars(&[
        base[0],
        base[1],
        ("MSCCLPP_BOOTSTRAP", "127.0.0.1:1"),
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "-3"),
    ]))
    .unwrap_err();
    assert!(
        matches!(&err, LaunchError::Settings(e) if e.bad[0].var == ENV_BOOTSTRAP_TIMEOUT),
        "{err}"
    );
    let err = Launch::from_vars(vars(&[
        base[0],
        base[1],
        ("MSCCLPP_BOOTSTRAP", "127.0.0.1:1"),
        ("MSCCLPP_RENDEZVOUS_TIMEOUT", "soon"),
    ]))
    .unwrap_err();
    assert!(
        matches!(&err, LaunchError::Settings(e) if e.bad[0].var == ENV_RENDEZVOUS_TIMEOUT),
        "{err}"
    );
    assert!(
        err.to_string()
            .contains("MSCCLPP_RENDEZVOUS_TIMEOUT=\"soon\": expected a number of seconds above 0"),
        "{err}"
    );
}

#[test]
fn the_rendezvous_timeout_is_its_own_and_defaults_to_the_bootstrap_timeout() {
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = vec![
            ("MSCCLPP_RANK", "0"),
            ("MSCCLPP_NRANKS", "2"),
            ("MSCCLPP_BOOTSTRAP", "127.0.0.1:1"),
        ];
        v.extend_from_slice(extra);
        Launch::from_vars(vars(&v)).unwrap().config()
    };
    let c = with(&[("MSCCLPP_BOOTSTRAP_TIMEOUT", "7")]);
    assert_eq!(
        (c.timeout, c.rendezvous_wait()),
        (Duration::from_secs(7), Duration::from_secs(7))
    );
    let c = with(&[
        ("MSCCLPP_BOOTSTRAP_TIMEOUT", "7"),
        ("MSCCLPP_RENDEZVOUS_TIMEOUT", "600"),
    ]);
    assert_eq!(
        (c.timeout, c.rendezvous_wait()),
        (Duration::from_secs(7), Duration::from_secs(600))
    );
    let c = with(&[("MSCCLPP_RENDEZVOUS_TIMEOUT", " 1.5 ")]);
    assert_eq!(
        (c.timeout, c.rendezvous_wait()),
        (Duration::from_secs(30), Duration::from_millis(1500))
    );
}

#[test]
fn output_lines_are_prefixed() {
    assert_eq!(forward::prefixed(3, b"hello\r\n"), "[rank 3] hello");
    assert_eq!(
        forward::prefixed(0, b"\xffbad utf8\n"),
        "[rank 0] \u{fffd}bad utf8"
    );
}

#[cfg(unix)]
#[test]
fn unprefixed_stdout_leaves_one_ranks_stdout_bare() {
    let report = LocalLauncher::command(2, "/bin/sh")
        .args(["-c", "echo out $MSCCLPP_RANK; echo err $MSCCLPP_RANK >&2"])
        .unprefixed_stdout(0)
        .capture_output(true)
        .timeout(Duration::from_secs(30))
        .run()
        .unwrap();
    assert!(report.success(), "{report}");
    let has = |l: &str| report.output.iter().any(|o| o == l);
    assert!(has("out 0"), "{:?}", report.output);
    assert!(has("[rank 1] out 1"), "{:?}", report.output);
    assert!(has("[rank 0] err 0"), "{:?}", report.output);
    assert!(!has("[rank 0] out 0"), "{:?}", report.output);
}

/// A malformed unique id (one hex digit short, or one digit wrong) in MSCCLPP_BOOTSTRAP: the
/// error says what is wrong and shows the id's first characters only, never its secret.
#[test]
fn a_malformed_unique_id_is_refused_without_showing_its_secret() {
    let id = crate::bootstrap::UniqueId::for_address_with_secret(
        "127.0.0.1:4000".parse().unwrap(),
        "shared",
    );
    let text = id.to_string();
    let secret: String = id.secret().iter().map(|b| format!("{b:02x}")).collect();
    assert!(text.contains(&secret), "the hex form holds the secret");
    let mut wrong_digit = text.clone();
    wrong_digit.replace_range(200..201, "g");
    for bad in [&text[..text.len() - 1], wrong_digit.as_str()] {
        let err = Launch::from_vars(vars(&[
            ("MSCCLPP_RANK", "0"),
            ("MSCCLPP_NRANKS", "2"),
            ("MSCCLPP_BOOTSTRAP", bad),
        ]))
        .unwrap_err();
        let (shown, debug) = (err.to_string(), format!("{err:?}"));
        for half in [&secret[..32], &secret[32..]] {
            assert!(
                !shown.contains(half) && !debug.contains(half),
                "{shown}\n{debug}"
            );
        }
        assert!(
            shown.contains("MSCCLPP_BOOTSTRAP") && shown.contains(&text[..16]),
            "{shown}"
        );
        assert!(shown.contains("is not shown"), "{shown}");
    }
}

/// The CPUs of a `Cpus_allowed_list` line ("0-2,5").
fn cpu_list(text: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap());
    }
    cpus
}

/// With `bind_cpus`, each rank runs on its own share of the launcher's CPUs from its start
/// (what a shell it runs reads of itself), where there are enough; without, on all of them.
#[cfg(target_os = "linux")]
#[test]
fn bound_ranks_run_on_their_own_share_of_the_cpus() {
    let allowed = super::affinity::allowed_cpus();
    assert!(!allowed.is_empty(), "no CPUs read for this thread");
    let run = |bind: bool| {
        let report = LocalLauncher::command(2, "/bin/sh")
            .args(["-c", "grep Cpus_allowed_list: /proc/self/status"])
            .bind_cpus(bind)
            .capture_output(true)
            .timeout(Duration::from_secs(30))
            .run()
            .unwrap();
        assert!(report.success(), "{report}");
        (0..2)
            .map(|r| {
                let prefix = format!("[rank {r}] Cpus_allowed_list:");
                let line = report.output.iter().find_map(|o| o.strip_prefix(&prefix));
                cpu_list(line.unwrap_or_else(|| panic!("rank {r}: {:?}", report.output)))
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(run(false), vec![allowed.clone(); 2], "unbound");
    let want = super::affinity::shares(&allowed, 2).unwrap_or_else(|| vec![allowed.clone(); 2]);
    let got = run(true);
    assert_eq!(got, want, "bound, the launcher's CPUs {allowed:?}");
    if allowed.len() >= 2 {
        assert!(got[0].iter().all(|c| !got[1].contains(c)), "{got:?}");
    }
}
