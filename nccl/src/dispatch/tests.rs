//! The dispatch decisions, and the native calls run with NCCL's argument conventions over
//! the Host transport (ranks as threads): the same [`Launch`] values the C API builds, the
//! same [`plan_p2p`] schedule, on our host kernels.

use mscclpp_host::collectives::Exec;
use std::time::Duration;

use half::{bf16, f16};
use mscclpp_host::bootstrap::{BlockingBootstrap, BootstrapConfig, create_unique_id};
use mscclpp_host::collectives::{CollConfig, Element};
use mscclpp_host::communicator::{Backend, CommConfig, Communicator};

use super::*;
use crate::types::{NUM_OPS, NUM_TYPES};

#[test]
fn reducing_calls_are_native_for_every_builtin_op_and_reducing_type() {
    let fb = Fallback::default();
    for call in [
        NativeCall::AllReduce,
        NativeCall::ReduceScatter,
        NativeCall::Reduce,
    ] {
        for dt in 0..NUM_TYPES {
            // fp8 (10, 11) included: its reductions are staged in f32.
            for op in 0..NUM_OPS {
                let got = reducing(&fb, call, dt, op, None);
                let (d, o) = got.unwrap_or_else(|e| panic!("{call:?} {dt} {op}: {e}"));
                assert_eq!(d, native_dtype(dt).unwrap());
                assert_eq!(o, native_op(op).unwrap());
            }
            // A pre-multiplied sum made here is native, even with the call switched off by
            // the environment (the real NCCL does not know it); a number the communicator
            // did not make is not an operation.
            let d = native_dtype(dt).unwrap();
            let s = PreMulScalar::Host { dtype: d, bits: 1 };
            let want = Ok((d, ReduceOp::PreMulSum(s)));
            assert_eq!(reducing(&fb, call, dt, NUM_OPS, Some(s)), want);
            let off = Fallback::parse("all");
            assert_eq!(reducing(&off, call, dt, NUM_OPS, Some(s)), want);
            assert_eq!(reducing(&fb, call, dt, NUM_OPS, None), Err(PREMUL));
        }
        assert_eq!(reducing(&fb, call, 12, 0, None), Err(BAD_TYPE));
        // The environment switches each call off by its name, and only that one.
        let off = Fallback::parse(call.name());
        assert_eq!(reducing(&off, call, 7, 0, None), Err(BY_ENV));
        assert!(reducing(&Fallback::parse("all"), call, 7, 0, None).is_err());
        for other in NativeCall::ALL.into_iter().filter(|c| *c != call) {
            assert!(off.native(other), "{call:?} switched {other:?} off");
        }
    }
}

#[test]
fn moving_calls_are_native_for_every_type() {
    let fb = Fallback::default();
    for call in [
        NativeCall::AllGather,
        NativeCall::Broadcast,
        NativeCall::AllToAll,
        NativeCall::SendRecv,
    ] {
        for dt in 0..NUM_TYPES {
            assert_eq!(moving(&fb, call, dt), Ok(native_dtype(dt).unwrap()));
        }
        assert_eq!(moving(&fb, call, -1), Err(BAD_TYPE));
        assert_eq!(moving(&Fallback::parse(call.name()), call, 7), Err(BY_ENV));
        assert_eq!(moving(&Fallback::parse("all"), call, 7), Err(BY_ENV));
    }
    // Either direction's name forwards both: a send and its receive never split.
    for w in ["send", "recv"] {
        assert_eq!(
            moving(&Fallback::parse(w), NativeCall::SendRecv, 1),
            Err(BY_ENV)
        );
    }
}

#[test]
fn sends_and_receives_follow_the_real_nccl_when_ours_cannot_reach_every_rank() {
    let off = Fallback {
        p2p_off: true,
        ..Fallback::default()
    };
    for dt in 0..NUM_TYPES {
        assert_eq!(moving(&off, NativeCall::SendRecv, dt), Err(P2P_OFF));
    }
    // Only sends and receives: every other call stays native.
    for call in NativeCall::ALL
        .into_iter()
        .filter(|c| *c != NativeCall::SendRecv)
    {
        assert!(off.native(call), "{call:?}");
    }
    assert!(
        !off.native_names().contains("sendrecv"),
        "{}",
        off.native_names()
    );
    // The environment's reason comes first when it names them too.
    let both = Fallback {
        p2p_off: true,
        ..Fallback::parse("send")
    };
    assert_eq!(moving(&both, NativeCall::SendRecv, 7), Err(BY_ENV));
}

