//! Output buffers of the fast commit path: programs write their stores straight into these at
//! the end of their run. Elements are atomics with relaxed ordering (plain loads and stores on
//! every target) so that a racy kernel, whose programs write one element concurrently, is not
//! undefined behaviour; the race itself is found afterwards from the owner table and the launch
//! is re-run on the exact path.

use super::offs::{with_offs, Off};
use crate::tensor::Data;
use rayon::prelude::*;
use std::mem::{align_of, size_of, ManuallyDrop};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
use tilegrad_ir::DType;

/// Reinterprets a vector's elements as another type of identical size and alignment, without
/// copying.
///
/// # Safety
/// Every bit pattern a `T` holds must be a valid `U`.
unsafe fn cast_vec<T, U>(v: Vec<T>) -> Vec<U> {
    assert!(size_of::<T>() == size_of::<U>() && align_of::<T>() == align_of::<U>());
    let mut v = ManuallyDrop::new(v);
    // SAFETY: same size and alignment (asserted), so the allocation's layout is unchanged, and
    // the caller guarantees bit validity.
    unsafe { Vec::from_raw_parts(v.as_mut_ptr() as *mut U, v.len(), v.capacity()) }
}

pub(crate) enum FastBuf {
    I1(Vec<AtomicBool>),
    I32(Vec<AtomicU32>),
    I64(Vec<AtomicU64>),
    F32(Vec<AtomicU32>),
    F64(Vec<AtomicU64>),
}

/// Output buffers released by earlier launches (the tensors their commits replaced), reused as
/// the next launch's output buffers: they hold valid but stale values, so the launch then copies
/// initial values only into the elements no program stored (for a kernel that overwrites its
/// whole output, nothing), instead of copying the whole tensor up front.
static POOL: std::sync::Mutex<Vec<Data>> = std::sync::Mutex::new(Vec::new());

/// Buffers smaller than this are copied (not worth pooling); at most this many, and this many
/// bytes in all, are kept.
const POOL_MIN_ELEMS: usize = 1 << 16;
const POOL_MAX_BUFFERS: usize = 4;
const POOL_MAX_BYTES: usize = 256 << 20;

fn bytes(d: &Data) -> usize {
    d.len()
        * match d {
            Data::I1(_) => 1,
            Data::I32(_) | Data::F32(_) => 4,
            Data::I64(_) | Data::F64(_) => 8,
        }
}

/// Offers a released tensor's storage for reuse.
pub(crate) fn recycle(d: Data) {
    if d.len() < POOL_MIN_ELEMS || bytes(&d) > POOL_MAX_BYTES / 2 {
        return;
    }
    if let Ok(mut pool) = POOL.lock() {
        while !pool.is_empty() && (pool.len() >= POOL_MAX_BUFFERS || pool.iter().map(bytes).sum::<usize>() + bytes(&d) > POOL_MAX_BYTES) {
            pool.remove(0);
        }
        pool.push(d);
    }
}

/// Frees the buffers kept for reuse (between phases of a caller's work, so that memory held for
/// the next launch does not add to a later peak).
pub fn release_buffers() {
    if let Ok(mut pool) = POOL.lock() {
        pool.clear();
        pool.shrink_to_fit();
    }
    // glibc keeps what worker threads freed in their arenas; hand it back to the system.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim only releases free memory; it is thread-safe.
        unsafe {
            malloc_trim(0);
        }
    }
}

/// A pooled buffer with the storage kind and length of `like`.
fn take_pooled(like: &Data) -> Option<Data> {
    let mut pool = POOL.lock().ok()?;
    let i = pool.iter().position(|d| d.len() == like.len() && std::mem::discriminant(d) == std::mem::discriminant(like))?;
    Some(pool.swap_remove(i))
}

impl FastBuf {
    /// A buffer for the final contents of a tensor whose initial contents are `d`, and whether
    /// it still needs [`FastBuf::fill_unstored`] (a reused buffer holds stale values; a fresh
    /// one is a copy of `d`).
    pub fn for_output(d: &Data) -> (FastBuf, bool) {
        match take_pooled(d) {
            Some(stale) => (FastBuf::from_owned(stale), true),
            None => (FastBuf::from_data(d), false),
        }
    }

