use super::*;

/// A mesh of `nranks` whose rank is `rank`, with no connections (nothing is dialed).
fn mesh(rank: usize, nranks: usize) -> Arc<Mesh> {
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let peers = (0..nranks)
        .map(|r| PeerInfo {
            addr,
            host_id: "h".into(),
            pid: r as u32,
            process_space: "m".into(),
        })
        .collect();
    Mesh::new(
        rank,
        UniqueId::random(addr),
        peers,
        BootstrapConfig::default(),
    )
}

fn gave_up(waiting_for: usize, op: &str) -> Option<GaveUp> {
    Some(GaveUp {
        waiting_for,
        op: op.into(),
        seen: None,
    })
}

#[test]
fn stall_reports_that_mean_nothing_here_are_ignored() {
    let m = mesh(0, 4);
    // Out of range, about this rank, and a rank about itself: none is recorded.
    m.note_reported_stall(2, 4, "barrier".into(), String::new());
    m.note_reported_stall(2, u32::MAX as usize, "barrier".into(), String::new());
    m.note_reported_stall(2, 0, "barrier".into(), String::new());
    m.note_reported_stall(2, 2, "barrier".into(), String::new());
    assert_eq!(m.stall_reported_by(2), None);
    assert_eq!(m.stall_behind(2, None), None);
    // A meaningful report counts; a later one replaces it.
    m.note_reported_stall(2, 3, "barrier".into(), String::new());
    m.note_reported_stall(2, 1, "all_gather".into(), String::new());
    assert_eq!(m.stall_reported_by(2), gave_up(1, "all_gather"));
    // Out of range asks nothing of the state.
    assert_eq!(m.stall_reported_by(4), None);
    assert_eq!(m.stall_reported_by(usize::MAX), None);
    // The rest of the state is untouched: every rank still alive, none lost.
    assert!((0..4).all(|p| m.is_alive(p)));
    assert_eq!(m.first_lost(), None);
}

#[test]
fn a_long_stalled_op_is_cut_on_receipt() {
    let m = mesh(0, 3);
    // Within the header limit, but beyond the bound a sender keeps to.
    let long = "é".repeat(wire::MAX_STALLED_OP_LEN);
    m.note_reported_stall(1, 2, long, String::new());
    let op = m.stall_reported_by(1).unwrap().op;
    assert!(op.len() <= wire::MAX_STALLED_OP_LEN, "{}", op.len());
    assert!(op.chars().all(|c| c == 'é'));
}

#[test]
fn stall_chains_are_followed_to_their_end() {
    let m = mesh(0, 6);
    // 3 gave up on 2, which gave up on 1: behind 3 is 1, with 2's operation.
    m.note_reported_stall(3, 2, "barrier".into(), String::new());
    m.note_reported_stall(2, 1, "all_gather".into(), String::new());
    assert_eq!(m.stall_behind(3, None), gave_up(1, "all_gather"));
    assert_eq!(m.stall_behind(2, None), gave_up(1, "all_gather"));
    assert_eq!(m.stall_behind(1, None), None);
    // A cycle (4 on 5, 5 on 4) ends where it would come back.
    m.note_reported_stall(4, 5, "recv (tag 1)".into(), String::new());
    m.note_reported_stall(5, 4, "recv (tag 2)".into(), String::new());
    assert_eq!(m.stall_behind(4, None), gave_up(5, "recv (tag 1)"));
    assert_eq!(m.stall_behind(5, None), gave_up(4, "recv (tag 2)"));
}

#[test]
fn a_closed_rank_that_gave_up_says_so() {
    let m = mesh(0, 3);
    m.note_reported_stall(2, 1, "all_gather".into(), String::new());
    m.mark_closed(2, None, false);
    let err = m.status_error(2, Op::Barrier).unwrap();
    assert!(
        matches!(&err, BootstrapError::PeerClosed { peer: 2, gave_up: Some(g), .. }
            if g.waiting_for == 1),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "rank 0: barrier failed: rank 2 has closed its bootstrap (it had given up, stuck behind \
         rank 1 in all_gather)"
    );
    // One that closed without a report: as before.
    m.mark_closed(1, None, false);
    assert_eq!(
        m.status_error(1, Op::Barrier).unwrap().to_string(),
        "rank 0: barrier failed: rank 1 has closed its bootstrap"
    );
}

