//! Kernels shared by the root test suites.

use tilegrad_ir::{DType, Kernel, KernelBuilder};

/// Nested loops, the inner one reading and writing `acc`, the outer carrying a value that is
/// finally stored over `x` (16 lanes per program).
pub fn nested_loops_through_memory() -> Kernel {
    let mut b = KernelBuilder::new("nested");
    let x = b.ptr_param("x", DType::F32);
    let acc = b.ptr_param("acc", DType::F32);
    let pid = b.program_id(0);
    let bs = b.i32(16);
    let start = b.mul(pid, bs);
    let ar = b.arange(0, 16);
    let offs = b.add(start, ar);
    let px = b.add(x, offs);
    let pa = b.add(acc, offs);
    let xv = b.load(px, None, None);
    let (zero, two, three, one) = (b.i32(0), b.i32(2), b.i32(3), b.i32(1));
    let init = b.zeros(&[16], DType::F32);
    let res = b.for_range(zero, two, one, None, &[init], |b, _, c| {
        let inner = b.for_range(zero, three, one, None, &[c[0]], |b, _, c| {
            let a = b.load(pa, None, None);
            let s = b.sin(a);
            let v = b.mul(s, xv);
            let n = b.add(v, c[0]);
            b.store(pa, n, None);
            vec![n]
        });
        vec![b.mul(inner[0], xv)]
    });
    b.store(px, res[0], None);
    b.finish().unwrap()
}
