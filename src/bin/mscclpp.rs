//! `mscclpp`: lists the GPUs and runs the smoke kernels on each; without a GPU, runs them on
//! the Host transport (CPU threads) and says so. Exits non-zero if any check fails.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use mscclpp::host::cuda::{self, Gpu, KernelModule};
use mscclpp::host::smoke::{self, Backend, SmokeError};

fn main() -> ExitCode {
    if std::env::args().skip(1).any(|a| a == "-h" || a == "--help") {
        println!(
            "usage: mscclpp\n\nLists the GPUs and runs the smoke kernels (arch check, vector add, \
             GPU->host memory-ordering probe) on each, checking every element.\nWithout a GPU \
             they run on the Host transport (CPU threads)."
        );
        return ExitCode::SUCCESS;
    }
    println!("mscclpp {}", env!("CARGO_PKG_VERSION"));
    let embedded: Vec<String> = mscclpp::host::ptx::PTX
        .iter()
        .map(|(cc, _)| format!("sm_{cc}"))
        .collect();
    println!("embedded PTX: {}", embedded.join(", "));
    let cubins: Vec<String> = mscclpp::host::ptx::CUBIN
        .iter()
        .map(|(cc, _)| format!("sm_{cc}"))
        .collect();
    println!(
        "embedded cubin: {}",
        if cubins.is_empty() {
            "none (built without ptxas: the driver compiles the PTX on each machine's first run)"
                .to_string()
        } else {
            cubins.join(", ")
        }
    );
    let mut ok = true;
    match cuda::list_gpus() {
        Ok(gpus) => {
            for info in gpus {
                println!(
                    "GPU {}: {} (sm_{}{}, {} SMs, {:.1} GiB, PCI {})",
                    info.ordinal,
                    info.name,
                    info.compute_capability.0,
                    info.compute_capability.1,
                    info.multiprocessors,
                    info.total_memory as f64 / (1u64 << 30) as f64,
                    info.pci_bus_id
                );
                ok &= run_on_gpu(info.ordinal);
            }
        }
        Err(e) => {
            println!("no GPU ({e})");
            println!("running the smoke kernels on the Host transport (CPU threads) instead");
            ok &= run_all(Backend::Host, 1 << 12, 200);
        }
    }
    if ok {
        println!("all smoke kernels passed");
        ExitCode::SUCCESS
    } else {
        println!("FAILED");
        ExitCode::FAILURE
    }
}

fn run_on_gpu(ordinal: usize) -> bool {
    let loaded = Gpu::open(ordinal).and_then(|g| KernelModule::load_builtin(&g).map(|m| (g, m)));
    match loaded {
        Ok((gpu, module)) => {
            match module.image() {
                cuda::ImageKind::Cubin => println!("  loaded the cubin for sm_{}", module.arch()),
                cuda::ImageKind::Ptx => println!(
                    "  loaded PTX for sm_{} (compiled by the driver{})",
                    module.arch(),
                    module
                        .cubin_refused()
                        .map_or(String::new(), |why| format!(": {why}"))
                ),
            }
            run_all(Backend::Gpu(&gpu, &module), 1 << 16, 1000)
        }
        Err(e) => {
            println!("  cannot load kernels: {e}");
            false
        }
    }
}

fn run_all(backend: Backend<'_>, probe_words: usize, probe_rounds: u64) -> bool {
    let mut ok = true;
    ok &= report("arch_check (1 block x 256)", || {
        smoke::arch_check(backend, 256, 12345)
    });
    ok &= report("vector_add_f32 (1M + 3 elements)", || {
        smoke::vector_add(backend, (1 << 20) + 3, 42)
    });
    ok &= report(
        &format!("ordering_probe ({probe_rounds} rounds x {probe_words} words)"),
        || {
            smoke::ordering_probe(
                backend,
                probe_words,
                probe_rounds,
                7,
                Duration::from_secs(20),
            )
            .map(|_| ())
        },
    );
    ok
}

fn report(name: &str, f: impl FnOnce() -> Result<(), SmokeError>) -> bool {
    let t = Instant::now();
    match f() {
        Ok(()) => {
            println!("  {name}: ok ({:.1} ms)", t.elapsed().as_secs_f64() * 1e3);
            true
        }
        Err(e) => {
            println!("  {name}: FAILED: {e}");
            false
        }
    }
}