/// A wait follows only reports that came after it began: rank 2 gave up on rank 1 in an
/// earlier wait (a `recv` it recovered from, say); a barrier that began later and timed out
/// on rank 2 blames rank 2, not rank 1 (found by review: an old report blamed a healthy rank).
#[test]
fn reports_older_than_the_wait_are_not_followed() {
    let m = mesh(0, 4);
    m.note_reported_stall(2, 1, "recv (tag 5)".into(), String::new());
    std::thread::sleep(Duration::from_millis(5));
    let began = Instant::now();
    assert_eq!(m.stall_behind(2, Some(began)), None);
    assert_eq!(m.stall_behind(2, None), gave_up(1, "recv (tag 5)"));
    // A chain is cut where a link is older than the wait: 3 on 2 (new), 2 on 1 (old).
    m.note_reported_stall(3, 2, "barrier".into(), String::new());
    assert_eq!(m.stall_behind(3, Some(began)), gave_up(2, "barrier"));
    // A new report of rank 2 replaces the old one and is followed.
    m.note_reported_stall(2, 1, "barrier".into(), String::new());
    assert_eq!(m.stall_behind(3, Some(began)), gave_up(1, "barrier"));
}

/// A child process (`sleep 30`) that is killed when dropped.
struct Sleeper(std::process::Child);

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A wait that times out names the ranks of this machine and process id namespace whose
/// processes are stopped, whichever rank it waited for; ranks elsewhere (another process
/// space, even with the same pid) and this process are never looked at.
#[test]
fn a_timed_out_wait_names_a_stopped_process_of_this_machine() {
    if !cfg!(target_os = "linux") {
        eprintln!("skipped: /proc is Linux's");
        return;
    }
    let child = Sleeper(
        std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let here = super::super::process_space_id();
    let addr: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let peer = |pid: u32, process_space: &str| PeerInfo {
        addr,
        host_id: format!("simhost{pid}"),
        pid,
        process_space: process_space.into(),
    };
    // Rank 0: this process. Rank 1: the child, here. Rank 2: the child's pid elsewhere.
    // Rank 3: this process again (ranks that are threads of one process).
    let peers = vec![
        peer(std::process::id(), &here),
        peer(pid, &here),
        peer(pid, "another-machine/boot/pid:[1]"),
        peer(std::process::id(), &here),
    ];
    let config = BootstrapConfig::default().with_timeout(Duration::from_millis(200));
    let m = Mesh::new(0, UniqueId::random(addr), peers, config);
    assert_eq!(m.local_pid(0), None, "this rank");
    assert_eq!(m.local_pid(1), Some(pid));
    assert_eq!(m.local_pid(2), None, "another process space");
    assert_eq!(m.local_pid(3), None, "this process");
    // A sleeping process is not stuck (once it sleeps: a child just started may still be in
    // a disk wait, D, loading its program on a loaded machine).
    let start = Instant::now();
    while !m.stuck_ranks().is_empty() {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "a sleeping process is not stuck: {:?}",
            m.stuck_ranks()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    crate::testing::signal(pid, "-STOP");
    let start = Instant::now();
    while !crate::procfs::process_stopped(pid) {
        assert!(start.elapsed() < Duration::from_secs(10), "not stopped");
        std::thread::sleep(Duration::from_millis(5));
    }
    // What this rank's stall reports say of rank 1 (ranks on other machines learn it so);
    // nothing of a rank it cannot look at.
    let seen = m.seen_of(1).unwrap();
    assert!(
        seen.starts_with(&format!("rank 1 (pid {pid}) is stopped by a signal")),
        "{seen}"
    );
    assert_eq!(m.seen_of(2), None);
    let err = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(m.wait_message(3, Channel::User(1), Op::Recv(1), false))
        .unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(&err, BootstrapError::Timeout { stuck, .. }
            if stuck.len() == 1 && stuck[0].rank == 1 && stuck[0].pid == pid),
        "{err:?}"
    );
    assert!(
        text.contains(&format!(
            "waiting for rank 3; on this machine, rank 1 (pid {pid}) is stopped by a signal"
        )),
        "{text}"
    );
}

/// A closed rank's reason ([`Message::PeerClosed`]'s `why`) is shown by the errors that name
/// it: the first reason that came is kept, an empty one says nothing, a long one is cut on
/// receipt.
#[test]
fn a_closed_rank_that_said_why_is_named_with_it() {
    let m = mesh(0, 4);
    m.note_reported_closure(1, 0, "");
    m.note_reported_closure(1, 0, "setting up its collectives failed on it: no GPU");
    m.note_reported_closure(1, 0, "a later word");
    m.mark_closed(1, None, false);
    let err = m.status_error(1, Op::AllGather).unwrap();
    assert!(
        matches!(&err, BootstrapError::PeerClosed { peer: 1, said: Some(w), .. }
            if w == "setting up its collectives failed on it: no GPU"),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "rank 0: all_gather failed: rank 1 has closed its bootstrap; it said why: setting up \
         its collectives failed on it: no GPU"
    );
    // Said nothing: as before.
    m.note_reported_closure(2, 0, "");
    m.mark_closed(2, None, false);
    assert_eq!(m.closed_why(2), None);
    assert_eq!(
        m.status_error(2, Op::Barrier).unwrap().to_string(),
        "rank 0: barrier failed: rank 2 has closed its bootstrap"
    );
    // Within the frame limits, but beyond the bound a sender keeps to.
    m.note_reported_closure(3, 0, &"é".repeat(wire::MAX_CLOSED_WHY_LEN));
    let why = m.closed_why(3).unwrap();
    assert!(why.len() <= wire::MAX_CLOSED_WHY_LEN && why.chars().all(|c| c == 'é'));
    // This rank's own reason, once other ranks are known closed: not kept (its failure
    // most likely follows theirs, and they are named with their own).
    m.set_leaving_why("after them");
    assert_eq!(lock(&m.leaving_why).as_deref(), None);
    // With none gone, the first reason set is kept.
    let m = mesh(0, 2);
    m.set_leaving_why("first");
    m.set_leaving_why("second");
    assert_eq!(lock(&m.leaving_why).as_deref(), Some("first"));
}

/// A dial refused after the rendezvous (the peer's listener has closed) waits a moment for
/// news of the peer, and names it as closed with why it left when that news comes through
/// another rank; with no news, the refusal itself is the error (a rank known closed with a
/// reason explains only the init's ring, not a refused send to another rank).
#[test]
fn a_refused_dial_names_the_closed_peer_with_why() {
    // Every peer's address is 127.0.0.1:1, where nothing listens.
    let m = mesh(0, 3);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let news = Arc::clone(&m);
        tokio::spawn(async move {
            // Well within the grace (0.5 s), so that a loaded machine still sees it in time.
            tokio::time::sleep(Duration::from_millis(20)).await;
            news.note_reported_closure(1, 0, "setting up its collectives failed on it: x");
        });
        let err = m.connect_ring().await.unwrap_err();
        assert!(
            matches!(&err, BootstrapError::PeerClosed { peer: 1, said: Some(w), .. }
                if w == "setting up its collectives failed on it: x"),
            "{err:?}"
        );
        // A rank that closed without a reason does not explain another's refusal at init.
        let other = mesh(0, 3);
        other.note_reported_closure(2, 5, "");
        let err = other.connect_ring().await.unwrap_err();
        assert!(
            matches!(&err, BootstrapError::Io { .. })
                && err.to_string().contains("cannot connect to rank 1"),
            "{err:?}"
        );
        let err = m.link(2, Op::Barrier).await.err().unwrap();
        assert!(
            matches!(&err, BootstrapError::Io { .. })
                && err.to_string().contains("cannot connect to rank 2"),
            "{err:?}"
        );
    });
}

