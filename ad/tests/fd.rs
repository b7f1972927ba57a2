//! Finite differences in f64 through the reference interpreter (`tilegrad_ad::fd`), and the float
//! promotion they rely on (`tilegrad_ir::passes::promote_floats`), against analytic gradients.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tilegrad_ad::fd::{fd_directional, fd_vjp, FdSpec};
use tilegrad_ad::AdError;
use tilegrad_ir::passes::promote_floats;
use tilegrad_ir::{DType, Kernel, KernelBuilder, Op};
use tilegrad_reference::{HostTensor, Launch, Memory, TensorId};

fn rand_vec(rng: &mut StdRng, n: usize, lo: f64, hi: f64) -> Vec<f64> {
    (0..n).map(|_| rng.gen_range(lo..hi)).collect()
}

/// Asserts `|got - want| <= rtol * max(1, |want|)` elementwise.
#[track_caller]
fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = rtol * w.abs().max(1.0);
        assert!((g - w).abs() <= tol, "{what}[{i}]: got {g}, want {w} (|diff| {:e} > {tol:e})", (g - w).abs());
    }
}

/// Offsets `pid * block + arange(0, block)` and the mask `offs < n` of a 1-d kernel.
fn lanes(b: &mut KernelBuilder, block: i64, n: tilegrad_ir::Value) -> (tilegrad_ir::Value, tilegrad_ir::Value) {
    let pid = b.program_id(0);
    let bs = b.i32(block as i32);
    let start = b.mul(pid, bs);
    let r = b.arange(0, block);
    let offs = b.add(start, r);
    let mask = b.lt(offs, n);
    (offs, mask)
}

/// y = x * w elementwise; s += sum(x * w) per program (atomic_add into a 1-element tensor).
fn mul_sum(dt: DType) -> Kernel {
    let mut b = KernelBuilder::new("mul_sum");
    let x = b.ptr_param("x", dt);
    let w = b.ptr_param("w", dt);
    let y = b.ptr_param("y", dt);
    let s = b.ptr_param("s", dt);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 8, n);
    let px = b.add(x, offs);
    let xv = b.load(px, Some(mask), None);
    let pw = b.add(w, offs);
    let wv = b.load(pw, Some(mask), None);
    let p = b.mul(xv, wv);
    let py = b.add(y, offs);
    b.store(py, p, Some(mask));
    let tot = b.sum(p, None, false);
    b.atomic_add(s, tot, None);
    b.finish().unwrap()
}

#[test]
fn a_elementwise_product_and_sum_match_analytic_gradient() {
    let mut rng = StdRng::seed_from_u64(1);
    let n = 37;
    let k = mul_sum(DType::F64);
    let xs = rand_vec(&mut rng, n, -2.0, 2.0);
    let ws = rand_vec(&mut rng, n, -2.0, 2.0);
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f64(&[n], xs.clone()));
    let w = mem.add("w", HostTensor::from_f64(&[n], ws.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F64, &[n]));
    let s = mem.add("s", HostTensor::from_f64(&[1], vec![0.25]));
    let launch = Launch::new(&k, n.div_ceil(8)).arg("x", x).arg("w", w).arg("y", y).arg("s", s).arg("n", n as i32);
    let spec = FdSpec::new(&launch, &mem, [x, w], [y, s]);
    let cy = rand_vec(&mut rng, n, -1.0, 1.0);
    let cs = 0.7;
    let g = fd_vjp(&spec, &[cy.clone(), vec![cs]], 1e-3).unwrap();
    let gx: Vec<f64> = (0..n).map(|i| ws[i] * (cy[i] + cs)).collect();
    let gw: Vec<f64> = (0..n).map(|i| xs[i] * (cy[i] + cs)).collect();
    assert_close("dx", &g[0], &gx, 1e-8);
    assert_close("dw", &g[1], &gw, 1e-8);
    // The memory given is left as it was.
    assert_eq!(mem[y].as_f64().unwrap(), &vec![0.0; n][..]);
    assert_eq!(mem[s].as_f64().unwrap(), &[0.25]);
}

