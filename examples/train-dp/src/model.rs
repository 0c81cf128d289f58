//! The model's shape, the flat parameter layout, gradient buckets, initialisation and the
//! synthetic data: everything both the GPU and the CPU paths agree on.

use train_dp_kernels::{input_value, unit_uniform};

/// A multi-layer perceptron: layer `l` maps `dims[l]` features to `dims[l + 1]`
/// (`y = h W^T + b`, `W` row-major `[out x in]`), with ReLU after every layer but the last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mlp {
    /// Feature counts: input, hidden..., output.
    pub dims: Vec<usize>,
    /// Offset of each layer's weight in the flat parameter (and gradient) vector.
    pub w_off: Vec<usize>,
    /// Offset of each layer's bias.
    pub b_off: Vec<usize>,
    /// Total number of parameters.
    pub params: usize,
}

impl Mlp {
    /// An MLP with these feature counts (at least one layer).
    ///
    /// The flat vector holds the layers in *backward* order (last layer first; in a layer,
    /// weight then bias), so the gradients the backward pass produces first lie at the
    /// start, and every bucket of consecutive layers is one contiguous range.
    pub fn new(dims: Vec<usize>) -> Mlp {
        assert!(dims.len() >= 2, "an MLP needs at least one layer");
        let layers = dims.len() - 1;
        let (mut w_off, mut b_off) = (vec![0; layers], vec![0; layers]);
        let mut off = 0;
        for l in (0..layers).rev() {
            w_off[l] = off;
            off += dims[l] * dims[l + 1];
            b_off[l] = off;
            off += dims[l + 1];
        }
        Mlp {
            dims,
            w_off,
            b_off,
            params: off,
        }
    }

    /// `layers` layers of `width` features in and out.
    pub fn square(layers: usize, width: usize) -> Mlp {
        Mlp::new(vec![width; layers + 1])
    }

    /// Number of layers.
    pub fn layers(&self) -> usize {
        self.dims.len() - 1
    }

    /// Input features.
    pub fn input(&self) -> usize {
        self.dims[0]
    }

    /// Output features.
    pub fn output(&self) -> usize {
        self.dims[self.layers()]
    }

    /// The range of layer `l`'s parameters (weight and bias) in the flat vector.
    pub fn layer_range(&self, l: usize) -> std::ops::Range<usize> {
        self.w_off[l]..self.b_off[l] + self.dims[l + 1]
    }

    /// Initial parameters from `seed`: weights uniform with variance `2 / in` before a
    /// ReLU and `1 / in` for the last layer (He / LeCun), biases uniform in
    /// `+-1 / sqrt(in)` scaled by `bias_scale`.
    pub fn init(&self, seed: u64, bias_scale: f32) -> Vec<f32> {
        let mut p = vec![0.0f32; self.params];
        for l in 0..self.layers() {
            let (fan_in, out) = (self.dims[l], self.dims[l + 1]);
            let gain = if l + 1 < self.layers() { 6.0 } else { 3.0 };
            let bound = (gain / fan_in as f64).sqrt() as f32;
            for (i, w) in p[self.w_off[l]..self.w_off[l] + out * fan_in]
                .iter_mut()
                .enumerate()
            {
                *w = bound * (2.0 * unit_uniform(seed, 2 * l as u64, i as u64) - 1.0);
            }
            let bb = bias_scale / (fan_in as f32).sqrt();
            for (i, b) in p[self.b_off[l]..self.b_off[l] + out].iter_mut().enumerate() {
                *b = bb * (2.0 * unit_uniform(seed, 2 * l as u64 + 1, i as u64) - 1.0);
            }
        }
        p
    }
}

/// The teacher that labels the data: a fixed random MLP `[width, hidden, width]`.
pub fn teacher(width: usize, hidden: usize) -> Mlp {
    Mlp::new(vec![width, hidden, width])
}

/// Seeds derived from the run's seed.
pub mod seeds {
    /// The student's initial parameters.
    pub fn student(seed: u64) -> u64 {
        seed ^ 0x5354_5544_454e_5401
    }
    /// The teacher's parameters.
    pub fn teacher(seed: u64) -> u64 {
        seed ^ 0x5445_4143_4845_5202
    }
    /// The inputs.
    pub fn data(seed: u64) -> u64 {
        seed ^ 0x4441_5441_0000_0003
    }
}

/// Inputs of `rows` samples starting at global sample `first` (row-major `rows x width`),
/// bit-identical to the GPU's `gen_inputs`.
pub fn inputs(data_seed: u64, first: u64, rows: usize, width: usize) -> Vec<f32> {
    let mut x = Vec::with_capacity(rows * width);
    for r in 0..rows as u64 {
        for c in 0..width as u64 {
            x.push(input_value(data_seed, first + r, c));
        }
    }
    x
}

/// One gradient bucket: the contiguous range `start..end` of the flat gradient holding the
/// layers `lo..=hi`; it is complete once the backward pass has produced layer `lo`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bucket {
    /// First element.
    pub start: usize,
    /// One past the last element.
    pub end: usize,
    /// Lowest layer in the bucket (the last one the backward pass produces).
    pub lo: usize,
    /// Highest layer in the bucket.
    pub hi: usize,
}

