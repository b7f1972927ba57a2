//! The kernel zoo: classic Triton kernels written with the Rust builder, each beside a plain-Rust
//! f64 reference and a launch helper.
//!
//! The zoo exists to exercise tilegrad on the code its users actually write: masked elementwise
//! kernels, 2-D grids, block pointers with `advance` inside loops, partial-gradient buffers reduced
//! on the host, `dot` at both precisions, whole-row reductions, two-kernel global reductions,
//! `atomic_add` and data-dependent loop trip counts. Every family has
//!
//! - builder function(s) parameterised by tile sizes (the tile sizes become constexpr parameters,
//!   which the launch helpers read back to size the grid),
//! - a reference written with simple loops in f64, independent of the IR,
//! - a `launch_*` helper that binds the arguments of the kernel (strides and sizes from the host
//!   tensors in a [`Memory`]) and runs it on the reference interpreter.
//!
//! [`run_case`] runs one named case of [`names`] end to end on random data at a ragged default size
//! and reports its error against the reference; the CLI prints these.
//!
//! ```
//! use tilegrad::zoo;
//! let kernel = zoo::vector_add(256).unwrap();
//! assert_eq!(kernel.name, "vector_add");
//! ```

// `ExecError` (the reference crate's error, which the launch helpers return as the interpreter
// does) is large; boxing it here would only hide that from the interpreter's own API.

mod atomic_sum;
mod copy;
mod grey;
mod l2_norm;
mod matmul;
mod segment_sum;
mod softmax;
mod vector_add;
mod weighted_sum;

pub use atomic_sum::*;
pub use copy::*;
pub use grey::*;
pub use l2_norm::*;
pub use matmul::*;
pub use segment_sum::*;
pub use softmax::*;
pub use vector_add::*;
pub use weighted_sum::*;

use crate::check::backend::Executor;
use crate::check::Backend;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::fmt;
use std::time::{Duration, Instant};
use tilegrad_ir::{DType, DotPrecision, IrError, Kernel, Lit, ParamKind};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory, TensorId};

/// The unit roundoff of f32 (2^-24): the relative error of one correctly rounded f32 operation.
/// Tolerances of the zoo are multiples of it: recursive or blocked summation of `n` terms in f32
/// errs by at most about `n * F32_UNIT_ROUNDOFF * sum |term|` whatever the order.
pub const F32_UNIT_ROUNDOFF: f64 = 5.960_464_477_539_063e-8;

/// What [`run_case`] measured for one zoo case.
#[derive(Clone, Debug, PartialEq)]
pub struct ZooRun {
    /// Case name (one of [`names`]).
    pub name: String,
    /// Program instances run, over all launches.
    pub programs: u64,
    /// Kernel launches.
    pub launches: usize,
    /// Active lanes loaded, over all launches.
    pub elements_loaded: u64,
    /// Active lanes stored, over all launches.
    pub elements_stored: u64,
    /// Active lanes atomically added, over all launches.
    pub elements_atomic: u64,
    /// Largest absolute difference from the f64 reference, over all outputs.
    pub max_abs_err: f64,
    /// Largest difference from the reference divided by the element's scale (see
    /// [`max_errors`]), over all outputs.
    pub max_rel_err: f64,
    /// The bound `max_rel_err` must stay within (derived from f32 rounding for the case).
    pub tolerance: f64,
    /// Time spent in the interpreter (the launches only).
    pub elapsed: Duration,
    /// Output tensors compared: name and shape.
    pub outputs: Vec<(String, Vec<usize>)>,
    /// Where the launches ran (see `check::Report::backend`).
    pub backend: String,
    /// With `Backend::Compare`: launches whose GPU run differed from the reference's.
    pub backend_mismatches: Vec<String>,
}

impl ZooRun {
    /// True when the kernel's outputs agree with the reference within the tolerance.
    pub fn passed(&self) -> bool {
        self.max_rel_err <= self.tolerance
    }
}

