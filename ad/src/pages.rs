//! Zeroed gradient buffers backed by transparent huge pages where the OS offers them.
//!
//! A gradient is fresh memory as large as its input (hundreds of MiB for large launches), and
//! the first touch of every 4 KiB page is a page fault: measured on a 2-core VM, zeroing a
//! 512 MiB gradient cost more time in faults than in writing. Asking Linux for transparent huge
//! pages on such a buffer (`madvise(MADV_HUGEPAGE)`, before the first touch) makes that one
//! fault per 2 MiB. Only advice: where it is refused or unsupported, nothing changes.

use rayon::prelude::*;

/// Buffers from this size on are advised (smaller ones come from the allocator's heap, whose
/// pages are usually already mapped).
const HUGE_MIN_BYTES: usize = 8 << 20;

/// `n` zeros, their pages touched in parallel in chunks of `chunk` elements (first-touch faults
/// taken inside the later accumulation cost several times more). The allocation is zeroed
/// already (`calloc`: fresh pages from the OS, or cleared by the allocator), so touching writes
/// one element per 4 KiB page rather than clearing the buffer a second time.
pub(crate) fn zeroed(n: usize, chunk: usize) -> Vec<f64> {
    let mut v = vec![0.0f64; n];
    if n * 8 >= HUGE_MIN_BYTES {
        advise_huge(&mut v);
    }
    v.par_chunks_mut(chunk.max(1)).for_each(|c| {
        for x in c.iter_mut().step_by(512) {
            // SAFETY: `x` is a valid, aligned element of `c`. The volatile write (of the zero it
            // already holds) cannot be elided, so the page is faulted in here.
            unsafe { std::ptr::write_volatile(x, 0.0) };
        }
    });
    v
}

#[cfg(target_os = "linux")]
fn advise_huge(v: &mut [f64]) {
    extern "C" {
        fn madvise(addr: *mut std::ffi::c_void, len: usize, advice: i32) -> i32;
    }
    const MADV_HUGEPAGE: i32 = 14;
    const PAGE: usize = 4096;
    let start = v.as_mut_ptr() as usize;
    let end = start + std::mem::size_of_val(v);
    let (a, b) = (start.next_multiple_of(PAGE), end / PAGE * PAGE);
    if a < b {
        // SAFETY: [a, b) lies within `v`'s allocation, page-aligned; MADV_HUGEPAGE only changes
        // how the kernel backs those pages (their contents are unchanged), and failure is
        // harmless (the return value is ignored).
        unsafe {
            madvise(a as *mut std::ffi::c_void, b - a, MADV_HUGEPAGE);
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn advise_huge(_: &mut [f64]) {}

#[cfg(test)]
mod tests {
    #[test]
    fn zeroed_buffers_are_zero() {
        for n in [0, 1, 1000, (8 << 20) / 8 + 123, (16 << 20) / 8] {
            let v = super::zeroed(n, 1 << 14);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x.to_bits() == 0));
        }
    }
}