fn send(buf: u64, count: usize, peer: usize) -> P2pOp {
    P2pOp::Send {
        buf,
        count,
        dtype: DataType::F32,
        peer,
    }
}

fn recv(buf: u64, count: usize, peer: usize) -> P2pOp {
    P2pOp::Recv {
        buf,
        count,
        dtype: DataType::F32,
        peer,
    }
}

#[test]
fn p2p_plans() {
    // Own rank: paired in order into copies, empty ones left out; an empty operation with
    // another rank is a transfer (NCCL's are since 2.12.10).
    let p = plan_p2p(
        1,
        &[
            send(10, 2, 1),
            recv(20, 0, 0),
            recv(30, 2, 1),
            send(40, 3, 2),
        ],
    )
    .unwrap();
    assert_eq!(p.self_copies, vec![(10, 30, 8)]);
    assert_eq!(p.launches, vec![vec![recv(20, 0, 0), send(40, 3, 2)]]);
    assert!(
        plan_p2p(0, &[send(1, 1, 0)])
            .unwrap_err()
            .contains("pair up")
    );
    assert!(
        plan_p2p(0, &[send(1, 1, 0), recv(2, 2, 0)])
            .unwrap_err()
            .contains("bytes")
    );
    // Up to MAX_P2P_OPS: one launch in call order.
    let ops: Vec<P2pOp> = (0..MAX_P2P_OPS)
        .map(|i| send(i as u64, 1, 1 + i % 3))
        .collect();
    assert_eq!(plan_p2p(0, &ops).unwrap().launches, vec![ops.clone()]);
    // More: per peer in pair order, rounds of 8 sends and 8 receives.
    let mut ops = Vec::new();
    for i in 0..10 {
        ops.push(send(100 + i, 1, 3));
        ops.push(recv(200 + i, 1, 0));
    }
    let p = plan_p2p(2, &ops).unwrap();
    let peers: Vec<Vec<(bool, usize)>> = p
        .launches
        .iter()
        .map(|l| l.iter().map(|o| (parts(o).0, parts(o).3)).collect())
        .collect();
    assert_eq!(p.launches.len(), 4);
    assert!(peers[0].iter().chain(&peers[1]).all(|&(s, q)| q == 0 && !s));
    assert!(peers[2].iter().chain(&peers[3]).all(|&(s, q)| q == 3 && s));
    assert_eq!(p.launches[0].len(), 8);
    assert_eq!(p.launches[1].len(), 2);
    assert!(p.launches.iter().all(|l| l.len() <= MAX_P2P_OPS));
    assert_eq!(p.launches[2][0], send(100, 1, 3));
}

// ---------------------------------------------------------------------------------------
// Host-transport runs