/// Why a zoo case could not run.
#[derive(Debug, Clone, PartialEq)]
pub enum ZooError {
    /// No case has this name.
    UnknownCase(String),
    /// A zoo kernel failed to build or verify.
    Ir(IrError),
    /// A launch failed.
    Exec(ExecError),
    /// The backend asked for cannot be used.
    Backend(String),
}

impl fmt::Display for ZooError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ZooError::UnknownCase(name) => write!(f, "no zoo case named `{name}` (cases: {})", names().join(", ")),
            ZooError::Ir(e) => write!(f, "{e}"),
            ZooError::Exec(e) => write!(f, "{e}"),
            ZooError::Backend(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ZooError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ZooError::UnknownCase(_) | ZooError::Backend(_) => None,
            ZooError::Ir(e) => Some(e),
            ZooError::Exec(e) => Some(e),
        }
    }
}

impl From<IrError> for ZooError {
    fn from(e: IrError) -> ZooError {
        ZooError::Ir(e)
    }
}

impl From<ExecError> for ZooError {
    fn from(e: ExecError) -> ZooError {
        ZooError::Exec(e)
    }
}

/// The names of the zoo cases [`run_case`] knows.
pub fn names() -> &'static [&'static str] {
    &[
        "vector_add",
        "copy",
        "rgb_to_grey",
        "weighted_sum_fwd",
        "weighted_sum_bwd",
        "matmul_ieee",
        "matmul_tf32",
        "softmax",
        "l2_norm",
        "atomic_sum",
        "segment_sum",
    ]
}

/// Runs zoo case `name` on random data (uniform in [-1, 1], from `seed`) at a default size that is
/// not a multiple of the tiles, through the reference interpreter, and compares every output with
/// the f64 reference. A result outside the tolerance is reported in the [`ZooRun`] (see
/// [`ZooRun::passed`]), not as an error.
pub fn run_case(name: &str, seed: u64) -> Result<ZooRun, ZooError> {
    run_case_on(name, seed, Backend::Cpu)
}

