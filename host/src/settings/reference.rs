//! The reference of the settings: the variables that are no field (build, tests, scripts),
//! which names are known (for the warning on unknown ones), and the guide's table.

use super::*;

/// Variables read at build time or by tests, scripts and examples only: listed in the
/// reference, and no warning when set, but no field (their readers read them as before).
pub const OTHER_VARS: &[Var] = &[
    Var {
        name: "MSCCLPP_PTX_ARCHES",
        kind: "list of sm_NN",
        default: "sm_90",
        meaning: "The GPU arches the device code is compiled for (comma-separated).",
        reader: "build: device-builder",
    },
    Var {
        name: "MSCCLPP_REQUIRE_PTXAS",
        kind: "1",
        default: "unset",
        meaning: "A missing `ptxas` fails the build instead of leaving PTX only.",
        reader: "build: device-builder",
    },
    Var {
        name: "MSCCLPP_DEVICE_TOOLCHAIN",
        kind: "toolchain name",
        default: "the pinned nightly",
        meaning: "The nightly toolchain that compiles the device code.",
        reader: "build: device-builder",
    },
    Var {
        name: "MSCCLPP_LLVM_TOOLS_DIR",
        kind: "path",
        default: "set by device-builder",
        meaning: "Internal: the LLVM tools folder device-builder gives its PTX linker.",
        reader: "build: device-builder's linker",
    },
    Var {
        name: "MSCCLPP_DEVICE_BUILD",
        kind: "auto | shipped | nightly",
        default: "auto",
        meaning: "Where the library's PTX comes from: `auto` takes `host/ptx/` while its stamp \
                  matches `device/` and else compiles with the nightly (warning), `shipped` \
                  forbids the nightly build, `nightly` always compiles.",
        reader: "build: `host/build.rs`, device-builder",
    },
    Var {
        name: "MSCCLPP_PTX_EXPORT_DIR",
        kind: "absolute path",
        default: "unset",
        meaning: "Write a fresh build of the PTX there as shipped PTX (`scripts/update-ptx.sh`).",
        reader: "build: `host/build.rs`",
    },
    Var {
        name: "MSCCLPP_REQUIRE_GPU",
        kind: "1",
        default: "unset",
        meaning: "GPU tests fail instead of skipping when no GPU opens.",
        reader: "test: `host::testing`, GPU tests",
    },
    Var {
        name: "MSCCLPP_REQUIRE_IB",
        kind: "1",
        default: "unset",
        meaning: "IB tests fail instead of skipping when no RDMA device opens.",
        reader: "test: `tests/ib_loopback.rs`",
    },
    Var {
        name: "MSCCLPP_REQUIRE_NCCL",
        kind: "1",
        default: "unset",
        meaning: "The NCCL library's fallback tests fail instead of skipping without a real NCCL.",
        reader: "test: `nccl/tests/gpu_setup_fallback.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_GPUS",
        kind: "whole number (2 to 8)",
        default: "2",
        meaning: "Ranks (GPUs) of the GPU collective tests.",
        reader: "test: GPU collective tests",
    },
    Var {
        name: "MSCCLPP_TEST_TIMEOUT_S",
        kind: "seconds",
        default: "550",
        meaning: "Time limit of the ranks of the collective test suites.",
        reader: "test: collective tests",
    },
    Var {
        name: "MSCCLPP_TEST_MAX_BYTES",
        kind: "bytes",
        default: "the suite's",
        meaning: "The largest all-reduce of the GPU collective sweep.",
        reader: "test: `tests/gpu_collectives.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_TRACE",
        kind: "1",
        default: "unset",
        meaning: "The GPU collective tests print each step of their ranks.",
        reader: "test: `tests/gpu_collectives.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_HOSTS",
        kind: "whole number (2 to 8)",
        default: "2",
        meaning: "Simulated hosts of the GPU cross-host tests.",
        reader: "test: `tests/gpu_cross_host.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_RANKS_PER_HOST",
        kind: "whole number (1 to 4)",
        default: "1",
        meaning: "Ranks per simulated host of the GPU cross-host tests.",
        reader: "test: `tests/gpu_cross_host.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_HOST_SIZES",
        kind: "list of whole numbers",
        default: "unset",
        meaning: "Hosts of different sizes in the GPU cross-host tests (`4,2`).",
        reader: "test: `tests/gpu_cross_host.rs`",
    },
    Var {
        name: "MSCCLPP_TEST_MIXED_CROSS_BUFFER",
        kind: "1",
        default: "unset",
        meaning: "The GPU cross-host tests give the ranks different `MSCCLPP_CROSS_BUFFER`s.",
        reader: "test: `tests/gpu_cross_host.rs`",
    },
    Var {
        name: "MSCCLPP_LITMUS_ITERS",
        kind: "whole number",
        default: "20000",
        meaning: "Iterations of the GPU memory-model litmus tests.",
        reader: "test: `tests/gpu_litmus.rs`",
    },
    Var {
        name: "MSCCLPP_NCCL_SO",
        kind: "path",
        default: "`target/release/libmscclpp_nccl.so`",
        meaning: "The NCCL library the comparison scripts load.",
        reader: "script: `nccl/scripts/*.sh`, `scripts/gpu-*-check.sh`",
    },
    Var {
        name: "MSCCLPP_PERF",
        kind: "path",
        default: "unset",
        meaning: "The perf tool binary a check script's kill test runs.",
        reader: "script: `scripts/gpu-x2-check.sh`",
    },
    Var {
        name: "MSCCLPP_UNDER_MPS",
        kind: "1",
        default: "unset",
        meaning: "Internal: set by `scripts/with-mps.sh` once MPS is running.",
        reader: "script: `scripts/with-mps.sh`",
    },
    Var {
        name: "MSCCLPP_CUBLAS_LIB",
        kind: "path",
        default: "searched",
        meaning: "The cuBLAS library (file or folder) of the data-parallel training example.",
        reader: "example: `examples/train-dp`",
    },
    Var {
        name: "MSCCLPP_SCALE_PER_HOST",
        kind: "whole number",
        default: "the example's",
        meaning: "Ranks per simulated host of the cross-host scaling example.",
        reader: "example: `examples/cross_host_scale.rs`",
    },
];