fn ranks<T: Send>(n: usize, f: impl Fn(Collectives) -> T + Sync) -> Vec<T> {
    let id = create_unique_id().unwrap();
    let comm_config = || CommConfig {
        fifo_slots: 8,
        device_timeout: Duration::from_secs(30),
        bootstrap: BootstrapConfig::default().with_timeout(Duration::from_secs(30)),
        ..CommConfig::default()
    };
    // Small scratch: several rounds and both the packet and the put paths for a few KB.
    let config = CollConfig {
        scratch_bytes: 4096,
        packet_max_bytes: 2048,
        ..CollConfig::default()
    };
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (f, config) = (&f, config.clone());
                s.spawn(move || {
                    let c = comm_config();
                    let bs =
                        BlockingBootstrap::init_with_config(n, r, id, c.bootstrap.clone()).unwrap();
                    let comm = Communicator::from_bootstrap(bs, Backend::Host, c).unwrap();
                    f(Collectives::new(comm, config).unwrap())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Runs a [`Launch`] on the host backend (the twin of [`Launch::run`]): host addresses, as
/// typed slices.
///
/// # Safety
/// The addresses are valid host buffers of the sizes NCCL's call implies.
unsafe fn run_host<T: Element>(l: &Launch, c: &Collectives) -> Result<(), CommError> {
    let n = c.nranks();
    // SAFETY (both): caller contract.
    let r = |p: u64, len: usize| unsafe { std::slice::from_raw_parts(p as *const T, len) };
    let w = |p: u64, len: usize| unsafe { std::slice::from_raw_parts_mut(p as *mut T, len) };
    match *l {
        Launch::AllReduce {
            send,
            recv,
            count,
            op,
            ..
        } if send == recv => c.all_reduce_in_place(w(recv, count), op, Exec::Host),
        Launch::AllReduce {
            send,
            recv,
            count,
            op,
            ..
        } => c.all_reduce(r(send, count), w(recv, count), op, Exec::Host),
        Launch::AllGather {
            send, recv, count, ..
        } => c.all_gather(r(send, count), w(recv, n * count), Exec::Host),
        Launch::ReduceScatter {
            send,
            recv,
            count,
            op,
            ..
        } if recv == send + (c.rank() * count * size_of::<T>()) as u64 => {
            c.reduce_scatter_in_place(w(send, n * count), op, Exec::Host)
        }
        Launch::ReduceScatter {
            send,
            recv,
            count,
            op,
            ..
        } => c.reduce_scatter(r(send, n * count), w(recv, count), op, Exec::Host),
        Launch::Reduce {
            send,
            recv,
            count,
            op,
            root,
            ..
        } if send == recv => c.reduce_in_place(w(recv, count), op, root, Exec::Host),
        Launch::Reduce {
            send,
            recv,
            count,
            op,
            root,
            ..
        } => c.reduce(r(send, count), w(recv, count), op, root, Exec::Host),
        Launch::Broadcast {
            send,
            recv,
            count,
            root,
            ..
        } if send == recv => c.broadcast_in_place(w(recv, count), root, Exec::Host),
        Launch::Broadcast {
            send,
            recv,
            count,
            root,
            ..
        } => c.broadcast(r(send, count), w(recv, count), root, Exec::Host),
        Launch::AllToAll {
            send, recv, count, ..
        } => c.all_to_all(r(send, n * count), w(recv, n * count), Exec::Host),
    }
}

/// A test element: built from small integers, compared exactly.
trait Num: Element + PartialEq + std::fmt::Debug {
    /// Floating point (an average is not truncated).
    const FLOAT: bool;
    fn of(v: i64) -> Self;
    fn f64(self) -> f64;
}
macro_rules! num {
    ($($t:ty, $float:expr => $e:expr, $back:expr;)*) => {$(
        impl Num for $t {
            const FLOAT: bool = $float;
            fn of(v: i64) -> Self {
                let f: fn(i64) -> $t = $e;
                f(v)
            }
            fn f64(self) -> f64 {
                let f: fn($t) -> f64 = $back;
                f(self)
            }
        }
    )*};
}
num! {
    f32, true => |v| v as f32, |x| x as f64;
    f64, true => |v| v as f64, |x| x;
    f16, true => |v| f16::from_f32(v as f32), |x| x.to_f64();
    bf16, true => |v| bf16::from_f32(v as f32), |x| x.to_f64();
    i8, false => |v| v as i8, |x| x as f64;
    u8, false => |v| v as u8, |x| x as f64;
    i32, false => |v| v as i32, |x| x as f64;
    u32, false => |v| v as u32, |x| x as f64;
    i64, false => |v| v, |x| x as f64;
    u64, false => |v| v as u64, |x| x as f64;
}

/// Checks a reduction's result: exact, but a float average to its type's precision (its
/// division may round differently from ours).
fn check_reduced<T: Num>(got: &[T], op: ReduceOp, n: usize, k: usize, first: usize, what: &str) {
    for (j, g) in got.iter().enumerate() {
        let i = first + j;
        if op == ReduceOp::Avg && T::FLOAT {
            let want = (0..n).map(|q| val(q, i, k)).sum::<i64>() as f64 / n as f64;
            assert!(
                (g.f64() - want).abs() <= want * 1e-2,
                "{what}: [{j}] {g:?}, want {want}"
            );
        } else {
            assert_eq!(*g, T::of(reduce(op, n, i, k)), "{what}: [{j}]");
        }
    }
}

/// Rank `q`'s value at `i` of call `k`: 1..=3 (products and sums stay exact in every type).
fn val(q: usize, i: usize, k: usize) -> i64 {
    ((q * 7 + i * 3 + k) % 3 + 1) as i64
}

fn reduce(op: ReduceOp, n: usize, i: usize, k: usize) -> i64 {
    let vs = (0..n).map(|q| val(q, i, k));
    match op {
        ReduceOp::Sum => vs.sum(),
        ReduceOp::Prod => vs.product(),
        ReduceOp::Min => vs.min().unwrap(),
        ReduceOp::Max => vs.max().unwrap(),
        ReduceOp::Avg => vs.sum::<i64>() / n as i64,
        ReduceOp::PreMulSum(_) => unreachable!("the built-in operations only"),
    }
}

fn addr<T>(v: &mut [T]) -> u64 {
    v.as_mut_ptr() as u64
}

/// Every native collective of one type on rank `c`, with NCCL's buffer layouts, in and out
/// of place; `ops` the operations tried.
fn collectives_of<T: Num>(c: &Collectives, dtype: DataType, ops: &[ReduceOp], count: usize) {
    let (n, me) = (c.nranks(), c.rank());
    let mine =
        |len: usize, k: usize| -> Vec<T> { (0..len).map(|i| T::of(val(me, i, k))).collect() };
    let run = |l: Launch| {
        // SAFETY: the buffers below live across the call, sized as NCCL's call says.
        unsafe { run_host::<T>(&l, c) }.unwrap_or_else(|e| panic!("rank {me}: {l:?}: {e}"))
    };
    for (k, &op) in ops.iter().enumerate() {
        for in_place in [false, true] {
            let what = format!("{dtype} {op:?} count {count} in_place {in_place} rank {me}");
            // All-reduce.
            let mut send = mine(count, k);
            let mut out = vec![T::of(0); count];
            let recv = if in_place {
                addr(&mut send)
            } else {
                addr(&mut out)
            };
            run(Launch::AllReduce {
                send: addr(&mut send),
                recv,
                count,
                dtype,
                op,
            });
            let got = if in_place { &send } else { &out };
            check_reduced(got, op, n, k, 0, &format!("all-reduce {what}"));
            // Reduce-scatter: recv = send + rank * count in place.
            let mut send = mine(n * count, k);
            let mut out = vec![T::of(0); count];
            let recv = if in_place {
                addr(&mut send) + (me * count * size_of::<T>()) as u64
            } else {
                addr(&mut out)
            };
            run(Launch::ReduceScatter {
                send: addr(&mut send),
                recv,
                count,
                dtype,
                op,
            });
            let got = if in_place {
                &send[me * count..(me + 1) * count]
            } else {
                &out[..]
            };
            check_reduced(got, op, n, k, me * count, &format!("reduce-scatter {what}"));
            // Reduce, to every root.
            for root in 0..n {
                let mut send = mine(count, k);
                let mut out = vec![T::of(0); count];
                let recv = if in_place {
                    addr(&mut send)
                } else {
                    addr(&mut out)
                };
                run(Launch::Reduce {
                    send: addr(&mut send),
                    recv,
                    count,
                    dtype,
                    op,
                    root,
                });
                if me == root {
                    let got = if in_place { &send } else { &out };
                    check_reduced(got, op, n, k, 0, &format!("reduce root {root} {what}"));
                }
            }
        }
    }
    for in_place in [false, true] {
        let what = format!("{dtype} count {count} in_place {in_place} rank {me}");
        // All-gather: in place, send = recv + rank * count.
        let mut out = vec![T::of(0); n * count];
        let mut own = mine(count, 9);
        if in_place {
            out[me * count..(me + 1) * count].copy_from_slice(&own);
        }
        let send = if in_place {
            addr(&mut out) + (me * count * size_of::<T>()) as u64
        } else {
            addr(&mut own)
        };
        run(Launch::AllGather {
            send,
            recv: addr(&mut out),
            count,
            dtype,
        });
        let want: Vec<T> = (0..n)
            .flat_map(|q| (0..count).map(move |i| T::of(val(q, i, 9))))
            .collect();
        assert_eq!(out, want, "all-gather {what}");
        // Broadcast (ncclBcast: in place), from every root.
        for root in 0..n {
            let mut send = mine(count, 10 + root);
            let mut out = vec![T::of(0); count];
            let recv = if in_place {
                addr(&mut send)
            } else {
                addr(&mut out)
            };
            run(Launch::Broadcast {
                send: addr(&mut send),
                recv,
                count,
                dtype,
                root,
            });
            let got = if in_place { &send } else { &out };
            let want: Vec<T> = (0..count).map(|i| T::of(val(root, i, 10 + root))).collect();
            assert_eq!(got, &want, "broadcast root {root} {what}");
        }
        // All-to-all: block p of rank q's send lands in block q of rank p's recv.
        let mut send: Vec<T> = (0..n * count).map(|i| T::of(val(me, i, 20))).collect();
        let mut out = vec![T::of(0); n * count];
        let recv = if in_place {
            addr(&mut send)
        } else {
            addr(&mut out)
        };
        run(Launch::AllToAll {
            send: addr(&mut send),
            recv,
            count,
            dtype,
        });
        let got = if in_place { &send } else { &out };
        let want: Vec<T> = (0..n)
            .flat_map(|q| (0..count).map(move |i| T::of(val(q, me * count + i, 20))))
            .collect();
        assert_eq!(got, &want, "all-to-all {what}");
    }
}

#[test]
fn native_collectives_give_nccls_results_over_the_host_transport() {
    let all = ReduceOp::ALL;
    for n in [2, 3] {
        ranks(n, |c| {
            // Across the packet limit (2 KB per pair) and over several scratch rounds.
            for count in [1, 37, 1500] {
                collectives_of::<f32>(&c, DataType::F32, &all, count);
                collectives_of::<i32>(&c, DataType::I32, &all, count);
            }
            for count in [3, 700] {
                collectives_of::<f16>(&c, DataType::F16, &all, count);
                collectives_of::<bf16>(&c, DataType::Bf16, &all, count);
                collectives_of::<f64>(&c, DataType::F64, &all, count);
                collectives_of::<u8>(&c, DataType::U8, &all, count);
                collectives_of::<i8>(&c, DataType::I8, &[ReduceOp::Sum], count);
                collectives_of::<u32>(&c, DataType::U32, &[ReduceOp::Max], count);
                collectives_of::<i64>(&c, DataType::I64, &[ReduceOp::Prod], count);
                collectives_of::<u64>(&c, DataType::U64, &[ReduceOp::Avg], count);
            }
        });
    }
}

/// Runs a rank's group as the library does at `ncclGroupEnd` (copies, then launches).
fn run_group(c: &Collectives, ops: &[P2pOp]) {
    let plan = plan_p2p(c.rank(), ops).unwrap();
    for (src, dst, bytes) in plan.self_copies {
        // SAFETY: the test's live buffers (the GPU path copies on the stream).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, bytes) };
    }
    for l in &plan.launches {
        // SAFETY: the test's live buffers.
        unsafe { c.group(l, Exec::Host) }.unwrap_or_else(|e| panic!("rank {}: {e}", c.rank()));
    }
}

#[test]
fn groups_of_sends_and_receives_run_and_pair_even_past_one_launch() {
    // Every rank sends `per` messages to every rank (itself included) and receives as many
    // from each, interleaved in a rank-dependent order: with 3 ranks and per = 4 a rank has
    // 2 * 3 * 4 = 24 operations, past one launch's 16, so the round schedule runs; with
    // per = 1, one launch. Ranks also differ in how many operations they hold (rank 0 adds
    // an empty send to rank 1, which adds the empty receive).
    for per in [1, 4, 9] {
        ranks(3, |c| {
            let (n, me) = (c.nranks(), c.rank());
            let count = 33;
            let mut sends: Vec<Vec<f32>> = (0..n * per)
                .map(|m| {
                    (0..count)
                        .map(|i| (me * 1000 + m * 10 + i) as f32)
                        .collect()
                })
                .collect();
            let mut recvs: Vec<Vec<f32>> = vec![vec![-1.0; count]; n * per];
            let mut ops = Vec::new();
            for k in 0..per {
                for j in 0..n {
                    let p = (me + j) % n;
                    let m = p * per + k;
                    let s = send(addr(&mut sends[m]), count, p);
                    let q = (me + n - j) % n;
                    let r = recv(addr(&mut recvs[q * per + k]), count, q);
                    if me % 2 == 0 {
                        ops.extend([s, r]);
                    } else {
                        ops.extend([r, s]);
                    }
                }
            }
            if me == 0 {
                ops.push(send(0, 0, 1));
            }
            if me == 1 {
                ops.push(recv(0, 0, 0));
            }
            run_group(&c, &ops);
            for q in 0..n {
                for k in 0..per {
                    // Rank q's message k to us was its sends[me * per + k].
                    let want: Vec<f32> = (0..count)
                        .map(|i| (q * 1000 + (me * per + k) * 10 + i) as f32)
                        .collect();
                    assert_eq!(
                        recvs[q * per + k],
                        want,
                        "rank {me} from {q} #{k} per {per}"
                    );
                }
            }
        });
    }
}