/// y = exp(x) * w + sin(x * x) on `dt` tensors, 16 lanes per program.
fn smooth(dt: DType) -> Kernel {
    let mut b = KernelBuilder::new("smooth");
    let x = b.ptr_param("x", dt);
    let w = b.ptr_param("w", dt);
    let y = b.ptr_param("y", dt);
    let n = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 16, n);
    let px = b.add(x, offs);
    let xv = b.load(px, Some(mask), None);
    let pw = b.add(w, offs);
    let wv = b.load(pw, Some(mask), None);
    let e = b.exp(xv);
    let a = b.mul(e, wv);
    let sq = b.mul(xv, xv);
    let sn = b.sin(sq);
    let r = b.add(a, sn);
    let py = b.add(y, offs);
    b.store(py, r, Some(mask));
    b.finish().unwrap()
}

struct Smooth {
    k: Kernel,
    mem: Memory,
    ids: [TensorId; 3],
    xs: Vec<f64>,
    ws: Vec<f64>,
    n: usize,
}

fn smooth_case(seed: u64) -> Smooth {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = 29;
    let k = smooth(DType::F32);
    // Values exactly representable in f32: the f64 gradient is that of the f32 inputs.
    let xs: Vec<f64> = rand_vec(&mut rng, n, -1.0, 1.0).iter().map(|&v| v as f32 as f64).collect();
    let ws: Vec<f64> = rand_vec(&mut rng, n, -2.0, 2.0).iter().map(|&v| v as f32 as f64).collect();
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f64_as(DType::F32, &[n], &xs));
    let w = mem.add("w", HostTensor::from_f64_as(DType::F32, &[n], &ws));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[n]));
    Smooth { k, mem, ids: [x, w, y], xs, ws, n }
}

impl Smooth {
    fn launch(&self) -> Launch<'_> {
        let [x, w, y] = self.ids;
        Launch::new(&self.k, self.n.div_ceil(16)).arg("x", x).arg("w", w).arg("y", y).arg("n", self.n as i32)
    }
}

#[test]
fn b_f32_kernel_is_differentiated_in_f64() {
    let c = smooth_case(2);
    let mut rng = StdRng::seed_from_u64(20);
    let launch = c.launch();
    let [x, w, y] = c.ids;
    let spec = FdSpec::new(&launch, &c.mem, [x, w], [y]);
    let cy = rand_vec(&mut rng, c.n, -1.0, 1.0);
    let g = fd_vjp(&spec, std::slice::from_ref(&cy), 1e-6).unwrap();
    let gx: Vec<f64> = (0..c.n).map(|i| cy[i] * (c.xs[i].exp() * c.ws[i] + 2.0 * c.xs[i] * (c.xs[i] * c.xs[i]).cos())).collect();
    let gw: Vec<f64> = (0..c.n).map(|i| cy[i] * c.xs[i].exp()).collect();
    assert_close("dx", &g[0], &gx, 1e-9);
    assert_close("dw", &g[1], &gw, 1e-9);

    // The same central difference evaluated in f32 (the kernel as written) is far off: the
    // promotion is what makes 1e-9 reachable.
    let i = 5;
    let eval32 = |t: f64| {
        let mut mem = c.mem.clone();
        let mut xs = c.xs.clone();
        xs[i] += t;
        *mem.get_mut(x) = HostTensor::from_f64_as(DType::F32, &[c.n], &xs);
        launch.run(&mut mem).unwrap();
        mem[y].to_f64_vec().iter().zip(&cy).map(|(a, b)| a * b).sum::<f64>()
    };
    let h = 1e-6;
    let g32 = (eval32(h) - eval32(-h)) / (2.0 * h);
    assert!((g32 - gx[i]).abs() > 1e-6, "f32 finite differences unexpectedly accurate: {g32} vs {}", gx[i]);
}

