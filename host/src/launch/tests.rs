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
    assert_eq!(launch.root, addr("127.0.0.1:29500"));
    assert_eq!(launch.timeout, None);
    let v6 = Launch::from_vars(vars(&[
        ("RANK", "0"),
        ("WORLD_SIZE", "1"),
        ("MASTER_ADDR", "::1"),
        ("MASTER_PORT", "7"),
    ]))
    .unwrap();
    assert_eq!(v6.root, addr("[::1]:7"));
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
    assert!(matches!(err, LaunchError::BadTimeout(_)), "{err}");
}

#[test]
fn output_lines_are_prefixed() {
    assert_eq!(prefixed(3, b"hello\r\n"), "[rank 3] hello");
    assert_eq!(prefixed(0, b"\xffbad utf8\n"), "[rank 0] \u{fffd}bad utf8");
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
