//! Memory: loads, stores and `atomic_add`s, each lane's bounds checked, with the race marks and
//! the writers' records of the flavors that keep them, and float atomics logged in program order
//! where the flavor says so.

use super::*;

impl<'k> Gen<'k> {
    /// The lane guard and lane index of an access: scalar accesses are made by thread 0.
    pub(super) fn access_lane(&self, p: Value) -> (&'static str, &'static str) {
        if self.scalar(p) {
            ("tid == 0", "0")
        } else {
            ("true", "e")
        }
    }

    pub(super) fn load(&mut self, i: Inst, mask: bool, other: bool) {
        let k = self.k;
        let d = k.inst(i);
        let (r, p) = (d.results[0], d.args[0]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        self.declare(r);
        let m = if mask { format!("v{}[j]", d.args[1].0) } else { "true".into() };
        let fill = if other { format!("v{}[j]", d.args[2].0) } else { self.fill(i, dt) };
        let (lead, lane) = self.access_lane(p);
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        let read = from_storage(dt, &format!("tg_b{j}[off]"));
        // Where the launch keeps them, the read marks and the check for reads of this
        // program's own atomics; then the reads, with nothing between them that waits (so that
        // a thread's loads are in flight together, and its offsets then free).
        let body = format!(
            "if ({m}) {{ const i64 off = v{p}[j]; if ((u64)off >= (u64)tg_n{j}) {{ if ({lead}) {fail} v{r}[j] = ({t})0; }} else {{ v{r}[j] = {read}; if ({lead}) tg_ok++; }} }} else v{r}[j] = {fill};",
            p = p.0,
            r = r.0,
            t = ctype(dt),
        );
        self.line(&format!("if (tg_r{j} || tg_a{j}) {{"));
        self.each_of(
            p,
            &format!(
                "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off < (u64)tg_n{j} && {lead}) {{ if (tg_r{j}) tg_mark(tg_r{j} + off, tg_p + 1); if (tg_a{j} && tg_a{j}[off] == tg_p + 1) atomicOr(TG_FLAGS, {FLAG_OWN_ATOMIC}u); }} }}",
                p.0
            ),
        );
        self.line("}");
        // Counted in 32 bits, added once an op (a 64-bit count per lane costs an instruction).
        self.line("{ u32 tg_ok = 0;");
        if self.bounds_first(p, &m, j, &fail, Some(r)) {
            let fast = format!(
                "if ({m}) {{ const i64 off = v{p}[j]; v{r}[j] = {read}; if ({lead}) tg_ok++; }} else v{r}[j] = {fill};",
                p = p.0,
                r = r.0,
            );
            self.each(r, &fast);
        } else {
            self.each(r, &body);
        }
        self.line("} tg_cl += tg_ok; }");
        self.check(i);
    }

    /// Opens a memory op's accesses (close with `}`). In the flavor VJP kernels run in (no race
    /// marks, float atomics in the device's order) every active lane's bounds are tested first,
    /// in every thread (a scalar access is made by every thread, and recorded by thread 0): a
    /// thread with an out-of-bounds lane notes its failures, posts its key once
    /// ([`Failure::noted`]) and makes none of the op's accesses (a load's `result` gets
    /// zeros). The accesses of the other threads (returns true) have no bounds check and no
    /// failure code between them. A failing program ends at its next check ([`Gen::flush`])
    /// with nothing it computed seen, so the accesses skipped change no result. In other flavors (returns false) the caller checks each lane as it
    /// accesses it.
    ///
    /// Measured on an H100 against checking each lane at its access (same machine,
    /// alternating): the weighted sum's VJP kernel 0.628-0.635 ms in f32 (was 0.693-0.695) and
    /// 0.838 in f64 (0.911), the softmax's 0.901-0.905 (0.943-0.948) and 2.280 (2.433); the
    /// matmul's f32 10.36-10.39 (10.22-10.27). In forward kernels it made the weighted sum
    /// slower (0.306-0.322 ms against 0.269-0.272, with fewer registers: its loads predicated,
    /// issued together) and the softmax with race marks (1.165 against 0.967), the softmax
    /// without them faster (0.466 against 0.491-0.498): forward kernels check at the access.
    /// (Those figures had a failing thread make its in-bounds accesses too, in a second copy of
    /// the op's code; without it Liger-Kernel's cross-entropy VJP kernel is 1% less CUDA C and
    /// 6% less machine code, NVRTC 13.2.)
    fn bounds_first(&mut self, p: Value, m: &str, j: usize, fail: &Failure, result: Option<Value>) -> bool {
        if self.marks || self.ordered {
            self.line("{");
            return false;
        }
        let bad = format!("({m}) && (u64)off >= (u64)tg_n{j}");
        // The test sets a flag only (no branch a lane), so that it stays out of the accesses'
        // way; the failures are recorded apart, where it is set.
        self.line("bool tg_bad = false;");
        let (test, record) = (format!("tg_bad |= {bad};"), format!("if ({bad}) {}", fail.noted()));
        let (tests, records) = if self.scalar(p) {
            let at = |body: &str| format!("{{ const int j = 0; const i64 off = v{}[j]; {body} }}", p.0);
            (at(&test), format!("if (tid == 0) {}", at(&record)))
        } else {
            let (r, n, nt) = (self.regs(p), self.numel(p), self.nt);
            let guard = if r * nt == n { String::new() } else { format!("if (e < {n}) ") };
            let at = |body: &str| {
                self.registers(r, &format!("{{ const int e = tid + j * {nt}; const i64 off = v{}[j]; {guard}{{ {body} }} }}", p.0))
            };
            (at(&test), at(&record))
        };
        self.line(&tests);
        self.line("if (tg_bad) {");
        self.line(&records);
        self.line("TG_POST;");
        if let Some(r) = result {
            // A stand-in for the load's result: left unset, its previous value would be kept
            // alive for this path (the attention's VJP kernel's stack frame grew from 304 to
            // 456 bytes a thread, and it ran 5% slower).
            self.each(r, &format!("v{}[j] = ({})0;", r.0, ctype(self.dtype(r))));
        }
        self.line("} else {");
        true
    }

    /// What a masked-off lane of load `i` without `other` reads: NaN for floats where the launch
    /// poisons this load (its bit of the mask, see `tilegrad_ir::analysis::unfilled_loads`),
    /// else zero.
    pub(super) fn fill(&self, i: Inst, dt: DType) -> String {
        let unfilled = tilegrad_ir::analysis::unfilled_loads(self.k);
        if let Some(n) = unfilled.iter().position(|&l| l == i) {
            let nan = if dt == DType::F64 { "TG_NAN_D" } else { "TG_NAN_F" };
            format!("(((TG_POISON >> {}) & 1) ? {nan} : ({})0)", n.min(63), ctype(dt))
        } else {
            format!("({})0", ctype(dt))
        }
    }

    pub(super) fn store(&mut self, i: Inst, mask: bool) {
        let k = self.k;
        let d = k.inst(i);
        let (p, v) = (d.args[0], d.args[1]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        let m = if mask { format!("v{}[j]", d.args[2].0) } else { "true".into() };
        let (_, lane) = self.access_lane(p);
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        let val = to_storage(dt, &format!("v{}[j]", v.0));
        // Each written element's mark takes a stamp of program and store count: another
        // program's stamp is a conflict, this store's own a duplicate lane. 32-bit stamps keep
        // the count's low 8 bits, so that a program's 257th store of one element looks like a
        // duplicate and goes to the reference. They are taken after the writes, and the
        // exchanges of a thread are in flight together: what they return is only or-ed into a
        // flag word.
        self.flush();
        self.line("tg_sseq++; tg_nev++;");
        let stamp_check = |wide: bool| {
            let (ty, stamp, xchg, other) = if wide {
                (
                    "u64",
                    "((u64)(tg_p + 1) << 32) | tg_sseq",
                    format!("(u64)atomicExch((unsigned long long*)(tg_w{j} + off), (unsigned long long)stamp)"),
                    "(u32)(old >> 32)",
                )
            } else {
                ("u32", "((tg_p + 1u) << 8) | (tg_sseq & 0xffu)", format!("atomicExch((u32*)tg_w{j} + off, stamp)"), "(old >> 8)")
            };
            format!(
                "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off < (u64)tg_n{j}) {{ if (tg_w{j}) {{ const {ty} stamp = {stamp}; const {ty} old = {xchg}; tg_fl |= old == stamp ? {FLAG_DUPLICATE}u : (old != 0 && {other} != tg_p + 1u ? {FLAG_CONFLICT}u : 0u); }} if (tg_wi{j}) tg_wi{j}[off] = {}u; }} }}",
                p.0,
                i.0 + 1
            )
        };
        // Each active lane checks its bounds and writes. A launch with an out-of-bounds lane
        // fails, so what its other lanes wrote is never seen (and a write another program reads
        // is a conflict the reference then settles). The check's barrier also makes the writes
        // visible to the block's later loads.
        self.line("{ u32 tg_ok = 0;");
        if self.bounds_first(p, &m, j, &fail, None) {
            self.each_of(p, &format!("if ({m}) {{ const i64 off = v{}[j]; tg_b{j}[off] = {val}; tg_ok++; }}", p.0));
        } else {
            self.each_of(
                p,
                &format!(
                    "if ({m}) {{ const i64 off = v{}[j]; if ((u64)off >= (u64)tg_n{j}) {fail} else {{ tg_b{j}[off] = {val}; tg_ok++; }} }}",
                    p.0
                ),
            );
        }
        self.line("} tg_cs += tg_ok; }");
        self.line(&format!("if (tg_w{j} || tg_wi{j}) {{ u32 tg_fl = 0;"));
        self.each_of(p, &stamp_check(self.wide));
        self.line("if (tg_fl) atomicOr(TG_FLAGS, tg_fl); }");
        self.check(i);
    }

    pub(super) fn atomic_add(&mut self, i: Inst, mask: bool) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (p, v) = (d.args[0], d.args[1]);
        let j = self.param_of(p);
        let dt = self.pointee(p);
        if let Some(&r) = d.results.first() {
            // Unused (launches that use the old values are ordered and run on the reference).
            self.declare(r);
            self.each(r, &format!("v{}[j] = ({})0;", r.0, ctype(dt)));
        }
        let m = if mask { format!("v{}[j]", d.args[2].0) } else { "true".into() };
        let (_, lane) = self.access_lane(p);
        self.flush();
        let fail = self.fail(i, ERR_OOB, lane, "off", &j.to_string());
        self.line("tg_nev++; tg_aseq++;");
        if i.0 > 0xffff {
            self.line(&format!("if (tg_ak{j}) atomicOr(TG_FLAGS, {FLAG_WRITERS}u);"));
        }
        // For blame: the last atomic on each element in program order has the largest key.
        let key = format!("(((u64)(tg_p + 1) << 32) | ((u64)(tg_aseq & 0xffffu) << 16) | {}ULL)", i.0 & 0xffff);
        let mark = format!(
            "tg_ok++; if (tg_a{j}) tg_mark(tg_a{j} + off, tg_p + 1); if (tg_ak{j}) {{ if (tg_aseq > 0xffffu) atomicOr(TG_FLAGS, {FLAG_WRITERS}u); atomicMax((unsigned long long*)(tg_ak{j} + off), (unsigned long long){key}); }}"
        );
        let x = format!("v{}[j]", v.0);
        let body = match dt {
            DType::I32 => format!("atomicAdd((int*)(tg_b{j} + off), {x});"),
            DType::I64 => format!("atomicAdd((unsigned long long*)(tg_b{j} + off), (unsigned long long){x});"),
            DType::I1 => {
                format!("if ({x}) {{ const u64 ad = (u64)(tg_b{j} + off); atomicOr((u32*)(ad & ~3ULL), 1u << (8 * (ad & 3ULL))); }}")
            }
            DType::F64 if !self.ordered => format!("atomicAdd((double*)(tg_b{j} + off), {x});"),
            DType::F32 if !self.ordered => format!("atomicAdd((float*)(tg_b{j} + off), {x});"),
            _ => {
                // Floats: logged, then added in program order when the program ends, each by the
                // thread its address hashes to (named in the entry's high word).
                self.float_atomics = true;
                let per = self.numel(p).max(1) as u64;
                self.log_per_program += per;
                let bits = if dt == DType::F64 { format!("(u64)__double_as_longlong({x})") } else { format!("(u64)__float_as_uint({x})") };
                let n = self.numel(p).max(1);
                self.line(&format!("const u32 tg_base{} = tg_alen; tg_alen += {n};", i.0));
                let body = format!(
                    "const i64 off = v{}[j]; const bool act = ({m}) && (u64)off < (u64)tg_n{j}; if (({m}) && !act) {fail} u64* le = TG_LOG + 3 * (u64)(tg_base{} + e); if (tg_base{} + e < TG_LOGCAP) {{ le[0] = act ? (u64)off : ~0ULL; le[1] = act ? ({j}ULL | ((((u64)(tg_b{j} + off) / {esize}) % {nt}) << 32)) : ~0ULL; le[2] = {bits}; }} else atomicOr(TG_FLAGS, {FLAG_LOG_FULL}u); if (act) {{ {mark} }}",
                    p.0,
                    i.0,
                    i.0,
                    esize = crate::device_bytes(dt),
                    nt = self.nt,
                );
                self.line("{ u32 tg_ok = 0;");
                self.each_of(p, &body);
                self.line("tg_ca += tg_ok; }");
                self.check(i);
                return Ok(());
            }
        };
        self.line("{ u32 tg_ok = 0;");
        if self.bounds_first(p, &m, j, &fail, None) {
            self.each_of(p, &format!("if ({m}) {{ const i64 off = v{}[j]; {body} {mark} }}", p.0));
        } else {
            self.each_of(
                p,
                &format!("if ({m}) {{ const i64 off = v{}[j]; if ((u64)off >= (u64)tg_n{j}) {fail} else {{ {body} {mark} }} }}", p.0),
            );
        }
        self.line("} tg_ca += tg_ok; }");
        self.check(i);
        Ok(())
    }
}
