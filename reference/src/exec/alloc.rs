//! Allocator tuning for launches. A launch allocates and frees many tile-sized buffers (tens to
//! hundreds of KiB) on several threads. With glibc's defaults, freed memory at the top of a heap
//! is handed back to the kernel eagerly, and every hand-back in a multithreaded process costs a
//! TLB shootdown across cores; measured on a 2-core VM this doubled the time of a row-softmax
//! launch. Keeping freed memory in the process (as every allocator tuned for throughput does)
//! removes that cost. This is applied once per process, only with glibc.

#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub(crate) fn tune() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_TOP_PAD: i32 = -2;
        const M_MMAP_THRESHOLD: i32 = -3;
        // SAFETY: mallopt only adjusts allocator parameters; these are documented values.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
            mallopt(M_TOP_PAD, 16 << 20);
        }
    });
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn tune() {}