/// [`run_case`] with its launches on a backend ([`ZooRun::backend`] says where they ran, and
/// with [`Backend::Compare`] [`ZooRun::backend_mismatches`] where the GPU and the reference
/// differed).
pub fn run_case_on(name: &str, seed: u64, backend: Backend) -> Result<ZooRun, ZooError> {
    let exec = Executor::new(backend).map_err(|e| ZooError::Backend(e.to_string()))?;
    let mut rng = StdRng::seed_from_u64(seed);
    let mut run = CaseRun::new(name, exec);
    let mut mem = Memory::new();
    match name {
        "vector_add" => {
            let n = 10_007;
            let (xs, ys) = (uniform(&mut rng, n), uniform(&mut rng, n));
            let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
            let y = mem.add("y", HostTensor::from_f32(&[n], ys.clone()));
            let out = mem.add("out", HostTensor::zeros(DType::F32, &[n]));
            let k = vector_add(1024)?;
            run.launch(&mut mem, |m| vector_add_launch(&k, m, x, y, out))?;
            let (xd, yd) = (to_f64(&xs), to_f64(&ys));
            let scale: Vec<f64> = xd.iter().zip(&yd).map(|(a, b)| a.abs() + b.abs()).collect();
            // One f32 rounding of an exact sum.
            run.compare(&mem, out, &vector_add_ref(&xd, &yd), &scale, 2.0 * F32_UNIT_ROUNDOFF);
        }
        "copy" => {
            let n = 10_007;
            let xs = uniform(&mut rng, n);
            let src = mem.add("src", HostTensor::from_f32(&[n], xs.clone()));
            let dst = mem.add("dst", HostTensor::zeros(DType::F32, &[n]));
            let k = copy(1024)?;
            run.launch(&mut mem, |m| copy_launch(&k, m, src, dst))?;
            let xd = to_f64(&xs);
            let scale: Vec<f64> = xd.iter().map(|v| v.abs()).collect();
            // A copy is exact.
            run.compare(&mem, dst, &copy_ref(&xd), &scale, 0.0);
        }
        "rgb_to_grey" => {
            let (h, w) = (67, 93);
            let px = uniform(&mut rng, h * w * 3);
            let img = mem.add("img", HostTensor::from_f32(&[h, w, 3], px.clone()));
            let grey = mem.add("grey", HostTensor::zeros(DType::F32, &[h, w]));
            let k = rgb_to_grey(16, 32)?;
            run.launch(&mut mem, |m| rgb_to_grey_launch(&k, m, img, grey))?;
            let pd = to_f64(&px);
            let scale: Vec<f64> = pd.chunks(3).map(|c| c.iter().zip(GREY_WEIGHTS).map(|(v, w)| (v * w as f64).abs()).sum()).collect();
            // Three products and two sums, each rounded once.
            run.compare(&mem, grey, &rgb_to_grey_ref(&pd, h, w), &scale, 8.0 * F32_UNIT_ROUNDOFF);
        }
        "weighted_sum_fwd" => {
            let (rows, d) = (1000, 300);
            let (xs, ws) = (uniform(&mut rng, rows * d), uniform(&mut rng, d));
            let x = mem.add("x", HostTensor::from_f32(&[rows, d], xs.clone()));
            let wt = mem.add("weight", HostTensor::from_f32(&[d], ws.clone()));
            let out = mem.add("output", HostTensor::zeros(DType::F32, &[rows]));
            let k = weighted_sum_fwd(16, 128)?;
            run.launch(&mut mem, |m| weighted_sum_fwd_launch(&k, m, x, wt, out))?;
            let (xd, wd) = (to_f64(&xs), to_f64(&ws));
            let scale: Vec<f64> = (0..rows).map(|r| (0..d).map(|j| (xd[r * d + j] * wd[j]).abs()).sum()).collect();
            // A sum of d rounded products, in any order.
            run.compare(&mem, out, &weighted_sum_fwd_ref(&xd, &wd, rows, d), &scale, 2.0 * (d as f64 + 2.0) * F32_UNIT_ROUNDOFF);
        }
        "weighted_sum_bwd" => {
            let (rows, d, rows_tile) = (1000, 300, 16);
            let (xs, ws, gs) = (uniform(&mut rng, rows * d), uniform(&mut rng, d), uniform(&mut rng, rows));
            let x = mem.add("x", HostTensor::from_f32(&[rows, d], xs.clone()));
            let wt = mem.add("weight", HostTensor::from_f32(&[d], ws.clone()));
            let g = mem.add("grad_output", HostTensor::from_f32(&[rows], gs.clone()));
            let gx = mem.add("grad_x", HostTensor::zeros(DType::F32, &[rows, d]));
            let tiles = rows.div_ceil(rows_tile);
            let pgw = mem.add("partial_grad_weight", HostTensor::zeros(DType::F32, &[tiles, d]));
            let k = weighted_sum_bwd(rows_tile, 128)?;
            run.launch(&mut mem, |m| weighted_sum_bwd_launch(&k, m, x, wt, g, gx, pgw))?;
            let (xd, wd, gd) = (to_f64(&xs), to_f64(&ws), to_f64(&gs));
            let (gx_ref, gw_ref) = weighted_sum_bwd_ref(&xd, &wd, &gd, rows, d);
            let gx_scale: Vec<f64> = gx_ref.iter().map(|v| v.abs()).collect();
            let gw_scale: Vec<f64> = (0..d).map(|j| (0..rows).map(|r| (xd[r * d + j] * gd[r]).abs()).sum()).collect();
            // grad_x: one rounded product; grad_weight: f32 sums of `rows_tile` products per
            // tile, reduced on the host in f64.
            let tol = 2.0 * (rows_tile as f64 + 2.0) * F32_UNIT_ROUNDOFF;
            run.compare(&mem, gx, &gx_ref, &gx_scale, tol);
            let gw = sum_partial_grad_weight(mem.get(pgw));
            run.compare_values("grad_weight", vec![d], &gw, &gw_ref, &gw_scale, tol);
        }
        "matmul_ieee" | "matmul_tf32" => {
            let (m, n, kk) = (100, 70, 90);
            let (a_s, b_s) = (uniform(&mut rng, m * kk), uniform(&mut rng, kk * n));
            let a = mem.add("a", HostTensor::from_f32(&[m, kk], a_s.clone()));
            let b = mem.add("b", HostTensor::from_f32(&[kk, n], b_s.clone()));
            let c = mem.add("c", HostTensor::zeros(DType::F32, &[m, n]));
            let (precision, ad, bd) = if name == "matmul_ieee" {
                (Some(DotPrecision::Ieee), to_f64(&a_s), to_f64(&b_s))
            } else {
                // The reference gets the operands as the tensor cores see them.
                (None, a_s.iter().map(|&v| round_tf32(v) as f64).collect(), b_s.iter().map(|&v| round_tf32(v) as f64).collect())
            };
            let k = matmul(64, 64, 32, precision)?;
            run.launch(&mut mem, |m| matmul_launch(&k, m, a, b, c))?;
            // Products of tf32 values are exact in f32: only the f32 accumulation of K terms errs.
            run.compare(
                &mem,
                c,
                &matmul_ref(&ad, &bd, m, n, kk),
                &matmul_scale(&ad, &bd, m, n, kk),
                2.0 * (kk as f64 + 2.0) * F32_UNIT_ROUNDOFF,
            );
        }
        "softmax" => {
            let (rows, cols) = (50, 300);
            let xs = uniform(&mut rng, rows * cols);
            let x = mem.add("x", HostTensor::from_f32(&[rows, cols], xs.clone()));
            let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
            let k = softmax(16, cols.next_power_of_two())?;
            run.launch(&mut mem, |m| softmax_launch(&k, m, x, y))?;
            let expected = softmax_ref(&to_f64(&xs), rows, cols);
            let scale: Vec<f64> = expected.iter().map(|v| v.abs()).collect();
            // exp of an argument off by a rounding, a sum of `cols` terms, a division.
            run.compare(&mem, y, &expected, &scale, 2.0 * (cols as f64 + 8.0) * F32_UNIT_ROUNDOFF);
        }
        "l2_norm" => {
            let (n, block) = (10_007, 1024);
            let xs = uniform(&mut rng, n);
            let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
            let parts = l2_norm_num_partials(n, block);
            let partial = mem.add("partial", HostTensor::zeros(DType::F32, &[parts]));
            let out = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
            let (k1, k2) = (l2_norm_partial(block)?, l2_norm_finish(256)?);
            run.launch(&mut mem, |m| l2_norm_partial_launch(&k1, m, x, partial))?;
            run.launch(&mut mem, |m| l2_norm_finish_launch(&k2, m, partial, out))?;
            let expected = [l2_norm_ref(&to_f64(&xs))];
            // Sums of positive terms: `block` per partial, then the partials; sqrt halves it.
            run.compare(&mem, out, &expected, &expected, 2.0 * ((block + parts) as f64 + 3.0) * F32_UNIT_ROUNDOFF);
        }
        "atomic_sum" => {
            let (n, block) = (10_007, 1024);
            let xs = uniform(&mut rng, n);
            let x = mem.add("x", HostTensor::from_f32(&[n], xs.clone()));
            let out = mem.add("out", HostTensor::zeros(DType::F32, &[1]));
            let k = atomic_sum(block)?;
            run.launch(&mut mem, |m| atomic_sum_launch(&k, m, x, out))?;
            let xd = to_f64(&xs);
            let scale = [xd.iter().map(|v| v.abs()).sum::<f64>()];
            // A sum of `block` terms per program, then one atomic add per program.
            run.compare(&mem, out, &[atomic_sum_ref(&xd)], &scale, 2.0 * ((block + n.div_ceil(block)) as f64 + 2.0) * F32_UNIT_ROUNDOFF);
        }
        "segment_sum" => {
            let segments = 100;
            let (starts, lengths, total) = random_segments(&mut rng, segments, 500);
            let vs = uniform(&mut rng, total);
            let v = mem.add("values", HostTensor::from_f32(&[total], vs.clone()));
            let s = mem.add("starts", HostTensor::from_i32(&[segments], starts.clone()));
            let l = mem.add("lengths", HostTensor::from_i32(&[segments], lengths.clone()));
            let out = mem.add("out", HostTensor::zeros(DType::F32, &[segments]));
            let k = segment_sum(128)?;
            run.launch(&mut mem, |m| segment_sum_launch(&k, m, v, s, l, out))?;
            let vd = to_f64(&vs);
            let scale: Vec<f64> =
                starts.iter().zip(&lengths).map(|(&s, &l)| vd[s as usize..(s + l) as usize].iter().map(|x| x.abs()).sum()).collect();
            let max_len = lengths.iter().copied().max().unwrap_or(0) as f64;
            run.compare(&mem, out, &segment_sum_ref(&vd, &starts, &lengths), &scale, 2.0 * (max_len + 2.0) * F32_UNIT_ROUNDOFF);
        }
        _ => return Err(ZooError::UnknownCase(name.to_string())),
    }
    Ok(run.finish())
}

