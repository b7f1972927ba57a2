//! Kernels converted from the user's `@triton.jit` source, and the variants a launch needs.
//!
//! A Triton pointer argument is a raw address: a view's `data_ptr()` may lie anywhere inside its
//! storage. tilegrad's pointers are (tensor, element offset), with the tensor's bounds checked.
//! So a launch passes the whole storage as the tensor, and a pointer parameter whose view does
//! not start at element 0 gets that element offset added at the top of the kernel (a variant with
//! a hidden `i64` parameter `__base_<name>` and one `addptr`). Accesses are then bounded by the
//! storage, as on the GPU, and views, strides and aliasing behave as in Triton.

use smallvec::smallvec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tilegrad_ir::{DType, Elem, Inst, InstData, Kernel, Op, Param, ParamKind, Type};

/// The name of the hidden parameter holding the element offset of pointer parameter `p`.
pub fn base_param(p: &str) -> String {
    format!("__base_{p}")
}

/// `k` with the element offsets of the pointer parameters `ptrs` taken from hidden `i64` scalar
/// parameters (see the module docs).
pub fn with_bases(k: &Kernel, ptrs: &[String]) -> Result<Kernel, String> {
    let mut k = k.clone();
    let mut added = Vec::new();
    for name in ptrs {
        let Some(p) = k.params.iter().find(|p| p.name == *name) else {
            return Err(format!("kernel `{}` has no parameter `{name}`", k.name));
        };
        let ParamKind::Ptr(d) = p.kind else {
            return Err(format!("parameter `{name}` of kernel `{}` is not a pointer", k.name));
        };
        let pv = p.value;
        let bv = k.new_value(Type::scalar(DType::I64));
        k.params.push(Param { name: base_param(name), kind: ParamKind::Scalar(DType::I64), value: bv });
        let nv = k.new_value(Type { elem: Elem::Ptr(d), shape: Default::default() });
        for inst in &mut k.insts {
            for a in inst.args.iter_mut() {
                if *a == pv {
                    *a = nv;
                }
            }
        }
        k.insts.push(InstData { op: Op::AddPtr, args: smallvec![pv, bv], results: smallvec![nv], loc: k.loc.clone() });
        added.push(Inst(k.insts.len() as u32 - 1));
    }
    let body = k.body.index();
    k.blocks[body].insts.splice(0..0, added);
    k.canonicalize();
    tilegrad_ir::verify(&k).map_err(|e| e.to_string())?;
    Ok(k)
}

/// Variants by (pointer parameters with a base offset, promoted to f64).
type VariantCache = Mutex<HashMap<(Vec<String>, bool), Arc<Kernel>>>;

/// A converted kernel and its variants (with base offsets, promoted to f64), built on first use.
pub struct KernelVariants {
    /// The kernel as converted.
    pub kernel: Arc<Kernel>,
    variants: VariantCache,
    /// Variants (by their based pointers) whose f64 forms were queued to compile ahead.
    ahead: Mutex<Vec<Vec<String>>>,
}

impl KernelVariants {
    /// Wraps a converted kernel.
    pub fn new(kernel: Kernel) -> KernelVariants {
        KernelVariants { kernel: Arc::new(kernel), variants: Mutex::new(HashMap::new()), ahead: Mutex::new(Vec::new()) }
    }

    /// The variant taking the base offsets of `ptrs` (sorted) and, when `promote`, computing every
    /// float in f64.
    pub fn variant(&self, ptrs: &[String], promote: bool) -> Result<Arc<Kernel>, String> {
        if ptrs.is_empty() && !promote {
            return Ok(self.kernel.clone());
        }
        let key = (ptrs.to_vec(), promote);
        let mut cache = self.variants.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(k) = cache.get(&key) {
            return Ok(k.clone());
        }
        let mut k = if ptrs.is_empty() { (*self.kernel).clone() } else { with_bases(&self.kernel, ptrs)? };
        if promote {
            k = tilegrad_ir::passes::promote_floats(&k, DType::F64).map_err(|e| e.to_string())?;
        }
        let k = Arc::new(k);
        cache.insert(key, k.clone());
        Ok(k)
    }

    /// Queues, once per variant, the GPU compiles a check will need after a launch of the
    /// kernel in its own dtypes: its f64 form (the ground truth's forward, the replay of a
    /// backward) and, for a forward, that form's VJP kernel, in the background on `exec`.
    /// Whatever fails to build is left to the launch that needs it, which reports it.
    pub fn compile_ahead(&self, ptrs: &[String], forward: bool, exec: &tilegrad::check::Executor, programs: u64) {
        {
            let mut queued = self.ahead.lock().unwrap_or_else(|e| e.into_inner());
            if queued.iter().any(|p| p == ptrs) {
                return;
            }
            queued.push(ptrs.to_vec());
        }
        let Ok(f64_form) = self.variant(ptrs, true) else { return };
        let vjp = if forward { tilegrad_ad::vjp_kernel_as(&f64_form, &|_: &str, d: DType| d, DType::F64).ok() } else { None };
        let mut kernels = vec![(&*f64_form, false, programs)];
        kernels.extend(vjp.as_ref().map(|vk| (&vk.kernel, true, programs)));
        exec.precompile_in_background(&kernels, true);
    }
}
