//! The ops that move elements between threads through scratch: reductions, scans and `dot`,
//! each in the reference's order of operations.

use super::*;

impl<'k> Gen<'k> {
    pub(super) fn reduce(&mut self, i: Inst, kind: ReduceOp, axis: usize) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, x) = (d.results[0], d.args[0]);
        let xd = self.dtype(x);
        if xd == DType::I1 {
            return Err(self.unsupported(i, "cannot reduce i1"));
        }
        self.declare(r);
        let shape = k.ty(x).shape.clone();
        let outer: usize = shape[..axis].iter().product();
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let t = ctype(xd);
        let rd = self.dtype(r);
        let xbytes = self.numel(x) * reg_bytes(xd);
        let at = |o: &str, kk: &str, ii: &str| format!("(({t}*)sb)[({o} * {n} + {kk}) * {inner} + {ii}]");
        let float = xd.is_float();
        let (plus, max2, min2) = match xd {
            DType::I32 => ("tg_add32(A, B)", "(B > A ? B : A)", "(B < A ? B : A)"),
            DType::I64 => ("tg_add64(A, B)", "(B > A ? B : A)", "(B < A ? B : A)"),
            DType::F64 => ("(A + B)", "tg_maxd(A, B)", "tg_mind(A, B)"),
            _ => ("(A + B)", "tg_maxf(A, B)", "tg_minf(A, B)"),
        };
        let f = |tmpl: &str, a: &str, b: &str| tmpl.replace('A', a).replace('B', b);
        if matches!(kind, ReduceOp::Max | ReduceOp::Min) && inner == 1 && !self.scalar(x) && n % self.nt == 0 {
            // Rows of whole multiples of the block: each thread folds its registers of a row,
            // a warp its threads by shuffles, and one barrier later every output folds the
            // warps' partials (a single output: by shuffles in every warp). Pairs of value and
            // index pick what the in-order fold would.
            let mx = if kind == ReduceOp::Max { "true" } else { "false" };
            let (nw, per, nt) = (self.nt / 32, n / self.nt, self.nt);
            let ioff = (outer * nw * reg_bytes(xd)).div_ceil(16) * 16;
            self.need_scratch(ioff + outer * nw * 4);
            if outer == 1 {
                self.line_before(&format!("{t} tg_m{};", r.0));
            }
            self.open_scratch();
            let base = self.scratch_base();
            let (uo, uq) = (self.unroll(outer * per), self.unroll(per));
            self.line(&format!(
                "{{ const int lane = tid % 32, warp = tid / 32;\n{uo}for (int o = 0; o < {outer}; ++o) {{ {t} m = v{x}[o * {per}]; int mi = tid;\n{uq}for (int q = 1; q < {per}; ++q) tg_pick_next<{t}, {mx}>(m, mi, v{x}[o * {per} + q], tid + q * {nt});\nfor (int w = 16; w >= 1; w /= 2) {{ const {t} om = __shfl_xor_sync(0xffffffffu, m, w); const int oi = __shfl_xor_sync(0xffffffffu, mi, w); tg_pick<{t}, {mx}>(m, mi, om, oi); }}\nif (lane == 0) {{ (({t}*)sb)[o * {nw} + warp] = m; ((int*)(sb + {ioff}))[o * {nw} + warp] = mi; }} }} }}",
                x = x.0
            ));
            self.sync();
            if outer == 1 {
                // One output: every thread folds the warps' partials, by shuffles, and holds it.
                self.line(&format!("tg_m{} = tg_fold_warps<{t}, {mx}>((const {t}*)({base}), (const int*)({base} + {ioff}), {nw});", r.0));
                let all = narrow(rd, &format!("tg_m{}", r.0));
                self.each(r, &format!("v{}[j] = {all};", r.0));
                self.resident.insert(r.0, all);
                self.close_scratch();
                return Ok(());
            }
            let at_index = narrow(
                rd,
                &format!("(tg_fold<{t}, {mx}>((const {t}*)({base}) + (@) * {nw}, (const int*)({base} + {ioff}) + (@) * {nw}, {nw}))"),
            );
            self.each(r, &format!("v{}[j] = {};", r.0, at_index.replace('@', "e")));
            self.resident.insert(r.0, at_index);
            self.close_scratch();
            return Ok(());
        }
        self.open_scratch();
        self.spill(x, 0);
        self.sync();
        // Output element e is (o, ii) with o = e / inner, ii = e % inner.
        let oi = format!("const int o = e / {inner}; const int ii = e % {inner}; (void)o; (void)ii;");
        match kind {
            ReduceOp::Sum if inner == 1 => {
                // The reference's order (`sum_run`): 64 interleaved chains from 0, in parallel
                // threads; then per output a warp folds them pairwise with shuffles (lane j takes
                // lane j + w for w = 32, ..., 1) and adds the remainder in order.
                const L: usize = tilegrad_reference::SUM_LANES;
                let part = xbytes.div_ceil(16) * 16;
                let res = part + (outer * L * reg_bytes(xd)).div_ceil(16) * 16;
                self.need_scratch(res + outer * reg_bytes(xd));
                let chunks = n / L;
                // With one chunk or none a lane's chain is its first element (or zero): read
                // where it is, without a pass and its barrier.
                let zero = format!("({t})0");
                let first = |q: &str| f(plus, &zero, &at("o", q, "0"));
                let pp: Box<dyn Fn(&str) -> String> = if chunks >= 2 {
                    self.line(&format!(
                        "{} const int o = q / {L}; const int c = q % {L}; {t} acc = ({t})0; for (int ch = 0; ch < {chunks}; ++ch) acc = {}; (({t}*)(sb + {part}))[q] = acc; }}",
                        strided("q", "tid", outer * L, self.nt),
                        f(plus, "acc", &at("o", &format!("(ch * {L} + c)"), "0"))
                    ));
                    self.sync();
                    Box::new(|q: &str| format!("(({t}*)(sb + {part}))[o * {L} + {q}]"))
                } else if chunks == 1 {
                    Box::new(move |q: &str| first(q))
                } else {
                    Box::new(|_: &str| format!("({t})0"))
                };
                // What is left past the chunks, added in order.
                let rest = match chunks * L < n {
                    true => format!("for (int kk = {}; kk < {n}; ++kk) s = {};", chunks * L, f(plus, "s", &at("o", "kk", "0"))),
                    false => String::new(),
                };
                self.line(&format!(
                    "{} const int lane = tid % 32; {t} s = {}; for (int w = 16; w >= 1; w /= 2) {{ const {t} other = __shfl_down_sync(0xffffffffu, s, w); s = {}; }} if (lane == 0) {{ {rest} (({t}*)(sb + {res}))[o] = s; }} }}",
                    strided("o", "tid / 32", outer, self.nt / 32),
                    f(plus, &pp("lane"), &pp("lane + 32")),
                    f(plus, "s", "other"),
                ));
                self.sync();
                let at_index = narrow(rd, &format!("(({t}*)({} + {res}))[@]", self.scratch_base()));
                self.each(r, &format!("v{}[j] = {};", r.0, at_index.replace('@', "e")));
                self.resident.insert(r.0, at_index);
                self.close_scratch();
                // Written before the first barrier: the spilled tile (below `part`); read after
                // the last: the results (from `res`).
                self.tail_apart = true;
                return Ok(());
            }
            ReduceOp::Max | ReduceOp::Min if n >= 16 => {
                // Max and min are exact in any order (a NaN operand yields the other): chains
                // of a strided part of each row in parallel threads, then combined in order.
                let outputs = outer * inner;
                let mut ch = 1usize;
                while outputs * ch * 2 <= self.nt && ch * 2 <= 32 && ch * 2 <= n {
                    ch *= 2;
                }
                let part = xbytes.div_ceil(16) * 16;
                self.need_scratch(part + outputs * ch * reg_bytes(xd));
                let op = if kind == ReduceOp::Max { max2 } else { min2 };
                self.line(&format!(
                    "{} const int ov = q / {ch}; const int c = q % {ch}; const int o = ov / {inner}; const int ii = ov % {inner}; {t} acc = {}; for (int kk = c + {ch}; kk < {n}; kk += {ch}) acc = {}; (({t}*)(sb + {part}))[q] = acc; }}",
                    strided("q", "tid", outputs * ch, self.nt),
                    at("o", "c", "ii"),
                    f(op, "acc", &at("o", "kk", "ii"))
                ));
                self.sync();
                let p = |q: &str| format!("(({t}*)(sb + {part}))[e * {ch} + {q}]");
                let body = format!(
                    "{t} s = {}; for (int c = 1; c < {ch}; ++c) s = {}; v{}[j] = {};",
                    p("0"),
                    f(op, "s", &p("c")),
                    r.0,
                    narrow(rd, "s")
                );
                self.each(r, &body);
            }
            ReduceOp::Sum | ReduceOp::Max | ReduceOp::Min => {
                self.need_scratch(xbytes);
                let op = match kind {
                    ReduceOp::Sum => plus,
                    ReduceOp::Max => max2,
                    _ => min2,
                };
                let body = format!(
                    "{oi} {t} s = {}; for (int kk = 1; kk < {n}; ++kk) s = {}; v{}[j] = {};",
                    at("o", "0", "ii"),
                    f(op, "s", &at("o", "kk", "ii")),
                    r.0,
                    narrow(rd, "s")
                );
                self.each(r, &body);
            }
            ReduceOp::Argmax | ReduceOp::Argmin => {
                self.need_scratch(xbytes);
                let better = if kind == ReduceOp::Argmax { "xv > bv" } else { "xv < bv" };
                let nan = if float { "(bv != bv && xv == xv)" } else { "false" };
                let body = format!(
                    "{oi} int best = 0; for (int kk = 1; kk < {n}; ++kk) {{ {t} xv = {}; {t} bv = {}; if ({better} || {nan}) best = kk; }} v{}[j] = best;",
                    at("o", "kk", "ii"),
                    at("o", "best", "ii"),
                    r.0
                );
                self.each(r, &body);
            }
        }
        self.close_scratch();
        Ok(())
    }

    pub(super) fn cumsum(&mut self, i: Inst, axis: usize, reverse: bool) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, x) = (d.results[0], d.args[0]);
        let xd = self.dtype(x);
        if xd == DType::I1 {
            return Err(self.unsupported(i, "cannot scan i1"));
        }
        self.declare(r);
        let shape = k.ty(x).shape.clone();
        let outer: usize = shape[..axis].iter().product();
        let n = shape[axis];
        let inner: usize = shape[axis + 1..].iter().product();
        let t = ctype(xd);
        self.need_scratch(self.numel(x) * reg_bytes(xd));
        let plus = match xd {
            DType::I32 => "tg_add32(P, C)".to_string(),
            DType::I64 => "tg_add64(P, C)".to_string(),
            _ => narrow(xd, "(P + C)"),
        };
        let (k_of, prev_of) = if reverse { (format!("({n} - 1 - st)"), format!("({n} - st)")) } else { ("st".into(), "(st - 1)".into()) };
        let at = |kk: &str| format!("(({t}*)sb)[(o * {n} + {kk}) * {inner} + ii]");
        self.open_scratch();
        self.spill(x, 0);
        self.sync();
        let step = plus.replace('P', &at(&prev_of)).replace('C', &at(&k_of));
        self.line(&format!(
            "{} const int o = q / {inner}; const int ii = q % {inner}; for (int st = 1; st < {n}; ++st) {} = {step}; }}",
            strided("q", "tid", outer * inner, self.nt),
            at(&k_of)
        ));
        self.sync();
        self.each(r, &format!("v{}[j] = (({t}*)sb)[e];", r.0));
        self.close_scratch();
        Ok(())
    }

    pub(super) fn dot(&mut self, i: Inst, precision: DotPrecision) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let (r, a, b, c) = (d.results[0], d.args[0], d.args[1], d.args[2]);
        let rd = self.dtype(r);
        let (m, kk, n) = (k.ty(a).shape[0], k.ty(a).shape[1], k.ty(b).shape[1]);
        let acc = match rd {
            DType::F16 | DType::BF16 | DType::F32 => DType::F32,
            DType::F64 => DType::F64,
            _ => return Err(self.unsupported(i, "dot accumulates in floats only")),
        };
        self.declare(r);
        let t = ctype(acc);
        let sz = reg_bytes(acc);
        let tf32 = precision == DotPrecision::Tf32 && self.dtype(a) == DType::F32 && acc == DType::F32;
        let conv = |v: Value, g: &Gen| {
            let e = convert(g.dtype(v), acc, &format!("v{}[j]", v.0));
            if tf32 {
                format!("tg_tf32({e})")
            } else {
                e
            }
        };
        let (ca, cb) = (conv(a, self), conv(b, self));
        let (regs, numel, nt) = (self.regs(r), self.numel(r), self.nt);
        // Every register of a thread in one column (`tid % n`), at rows `tid / n + S * j`: a is
        // kept transposed, with each thread's rows side by side, so that a step over k reads
        // them in a few wide loads (one address for a warp) and one element of b.
        let strip = !self.scalar(r) && nt % n == 0 && regs * nt == numel && m % (nt / n) == 0 && regs == m / (nt / n);
        let stride = nt / n;
        // Rows of transposed a padded by 4 elements (16 bytes apart stay 16 bytes apart):
        // a warp writing one row of a, 32 steps of k, then meets 4 banks at a time, not 1.
        let pitch = if strip && m % 4 == 0 { m + 4 } else { m };
        let boff = (pitch * kk * sz).div_ceil(16) * 16;
        self.need_scratch(boff + kk * n * sz);
        self.open_scratch();
        if strip {
            self.each_of(
                a,
                &format!("(({t}*)sb)[(e % {kk}) * {pitch} + ((e / {kk}) % {stride}) * {regs} + (e / {kk}) / {stride}] = {ca};"),
            );
        } else {
            self.each_of(a, &format!("(({t}*)sb)[e] = {ca};"));
        }
        self.each_of(b, &format!("(({t}*)(sb + {boff}))[e] = {cb};"));
        self.sync();
        // Each output accumulates over k in order, as the reference's `dot` does: in f32 one
        // fused multiply-add a step, in f64 products and sums rounded apart. k is the outer
        // loop so that a column of b, when every register of a thread is in one column, is
        // read once.
        let step = |s: &str, x: &str, y: &str| {
            if acc == DType::F32 {
                format!("__fmaf_rn({x}, {y}, {s})")
            } else {
                format!("__dadd_rn({s}, __dmul_rn({x}, {y}))")
            }
        };
        let cv = convert(self.dtype(c), acc, &format!("v{}[j]", c.0));
        let one_col = !self.scalar(r) && nt % n == 0;
        let bq = if one_col { "bq".to_string() } else { format!("(({t}*)(sb + {boff}))[q * {n} + (e % {n})]") };
        let hoist = if one_col { format!("const {t} bq = (({t}*)(sb + {boff}))[q * {n} + (tid % {n})];") } else { String::new() };
        self.line("{");
        self.line(&format!("{t} s[{regs}];"));
        let guard = if regs * nt == numel { String::new() } else { format!("if (e < {numel}) ") };
        let otherwise = if regs * nt == numel { String::new() } else { format!(" else s[j] = ({t})0;") };
        self.line(&self.registers(regs, &format!("{{ const int e = tid + j * {nt}; {guard}s[j] = {cv};{otherwise} }}")));
        if strip {
            let (wide, w) = match acc {
                DType::F32 if regs % 4 == 0 => ("float4", 4),
                DType::F64 if regs % 2 == 0 => ("double2", 2),
                _ => (t, 1),
            };
            // Steps over k unrolled until they read about 512 bytes of a a thread (8 steps of 16
            // floats): the loop's own instructions are then 7 beside 256 products and sums.
            let unroll = (512 / (regs * sz)).clamp(2, 8);
            let lanes = ["x", "y", "z", "w"];
            let mut body = String::new();
            for l in lanes.iter().take(w) {
                let el = if w == 1 { "a4".to_string() } else { format!("a4.{l}") };
                let at = lanes.iter().position(|x| x == l).unwrap_or(0);
                let sj = format!("s[{w} * jw + {at}]");
                let _ = write!(body, " {sj} = {};", step(&sj, &el, "bq"));
            }
            let uj = self.unroll(regs);
            self.line(&format!(
                "#pragma unroll {unroll}\nfor (int q = 0; q < {kk}; ++q) {{ {hoist} const {wide}* ap = (const {wide}*)((({t}*)sb) + q * {pitch} + (tid / {n}) * {regs});\n{uj}for (int jw = 0; jw < {}; ++jw) {{ const {wide} a4 = ap[jw];{body} }} }}",
                regs / w
            ));
        } else {
            let each = format!(
                "{{ const int e = tid + j * {nt}; if (e < {numel}) s[j] = {}; }}",
                step("s[j]", &format!("(({t}*)sb)[(e / {n}) * {kk} + q]"), &bq)
            );
            self.line(&format!("for (int q = 0; q < {kk}; ++q) {{ {hoist}\n{} }}", self.registers(regs, &each)));
        }
        let body = format!("v{}[j] = {};", r.0, narrow(rd, "s[j]"));
        self.each(r, &body);
        self.line("}");
        self.close_scratch();
        Ok(())
    }
}

/// Opens (with `{`) a block that runs `var` from `first` to below `count` in steps of `step`, a
/// loop where a thread may take several values, else an `if` (`count <= step`): the compiler
/// then neither unrolls nor peels a loop that runs at most once (a fifth of the machine code
/// of a cross-entropy VJP kernel went in such loops).
fn strided(var: &str, first: &str, count: usize, step: usize) -> String {
    match count <= step {
        true => format!("if ({first} < {count}) {{ const int {var} = {first};"),
        false => format!("for (int {var} = {first}; {var} < {count}; {var} += {step}) {{"),
    }
}