/// Accumulates launches and comparisons of one case.
struct CaseRun {
    run: ZooRun,
    exec: Executor,
}

impl CaseRun {
    fn new(name: &str, exec: Executor) -> CaseRun {
        CaseRun {
            exec,
            run: ZooRun {
                name: name.to_string(),
                programs: 0,
                launches: 0,
                elements_loaded: 0,
                elements_stored: 0,
                elements_atomic: 0,
                max_abs_err: 0.0,
                max_rel_err: 0.0,
                tolerance: 0.0,
                elapsed: Duration::ZERO,
                outputs: Vec::new(),
                backend: String::new(),
                backend_mismatches: Vec::new(),
            },
        }
    }

    /// Builds a launch against `mem` and runs it on the case's backend.
    fn launch<'k>(&mut self, mem: &mut Memory, build: impl FnOnce(&Memory) -> Result<Launch<'k>, ExecError>) -> Result<(), ExecError> {
        let launch = build(mem)?;
        let t0 = Instant::now();
        let s = self.exec.run(&launch, mem)?;
        self.run.elapsed += t0.elapsed();
        self.run.launches += 1;
        self.run.programs += s.programs;
        self.run.elements_loaded += s.elements_loaded;
        self.run.elements_stored += s.elements_stored;
        self.run.elements_atomic += s.elements_atomic;
        Ok(())
    }

    fn compare(&mut self, mem: &Memory, id: TensorId, expected: &[f64], scale: &[f64], tolerance: f64) {
        let t = mem.get(id);
        self.compare_values(mem.name(id), t.shape().to_vec(), &t.to_f64_vec(), expected, scale, tolerance);
    }

    /// Records one output. Outputs of one case share the case's tolerance (the largest given).
    fn compare_values(&mut self, name: &str, shape: Vec<usize>, got: &[f64], expected: &[f64], scale: &[f64], tolerance: f64) {
        let (abs, rel) = max_errors(got, expected, scale);
        self.run.max_abs_err = self.run.max_abs_err.max(abs);
        self.run.max_rel_err = self.run.max_rel_err.max(rel);
        self.run.tolerance = self.run.tolerance.max(tolerance);
        self.run.outputs.push((name.to_string(), shape));
    }

    fn finish(mut self) -> ZooRun {
        self.run.backend = self.exec.describe();
        self.run.backend_mismatches = self.exec.mismatches();
        self.run
    }
}

