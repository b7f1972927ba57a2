//! Outputs written in place. The fast path writes a launch's stores into a buffer that starts
//! as a copy of the output's initial contents, so a large output costs twice its size while the
//! launch runs. Where nothing needs those initial contents apart from the buffer (no clone shares
//! the tensor, the kernel only stores through it, and every element holds one value, as a fresh
//! `empty` or `zeros` allocation does), the tensor's own storage becomes the buffer and the
//! memory keeps a placeholder of zeros the system maps only when touched. Should the fast path
//! fail (a race: the exact path then commits in program order from the initial contents), the
//! tensor is filled with its value again and the launch runs as if nothing had been taken.

use super::plan::Plan;
use crate::launch::{Bound, Launch, Memory, RaceMode, TensorId};
use crate::tensor::{Data, HostTensor};
use rayon::prelude::*;

/// Tensors smaller than this are copied as before: below glibc's mmap threshold (set in
/// [`super::alloc`]) a placeholder of zeros would be written too, and a copy is cheap.
const MIN_BYTES: usize = 32 << 20;

/// A tensor's storage taken for a launch to write in place, and its one value (a single
/// element) to fill it with again.
pub(crate) struct Donated {
    pub tensor: TensorId,
    pub data: Option<Data>,
    fill: Data,
}

/// Takes from `mem` the storage of every tensor that launch `l` may write in place (see the
/// module's documentation), leaving placeholders.
pub(crate) fn take(l: &Launch, bound: &[Bound], mem: &mut Memory, plan: &Plan) -> Vec<Donated> {
    let fast = !plan.ordered && !l.options.exact && l.options.races == RaceMode::Error;
    if !fast || !plan.while_deps.is_empty() {
        return Vec::new();
    }
    let uses = tilegrad_ir::analysis::param_uses(l.kernel);
    let mut out = Vec::new();
    for b in bound {
        let Bound::Tensor(t) = *b else { continue };
        if out.iter().any(|d: &Donated| d.tensor == t) || !only_stored(l, bound, &uses, t) {
            continue;
        }
        let ten = mem.get(t);
        if ten.numel() * ten.dtype().size_bytes() < MIN_BYTES || !ten.is_unique() || !uniform(ten.data()) {
            continue;
        }
        let placeholder = HostTensor::zeros(ten.dtype(), ten.shape());
        let data = mem.set(t, placeholder).try_into_data().expect("checked unique");
        let fill = first(&data);
        out.push(Donated { tensor: t, data: Some(data), fill });
    }
    out
}

/// Puts back every donated tensor as it was before the launch.
pub(crate) fn restore(mem: &mut Memory, donated: Vec<Donated>) {
    for d in donated {
        let t = mem.get(d.tensor);
        let n = t.numel();
        let data = repeat(&d.fill, n);
        let back = HostTensor::new(t.dtype(), t.shape(), data).expect("same dtype and shape");
        mem.set(d.tensor, back);
    }
}

/// Whether every parameter bound to tensor `t` is only stored through: no load, no atomic, not
/// scratch.
fn only_stored(l: &Launch, bound: &[Bound], uses: &[tilegrad_ir::analysis::ParamUse], t: TensorId) -> bool {
    bound
        .iter()
        .zip(uses)
        .zip(&l.kernel.params)
        .filter(|((b, _), _)| matches!(b, Bound::Tensor(x) if *x == t))
        .all(|((_, u), p)| u.stored && !u.loaded && !u.atomic && !l.options.scratch.contains(&p.name))
}

/// Whether every element of `d` has the bits of the first.
fn uniform(d: &Data) -> bool {
    fn all_as<T: Copy + Sync, B: PartialEq + Sync>(v: &[T], bits: impl Fn(T) -> B + Sync) -> bool {
        let Some(&x) = v.first() else { return false };
        let b0 = bits(x);
        v.par_chunks(1 << 16).all(|c| c.iter().all(|&y| bits(y) == b0))
    }
    match d {
        Data::I1(v) => all_as(v, |x| x),
        Data::I32(v) => all_as(v, |x| x),
        Data::I64(v) => all_as(v, |x| x),
        Data::F32(v) => all_as(v, f32::to_bits),
        Data::F64(v) => all_as(v, f64::to_bits),
    }
}

