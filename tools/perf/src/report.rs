//! What a run measures and how it is printed: element counts per size, nccl-tests' bus
//! bandwidth factors, the rows and their table.

use serde::{Deserialize, Serialize};

use crate::host::collectives::DataType;

use super::args::Collective;

/// Elements and bytes of one size of the sweep, rounded as nccl-tests rounds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// The size column: all-reduce, broadcast, reduce, send/recv: bytes per rank;
    /// all-gather: total output bytes; reduce-scatter, all-to-all: one rank's whole input.
    pub bytes: u64,
    /// The count column: elements of `bytes`.
    pub count: u64,
    /// Elements each rank sends (all-gather: `count / nranks`; the others: `count`).
    pub send_count: u64,
}

/// The shape of `size` bytes, or `None` when it holds no element (per rank, for
/// all-gather). All-gather sends a multiple of 16 bytes per rank, as in nccl-tests.
pub fn shape(collective: Collective, size: u64, dtype: DataType, nranks: usize) -> Option<Shape> {
    let elt = dtype.size() as u64;
    let nranks = nranks.max(1) as u64;
    let s = match collective {
        Collective::AllReduce
        | Collective::Broadcast
        | Collective::Reduce
        | Collective::SendRecv => {
            let count = size / elt;
            Shape {
                bytes: count * elt,
                count,
                send_count: count,
            }
        }
        Collective::AllGather => {
            let per_rank = size / elt / nranks / align_elements(elt) * align_elements(elt);
            Shape {
                bytes: per_rank * nranks * elt,
                count: per_rank * nranks,
                send_count: per_rank,
            }
        }
        Collective::ReduceScatter | Collective::AllToAll => {
            // Whole input per rank: one block of `per_rank` elements per rank.
            let per_rank = size / elt / nranks / align_elements(elt) * align_elements(elt);
            Shape {
                bytes: per_rank * nranks * elt,
                count: per_rank * nranks,
                send_count: per_rank * nranks,
            }
        }
    };
    (s.count > 0).then_some(s)
}

/// Elements of `elt` bytes in 16 bytes (at least 1): nccl-tests rounds the per-rank count
/// of all-gather, reduce-scatter and all-to-all down to a multiple of it.
fn align_elements(elt: u64) -> u64 {
    (16 / elt).max(1)
}

/// Why a size of the sweep has no shape: what a rank's part must hold.
pub fn too_small(collective: Collective) -> &'static str {
    match collective {
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
            "less than 16 bytes per rank (nccl-tests rounds each rank's part down to a \
             multiple of 16 bytes)"
        }
        _ => "less than one element",
    }
}

/// nccl-tests' bus bandwidth factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter and
/// all-to-all (n-1)/n; broadcast, reduce and send/recv 1.
pub fn bus_factor(collective: Collective, nranks: usize) -> f64 {
    let n = nranks.max(1) as f64;
    match collective {
        Collective::AllReduce => 2.0 * (n - 1.0) / n,
        Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => (n - 1.0) / n,
        Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
    }
}

/// Elements of a rank's output of `shape`: reduce-scatter `count / nranks`, else `count`.
pub fn out_count(collective: Collective, shape: &Shape, nranks: usize) -> u64 {
    match collective {
        Collective::ReduceScatter => shape.count / nranks.max(1) as u64,
        _ => shape.count,
    }
}

/// One measurement: the time (max over ranks) and what follows from it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Microseconds per operation.
    pub time_us: f64,
    /// Algorithm bandwidth: size column / time, GB/s.
    pub algbw_gbps: f64,
    /// Bus bandwidth: algbw × the collective's factor, GB/s.
    pub busbw_gbps: f64,
    /// Mismatching elements summed over ranks; `None` when not checked.
    pub wrong: Option<u64>,
    /// CPU time to queue one operation (the library call returning, launches included),
    /// microseconds, max over ranks, from the timed loop of plain launches; `None` under
    /// a CUDA graph and on the Host transport. When it is close to `time_us`, the plain
    /// loop was bound by the host, not the GPU.
    #[serde(default)]
    pub host_us: Option<f64>,
}

impl Measurement {
    /// Bandwidths of `bytes` moved in `time_us`.
    pub fn new(bytes: u64, time_us: f64, factor: f64, wrong: Option<u64>) -> Measurement {
        let algbw = if time_us > 0.0 {
            bytes as f64 / time_us / 1e3
        } else {
            0.0
        };
        Measurement {
            time_us,
            algbw_gbps: algbw,
            busbw_gbps: algbw * factor,
            wrong,
            host_us: None,
        }
    }
}

/// Out-of-place and in-place measurements of one library.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// Distinct send and receive buffers.
    pub out_of_place: Measurement,
    /// Send and receive in one buffer (all-gather: the send is the rank's slot).
    pub in_place: Measurement,
}