/// Largest absolute error `|got - expected|` and largest scaled error `|got - expected| / scale`
/// (the scale of an element is the magnitude of the computation that produced it, e.g. the sum of
/// the absolute values of the terms of a sum, so that cancellation does not inflate the error). A
/// NaN, an infinity or a length mismatch gives an infinite error.
pub fn max_errors(got: &[f64], expected: &[f64], scale: &[f64]) -> (f64, f64) {
    if got.len() != expected.len() || expected.len() != scale.len() {
        return (f64::INFINITY, f64::INFINITY);
    }
    let mut abs = 0.0f64;
    let mut rel = 0.0f64;
    for ((&g, &e), &s) in got.iter().zip(expected).zip(scale) {
        let d = (g - e).abs();
        if !d.is_finite() {
            return (f64::INFINITY, f64::INFINITY);
        }
        abs = abs.max(d);
        if d > 0.0 {
            rel = rel.max(d / s.abs().max(f64::MIN_POSITIVE));
        }
    }
    (abs, rel)
}

/// `n` f32 values uniform in [-1, 1].
pub fn uniform(rng: &mut impl Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| rng.gen_range(-1.0f32..=1.0)).collect()
}

/// Random segments for [`segment_sum`]: `(starts, lengths, total)` with lengths in
/// `0..=max_len` (some empty), segments in increasing order separated by random gaps of up to 3
/// elements that no segment covers, and `total` the length of the value array they index.
pub fn random_segments(rng: &mut impl Rng, segments: usize, max_len: i32) -> (Vec<i32>, Vec<i32>, usize) {
    let mut starts = Vec::with_capacity(segments);
    let mut lengths = Vec::with_capacity(segments);
    let mut pos = 0i32;
    for i in 0..segments {
        pos += rng.gen_range(0..=3);
        // Every fifth segment is empty, so zero-trip loops are always exercised.
        let len = if i % 5 == 2 { 0 } else { rng.gen_range(1..=max_len) };
        starts.push(pos);
        lengths.push(len);
        pos += len;
    }
    (starts, lengths, pos as usize)
}