/// The first element of `d`, alone.
fn first(d: &Data) -> Data {
    repeat(d, 1)
}

/// `n` copies of the first element of `d`.
fn repeat(d: &Data, n: usize) -> Data {
    match d {
        Data::I1(v) => Data::I1(vec![v[0]; n]),
        Data::I32(v) => Data::I32(vec![v[0]; n]),
        Data::I64(v) => Data::I64(vec![v[0]; n]),
        Data::F32(v) => Data::F32(vec![v[0]; n]),
        Data::F64(v) => Data::F64(vec![v[0]; n]),
    }
}

#[cfg(test)]
mod tests {
    use crate::{ExecError, HostTensor, Launch, Memory};
    use tilegrad_ir::{DType, Kernel, KernelBuilder};

    /// Elements of a tensor just at the size written in place.
    const N: usize = super::MIN_BYTES / 4;
    const BLOCK: i32 = 1 << 16;

    /// Program `p` stores `lane + p` (as f32) at `y[base(p) + lane]` for 2^16 lanes:
    /// `base(p) = p * BLOCK` (`overlap` false), or 0 for every program (a race).
    fn lanes_kernel(overlap: bool) -> Kernel {
        let mut b = KernelBuilder::new("lanes");
        let y = b.ptr_param("y", DType::F32);
        let pid = b.program_id(0);
        let bs = b.i32(if overlap { 0 } else { BLOCK });
        let start = b.mul(pid, bs);
        let ar = b.arange(0, BLOCK as i64);
        let offs = b.add(start, ar);
        let lane = b.add(ar, pid);
        let v = b.cast(lane, DType::F32);
        let py = b.add(y, offs);
        b.store(py, v, None);
        b.finish().unwrap()
    }

    fn empty() -> HostTensor {
        HostTensor::try_full(DType::F32, &[N], f64::NAN).unwrap()
    }

    /// Half the programs of the grid that covers the tensor: the rest keeps its NaNs.
    fn half_grid() -> u32 {
        (N / BLOCK as usize / 2) as u32
    }

    #[test]
    fn an_output_nothing_else_holds_is_written_in_place() {
        let k = lanes_kernel(false);
        let mut mem = Memory::new();
        let y = mem.add("y", empty());
        let before = mem[y].as_f32().unwrap().as_ptr();
        Launch::new(&k, half_grid()).arg("y", y).run(&mut mem).unwrap();
        let v = mem[y].as_f32().unwrap();
        assert_eq!(v.as_ptr(), before, "the launch wrote into the tensor's own storage");
        assert_eq!((v[0], v[BLOCK as usize - 1], v[BLOCK as usize + 3]), (0.0, (BLOCK - 1) as f32, 4.0));
        assert!(v[N / 2..].iter().all(|x| x.is_nan()), "elements no program stored keep their value");
    }

    #[test]
    fn an_output_a_clone_shares_is_copied() {
        let k = lanes_kernel(false);
        let mut mem = Memory::new();
        let y = mem.add("y", empty());
        let kept = mem[y].clone();
        Launch::new(&k, half_grid()).arg("y", y).run(&mut mem).unwrap();
        assert_eq!(mem[y].as_f32().unwrap()[5], 5.0);
        assert!(!mem[y].shares_storage(&kept));
        assert!(kept.as_f32().unwrap().iter().all(|x| x.is_nan()), "the clone is as it was");
    }

    #[test]
    fn a_race_on_an_output_written_in_place_leaves_it_as_it_was() {
        let k = lanes_kernel(true);
        let mut mem = Memory::new();
        let y = mem.add("y", empty());
        let e = Launch::new(&k, 2).arg("y", y).run(&mut mem).unwrap_err();
        assert!(matches!(e, ExecError::Race(_)), "{e}");
        assert!(mem[y].as_f32().unwrap().iter().all(|x| x.is_nan()), "the failed launch left `y` as it was");
    }
}