/// One line of the table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The size column, bytes.
    pub bytes: u64,
    /// The count column, elements.
    pub count: u64,
    /// Data type name (nccl-tests' spelling).
    pub dtype: String,
    /// Reduction (`sum`), `none` for all-gather.
    pub redop: String,
    /// The algorithm mscclpp ran.
    pub algo: String,
    /// mscclpp.
    pub mscclpp: Pair,
    /// NCCL, with `--compare nccl`.
    pub nccl: Option<Pair>,
}

/// The ratio printed next to NCCL: ours busbw / NCCL busbw (= NCCL time / ours time).
pub fn ratio(ours: &Measurement, nccl: &Measurement) -> f64 {
    if ours.time_us > 0.0 {
        nccl.time_us / ours.time_us
    } else {
        0.0
    }
}

struct Col {
    title: &'static str,
    unit: &'static str,
    width: usize,
}

const fn col(title: &'static str, unit: &'static str, width: usize) -> Col {
    Col { title, unit, width }
}

const LEAD: [Col; 5] = [
    col("size", "(B)", 12),
    col("count", "(elements)", 12),
    col("type", "", 8),
    col("redop", "", 6),
    col("algo", "", 8),
];
const OURS: [Col; 4] = [
    col("time", "(us)", 8),
    col("algbw", "(GB/s)", 7),
    col("busbw", "(GB/s)", 7),
    col("#wrong", "", 6),
];
const THEIRS: [Col; 4] = [
    col("time", "(us)", 8),
    col("busbw", "(GB/s)", 7),
    col("#wrong", "", 6),
    col("ratio", "", 6),
];

fn columns(compare: bool) -> (Vec<&'static Col>, Vec<(String, usize, usize)>) {
    let mut cols: Vec<&Col> = LEAD.iter().collect();
    let mut groups = Vec::new();
    for place in ["out-of-place", "in-place"] {
        let start = cols.len();
        cols.extend(OURS.iter());
        groups.push((place.to_string(), start, cols.len()));
        if compare {
            let start = cols.len();
            cols.extend(THEIRS.iter());
            groups.push((format!("NCCL {place}"), start, cols.len()));
        }
    }
    (cols, groups)
}

fn join(first: char, cols: &[&Col], cells: &[String]) -> String {
    let mut line = String::new();
    line.push(first);
    for (i, (c, cell)) in cols.iter().zip(cells).enumerate() {
        if i > 0 {
            line.push(' ');
        }
        line.push_str(&format!("{cell:>w$}", w = c.width));
    }
    line.trim_end().to_string()
}

/// The three header lines (group labels, titles, units), nccl-tests style.
pub fn header(compare: bool) -> Vec<String> {
    let (cols, groups) = columns(compare);
    let titles: Vec<String> = cols.iter().map(|c| c.title.to_string()).collect();
    let units: Vec<String> = cols.iter().map(|c| c.unit.to_string()).collect();
    // Group labels centred over their columns.
    let mut label = String::from("#");
    let mut offset = 1;
    let mut starts = Vec::new();
    for c in &cols {
        starts.push(offset);
        offset += c.width + 1;
    }
    for (name, start, end) in &groups {
        let from = starts[*start];
        let to = starts[end - 1] + cols[end - 1].width;
        let pad = (to - from).saturating_sub(name.len()) / 2;
        let at = from + pad;
        while label.len() < at {
            label.push(' ');
        }
        label.push_str(name);
    }
    vec![label, join('#', &cols, &titles), join('#', &cols, &units)]
}

/// nccl-tests' time format: fewer decimals as the number grows.
pub fn format_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

fn wrong(w: Option<u64>) -> String {
    w.map_or_else(|| "N/A".to_string(), |n| n.to_string())
}

/// One row of the table.
pub fn format_row(row: &Row) -> String {
    let compare = row.nccl.is_some();
    let (cols, _) = columns(compare);
    let mut cells = vec![
        row.bytes.to_string(),
        row.count.to_string(),
        row.dtype.clone(),
        row.redop.clone(),
        row.algo.clone(),
    ];
    let ours = [row.mscclpp.out_of_place, row.mscclpp.in_place];
    let theirs = row.nccl.map(|n| [n.out_of_place, n.in_place]);
    for i in 0..2 {
        let m = &ours[i];
        cells.push(format_time(m.time_us));
        cells.push(format!("{:.2}", m.algbw_gbps));
        cells.push(format!("{:.2}", m.busbw_gbps));
        cells.push(wrong(m.wrong));
        if let Some(t) = &theirs {
            let n = &t[i];
            cells.push(format_time(n.time_us));
            cells.push(format!("{:.2}", n.busbw_gbps));
            cells.push(wrong(n.wrong));
            cells.push(format!("{:.2}", ratio(m, n)));
        }
    }
    join(' ', &cols, &cells)
}

