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

/// `MSCCLPP_SIMULATE_HOSTS`: rank `r` of `n` on `simhost{r * h / n}`, unset or empty is no
/// simulation, more hosts than ranks (a split communicator's) one host per rank, and
/// anything but a positive number is refused with the variable's name.
#[test]
fn simulated_host_ids_split_the_ranks_in_blocks() {
    let hosts = |spec: &str| {
        crate::settings::Settings::from_vars([("MSCCLPP_SIMULATE_HOSTS", spec)])
            .map(|s| s.simulate_hosts)
    };
    let ids = |spec: &str, n: usize| -> Vec<Option<String>> {
        let h = hosts(spec).unwrap();
        (0..n).map(|r| simulated_host_id(h, r, n)).collect()
    };
    let names = |v: &[usize]| -> Vec<Option<String>> {
        v.iter().map(|h| Some(format!("simhost{h}"))).collect()
    };
    assert_eq!(ids("2", 4), names(&[0, 0, 1, 1]));
    assert_eq!(ids(" 3 ", 6), names(&[0, 0, 1, 1, 2, 2]));
    assert_eq!(ids("4", 4), names(&[0, 1, 2, 3]));
    // Not a divisor: hosts of different sizes (the collectives then run flat).
    assert_eq!(ids("2", 3), names(&[0, 0, 1]));
    assert_eq!(simulated_host_id(None, 0, 2), None);
    assert_eq!(hosts("").unwrap(), None);
    // More hosts than ranks: a 1-rank child of a split under MSCCLPP_SIMULATE_HOSTS=2.
    assert_eq!(ids("5", 4), names(&[0, 1, 2, 3]));
    assert_eq!(ids("2", 1), names(&[0]));
    for bad in ["0", "two", "-1"] {
        let e = hosts(bad).unwrap_err().to_string();
        assert!(
            e.contains("MSCCLPP_SIMULATE_HOSTS") && e.contains("whole number from 1"),
            "{bad}: {e}"
        );
    }
}

/// Set in the child of the test below: run a rendezvous that misses a rank.
const NOTICE_CHILD: &str = "MSCCLPP_ROOT_NOTICE_TEST_CHILD";

/// A long rendezvous (timeout above the bootstrap timeout) says on stderr which ranks it
/// still waits for once the bootstrap timeout has passed (the root), and that it waits (each
/// joined rank); a short one says nothing until it fails. Run in a child process, whose stderr the test reads.
#[test]
fn a_long_rendezvous_says_which_ranks_it_still_waits_for() {
    use std::time::Duration;
    if let Ok(rendezvous_ms) = std::env::var(NOTICE_CHILD) {
        let config = BootstrapConfig::new()
            .with_timeout(Duration::from_millis(1000))
            .with_rendezvous_timeout(Duration::from_millis(rendezvous_ms.parse().unwrap()));
        let id = create_unique_id_at("127.0.0.1:0".parse().unwrap(), config.clone()).unwrap();
        // Rank 1 of 2 joins, rank 0 never does.
        let e = BlockingBootstrap::init_with_config(2, 1, BootstrapRoot::Id(id), config)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        eprintln!("child result: {e}");
        return;
    }
    let run = |rendezvous_ms: u64| {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "bootstrap::tests::a_long_rendezvous_says_which_ranks_it_still_waits_for",
                "--nocapture",
            ])
            .env(NOTICE_CHILD, rendezvous_ms.to_string())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let long = run(4000);
    assert!(long.contains("child result:"), "{long}");
    assert!(
        long.contains("never joined"),
        "the rendezvous must fail: {long}"
    );
    // The root's line (the rank's, below, may come first).
    let line = long
        .lines()
        .find(|l| l.contains("mscclpp: the bootstrap root at") && l.contains("has waited"))
        .unwrap_or_else(|| panic!("no notice from the root: {long}"));
    assert!(
        line.contains("for rank 0 to join") && line.contains("up to 4s"),
        "{line}"
    );
    // The waiting rank says so too, in its own output.
    assert!(
        long.lines()
            .any(|l| l.contains("rank 1 has waited") && l.contains("for the other ranks")),
        "{long}"
    );
    let short = run(1000);
    assert!(short.contains("never joined"), "{short}");
    assert!(!short.contains("has waited"), "{short}");
}

#[test]
fn rank_ranges_collapse_runs_and_stay_short() {
    use super::RankRanges;
    let text = |ranks: Vec<u32>| RankRanges::new(ranks).to_string();
    assert_eq!(text(vec![]), "no rank");
    assert_eq!(text(vec![5]), "rank 5");
    assert_eq!(text(vec![2, 1]), "ranks 1-2");
    assert_eq!(text((1..100_000).collect()), "ranks 1-99999");
    assert_eq!(
        text(vec![9, 1, 2, 3, 7, 10, 11, 12, 3]),
        "ranks 1-3, 7 and 9-12"
    );
    assert_eq!(text(vec![0, 2]), "ranks 0 and 2");
    assert_eq!(
        text(vec![u32::MAX - 1, u32::MAX]),
        format!("ranks {}-{}", u32::MAX - 1, u32::MAX)
    );
    // Every other rank of 200,000: 100,000 runs, of which 8 are named.
    let sparse = RankRanges::new((0..200_000).step_by(2));
    assert_eq!(sparse.len(), 100_000);
    let long = sparse.to_string();
    assert_eq!(
        long,
        "ranks 0, 2, 4, 6, 8, 10, 12, 14 and 99992 more in 99992 more runs (100000 in all)"
    );
    assert_eq!(sparse.ranks().count(), RankRanges::MAX_RUNS);
}

#[test]
fn job_id_comes_from_the_first_launcher_variable_set() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |var: &str| {
            vars.iter()
                .find(|(k, _)| *k == var)
                .map(|(_, v)| v.to_string())
        }
    };
    assert_eq!(job_id_from(env(&[])), "");
    assert_eq!(
        job_id_from(env(&[("SLURM_JOB_ID", "12"), ("SLURM_STEP_ID", "3")])),
        "SLURM_JOB_ID=12.3"
    );
    assert_eq!(
        job_id_from(env(&[
            ("SLURM_JOB_ID", "12"),
            ("MSCCLPP_JOB_ID", "mine"),
            ("TORCHELASTIC_RUN_ID", "t")
        ])),
        "MSCCLPP_JOB_ID=mine"
    );
    // Blank values do not count.
    assert_eq!(
        job_id_from(env(&[
            ("MSCCLPP_JOB_ID", " "),
            ("PMIX_NAMESPACE", "prte-1@1")
        ])),
        "PMIX_NAMESPACE=prte-1@1"
    );
    let long = job_id_from(|_| Some("x".repeat(1000)));
    assert_eq!(long.len(), wire::MAX_JOB_ID_LEN);
}