    /// Takes ownership of a buffer's storage.
    pub fn from_owned(d: Data) -> FastBuf {
        // SAFETY (all arms): bool, i32, i64, f32 and f64 are plain bit patterns valid as the
        // atomic integer (or atomic bool) of their size, which has the same layout.
        unsafe {
            match d {
                Data::I1(v) => FastBuf::I1(cast_vec(v)),
                Data::I32(v) => FastBuf::I32(cast_vec(v)),
                Data::I64(v) => FastBuf::I64(cast_vec(v)),
                Data::F32(v) => FastBuf::F32(cast_vec(v)),
                Data::F64(v) => FastBuf::F64(cast_vec(v)),
            }
        }
    }

    /// Copies `initial[a..b]` into the buffer (single-threaded use, after the programs ran).
    pub fn fill_range(&self, initial: &Data, a: usize, b: usize) {
        fn go<A, T: Copy>(dst: &[A], src: &[T], a: usize, b: usize, st: impl Fn(&A, T)) {
            dst[a..b].iter().zip(&src[a..b]).for_each(|(d, &x)| st(d, x));
        }
        match (self, initial) {
            (FastBuf::I1(d), Data::I1(v)) => go(d, v, a, b, |d, x| d.store(x, Relaxed)),
            (FastBuf::I32(d), Data::I32(v)) => go(d, v, a, b, |d, x| d.store(x as u32, Relaxed)),
            (FastBuf::F32(d), Data::F32(v)) => go(d, v, a, b, |d, x| d.store(x.to_bits(), Relaxed)),
            (FastBuf::I64(d), Data::I64(v)) => go(d, v, a, b, |d, x| d.store(x as u64, Relaxed)),
            (FastBuf::F64(d), Data::F64(v)) => go(d, v, a, b, |d, x| d.store(x.to_bits(), Relaxed)),
            _ => unreachable!("a tensor's buffer has its storage kind"),
        }
    }

    /// A copy of `d` that programs may write concurrently.
    pub fn from_data(d: &Data) -> FastBuf {
        fn par_clone<T: Copy + Send + Sync>(v: &[T]) -> Vec<T> {
            let mut out = Vec::with_capacity(v.len());
            v.par_iter().copied().collect_into_vec(&mut out);
            out
        }
        let copy = match d {
            Data::I1(v) => Data::I1(par_clone(v)),
            Data::I32(v) => Data::I32(par_clone(v)),
            Data::I64(v) => Data::I64(par_clone(v)),
            Data::F32(v) => Data::F32(par_clone(v)),
            Data::F64(v) => Data::F64(par_clone(v)),
        };
        // SAFETY (all arms): bool, i32, i64, f32 and f64 are plain bit patterns valid as the
        // atomic integer (or atomic bool) of their size, which has the same layout.
        unsafe {
            match copy {
                Data::I1(v) => FastBuf::I1(cast_vec(v)),
                Data::I32(v) => FastBuf::I32(cast_vec(v)),
                Data::I64(v) => FastBuf::I64(cast_vec(v)),
                Data::F32(v) => FastBuf::F32(cast_vec(v)),
                Data::F64(v) => FastBuf::F64(cast_vec(v)),
            }
        }
    }

    /// Writes the active lanes of `vals` at their offsets (i32 or i64 data, in lane order).
    pub fn write(&self, offs: &Data, mask: Option<&[bool]>, vals: &Data) {
        fn go<A, T: Off, V: Copy>(b: &[A], offs: &[T], mask: Option<&[bool]>, v: &[V], st: impl Fn(&A, V)) {
            match mask {
                None => offs.iter().zip(v).for_each(|(&o, &x)| st(&b[o.i() as usize], x)),
                Some(m) => offs.iter().zip(v).zip(m).filter(|(_, &k)| k).for_each(|((&o, &x), _)| st(&b[o.i() as usize], x)),
            }
        }
        with_offs!(offs, |ov| match (self, vals) {
            (FastBuf::I1(b), Data::I1(v)) => go(b, ov, mask, v, |a, x| a.store(x, Relaxed)),
            (FastBuf::I32(b), Data::I32(v)) => go(b, ov, mask, v, |a, x| a.store(x as u32, Relaxed)),
            (FastBuf::F32(b), Data::F32(v)) => go(b, ov, mask, v, |a, x| a.store(x.to_bits(), Relaxed)),
            (FastBuf::I64(b), Data::I64(v)) => go(b, ov, mask, v, |a, x| a.store(x as u64, Relaxed)),
            (FastBuf::F64(b), Data::F64(v)) => go(b, ov, mask, v, |a, x| a.store(x.to_bits(), Relaxed)),
            _ => unreachable!("the verifier checked stored values have the pointee dtype"),
        })
    }