/// The closing lines: average bus bandwidth (over both placements, as nccl-tests), NCCL's
/// and the ratio, the host time per queued call (plain launches), and the total of wrong
/// elements.
pub fn summary(rows: &[Row]) -> Vec<String> {
    let avg = |f: &dyn Fn(&Row) -> Option<[f64; 2]>| {
        let v: Vec<f64> = rows.iter().filter_map(f).flatten().collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let ours = avg(&|r| {
        Some([
            r.mscclpp.out_of_place.busbw_gbps,
            r.mscclpp.in_place.busbw_gbps,
        ])
    });
    let nccl = avg(&|r| {
        r.nccl
            .map(|n| [n.out_of_place.busbw_gbps, n.in_place.busbw_gbps])
    });
    let mut out = Vec::new();
    out.push(format!(
        "# Avg bus bandwidth    : {:.3} GB/s",
        ours.unwrap_or(0.0)
    ));
    if let Some(n) = nccl {
        let r = ours.map_or(0.0, |o| if n > 0.0 { o / n } else { 0.0 });
        out.push(format!(
            "# Avg bus bandwidth NCCL: {n:.3} GB/s (mscclpp/NCCL {r:.2})"
        ));
    }
    out.extend(ratio_lines(rows));
    out.extend(host_line(rows));
    let wrong = total_wrong(rows);
    match wrong {
        None => out.push("# Out of bounds values : N/A (not checked: -c 0)".into()),
        Some(0) => out.push("# Out of bounds values : 0 OK".into()),
        Some(n) => out.push(format!("# Out of bounds values : {n} FAILED")),
    }
    out
}

/// The CPU time per queued call of the plain-launch rows, as `min-max` over sizes and
/// placements, for each library that has one: a line, or nothing under a CUDA graph and on
/// the Host transport.
pub fn host_line(rows: &[Row]) -> Option<String> {
    let range = |f: &dyn Fn(&Row) -> Option<Pair>| {
        let v: Vec<f64> = rows
            .iter()
            .filter_map(f)
            .flat_map(|p| [p.out_of_place.host_us, p.in_place.host_us])
            .flatten()
            .collect();
        let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        (!v.is_empty()).then(|| format!("{lo:.2}-{hi:.2} us"))
    };
    let ours = range(&|r| Some(r.mscclpp))?;
    let nccl = range(&|r| r.nccl)
        .map(|n| format!(", NCCL {n}"))
        .unwrap_or_default();
    Some(format!(
        "# Host time per queued call (plain launches, max over ranks): mscclpp {ours}{nccl}"
    ))
}

/// Largest size (bytes) of the "small" geometric mean: the issues' goal is a mean ratio of
/// at least 1.5 up to 1 MB.
pub const SMALL_MAX_BYTES: u64 = 1 << 20;

/// Geometric mean of the ratios (NCCL time / ours) of `rows` in one placement, and the
/// lowest with its size; `None` without NCCL rows (or no positive ratio).
pub fn ratio_stats(rows: &[&Row], in_place: bool) -> Option<(f64, f64, u64)> {
    let pick = |p: &Pair| {
        if in_place { p.in_place } else { p.out_of_place }
    };
    let rs: Vec<(f64, u64)> = rows
        .iter()
        .filter_map(|r| {
            r.nccl
                .map(|n| (ratio(&pick(&r.mscclpp), &pick(&n)), r.bytes))
        })
        .filter(|&(x, _)| x > 0.0)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let geo = (rs.iter().map(|&(x, _)| x.ln()).sum::<f64>() / rs.len() as f64).exp();
    let (low, at) = rs.iter().copied().fold(
        (f64::INFINITY, 0),
        |m, (x, b)| if x < m.0 { (x, b) } else { m },
    );
    Some((geo, low, at))
}

/// With NCCL side by side: the geometric mean of the ratios up to [`SMALL_MAX_BYTES`] and
/// over every size, each placement, and the lowest row.
fn ratio_lines(rows: &[Row]) -> Vec<String> {
    let mut out = Vec::new();
    let small: Vec<&Row> = rows.iter().filter(|r| r.bytes <= SMALL_MAX_BYTES).collect();
    let all: Vec<&Row> = rows.iter().collect();
    for (what, set) in [("up to 1 MB", &small), ("all sizes", &all)] {
        let (Some(o), Some(i)) = (ratio_stats(set, false), ratio_stats(set, true)) else {
            continue;
        };
        out.push(format!(
            "# Ratio NCCL/mscclpp, geometric mean {what}: {:.2} out of place, {:.2} in place \
             ({} sizes; lowest {:.2} at {} B)",
            o.0,
            i.0,
            set.len(),
            o.1.min(i.1),
            if o.1 <= i.1 { o.2 } else { i.2 }
        ));
    }
    out
}

/// Sum of every `#wrong` (both libraries), `None` when nothing was checked.
pub fn total_wrong(rows: &[Row]) -> Option<u64> {
    let mut total = None;
    for r in rows {
        let pairs = std::iter::once(r.mscclpp).chain(r.nccl);
        for p in pairs {
            for m in [p.out_of_place, p.in_place] {
                if let Some(w) = m.wrong {
                    *total.get_or_insert(0) += w;
                }
            }
        }
    }
    total
}
