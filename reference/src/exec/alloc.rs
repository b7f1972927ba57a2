//! Allocator tuning for launches. A launch allocates and frees many tile-sized buffers (tens to
//! hundreds of KiB) on several threads. With glibc's defaults, freed memory at the top of a heap
//! is handed back to the kernel eagerly, and every hand-back in a multithreaded process costs a
//! TLB shootdown across cores; measured on a 2-core VM this doubled the time of a row-softmax
//! launch. Keeping freed memory in the process (as every allocator tuned for throughput does)
//! removes that cost. This is applied once per process, only with glibc.
//!
//! What a thread frees stays in its arena, and glibc gives each thread its own arena up to eight
//! per core: with more threads than cores, each extra thread's arena kept its own high-water
//! mark of tiles (softmax 16384x1024: 808 MB at 2 threads, 894 MB at 16 on 2 cores). Arenas are
//! capped at one per core, so what they keep grows with the cores that run at once, not with
//! the thread count (`MALLOC_ARENA_MAX` or `GLIBC_TUNABLES`, when set, decide instead).

/// Tunes glibc's allocator for launches (see the module's documentation); idempotent. Launches
/// call it; a program calls it first thing so that its threads' arenas follow it from the start.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn tune() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        extern "C" {
            fn mallopt(param: i32, value: i32) -> i32;
        }
        const M_TRIM_THRESHOLD: i32 = -1;
        const M_TOP_PAD: i32 = -2;
        const M_MMAP_THRESHOLD: i32 = -3;
        const M_ARENA_MAX: i32 = -8;
        let arenas = std::thread::available_parallelism().map_or(8, |n| n.get()).min(i32::MAX as usize) as i32;
        let chosen = std::env::var_os("MALLOC_ARENA_MAX").is_some() || std::env::var_os("GLIBC_TUNABLES").is_some();
        // SAFETY: mallopt only adjusts allocator parameters; these are documented values.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 32 << 20);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
            mallopt(M_TOP_PAD, 16 << 20);
            if !chosen {
                mallopt(M_ARENA_MAX, arenas);
            }
        }
    });
}

/// Tunes the allocator for launches: nothing to do without glibc.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn tune() {}

/// The threads that work on a launch at once: rayon's, but no more than the cores the process
/// may use. More threads than cores run no faster, and each holds the buffers of the program or
/// batch it runs, so that memory would grow with the thread count (`RAYON_NUM_THREADS=64` on
/// two cores) instead of with the cores.
pub fn working_threads() -> usize {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    rayon::current_num_threads().min(cores).max(1)
}