#[test]
fn d_directional_derivative_agrees_with_vjp() {
    let c = smooth_case(4);
    let mut rng = StdRng::seed_from_u64(40);
    let launch = c.launch();
    let [x, w, y] = c.ids;
    let spec = FdSpec::new(&launch, &c.mem, [x, w], [y]);
    let cots = vec![rand_vec(&mut rng, c.n, -1.0, 1.0)];
    let dirs = vec![rand_vec(&mut rng, c.n, -1.0, 1.0), rand_vec(&mut rng, c.n, -1.0, 1.0)];
    let g = fd_vjp(&spec, &cots, 1e-6).unwrap();
    let want: f64 = g.iter().zip(&dirs).map(|(g, v)| g.iter().zip(v).map(|(a, b)| a * b).sum::<f64>()).sum();
    let got = fd_directional(&spec, &cots, &dirs, 1e-6).unwrap();
    assert!(want.abs() > 0.1, "a degenerate direction: {want}");
    assert_close("directional", &[got], &[want], 1e-8);
    // Only one input moving: the other's term drops out.
    let dirs_x = vec![dirs[0].clone(), vec![0.0; c.n]];
    let want_x: f64 = g[0].iter().zip(&dirs[0]).map(|(a, b)| a * b).sum();
    assert_close("directional x", &[fd_directional(&spec, &cots, &dirs_x, 1e-6).unwrap()], &[want_x], 1e-8);
}

/// C = 0.5 * dot(A, B) + bias (f16, broadcast over rows), rows >= m masked; f32 A and B with
/// Triton's default (tf32) dot precision.
fn dot_kernel(m: i32) -> Kernel {
    let mut b = KernelBuilder::new("dot_bias");
    let a = b.ptr_param("a", DType::F32);
    let bm = b.ptr_param("b", DType::F32);
    let bias = b.ptr_param("bias", DType::F16);
    let c = b.ptr_param("c", DType::F32);
    let r = b.arange(0, 16);
    let rows = b.expand_dims(r, 1);
    let cols = b.expand_dims(r, 0);
    let s16 = b.i32(16);
    let roff = b.mul(rows, s16);
    let offs = b.add(roff, cols);
    let mv = b.i32(m);
    let rmask = b.lt(rows, mv);
    let pa = b.add(a, offs);
    let av = b.load(pa, Some(rmask), None);
    let pb = b.add(bm, offs);
    let bv = b.load(pb, None, None);
    let d = b.dot(av, bv, None);
    let half = b.f32(0.5);
    let d = b.mul(d, half);
    let pbias = b.add(bias, cols);
    let bb = b.load(pbias, None, None);
    let bb = b.cast(bb, DType::F32);
    let out = b.add(d, bb);
    let pc = b.add(c, offs);
    b.store(pc, out, Some(rmask));
    b.finish().unwrap()
}

struct DotCase {
    k: Kernel,
    mem: Memory,
    ids: [TensorId; 4],
    a: Vec<f64>,
    b: Vec<f64>,
    bias: Vec<f64>,
    m: usize,
}

fn dot_case() -> DotCase {
    let mut rng = StdRng::seed_from_u64(3);
    let m = 13;
    let a: Vec<f64> = rand_vec(&mut rng, m * 16, -1.0, 1.0).iter().map(|&v| v as f32 as f64).collect();
    let b: Vec<f64> = rand_vec(&mut rng, 256, -1.0, 1.0).iter().map(|&v| v as f32 as f64).collect();
    let bias: Vec<f64> = rand_vec(&mut rng, 16, -1.0, 1.0).iter().map(|&v| half::f16::from_f64(v).to_f64()).collect();
    let mut mem = Memory::new();
    let ia = mem.add("a", HostTensor::from_f64_as(DType::F32, &[m, 16], &a));
    let ib = mem.add("b", HostTensor::from_f64_as(DType::F32, &[16, 16], &b));
    let ibias = mem.add("bias", HostTensor::from_f64_as(DType::F16, &[16], &bias));
    let ic = mem.add("c", HostTensor::zeros(DType::F32, &[m, 16]));
    DotCase { k: dot_kernel(m as i32), mem, ids: [ia, ib, ibias, ic], a, b, bias, m }
}

