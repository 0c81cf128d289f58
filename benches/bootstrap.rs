//! Bootstrap collectives against plain loopback TCP, measured in the same run.
//!
//! Ranks are tokio tasks on one runtime (2 worker threads), each with its own `Bootstrap`
//! and its own sockets, as separate processes would have. Each measurement runs the
//! collective `iters` times back to back on every rank and divides.
//!
//! References (same run, same machine):
//! - `tcp_stream`: one plain loopback TCP stream (two std threads, blocking I/O) moving the
//!   bytes the all-gather moves between ranks, n·(n−1)·size, in `size` writes.
//! - `tcp_ring`: n plain streams in a ring moving the same bytes concurrently, (n−1)·size
//!   each, with no dependency between steps: a floor for any all-gather over TCP.
//! - `tcp_round_trip`: one 1-byte ping-pong on a plain stream, for the barrier
//!   (a dissemination barrier is ceil(log2 n) one-way hops).
//!
//! At the end it prints each bootstrap mean with its ratio to the references.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use mscclpp::host::bootstrap::{Bootstrap, BootstrapConfig, create_unique_id};

const RANKS: [usize; 3] = [2, 4, 8];
const SIZES: [usize; 2] = [8, 1 << 20];

/// Total time and iterations of every measurement, by name, for the ratio table.
fn samples() -> &'static Mutex<BTreeMap<String, (Duration, u64)>> {
    static S: OnceLock<Mutex<BTreeMap<String, (Duration, u64)>>> = OnceLock::new();
    S.get_or_init(Default::default)
}

fn record(name: &str, total: Duration, iters: u64) -> Duration {
    let mut map = samples().lock().unwrap();
    let entry = map.entry(name.to_string()).or_default();
    entry.0 += total;
    entry.1 += iters;
    total
}

