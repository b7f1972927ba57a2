//! Control flow: blocks, `if` branches and `for`/`while` loops (trip counts, `max_iters`, the
//! scratch halves a loop body alternates between).

use super::*;

impl<'k> Gen<'k> {
    /// Emits the instructions of a block; returns the operands of its final `yield`.
    pub(super) fn block(&mut self, b: Block) -> Result<Vec<Value>, GpuError> {
        // Scratch left by ops outside the block may be overwritten before (or while) it runs.
        self.resident.clear();
        let k = self.k;
        let mut ys = Vec::new();
        for &i in &k.block(b).insts {
            let d = k.inst(i);
            if let Op::Yield = d.op {
                ys = d.args.to_vec();
                break;
            }
            self.inst(i)?;
        }
        Ok(ys)
    }

    pub(super) fn branch(&mut self, i: Inst, b: Block) -> Result<(), GpuError> {
        self.depth += 1;
        let ys = self.block(b)?;
        let results = self.k.inst(i).results.clone();
        for (r, y) in results.iter().zip(ys) {
            self.copy(*r, y);
        }
        self.fence();
        self.depth -= 1;
        Ok(())
    }

    pub(super) fn loop_index(&mut self, i: Inst) -> usize {
        self.loops.push(i);
        self.loops.len() - 1
    }