fn to_f64(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| x as f64).collect()
}

/// The value of constexpr parameter `name` of a zoo kernel (its tile sizes), for sizing grids.
fn tile(kernel: &Kernel, name: &str) -> Result<usize, ExecError> {
    match kernel.param(name).map(|p| &p.kind) {
        Some(ParamKind::Constexpr(_, Lit::Int(v))) if *v > 0 => Ok(*v as usize),
        _ => Err(ExecError::Argument {
            kernel: kernel.name.clone(),
            param: name.into(),
            message: "expected a positive integer constexpr (is this the zoo kernel the helper launches?)".into(),
        }),
    }
}

/// The shape of tensor `id`, checked to have rank `rank`, for launch helpers.
/// The prologue of a 1-D blocked kernel: offsets `program_id(0) * BLOCK + arange(0, BLOCK)` and
/// the mask `offsets < n`. The ops are attributed to the caller's line.
#[track_caller]
fn block_offsets(
    b: &mut tilegrad_ir::KernelBuilder,
    block_v: tilegrad_ir::Value,
    block: usize,
    n: tilegrad_ir::Value,
) -> (tilegrad_ir::Value, tilegrad_ir::Value) {
    let pid = b.program_id(0);
    let start = b.mul(pid, block_v);
    let lanes = b.arange(0, block as i64);
    let offs = b.add(start, lanes);
    let mask = b.lt(offs, n);
    (offs, mask)
}

fn dims(kernel: &Kernel, mem: &Memory, id: TensorId, param: &str, rank: usize) -> Result<Vec<usize>, ExecError> {
    let s = mem.get(id).shape();
    if s.len() != rank {
        return Err(ExecError::Argument {
            kernel: kernel.name.clone(),
            param: param.into(),
            message: format!("expected a tensor of rank {rank}, got shape {s:?}"),
        });
    }
    Ok(s.to_vec())
}

/// A grid size for `n` items in tiles of `tile` (at least one program).
fn grid_for(n: usize, tile: usize) -> u32 {
    n.div_ceil(tile).max(1) as u32
}