    /// Writes all lanes of `vals`, whose offsets are the consecutive runs `runs` (in order).
    pub fn write_runs(&self, runs: &[(i64, u32)], vals: &Data) {
        fn go<A, V: Copy>(b: &[A], runs: &[(i64, u32)], v: &[V], st: impl Fn(&A, V)) {
            let mut lane = 0;
            for &(start, len) in runs {
                let (start, len) = (start as usize, len as usize);
                b[start..start + len].iter().zip(&v[lane..lane + len]).for_each(|(a, &x)| st(a, x));
                lane += len;
            }
        }
        match (self, vals) {
            (FastBuf::I1(b), Data::I1(v)) => go(b, runs, v, |a, x| a.store(x, Relaxed)),
            (FastBuf::I32(b), Data::I32(v)) => go(b, runs, v, |a, x| a.store(x as u32, Relaxed)),
            (FastBuf::F32(b), Data::F32(v)) => go(b, runs, v, |a, x| a.store(x.to_bits(), Relaxed)),
            (FastBuf::I64(b), Data::I64(v)) => go(b, runs, v, |a, x| a.store(x as u64, Relaxed)),
            (FastBuf::F64(b), Data::F64(v)) => go(b, runs, v, |a, x| a.store(x.to_bits(), Relaxed)),
            _ => unreachable!("the verifier checked stored values have the pointee dtype"),
        }
    }

    /// Adds lane `lane` of `vals` to element `o` (single-threaded use: the atomic commit).
    pub fn add(&self, o: usize, vals: &Data, lane: usize, dtype: DType) {
        match (self, vals) {
            (FastBuf::I1(b), Data::I1(v)) => b[o].store(b[o].load(Relaxed) | v[lane], Relaxed),
            (FastBuf::I32(b), Data::I32(v)) => b[o].store((b[o].load(Relaxed) as i32).wrapping_add(v[lane]) as u32, Relaxed),
            (FastBuf::F32(b), Data::F32(v)) => {
                let mut s = [f32::from_bits(b[o].load(Relaxed)) + v[lane]];
                super::ops::round_narrow(dtype, &mut s);
                b[o].store(s[0].to_bits(), Relaxed)
            }
            (FastBuf::I64(b), Data::I64(v)) => b[o].store((b[o].load(Relaxed) as i64).wrapping_add(v[lane]) as u64, Relaxed),
            (FastBuf::F64(b), Data::F64(v)) => b[o].store((f64::from_bits(b[o].load(Relaxed)) + v[lane]).to_bits(), Relaxed),
            _ => unreachable!("the verifier checked atomic values have the pointee dtype"),
        }
    }

    /// The final contents.
    pub fn into_data(self) -> Data {
        // SAFETY (all arms): the atomics hold bit patterns written from values of the element
        // type (or the initial data), all valid for it; layouts are identical.
        unsafe {
            match self {
                FastBuf::I1(b) => Data::I1(cast_vec(b)),
                FastBuf::I32(b) => Data::I32(cast_vec(b)),
                FastBuf::I64(b) => Data::I64(cast_vec(b)),
                FastBuf::F32(b) => Data::F32(cast_vec(b)),
                FastBuf::F64(b) => Data::F64(cast_vec(b)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_without_loss() {
        let d = Data::F32(vec![1.5, -0.0, f32::NAN, 3.25]);
        let b = FastBuf::from_data(&d);
        b.write(&Data::I64(vec![3, 0]), Some(&[true, false]), &Data::F32(vec![7.0, 9.0]));
        b.add(1, &Data::F32(vec![2.0]), 0, DType::F32);
        let Data::F32(v) = b.into_data() else { panic!() };
        assert_eq!(v[0], 1.5);
        assert_eq!(v[1], 2.0);
        assert!(v[2].is_nan());
        assert_eq!(v[3], 7.0);
    }
}