/// Mean time per iteration over every run of `name` (dominated by the measurement phase,
/// which runs far more iterations than the warm-up).
fn mean(name: &str) -> Option<Duration> {
    let map = samples().lock().unwrap();
    let (total, iters) = *map.get(name)?;
    (iters > 0).then(|| total / iters as u32)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn ranks(rt: &tokio::runtime::Runtime, n: usize) -> Vec<Arc<Bootstrap>> {
    rt.block_on(async {
        let id = create_unique_id().unwrap();
        let config = BootstrapConfig::new().with_timeout(Duration::from_secs(60));
        let tasks: Vec<_> = (0..n)
            .map(|r| tokio::spawn(Bootstrap::init_with_config(n, r, id, config.clone())))
            .collect();
        let mut out = Vec::new();
        for t in tasks {
            out.push(Arc::new(t.await.unwrap().unwrap()));
        }
        // Open every connection the collectives use before measuring.
        run(&out, 2, |bs| async move { bs.barrier().await.unwrap() }).await;
        out
    })
}

/// Runs `body` `iters` times on every rank concurrently; returns the elapsed time.
async fn run<F, Fut>(ranks: &[Arc<Bootstrap>], iters: u64, body: F) -> Duration
where
    F: Fn(Arc<Bootstrap>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let start = Instant::now();
    let tasks: Vec<_> = ranks
        .iter()
        .map(|bs| {
            let bs = Arc::clone(bs);
            let body = body.clone();
            tokio::spawn(async move {
                for _ in 0..iters {
                    body(Arc::clone(&bs)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    start.elapsed()
}

fn bench_barrier(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("barrier");
    for n in RANKS {
        let bs = ranks(&rt, n);
        let name = format!("barrier/{n}");
        group.bench_function(BenchmarkId::from_parameter(n), |b| {
            b.iter_custom(|iters| {
                let total =
                    rt.block_on(run(
                        &bs,
                        iters,
                        |bs| async move { bs.barrier().await.unwrap() },
                    ));
                record(&name, total, iters)
            })
        });
    }
    group.finish();
}

fn bench_all_gather(c: &mut Criterion) {
    let rt = runtime();
    let mut group = c.benchmark_group("all_gather");
    for n in RANKS {
        let bs = ranks(&rt, n);
        for size in SIZES {
            let name = format!("all_gather/{n}x{size}");
            group.throughput(Throughput::Bytes((n * (n - 1) * size) as u64));
            group.bench_function(BenchmarkId::new(format!("{n}_ranks"), size), |b| {
                b.iter_custom(|iters| {
                    let total = rt.block_on(run(&bs, iters, move |bs| async move {
                        let data = vec![bs.rank() as u8; size];
                        let all = bs.all_gather(&data).await.unwrap();
                        assert_eq!(all.len(), bs.nranks());
                    }));
                    record(&name, total, iters)
                })
            });
        }
    }
    group.finish();
}

fn pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).unwrap();
    let a = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let (b, _) = listener.accept().unwrap();
    a.set_nodelay(true).unwrap();
    b.set_nodelay(true).unwrap();
    (a, b)
}

/// Moves `chunks` writes of `size` bytes from `tx` to `rx` on two threads.
fn stream_bytes(mut tx: TcpStream, mut rx: TcpStream, size: usize, chunks: u64) {
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; size.max(1)];
        let mut left = size as u64 * chunks;
        while left > 0 {
            let want = (left as usize).min(buf.len());
            let n = rx.read(&mut buf[..want]).unwrap();
            assert!(n > 0, "reference stream closed early");
            left -= n as u64;
        }
        rx
    });
    let buf = vec![1u8; size];
    for _ in 0..chunks {
        tx.write_all(&buf).unwrap();
    }
    reader.join().unwrap();
}

fn bench_tcp_reference(c: &mut Criterion) {
    let mut group = c.benchmark_group("tcp_reference");
    for n in RANKS {
        for size in SIZES {
            let chunks = (n * (n - 1)) as u64;
            group.throughput(Throughput::Bytes(chunks * size as u64));
            let name = format!("tcp_stream/{n}x{size}");
            group.bench_function(BenchmarkId::new(format!("stream_{n}_ranks"), size), |b| {
                b.iter_custom(|iters| {
                    let (tx, rx) = pair();
                    let start = Instant::now();
                    stream_bytes(tx, rx, size, chunks * iters);
                    record(&name, start.elapsed(), iters)
                })
            });
            let name = format!("tcp_ring/{n}x{size}");
            group.bench_function(BenchmarkId::new(format!("ring_{n}_ranks"), size), |b| {
                b.iter_custom(|iters| {
                    let links: Vec<_> = (0..n).map(|_| pair()).collect();
                    let start = Instant::now();
                    let threads: Vec<_> = links
                        .into_iter()
                        .map(|(tx, rx)| {
                            std::thread::spawn(move || {
                                stream_bytes(tx, rx, size, (n as u64 - 1) * iters)
                            })
                        })
                        .collect();
                    for t in threads {
                        t.join().unwrap();
                    }
                    record(&name, start.elapsed(), iters)
                })
            });
        }
    }
    group.bench_function("round_trip_1B", |b| {
        b.iter_custom(|iters| {
            let (mut a, mut bb) = pair();
            let echo = std::thread::spawn(move || {
                let mut byte = [0u8; 1];
                for _ in 0..iters {
                    bb.read_exact(&mut byte).unwrap();
                    bb.write_all(&byte).unwrap();
                }
            });
            let start = Instant::now();
            let mut byte = [7u8; 1];
            for _ in 0..iters {
                a.write_all(&byte).unwrap();
                a.read_exact(&mut byte).unwrap();
            }
            let total = start.elapsed();
            echo.join().unwrap();
            record("tcp_round_trip", total, iters)
        })
    });
    group.finish();
}

fn us(d: Duration) -> String {
    format!("{:.1} us", d.as_secs_f64() * 1e6)
}

fn print_ratios() {
    println!("\nbootstrap vs plain loopback TCP (means of this run)");
    if let Some(rtt) = mean("tcp_round_trip") {
        println!("  tcp 1-byte round trip: {}", us(rtt));
        for n in RANKS {
            if let Some(t) = mean(&format!("barrier/{n}")) {
                let goal = if n == 8 {
                    format!(
                        "  (goal < 200 us: {})",
                        if t < Duration::from_micros(200) {
                            "met"
                        } else {
                            "NOT met"
                        }
                    )
                } else {
                    String::new()
                };
                println!(
                    "  barrier {n} ranks: {}  = {:.1}x tcp round trip{goal}",
                    us(t),
                    t.as_secs_f64() / rtt.as_secs_f64()
                );
            }
        }
    }
    for n in RANKS {
        for size in SIZES {
            let key = format!("{n}x{size}");
            let (Some(ag), Some(stream), Some(ring)) = (
                mean(&format!("all_gather/{key}")),
                mean(&format!("tcp_stream/{key}")),
                mean(&format!("tcp_ring/{key}")),
            ) else {
                continue;
            };
            let ratio = ag.as_secs_f64() / stream.as_secs_f64();
            let goal = if n == 8 && size == 1 << 20 {
                format!(
                    "  (goal <= 2x tcp stream: {})",
                    if ratio <= 2.0 { "met" } else { "NOT met" }
                )
            } else {
                String::new()
            };
            println!(
                "  all_gather {n} ranks x {size} B: {}  tcp stream {} ({ratio:.2}x)  tcp ring {} ({:.2}x){goal}",
                us(ag),
                us(stream),
                us(ring),
                ag.as_secs_f64() / ring.as_secs_f64(),
            );
        }
    }
}

fn main() {
    let mut c = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    bench_tcp_reference(&mut c);
    bench_barrier(&mut c);
    bench_all_gather(&mut c);
    c.final_summary();
    print_ratios();
}