/// What a rank on the stalled rank's machine saw of its process travels with the reports
/// (`seen`): followed along a chain with the report that names the root, shown by the
/// errors, and left out where this rank's own look at its machine names that rank already.
#[test]
fn what_was_seen_of_a_stalled_process_travels_with_the_reports() {
    let m = mesh(0, 4);
    let seen = "rank 1 (pid 42) is stopped by a signal";
    // 3 gave up on 2, which gave up on 1 and saw it stopped.
    m.note_reported_stall(3, 2, "barrier".into(), String::new());
    m.note_reported_stall(2, 1, "all_gather".into(), seen.into());
    let behind = m.stall_behind(3, None).unwrap();
    assert_eq!(
        (behind.waiting_for, behind.seen.as_deref()),
        (1, Some(seen))
    );
    assert_eq!(m.stall_reported_by(3).unwrap().seen, None);
    let timeout = |stuck: Vec<StuckProcess>| BootstrapError::Timeout {
        rank: 0,
        op: Op::Barrier,
        waiting_for: "rank 3".into(),
        after: Duration::from_secs(30),
        gave_up: m.stall_behind(3, None).map(Box::new),
        stuck: stuck.into(),
    };
    assert_eq!(
        timeout(vec![]).to_string(),
        "rank 0: barrier timed out after 30s waiting for rank 3, which had given up, stuck \
         behind rank 1 (all_gather); on its machine, rank 1 (pid 42) is stopped by a signal"
    );
    // This rank sees rank 1 itself: said once, by its own note.
    let own = StuckProcess {
        rank: 1,
        pid: 42,
        reason: "is stopped by a signal".into(),
    };
    let text = timeout(vec![own]).to_string();
    assert_eq!(text.matches("is stopped by a signal").count(), 1, "{text}");
    assert!(text.ends_with("; on this machine, rank 1 (pid 42) is stopped by a signal"));
    // A long word is cut on receipt.
    m.note_reported_stall(2, 1, "x".into(), "é".repeat(wire::MAX_STALLED_OP_LEN));
    let cut = m.stall_reported_by(2).unwrap().seen.unwrap();
    assert!(cut.len() <= wire::MAX_STALLED_OP_LEN && cut.chars().all(|c| c == 'é'));
}

/// A rank that reported giving up on rank 1 without having seen anything reports again when
/// a report of what was seen of rank 1 comes later (ranks stuck behind it may have no other
/// way to learn it), and not again for the same word.
#[test]
fn what_is_seen_later_of_the_same_root_is_reported_again() {
    let m = mesh(0, 4);
    let began = Instant::now();
    // This rank (0) gave up on rank 2, which had given up on rank 1 and seen nothing.
    m.note_reported_stall(2, 1, "all_gather".into(), String::new());
    m.report_stall(2, "barrier", began);
    let own = |m: &Mesh| {
        let o = lock(&m.own_report);
        let o = o.as_ref().unwrap();
        (o.root, o.seen.clone())
    };
    assert_eq!(own(&m), (1, String::new()));
    // Rank 2 reports again, now with what rank 3 (on rank 1's machine) saw: same root.
    let seen = "rank 1 (pid 42) is stopped by a signal";
    m.note_reported_stall(2, 1, "all_gather".into(), seen.into());
    assert_eq!(own(&m), (1, seen.to_string()));
    // The same word again changes nothing.
    m.note_reported_stall(2, 1, "all_gather".into(), seen.into());
    assert_eq!(own(&m), (1, seen.to_string()));
}