/// Variables a test sets for its own child processes (roles and the like): no setting, and
/// no warning. Every `MSCCLPP_TEST_*` name counts as one too.
pub const TEST_INTERNAL_VARS: &[&str] = &[
    "MSCCLPP_DIAG_TEST_CHILD",
    "MSCCLPP_ROOT_NOTICE_TEST_CHILD",
    "MSCCLPP_NCCL_TEST_ABORT_CHILD",
    "MSCCLPP_NCCL_TEST_ID",
    "MSCCLPP_NCCL_TEST_MODE",
    "MSCCLPP_NCCL_TEST_RANK",
    "MSCCLPP_NCCL_TEST_REVOKE_CHILD",
    "MSCCLPP_SCALE_ROLE",
    "MSCCLPP_SHM_CLEANUP_CASE",
    "MSCCLPP_SHM_CLEANUP_ROLE",
    "MSCCLPP_SHM_CLEANUP_VICTIM",
    "MSCCLPP_SHM_SPACE_ROLE",
    "MSCCLPP_SHM_SPACE_SCRATCH",
    "MSCCLPP_SMOKE_NO_GPU",
];

/// Whether `name` is known here: a field, another listed variable or a test's own.
pub fn is_known(name: &str) -> bool {
    VARS.iter().chain(OTHER_VARS).any(|v| v.name == name)
        || TEST_INTERNAL_VARS.contains(&name)
        || name.starts_with("MSCCLPP_TEST_")
}

/// The known name nearest `name` (at most two edits away), for a warning.
pub(super) fn nearest(name: &str) -> Option<&'static str> {
    VARS.iter()
        .chain(OTHER_VARS)
        .map(|v| (edit_distance(name, v.name), v.name))
        .filter(|&(d, _)| d <= 2)
        .min_by_key(|&(d, _)| d)
        .map(|(_, n)| n)
}

/// Levenshtein distance of two ASCII names.
pub(super) fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// Escapes `|` for a Markdown table cell and joins lines.
pub(super) fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// The reference of every setting (`docs/guide/08-settings.md`), from [`VARS`] and
/// [`OTHER_VARS`]: one table of name, type, default, meaning and reader.
pub fn reference_markdown() -> String {
    let mut out = String::new();
    out.push_str(
        "<!-- Generated from host/src/settings/ (the fields of Settings); do not edit. Regenerate with\n     \
         cargo run -p mscclpp-host --example settings_reference > docs/guide/08-settings.md\n     \
         (the test settings::tests::reference_is_current fails while this file is stale). -->\n\n",
    );
    out.push_str("# Settings\n\n");
    out.push_str(
        "Every setting of the library, the NCCL library (`libmscclpp_nccl.so`) and the perf \
         tool is a typed field of one\n`Settings` (`mscclpp_host::settings`), read from the \
         environment once per process. A value comes from,\nin order: the API \
         (`Settings::init`, called before the library's first use), the environment \
         variable, the\ndefault. Where a config of the API has the same setting (`CommConfig`, \
         `CollConfig`, `IbConfig`), the row says\nwhich wins: the variable overrides the \
         config, except the bootstrap secret, which `BootstrapConfig` sets\nfirst. A blank \
         value counts as unset. A value that does not parse fails the \
         first call that reads the settings, naming the\nvariable and the forms it accepts; an \
         `MSCCLPP_*` variable that is no setting (a typo) is named on stderr\nwith the nearest \
         known name. Sizes take `K`, `M`, `G` and `T` suffixes (powers of 1024); yes/no takes\n\
         `1`, `true`, `yes`, `on` or `0`, `false`, `no`, `off`.\n\n",
    );
    out.push_str(
        "The rows read by `build:`, `test:`, `script:` and `example:` are read by those \
         alone (at build time, by test\nharnesses, scripts and examples), as they always were. \
         Tests also set `MSCCLPP_TEST_*` and a few other names\nfor their own child processes \
         (`settings::TEST_INTERNAL_VARS`); those draw no warning.\n\n",
    );
    out.push_str("| Variable | Type | Default | Meaning | Read by |\n");
    out.push_str("| --- | --- | --- | --- | --- |\n");
    for v in VARS.iter().chain(OTHER_VARS) {
        out.push_str(&format!(
            "| `{}` | {} | {} | {} | {} |\n",
            v.name,
            cell(v.kind),
            cell(v.default),
            cell(v.meaning),
            cell(v.reader)
        ));
    }
    out
}
