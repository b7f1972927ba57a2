//! The entry point around a kernel's body: the argument block, programs taken from a counter,
//! errors keyed by site and lane, and float atomics added in program order.

use super::*;

/// Entries of a program's float-atomic log read into shared memory at a time (24 bytes each:
/// 12 KB, in the block's scratch where that is as large).
const LOG_TILE: usize = 512;

impl<'k> Gen<'k> {
    pub(super) fn emit_entry(&self, src: &mut String, body: &str) {
        let k = self.k;
        let nt = self.nt;
        let _ = writeln!(src, "\n// kernel `{}`", k.name);
        let min_blocks = self.min_blocks;
        let _ = writeln!(src, "extern \"C\" __global__ void __launch_bounds__({nt}, {min_blocks}) {ENTRY}(const TgArgs A) {{");
        // The argument block is a kernel parameter: read from the constant bank where used,
        // holding no registers.
        src.push_str(
            "    __shared__ u32 tg_sh_p[2]; __shared__ u64 tg_sh_key;\n\
             \x20   const int tid = threadIdx.x;\n\
             #define TG_G0 ((u32)A.w[0])\n#define TG_G1 ((u32)A.w[1])\n#define TG_G2 ((u32)A.w[2])\n#define TG_TOTAL (A.w[3])\n\
             #define TG_NEXT ((u32*)A.w[4])\n#define TG_TICKET ((u32*)A.w[5])\n#define TG_LOGMAX ((u32*)A.w[4] + 2)\n#define TG_ERR ((u64*)A.w[6])\n\
             #define TG_FLAGS ((u32*)A.w[7])\n#define TG_COUNT ((u64*)A.w[8])\n#define TG_TRIPS ((u64*)A.w[8] + 3)\n\
             #define TG_LOG ((u64*)A.w[11] + 3 * A.w[12] * (u64)blockIdx.x)\n#define TG_LOGCAP (A.w[12])\n\
             #define TG_POISON (A.w[13])\n\
             \x20   u64 tg_cl = 0, tg_cs = 0, tg_ca = 0;\n",
        );
        let _ = writeln!(src, "#define TG_HALF {}", self.scratch);
        let scratch_in = ScratchIn::of(2 * self.scratch);
        // Float atomics in program order add their log through a tile of it in shared memory:
        // the block's scratch where that is shared and large enough (the body is done with it
        // by then), else an array of its own.
        let log_tile = if !self.float_atomics {
            None
        } else if scratch_in != ScratchIn::Global && 2 * self.scratch >= 24 * LOG_TILE {
            Some("(u64*)scr")
        } else {
            let _ = writeln!(src, "    __shared__ u64 tg_lt_own[{}];", 3 * LOG_TILE);
            Some("tg_lt_own")
        };
        if self.float_atomics {
            src.push_str("    __shared__ u32 tg_sh_n;\n");
        }
        match scratch_in {
            // Small scratch in shared memory (a static size, so loads from it are `ld.shared`).
            ScratchIn::Shared => {
                let _ = writeln!(src, "    __shared__ __align__(16) unsigned char scr[{}]; (void)scr;", (2 * self.scratch).max(16));
            }
            ScratchIn::DynamicShared => {
                let _ = writeln!(src, "    extern __shared__ __align__(16) unsigned char scr[]; (void)scr;");
            }
            ScratchIn::Global => {
                let _ = writeln!(src, "#define scr ((unsigned char*)A.w[9] + (u64)blockIdx.x * A.w[10])");
            }
        }
        for (j, p) in k.params.iter().enumerate() {
            match &p.kind {
                tilegrad_ir::ParamKind::Ptr(d) => {
                    let w = HEADER_WORDS + PTR_WORDS * j;
                    if !self.marks {
                        let _ = writeln!(
                            src,
                            "#define tg_b{j} (({st}*)A.w[{w}])\n#define tg_n{j} ((i64)A.w[{}])\n#define tg_w{j} ((u64*)0)\n#define tg_r{j} ((u32*)0)\n#define tg_a{j} ((u32*)0)\n#define tg_wi{j} ((u32*)0)\n#define tg_ak{j} ((u64*)0)",
                            w + 1,
                            st = storage(*d)
                        );
                        continue;
                    }
                    let _ = writeln!(
                        src,
                        "#define tg_b{j} (({st}*)A.w[{w}])\n#define tg_n{j} ((i64)A.w[{}])\n#define tg_w{j} ((u64*)A.w[{}])\n#define tg_r{j} ((u32*)A.w[{}])\n#define tg_a{j} ((u32*)A.w[{}])\n#define tg_wi{j} ((u32*)A.w[{}])\n#define tg_ak{j} ((u64*)A.w[{}])",
                        w + 1,
                        w + 2,
                        w + 3,
                        w + 4,
                        w + 5,
                        w + 6,
                        st = storage(*d)
                    );
                }
                tilegrad_ir::ParamKind::Scalar(_) | tilegrad_ir::ParamKind::Constexpr(..) => {}
            }
        }
        // Programs from a counter: the next one is taken before the barrier that ends the
        // current one (into the other slot), except where float atomics pass a turn from
        // program to program, which every program taken must take.
        src.push_str("    if (tid == 0) { tg_sh_p[0] = atomicAdd(TG_NEXT, 1u); tg_sh_key = ~0ULL; }\n    __syncthreads();\n");
        let _ = writeln!(src, "    for (u32 tg_it = 0;; ++tg_it) {{");
        src.push_str(
            "        const u32 tg_p = tg_sh_p[tg_it & 1u];\n\
             \x20       if ((u64)tg_p >= TG_TOTAL) break;\n\
             \x20       int tg_stopped = 0;\n\
             \x20       const int pid0 = (int)(tg_p % TG_G0); const int pid1 = (int)((tg_p / TG_G0) % TG_G1); const int pid2 = (int)(tg_p / (TG_G0 * TG_G1));\n\
             \x20       (void)pid0; (void)pid1; (void)pid2;\n\
             \x20       u64 tg_eo = 0, tg_ea = 0, tg_key = ~0ULL;\n\
             \x20       u64 tg_nev = 0; u32 tg_sseq = 0; u32 tg_aseq = 0; u32 tg_alen = 0; (void)tg_nev; (void)tg_sseq; (void)tg_aseq; (void)tg_alen;\n\
             \x20       (void)tg_eo; (void)tg_ea; (void)tg_key;\n",
        );
        // A thread keeps its first failure; the block's first is the smallest key (failure
        // site, then lane), posted before the check's barrier (see `Failure`). A check that
        // finds one leaves through the one exit at the body's end (less code for NVRTC than an
        // exit a check), which reports it. A failed program ends its block's work: the key is
        // never reset.
        src.push_str("#define TG_NOTE(site, lane, off, aux) { if (tg_key == ~0ULL) { tg_key = ((u64)(site) << 32) | (u64)(u32)(lane); tg_eo = (off); tg_ea = (aux); } }\n");
        src.push_str("#define TG_POST { if (tg_key != ~0ULL) atomicMin((unsigned long long*)&tg_sh_key, (unsigned long long)tg_key); }\n");
        src.push_str("#define TG_FAIL(site, lane, off, aux) { if (tg_key == ~0ULL) { tg_key = ((u64)(site) << 32) | (u64)(u32)(lane); tg_eo = (off); tg_ea = (aux); atomicMin((unsigned long long*)&tg_sh_key, (unsigned long long)tg_key); } }\n");
        src.push_str("#define TG_SYNC { if (__syncthreads_or(tg_key != ~0ULL)) goto tg_fail; }\n");
        for (j, p) in k.params.iter().enumerate() {
            let v = p.value.0;
            match &p.kind {
                tilegrad_ir::ParamKind::Ptr(_) => {
                    let _ = writeln!(src, "        i64 v{v}[1] = {{0}}; (void)v{v};");
                }
                tilegrad_ir::ParamKind::Scalar(d) | tilegrad_ir::ParamKind::Constexpr(d, _) => {
                    let w = format!("A.w[{}]", HEADER_WORDS + PTR_WORDS * k.params.len() + j);
                    let e = match d {
                        DType::I1 => format!("({w} != 0)"),
                        DType::I32 => format!("(int)(i64){w}"),
                        DType::I64 => format!("(i64){w}"),
                        DType::F64 => format!("__longlong_as_double((i64){w})"),
                        // f16/bf16/f32 scalars arrive as the f32 bits of their value.
                        _ => format!("__uint_as_float((u32){w})"),
                    };
                    let _ = writeln!(src, "        const {} v{v}[1] = {{ {e} }}; (void)v{v};", ctype(*d));
                }
            }
        }
        src.push_str("        {\n");
        src.push_str(body);
        src.push_str("        }\n        goto tg_end;\n");
        let _ = writeln!(src, "        tg_fail: {{ if (tg_key == tg_sh_key) {{ u64* er = TG_ERR + {ERR_WORDS} * (u64)blockIdx.x; er[0] = tg_p; er[1] = tg_key >> 32; er[2] = 0; er[3] = tg_key & 0xffffffffULL; er[4] = tg_eo; er[5] = tg_ea; }} tg_stopped = 1; }}");
        src.push_str("        tg_end: ;\n");
        if !self.float_atomics {
            src.push_str("        if (tid == 0 && !tg_stopped) tg_sh_p[(tg_it + 1u) & 1u] = atomicAdd(TG_NEXT, 1u);\n");
        }
        src.push_str("        const int tg_stop = __syncthreads_or(tg_stopped);\n");
        if self.float_atomics {
            // Float atomics in program order: wait for this program's turn, add its logged
            // contributions (each element's in log order, by the thread its address hashes to),
            // then pass the turn on. Every program takes its turn, failed or not.
            // A log too short: the longest one wanted, for the launch run again.
            src.push_str("        if (tid == 0 && tg_alen > TG_LOGCAP) atomicMax(TG_LOGMAX, tg_alen);\n");
            // Thread 0's log length for all (every thread counts alike; the tile loop below
            // must run as many times in each).
            src.push_str("        if (tid == 0) { tg_sh_n = tg_alen; while (atomicAdd(TG_TICKET, 0u) != tg_p) { } }\n        __syncthreads();\n        __threadfence();\n");
            // Once some log ran out the launch runs again: no program adds its log.
            let _ =
                writeln!(src, "        const int tg_full = __syncthreads_or(tid == 0 && (*(volatile u32*)TG_FLAGS & {FLAG_LOG_FULL}u));");
            // The log a tile at a time: read into shared memory by the whole block (coalesced),
            // then scanned there by each thread for the entries whose addresses it owns (the
            // entry names its owner: the address hashed over the threads), in order.
            // Every thread reading the log from global memory made a layer norm backward of
            // 4096 rows x 1000 columns (2048 entries a program) take 0.34 s in a check (H200);
            // tiles of 64 entries without owners 0.25 s, with owners 0.18 s, of 512 0.077 s.
            let tile = log_tile.expect("a log tile where float atomics are logged");
            let _ = write!(
                src,
                "        if (!tg_stop && !tg_full) {{\n            const u32 tg_n = tg_sh_n < TG_LOGCAP ? tg_sh_n : (u32)TG_LOGCAP;\n            u64* tg_lt = {tile};\n            for (u32 q0 = 0; q0 < tg_n; q0 += {LOG_TILE}u) {{\n                const u32 tg_m = tg_n - q0 < {LOG_TILE}u ? tg_n - q0 : {LOG_TILE}u;\n                for (u32 q = tid; q < 3u * tg_m; q += {nt}u) tg_lt[q] = TG_LOG[3 * (u64)q0 + q];\n                __syncthreads();\n                for (u32 q = 0; q < tg_m; ++q) {{\n                const u64* le = tg_lt + 3 * q;\n                if ((u32)(le[1] >> 32) != (u32)tid) continue;\n                const i64 off = (i64)le[0];\n                switch ((int)(u32)le[1]) {{\n"
            );
            for (j, p) in k.params.iter().enumerate() {
                if let tilegrad_ir::ParamKind::Ptr(dt) = &p.kind {
                    if !dt.is_float() {
                        continue;
                    }
                    let add = match dt {
                        DType::F64 => format!("volatile double* x = (volatile double*)(tg_b{j} + off); *x = *x + __longlong_as_double((i64)le[2]);"),
                        DType::F32 => format!("volatile float* x = (volatile float*)(tg_b{j} + off); *x = *x + __uint_as_float((u32)le[2]);"),
                        DType::F16 => format!("volatile u16* x = (volatile u16*)(tg_b{j} + off); *x = tg_f2h(tg_f16((double)(tg_h2f(*x) + __uint_as_float((u32)le[2]))));"),
                        _ => format!("volatile u16* x = (volatile u16*)(tg_b{j} + off); *x = tg_f2bf(tg_bf16((double)(tg_bf2f(*x) + __uint_as_float((u32)le[2]))));"),
                    };
                    let _ = writeln!(src, "                    case {j}: {{ {add} }} break;");
                }
            }
            src.push_str("                    default: break;\n                }\n                }\n                __syncthreads();\n            }\n        }\n        __threadfence();\n        __syncthreads();\n        if (tid == 0) atomicExch(TG_TICKET, tg_p + 1);\n");
        }
        src.push_str("        if (tg_stop) break;\n");
        if self.float_atomics {
            src.push_str("        if (tid == 0) tg_sh_p[(tg_it + 1u) & 1u] = atomicAdd(TG_NEXT, 1u);\n        __syncthreads();\n");
        }
        src.push_str("#undef TG_FAIL\n#undef TG_SYNC\n    }\n");
        src.push_str("    if (tg_cl) atomicAdd((unsigned long long*)TG_COUNT, (unsigned long long)tg_cl);\n    if (tg_cs) atomicAdd((unsigned long long*)(TG_COUNT + 1), (unsigned long long)tg_cs);\n    if (tg_ca) atomicAdd((unsigned long long*)(TG_COUNT + 2), (unsigned long long)tg_ca);\n}\n");
    }
}