    pub(super) fn for_loop(&mut self, i: Inst, body: Block, max_iters: Option<u32>) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let li = self.loop_index(i);
        for &r in &d.results {
            self.declare(r);
        }
        for (r, &init) in d.results.iter().zip(&d.args[3..]) {
            self.copy(*r, init);
        }
        // The bounds must not come from a failed lane's stand-in values.
        self.fence();
        let n = i.0;
        let step0 = self.message("loop step is zero".into());
        self.line(&format!(
            "const i64 tg_lo{n} = (i64)v{}[0], tg_hi{n} = (i64)v{}[0], tg_st{n} = (i64)v{}[0];",
            d.args[0].0, d.args[1].0, d.args[2].0
        ));
        let f = self.fail(i, ERR_RUNTIME, "0", "0", &step0.to_string());
        self.line(&format!("if (tg_st{n} == 0 && tid == 0) {f}"));
        self.check(i);
        self.flush();
        self.line(&format!(
            "const u64 tg_as{n} = tg_st{n} > 0 ? (u64)tg_st{n} : (u64)0 - (u64)tg_st{n}; const bool tg_pos{n} = tg_st{n} > 0 ? tg_hi{n} > tg_lo{n} : tg_lo{n} > tg_hi{n}; const u64 tg_span{n} = tg_st{n} > 0 ? (u64)tg_hi{n} - (u64)tg_lo{n} : (u64)tg_lo{n} - (u64)tg_hi{n}; const u64 tg_trips{n} = tg_pos{n} ? tg_span{n} / tg_as{n} + (tg_span{n} % tg_as{n} != 0) : 0;"
        ));
        // Past `max_iters`, or without it past the reference's limit: an error before any trip.
        let (limit, f) = match max_iters {
            Some(m) => (u64::from(m), self.fail(i, ERR_LOOP, "0", "0", &format!("tg_trips{n}"))),
            None => {
                let long = self.message(tilegrad_reference::long_for_message());
                (tilegrad_reference::WHILE_LIMIT, self.fail(i, ERR_RUNTIME, "0", "0", &long.to_string()))
            }
        };
        self.line(&format!("if (tg_trips{n} > {limit}ULL && tid == 0) {f}"));
        self.check(i);
        self.flush();
        self.line(&format!("if (tid == 0) atomicMax((unsigned long long*)(TG_TRIPS + {li}), (unsigned long long)tg_trips{n} + 1ULL);"));
        let iv_ty = self.dtype(d.args[0]);
        let params = k.block(body).params.clone();
        self.line(&format!("for (u64 tg_t{n} = 0; tg_t{n} < tg_trips{n}; ++tg_t{n}) {{"));
        self.depth += 1;
        let ivp = params[0];
        self.declare(ivp);
        self.line(&format!("v{}[0] = ({})((u64)tg_lo{n} + (u64)tg_st{n} * tg_t{n});", ivp.0, ctype(iv_ty)));
        for (p, r) in params[1..].iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        // An innermost loop's body with an odd number of scratch ops would have its first op
        // use the half its last one read the iteration before: the halves are flipped on odd
        // iterations instead (the parity is settled once the body is emitted), so that they
        // alternate across iterations too, and no barrier is needed at the end of the body.
        let innermost = !k.block(body).insts.iter().any(|&x| matches!(k.inst(x).op, Op::For { .. } | Op::While { .. } | Op::If { .. }));
        let parity = format!("TG_PARITY_{n}_");
        if innermost {
            self.parity = Some(parity.clone());
        }
        self.write_merged();
        let (before, start) = (self.toggles, self.out.len());
        let ys = self.block(body)?;
        for (r, y) in d.results.iter().zip(ys) {
            self.copy(*r, y);
        }
        self.parity = None;
        let odd = (self.toggles - before) % 2 == 1;
        let flips = innermost && odd;
        let bit = if flips { format!("(int)(tg_t{n} & 1)") } else { "0".to_string() };
        self.write_merged();
        let text = self.out.split_off(start).replace(&parity, &bit);
        self.out.push_str(&text);
        // One scratch op whose reads after its last barrier are apart from its writes before
        // its first: the next iteration's writes cannot meet this one's reads.
        let alone = self.toggles - before == 1 && self.tail_apart;
        if odd && !alone && !flips {
            self.fence();
        } else {
            self.flush();
        }
        self.depth -= 1;
        self.line("}");
        self.resident.clear();
        if flips {
            // After an odd number of iterations the next op's half is the last one's.
            self.fence();
        }
        Ok(())
    }

    pub(super) fn while_loop(&mut self, i: Inst, cond: Block, body: Block, max_iters: Option<u32>) -> Result<(), GpuError> {
        let k = self.k;
        let d = k.inst(i);
        let li = self.loop_index(i);
        let n = i.0;
        for &r in &d.results {
            self.declare(r);
        }
        for (r, &init) in d.results.iter().zip(&d.args) {
            self.copy(*r, init);
        }
        self.fence();
        let limit = max_iters.map_or(tilegrad_reference::WHILE_LIMIT, u64::from);
        // The reference's rule: a trip that leaves unchanged every carried value the condition
        // depends on (and memory, where the condition reads it) is followed by the same trip
        // forever.
        let deps = tilegrad_ir::analysis::while_deps(k, i).expect("a `while` instruction");
        let endless = self.message(tilegrad_reference::endless_while_message(deps.reads_memory));
        let unbounded = self.message(format!(
            "`while` loop ran more than {} iterations without ending (give it a `max_iters` bound if it is meant to)",
            tilegrad_reference::WHILE_LIMIT
        ));
        self.line(&format!("u64 tg_wt{n} = 0;"));
        self.line("for (;;) {");
        self.depth += 1;
        self.line(&format!("bool tg_go{n};"));
        self.line("{");
        self.depth += 1;
        let cparams = k.block(cond).params.clone();
        for (p, r) in cparams.iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        let c = self.block(cond)?;
        // The loop may end here: scratch the condition read is fenced.
        self.fence();
        self.line(&format!("tg_go{n} = v{}[0];", c[0].0));
        self.depth -= 1;
        self.line("}");
        self.line(&format!("if (!tg_go{n}) break;"));
        self.line(&format!("tg_wt{n}++;"));
        let fail = match max_iters {
            Some(_) => self.fail(i, ERR_LOOP, "0", "0", &format!("tg_wt{n}")),
            None => self.fail(i, ERR_RUNTIME, "0", "0", &unbounded.to_string()),
        };
        self.line(&format!("if (tg_wt{n} > {limit}ULL && tid == 0) {fail}"));
        self.check(i);
        self.flush();
        self.line(&format!("const u64 tg_ev{n} = tg_nev; int tg_changed{n} = 0; (void)tg_ev{n};"));
        self.line("{");
        self.depth += 1;
        let bparams = k.block(body).params.clone();
        for (p, r) in bparams.iter().zip(&d.results) {
            self.declare(*p);
            self.copy(*p, *r);
        }
        let ys = self.block(body)?;
        for ((r, y), &dep) in d.results.iter().zip(ys).zip(&deps.carried) {
            // Changed, with the reference's `==` (a NaN always counts as a change).
            let cmp = format!("if (!(v{}[j] == v{}[j])) tg_changed{n} = 1;", r.0, y.0);
            match (dep, self.scalar(*r)) {
                (false, _) => {}
                (true, true) => self.line(&format!("{{ const int j = 0; {cmp} }}")),
                (true, false) => self.each(*r, &cmp),
            }
            self.copy(*r, y);
        }
        self.fence();
        self.depth -= 1;
        self.line("}");
        let f = self.fail(i, ERR_RUNTIME, "0", "0", &endless.to_string());
        let memory_same = if deps.reads_memory { format!(" && tg_nev == tg_ev{n}") } else { String::new() };
        self.line(&format!("if (!__syncthreads_or(tg_changed{n}){memory_same} && tid == 0) {f}"));
        self.check(i);
        self.flush();
        self.depth -= 1;
        self.line("}");
        self.line(&format!("if (tid == 0) atomicMax((unsigned long long*)(TG_TRIPS + {li}), (unsigned long long)tg_wt{n} + 1ULL);"));
        Ok(())
    }
}
