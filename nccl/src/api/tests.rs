use mscclpp_host::collectives::{DataType, P2pOp};

use crate::error::last_error;
use crate::types::result;

use super::p2p::{RootedKind, rooted_ops};
use super::*;

/// Runs every rank's sends and receives of one group on host memory: a send from `a`
/// to `b` pairs with `b`'s receive from `a` in call order (what the native group does),
/// and each rank's ops must pass `plan_p2p`. Returns the number of bytes copied.
fn emulate(all: &[Vec<P2pOp>]) -> usize {
    let parts = dispatch::parts;
    let mut moved = 0;
    for (r, ops) in all.iter().enumerate() {
        dispatch::plan_p2p(r, ops).unwrap_or_else(|e| panic!("rank {r}: {e}"));
        for (q, theirs) in all.iter().enumerate() {
            let sends: Vec<_> = ops.iter().map(parts).filter(|p| p.0 && p.3 == q).collect();
            let recvs: Vec<_> = theirs
                .iter()
                .map(parts)
                .filter(|p| !p.0 && p.3 == r)
                .collect();
            assert_eq!(sends.len(), recvs.len(), "{r} -> {q}: sends and receives");
            for (s, d) in sends.iter().zip(&recvs) {
                assert_eq!(s.2, d.2, "{r} -> {q}: sizes");
                // SAFETY: the test's own buffers, of the sizes the ops name; disjoint
                // (a piece never goes to its own place: those ops are left out).
                unsafe { std::ptr::copy_nonoverlapping(s.1 as *const u8, d.1 as *mut u8, s.2) };
                moved += s.2;
            }
        }
    }
    moved
}

#[test]
fn gather_and_scatter_spelled_as_sends_and_receives_move_every_piece_once() {
    for (n, count, dtype) in [
        (2, 5, DataType::F32),
        (3, 1, DataType::U8),
        (4, 7, DataType::F16),
    ] {
        let es = dtype.size();
        let piece = count * es;
        let byte = |r: usize, i: usize| (r * 31 + i * 7 + 1) as u8;
        for root in 0..n {
            for in_place in [false, true] {
                // Gather: rank r's piece (its own buffer, or its slot of the root's
                // output in place) lands in slot r of the root's output.
                let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; n * piece]).collect();
                let mut ins: Vec<Vec<u8>> = (0..n)
                    .map(|r| (0..piece).map(|i| byte(r, i)).collect())
                    .collect();
                outs[root][root * piece..(root + 1) * piece].copy_from_slice(&ins[root]);
                let all: Vec<Vec<P2pOp>> = (0..n)
                    .map(|r| {
                        let recv = outs[r].as_mut_ptr() as u64;
                        let send = if in_place && r == root {
                            recv + (r * piece) as u64
                        } else {
                            ins[r].as_mut_ptr() as u64
                        };
                        rooted_ops(
                            "t",
                            RootedKind::Gather,
                            r,
                            n,
                            root,
                            send,
                            recv,
                            count,
                            dtype,
                        )
                        .unwrap()
                    })
                    .collect();
                let moved = emulate(&all);
                let want: Vec<u8> = (0..n)
                    .flat_map(|r| (0..piece).map(move |i| byte(r, i)))
                    .collect();
                assert_eq!(
                    outs[root], want,
                    "gather n={n} root={root} in_place={in_place}"
                );
                assert_eq!(moved, (n - in_place as usize) * piece, "gather bytes moved");
                for (r, o) in outs.iter().enumerate().filter(|(r, _)| *r != root) {
                    assert!(o.iter().all(|&b| b == 0), "gather wrote rank {r}'s output");
                }
                // Scatter: slot q of the root's input lands in rank q's output (its own
                // buffer, or, in place on the root, already there).
                let mut src: Vec<u8> = (0..n)
                    .flat_map(|q| (0..piece).map(move |i| byte(q, i)))
                    .collect();
                let mut outs: Vec<Vec<u8>> = (0..n).map(|_| vec![0u8; piece]).collect();
                let all: Vec<Vec<P2pOp>> = (0..n)
                    .map(|r| {
                        let send = src.as_mut_ptr() as u64;
                        let recv = if in_place && r == root {
                            send + (r * piece) as u64
                        } else {
                            outs[r].as_mut_ptr() as u64
                        };
                        let send = if r == root {
                            send
                        } else {
                            ins[r].as_mut_ptr() as u64
                        };
                        rooted_ops(
                            "t",
                            RootedKind::Scatter,
                            r,
                            n,
                            root,
                            send,
                            recv,
                            count,
                            dtype,
                        )
                        .unwrap()
                    })
                    .collect();
                let moved = emulate(&all);
                for q in 0..n {
                    let got = if in_place && q == root {
                        &src[q * piece..(q + 1) * piece]
                    } else {
                        &outs[q][..]
                    };
                    let want: Vec<u8> = (0..piece).map(|i| byte(q, i)).collect();
                    assert_eq!(got, &want[..], "scatter n={n} root={root} to {q}");
                }
                assert_eq!(
                    moved,
                    (n - in_place as usize) * piece,
                    "scatter bytes moved"
                );
            }
        }
    }
    let none = rooted_ops("t", RootedKind::Gather, 0, 2, 1, 8, 16, 0, DataType::F32).unwrap();
    assert!(none.is_empty(), "nothing to move for count 0");
    let e = rooted_ops(
        "t",
        RootedKind::Scatter,
        1,
        2,
        1,
        8,
        16,
        usize::MAX / 4,
        DataType::F64,
    )
    .unwrap_err();
    assert_eq!(e.code, result::INVALID_ARGUMENT);
    assert!(
        rooted_ops(
            "t",
            RootedKind::Gather,
            0,
            8,
            1,
            8,
            16,
            1 << 20,
            DataType::F64
        )
        .is_ok()
    );
}