impl Bucket {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the bucket holds nothing (never, for buckets from [`buckets`]).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// Buckets as PyTorch DDP forms them: whole layers in backward order (last layer first),
/// a bucket closed once it holds at least `cap_elems` elements (so a layer larger than the
/// cap gets a bucket of its own), the last one holding what is left. In the order the
/// backward pass completes them, which is also their order in the flat vector.
pub fn buckets(mlp: &Mlp, cap_elems: usize) -> Vec<Bucket> {
    let mut out = Vec::new();
    let mut open: Option<Bucket> = None;
    for l in (0..mlp.layers()).rev() {
        let r = mlp.layer_range(l);
        let b = match open.take() {
            None => Bucket {
                start: r.start,
                end: r.end,
                lo: l,
                hi: l,
            },
            Some(b) => {
                debug_assert_eq!(b.end, r.start);
                Bucket {
                    end: r.end,
                    lo: l,
                    ..b
                }
            }
        };
        debug_assert!(!b.is_empty());
        if b.len() >= cap_elems.max(1) {
            out.push(b);
        } else {
            open = Some(b);
        }
    }
    out.extend(open);
    out
}

/// FNV-1a over the bits of `v`: the parameter checksum the ranks compare.
pub fn checksum(v: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for x in v {
        for b in x.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every gradient element in exactly one bucket, buckets contiguous, in backward order,
    /// holding whole layers, each layer in the bucket its range says.
    fn check_cover(mlp: &Mlp, cap: usize, bs: &[Bucket]) -> Result<(), String> {
        let mut seen = vec![0u8; mlp.params];
        let mut next = 0;
        let mut next_layer = mlp.layers();
        for (i, b) in bs.iter().enumerate() {
            if b.start != next {
                return Err(format!("bucket {i} starts at {}, expected {next}", b.start));
            }
            if b.is_empty() || b.lo > b.hi || b.hi + 1 != next_layer {
                return Err(format!("bucket {i} {b:?}: bad layer range"));
            }
            for l in b.lo..=b.hi {
                let r = mlp.layer_range(l);
                if r.start < b.start || r.end > b.end {
                    return Err(format!("layer {l} {r:?} outside bucket {i} {b:?}"));
                }
            }
            let inner: usize = (b.lo..=b.hi).map(|l| mlp.layer_range(l).len()).sum();
            if inner != b.len() {
                return Err(format!(
                    "bucket {i}: {} elements, layers hold {inner}",
                    b.len()
                ));
            }
            // Closed at the cap: all but the last bucket reach it, and without its lowest
            // layer a bucket would not have.
            if i + 1 < bs.len() {
                if b.len() < cap.max(1) {
                    return Err(format!("bucket {i} closed below the cap"));
                }
                if b.lo < b.hi && b.len() - mlp.layer_range(b.lo).len() >= cap {
                    return Err(format!("bucket {i} should have closed one layer earlier"));
                }
            }
            for s in &mut seen[b.start..b.end] {
                *s += 1;
            }
            next = b.end;
            next_layer = b.lo;
        }
        if next != mlp.params || next_layer != 0 {
            return Err(format!("buckets end at {next} (layer {next_layer})"));
        }
        if let Some(i) = seen.iter().position(|&c| c != 1) {
            return Err(format!("element {i} covered {} times", seen[i]));
        }
        Ok(())
    }

    #[test]
    fn buckets_cover_every_gradient_once() {
        let shapes = [
            vec![4, 4],
            vec![32, 32, 32, 32],
            vec![7, 13, 5, 11, 3],
            vec![64, 16, 64],
            vec![1000, 3, 2000, 1],
        ];
        for dims in shapes {
            let mlp = Mlp::new(dims.clone());
            for cap in [0, 1, 5, 17, 100, 1000, 4096, 10_000, 1 << 30] {
                check_cover(&mlp, cap, &buckets(&mlp, cap))
                    .unwrap_or_else(|e| panic!("{dims:?} cap {cap}: {e}"));
            }
        }
    }

    #[test]
    fn cover_check_rejects_bad_buckets() {
        // The checker itself must be able to fail: a hole, an overlap, a missing bucket,
        // buckets out of backward order, a bucket left open past the cap.
        let mlp = Mlp::new(vec![8, 8, 8, 8]);
        let good = buckets(&mlp, 1);
        assert_eq!(good.len(), 3);
        check_cover(&mlp, 1, &good).unwrap();
        let mut hole = good.clone();
        hole[1].start += 1;
        assert!(check_cover(&mlp, 1, &hole).is_err());
        let mut overlap = good.clone();
        overlap[1].start -= 1;
        assert!(check_cover(&mlp, 1, &overlap).is_err());
        assert!(check_cover(&mlp, 1, &good[..2]).is_err());
        let mut swapped = good.clone();
        swapped.swap(0, 1);
        assert!(check_cover(&mlp, 1, &swapped).is_err());
        let merged = [
            Bucket {
                end: good[1].end,
                lo: good[1].lo,
                ..good[0]
            },
            good[2],
        ];
        assert!(check_cover(&mlp, 1, &merged).is_err());
    }

    #[test]
    fn layout_backward_order() {
        let mlp = Mlp::new(vec![3, 5, 2]);
        assert_eq!(mlp.params, 3 * 5 + 5 + 5 * 2 + 2);
        assert_eq!(mlp.w_off[1], 0);
        assert_eq!(mlp.b_off[1], 10);
        assert_eq!(mlp.w_off[0], 12);
        assert_eq!(mlp.b_off[0], 27);
    }

    #[test]
    fn big_layers_get_own_buckets() {
        // The communication-heavy preset: 8192-wide layers are 256 MiB each, above 25 MiB.
        let mlp = Mlp::square(4, 8192);
        let bs = buckets(&mlp, (25 << 20) / 4);
        assert_eq!(bs.len(), 4);
        assert!(bs.iter().all(|b| b.lo == b.hi));
        assert!(mlp.params >= 200_000_000);
    }
}
