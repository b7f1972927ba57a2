//! Scratch holds values as registers hold them: f16 and bf16 as f32, so a 16-bit tile spilled
//! for a reduction takes as many bytes as an f32 one (sized by the storage dtype, a bf16 row
//! sum overran its shared scratch).

use super::*;
use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};

const ROW_SUM: &str = r#"
import triton
import triton.language as tl

@triton.jit
def row_sum(x_ptr, y_ptr, n, R: tl.constexpr, C: tl.constexpr):
    r = tl.program_id(0) * R + tl.arange(0, R)
    c = tl.arange(0, C)
    m = (r[:, None] < n) & (c[None, :] < 300)
    x = tl.load(x_ptr + r[:, None] * 300 + c[None, :], mask=m, other=0.0)
    tl.store(y_ptr + r, tl.sum(x * x, axis=1), mask=r < n)
"#;

fn row_sum(d: DType) -> Kernel {
    let constexprs = vec![("R".to_string(), ConstValue::Int(4)), ("C".to_string(), ConstValue::Int(512))];
    let pointer_dtypes = vec![("x_ptr".to_string(), d), ("y_ptr".to_string(), d)];
    convert(ROW_SUM, "row_sum.py", "row_sum", &ConvertOptions { constexprs, pointer_dtypes, ..ConvertOptions::default() }).unwrap()
}

#[test]
fn sixteen_bit_tiles_take_the_scratch_of_their_f32_registers() {
    let f32 = generate(&row_sum(DType::F32)).unwrap();
    assert!(f32.scratch_bytes >= 4 * 512 * 4, "{}", f32.scratch_bytes);
    for d in [DType::F16, DType::BF16] {
        let g = generate(&row_sum(d)).unwrap();
        assert_eq!(g.scratch_bytes, f32.scratch_bytes, "{d}");
    }
    assert_eq!(reg_bytes(DType::BF16), 4);
    assert_eq!(reg_bytes(DType::I1), 1);
    assert_eq!(reg_bytes(DType::F64), 8);
}

/// Scratch past static shared memory goes to dynamic shared memory where the device allows a
/// block that much, with the blocks an SM asked of the compiler no more than its shared memory
/// holds; else to global memory. (Sets the process's limits: no other test here depends on
/// them.)
#[test]
fn large_scratch_goes_to_dynamic_shared_memory_where_it_fits() {
    let constexprs = vec![("R".to_string(), ConstValue::Int(16)), ("C".to_string(), ConstValue::Int(512))];
    let pointer_dtypes = vec![("x_ptr".to_string(), DType::F64), ("y_ptr".to_string(), DType::F64)];
    let k = convert(ROW_SUM, "row_sum.py", "row_sum", &ConvertOptions { constexprs, pointer_dtypes, ..ConvertOptions::default() }).unwrap();
    set_dynamic_shared_limit(227 * 1024, 228 * 1024);
    let g = generate(&k).unwrap();
    assert!(g.scratch_bytes > SHARED_SCRATCH && g.scratch_bytes < 227 * 1024, "{}", g.scratch_bytes);
    assert_eq!(g.scratch_in, ScratchIn::DynamicShared);
    assert!(g.source.contains("extern __shared__"), "{}", g.source);
    assert_eq!(g.min_blocks as usize, (228 * 1024 / (g.scratch_bytes + 1024)).min(MAX_THREADS / g.threads as usize));
    set_dynamic_shared_limit(0, 0);
    let g = generate(&k).unwrap();
    assert_eq!(g.scratch_in, ScratchIn::Global);
    assert!(!g.source.contains("extern __shared__") && g.source.contains("A.w[9]"));
}