impl DotCase {
    fn launch<'k>(&self, k: &'k Kernel) -> Launch<'k> {
        let [a, b, bias, c] = self.ids;
        Launch::new(k, 1).arg("a", a).arg("b", b).arg("bias", bias).arg("c", c)
    }

    /// C in f64.
    fn reference(&self) -> Vec<f64> {
        let mut c = vec![0.0; self.m * 16];
        for i in 0..self.m {
            for j in 0..16 {
                let d: f64 = (0..16).map(|k| self.a[i * 16 + k] * self.b[k * 16 + j]).sum();
                c[i * 16 + j] = 0.5 * d + self.bias[j];
            }
        }
        c
    }
}

#[test]
fn promoted_kernel_runs_on_f64_tensors() {
    let c = dot_case();
    let p = promote_floats(&c.k, DType::F64).unwrap();
    let mut precisions = Vec::new();
    p.walk(&mut |_, d| {
        if let Op::Dot { precision } = d.op {
            precisions.push(precision);
        }
    });
    assert_eq!(precisions, vec![tilegrad_ir::DotPrecision::Ieee]);
    let mut mem64 = Memory::new();
    for i in 0..c.mem.len() {
        let t = &c.mem[TensorId(i as u32)];
        mem64.add(c.mem.name(TensorId(i as u32)), HostTensor::from_f64(t.shape(), t.to_f64_vec()));
    }
    c.launch(&p).run(&mut mem64).unwrap();
    let want = c.reference();
    assert_close("C (promoted, f64)", mem64[c.ids[3]].as_f64().unwrap(), &want, 1e-13);
    // The original f32 launch rounds operands to tf32: visibly different.
    let mut mem = c.mem.clone();
    c.launch(&c.k).run(&mut mem).unwrap();
    let err = mem[c.ids[3]].to_f64_vec().iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    assert!(err > 1e-5, "tf32 dot unexpectedly exact: {err}");
    // The promoted kernel refuses f32 tensors: launches of it take f64 memory.
    let mut mem = c.mem.clone();
    assert!(c.launch(&p).run(&mut mem).is_err());
}

#[test]
fn b_tf32_dot_with_f16_bias_is_differentiated_exactly() {
    let c = dot_case();
    let mut rng = StdRng::seed_from_u64(30);
    let launch = c.launch(&c.k);
    let [a, b, bias, cc] = c.ids;
    let spec = FdSpec::new(&launch, &c.mem, [a, b, bias], [cc]);
    let m = c.m;
    let cot = rand_vec(&mut rng, m * 16, -1.0, 1.0);
    let g = fd_vjp(&spec, std::slice::from_ref(&cot), 1e-3).unwrap();
    // dA = 0.5 * cot B^T, dB = 0.5 * A^T cot, dbias = column sums of cot.
    let mut ga = vec![0.0; m * 16];
    let mut gb = vec![0.0; 256];
    let mut gbias = vec![0.0; 16];
    for i in 0..m {
        for j in 0..16 {
            gbias[j] += cot[i * 16 + j];
            for k in 0..16 {
                ga[i * 16 + k] += 0.5 * cot[i * 16 + j] * c.b[k * 16 + j];
                gb[k * 16 + j] += 0.5 * c.a[i * 16 + k] * cot[i * 16 + j];
            }
        }
    }
    assert_close("dA", &g[0], &ga, 1e-9);
    assert_close("dB", &g[1], &gb, 1e-9);
    assert_close("dbias", &g[2], &gbias, 1e-9);
}