#[test]
fn argument_checks() {
    assert!(check_dtype("t", 9).is_ok());
    assert_eq!(
        check_dtype("t", 12).unwrap_err().code,
        result::INVALID_ARGUMENT
    );
    assert_eq!(
        check_dtype("t", -1).unwrap_err().code,
        result::INVALID_ARGUMENT
    );
    assert!(check_op("t", None, 4).is_ok());
    assert_eq!(
        check_op("t", None, -3).unwrap_err().code,
        result::INVALID_ARGUMENT
    );
    assert!(check_rank("t", "root", 1, 2).is_ok());
    assert!(check_rank("t", "root", 2, 2).is_err());
    assert!(check_rank("t", "root", -1, 2).is_err());
    assert!(check_ptr("t", "x", std::ptr::null(), 0).is_ok());
    assert!(check_ptr("t", "x", std::ptr::null(), 1).is_err());
}

#[test]
fn calls_on_null_or_unknown_comms_fail_cleanly() {
    let _l = crate::error::TEST_LOCK
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let mut n = 0;
    // SAFETY: valid out-pointer; a null communicator.
    let r = unsafe { ncclCommCount(std::ptr::null_mut(), &mut n) };
    assert_eq!(r, result::INVALID_ARGUMENT);
    assert!(last_error().contains("comm is NULL"), "{}", last_error());
    // SAFETY: a bad data type is refused before anything is dereferenced.
    let r = unsafe {
        ncclAllReduce(
            std::ptr::null(),
            std::ptr::null_mut(),
            0,
            99,
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    assert_eq!(r, result::INVALID_ARGUMENT);
    assert!(last_error().contains("data type 99"), "{}", last_error());
    // SAFETY: a group without a start.
    assert_eq!(unsafe { ncclGroupEnd() }, result::INVALID_USAGE);
    // Ending a NULL communicator (a split's NOCOLOR child) is done already, as in NCCL.
    // SAFETY: NULL communicators.
    unsafe {
        assert_eq!(ncclCommFinalize(std::ptr::null_mut()), result::SUCCESS);
        assert_eq!(ncclCommDestroy(std::ptr::null_mut()), result::SUCCESS);
        assert_eq!(ncclCommAbort(std::ptr::null_mut()), result::SUCCESS);
    }
}