#[test]
fn c_in_place_update() {
    let mut rng = StdRng::seed_from_u64(5);
    let n = 21;
    let mut b = KernelBuilder::new("axpy_inplace");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let nv = b.scalar_param("n", DType::I32);
    let (offs, mask) = lanes(&mut b, 8, nv);
    let px = b.add(x, offs);
    let xv = b.load(px, Some(mask), None);
    let py = b.add(y, offs);
    let yv = b.load(py, Some(mask), None);
    let two = b.f32(2.0);
    let t = b.mul(xv, two);
    let r = b.add(t, yv);
    b.store(px, r, Some(mask));
    let k = b.finish().unwrap();
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f64_as(DType::F32, &[n], &rand_vec(&mut rng, n, -3.0, 3.0)));
    let yi = mem.add("y", HostTensor::from_f64_as(DType::F32, &[n], &rand_vec(&mut rng, n, -3.0, 3.0)));
    let launch = Launch::new(&k, n.div_ceil(8)).arg("x", xi).arg("y", yi).arg("n", n as i32);
    // x is both an input (initial contents) and the output (final contents).
    let spec = FdSpec::new(&launch, &mem, [xi, yi], [xi]);
    let cot = rand_vec(&mut rng, n, -1.0, 1.0);
    let g = fd_vjp(&spec, std::slice::from_ref(&cot), 1e-3).unwrap();
    let two_cot: Vec<f64> = cot.iter().map(|c| 2.0 * c).collect();
    assert_close("dx (initial contents)", &g[0], &two_cot, 1e-10);
    assert_close("dy", &g[1], &cot, 1e-10);
}

#[test]
fn e_masked_lanes_get_zero_gradient() {
    let mut rng = StdRng::seed_from_u64(6);
    // x and y hold 40 elements; lanes >= n = 37 of the load are masked (they read `other`),
    // every in-bounds lane of y is stored; the last tile (32..48) is ragged.
    let (size, n) = (40usize, 37usize);
    let mut b = KernelBuilder::new("masked");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let nv = b.scalar_param("n", DType::I32);
    let sv = b.scalar_param("size", DType::I32);
    let (offs, lmask) = lanes(&mut b, 16, nv);
    let smask = b.lt(offs, sv);
    let px = b.add(x, offs);
    let other = b.f32(1.5);
    let xv = b.load(px, Some(lmask), Some(other));
    let three = b.f32(3.0);
    let lin = b.mul(xv, three);
    let sq = b.mul(xv, xv);
    let r = b.add(lin, sq);
    let py = b.add(y, offs);
    b.store(py, r, Some(smask));
    let k = b.finish().unwrap();
    let xs: Vec<f64> = rand_vec(&mut rng, size, -2.0, 2.0).iter().map(|&v| v as f32 as f64).collect();
    let mut mem = Memory::new();
    let xi = mem.add("x", HostTensor::from_f64_as(DType::F32, &[size], &xs));
    let yi = mem.add("y", HostTensor::zeros(DType::F32, &[size]));
    let launch = Launch::new(&k, size.div_ceil(16)).arg("x", xi).arg("y", yi).arg("n", n as i32).arg("size", size as i32);
    let spec = FdSpec::new(&launch, &mem, [xi], [yi]);
    let cot = rand_vec(&mut rng, size, 0.5, 1.0);
    let g = fd_vjp(&spec, std::slice::from_ref(&cot), 1e-3).unwrap();
    let want: Vec<f64> = (0..size).map(|i| if i < n { cot[i] * (3.0 + 2.0 * xs[i]) } else { 0.0 }).collect();
    assert_close("dx", &g[0], &want, 1e-9);
    for (i, gi) in g[0].iter().enumerate().skip(n) {
        assert_eq!(*gi, 0.0, "masked lane {i}");
    }
}

#[test]
fn f_specification_errors_name_the_tensor() {
    let k = mul_sum(DType::F64);
    let n = 10;
    let mut mem = Memory::new();
    let x = mem.add("x_in", HostTensor::from_f64(&[n], vec![1.0; n]));
    let w = mem.add("w_in", HostTensor::from_f64(&[n], vec![2.0; n]));
    let y = mem.add("y_out", HostTensor::zeros(DType::F64, &[n]));
    let s = mem.add("s_out", HostTensor::zeros(DType::F64, &[1]));
    let idx = mem.add("indices", HostTensor::from_i32(&[3], vec![0, 1, 2]));
    let launch = Launch::new(&k, 2).arg("x", x).arg("w", w).arg("y", y).arg("s", s).arg("n", n as i32);
    let spec_err = |inputs: &[TensorId], outputs: &[TensorId], cots: &[Vec<f64>], h: f64| -> String {
        match fd_vjp(&FdSpec::new(&launch, &mem, inputs, outputs), cots, h) {
            Err(AdError::Spec(m)) => m,
            other => panic!("expected a Spec error, got {other:?}"),
        }
    };
    let good = [vec![1.0; n], vec![1.0]];
    // Wrong cotangent length.
    let m = spec_err(&[x, w], &[y, s], &[vec![1.0; n - 1], vec![1.0]], 1e-3);
    assert!(m.contains("`y_out`") && m.contains("9 element(s)") && m.contains("has 10"), "{m}");
    // Integer input and output tensors.
    let m = spec_err(&[x, idx], &[y, s], &good, 1e-3);
    assert!(m.contains("`indices`") && m.contains("i32") && m.contains("input"), "{m}");
    let m = spec_err(&[x], &[y, idx], &[vec![1.0; n], vec![1.0; 3]], 1e-3);
    assert!(m.contains("`indices`") && m.contains("output"), "{m}");
    // Unknown tensor id, duplicates, counts, bad step.
    let m = spec_err(&[x, TensorId(99)], &[y, s], &good, 1e-3);
    assert!(m.contains("99") && m.contains("not in this memory"), "{m}");
    let m = spec_err(&[x, x], &[y, s], &good, 1e-3);
    assert!(m.contains("`x_in`") && m.contains("twice"), "{m}");
    let m = spec_err(&[x, w], &[y, s], &good[..1], 1e-3);
    assert!(m.contains("1 cotangent(s)") && m.contains("2 output"), "{m}");
    let m = spec_err(&[x, w], &[y, s], &good, 0.0);
    assert!(m.contains("step"), "{m}");
    // Direction errors.
    let spec = FdSpec::new(&launch, &mem, [x, w], [y, s]);
    match fd_directional(&spec, &good, &[vec![1.0; n], vec![1.0; n + 1]], 1e-3) {
        Err(AdError::Spec(m)) => assert!(m.contains("`w_in`") && m.contains("11 element(s)"), "{m}"),
        other => panic!("expected a Spec error, got {other:?}"),
    }
    match fd_directional(&spec, &good, &[vec![1.0; n]], 1e-3) {
        Err(AdError::Spec(m)) => assert!(m.contains("1 direction(s)"), "{m}"),
        other => panic!("expected a Spec error, got {other:?}"),
    }
    // A launch error (n larger than the tensors: out-of-bounds load) propagates as Exec.
    let bad = Launch::new(&k, 2).arg("x", x).arg("w", w).arg("y", y).arg("s", s).arg("n", 16);
    let spec = FdSpec::new(&bad, &mem, [x, w], [y, s]);
    assert!(matches!(fd_vjp(&spec, &good, 1e-3), Err(AdError::Exec(_))));
    assert!(matches!(fd_directional(&spec, &good, &[vec![0.0; n], vec![0.0; n]], 1e-3), Err(AdError::Exec(_))));
}
