//! The printer of the text format: writes a kernel in the syntax the parser reads back, one op per
//! line, with every known location, so that `parse(print(k)) == k`.
//!
//! The printer never panics, even on kernels that do not verify (it is used to show them in
//! errors): missing values or blocks print as `%?` or an empty block.

use super::lexer::quote;
use crate::kernel::{Block, InstData, Kernel, Loc, ParamKind, Value};
use crate::op::Op;
use crate::types::Lit;
use std::fmt::{self, Write};

/// Writes a literal. NaNs other than the canonical `f64::NAN` print with their bits,
/// `nan(0x...)`, so that they read back exactly; everything else prints via `Lit`'s `Display`.
pub(super) fn write_lit(out: &mut impl Write, lit: &Lit) -> fmt::Result {
    match *lit {
        Lit::Float(x) if x.is_nan() && x.to_bits() != f64::NAN.to_bits() => write!(out, "nan(0x{:016x})", x.to_bits()),
        l => write!(out, "{l}"),
    }
}

fn write_loc(out: &mut impl Write, loc: &Loc) -> fmt::Result {
    if loc.is_unknown() {
        return Ok(());
    }
    write!(out, " @ {}:{}:{}", quote(&loc.file), loc.line, loc.col)
}

struct Printer<'k, W> {
    k: &'k Kernel,
    out: W,
    /// Parameter names by value index.
    param_names: Vec<Option<&'k str>>,
}

impl<W: Write> Printer<'_, W> {
    fn name(&mut self, v: Value) -> fmt::Result {
        match self.param_names.get(v.index()).copied().flatten() {
            Some(n) => write!(self.out, "%{n}"),
            None => write!(self.out, "%{}", v.0),
        }
    }

    fn arg(&mut self, d: &InstData, i: usize) -> fmt::Result {
        match d.args.get(i) {
            Some(&v) => self.name(v),
            None => self.out.write_str("%?"),
        }
    }

    /// Writes `%v: type`.
    fn typed(&mut self, v: Value) -> fmt::Result {
        self.name(v)?;
        match self.k.values.get(v.index()) {
            Some(vd) => write!(self.out, ": {}", vd.ty),
            None => self.out.write_str(": ?"),
        }
    }

    /// Writes the args from `from` on, separated by `, `.
    fn args_from(&mut self, d: &InstData, from: usize) -> fmt::Result {
        for (j, &a) in d.args.iter().enumerate().skip(from) {
            if j > from {
                self.out.write_str(", ")?;
            }
            self.name(a)?;
        }
        Ok(())
    }

    fn indent(&mut self, depth: usize) -> fmt::Result {
        for _ in 0..depth {
            self.out.write_str("  ")?;
        }
        Ok(())
    }

    fn kernel(&mut self) -> fmt::Result {
        let k = self.k;
        write!(self.out, "kernel {}(", k.name)?;
        for (i, p) in k.params.iter().enumerate() {
            if i > 0 {
                self.out.write_str(", ")?;
            }
            write!(self.out, "%{}: ", p.name)?;
            match &p.kind {
                ParamKind::Ptr(d) => write!(self.out, "ptr<{d}>")?,
                ParamKind::Scalar(d) => write!(self.out, "{d}")?,
                ParamKind::Constexpr(d, lit) => {
                    write!(self.out, "constexpr {d} = ")?;
                    write_lit(&mut self.out, lit)?;
                }
            }
        }
        self.out.write_str(")")?;
        write_loc(&mut self.out, &k.loc)?;
        self.out.write_str(" {\n")?;
        self.block(k.body, 1)?;
        self.out.write_str("}\n")
    }

    fn block(&mut self, b: Block, depth: usize) -> fmt::Result {
        let Some(bd) = self.k.blocks.get(b.index()) else { return Ok(()) };
        for &i in &bd.insts {
            match self.k.insts.get(i.index()) {
                Some(d) => self.inst(d, depth)?,
                None => {
                    self.indent(depth)?;
                    writeln!(self.out, "# missing {i}")?;
                }
            }
        }
        Ok(())
    }

    fn inst(&mut self, d: &InstData, depth: usize) -> fmt::Result {
        self.indent(depth)?;
        for (j, &r) in d.results.iter().enumerate() {
            if j > 0 {
                self.out.write_str(", ")?;
            }
            self.typed(r)?;
        }
        if !d.results.is_empty() {
            self.out.write_str(" = ")?;
        }
        self.out.write_str(d.op.mnemonic())?;
        match &d.op {
            Op::ProgramId { axis } | Op::NumPrograms { axis } => write!(self.out, " {axis}")?,
            Op::Const { value } => {
                self.out.write_str(" ")?;
                write_lit(&mut self.out, value)?;
            }
            Op::Arange { start, end } => write!(self.out, " {start}, {end}")?,
            Op::Broadcast | Op::Reshape | Op::Cast | Op::Unary(_) => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
            }
            Op::ExpandDims { axis } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                write!(self.out, ", axis={axis}")?;
            }
            Op::Permute { perm } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                let p: Vec<String> = perm.iter().map(|p| p.to_string()).collect();
                write!(self.out, ", perm=[{}]", p.join(", "))?;
            }
            Op::Binary(_) | Op::AddPtr | Op::Where | Op::Yield => {
                if !d.args.is_empty() {
                    self.out.write_str(" ")?;
                    self.args_from(d, 0)?;
                }
            }
            Op::Cmp(c) => {
                write!(self.out, " {} ", c.name())?;
                self.args_from(d, 0)?;
            }
            Op::Reduce { kind, axis, keep_dims } => {
                write!(self.out, " {} ", kind.name())?;
                self.arg(d, 0)?;
                write!(self.out, ", axis={axis}")?;
                if *keep_dims {
                    self.out.write_str(", keep_dims")?;
                }
            }
            Op::Cumsum { axis, reverse } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                write!(self.out, ", axis={axis}")?;
                if *reverse {
                    self.out.write_str(", reverse")?;
                }
            }
            Op::Dot { precision } => {
                self.out.write_str(" ")?;
                self.args_from(d, 0)?;
                write!(self.out, ", precision={}", precision.name())?;
            }
            Op::Load { mask, other } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                if *mask {
                    self.out.write_str(", mask=")?;
                    self.arg(d, 1)?;
                }
                if *other {
                    self.out.write_str(", other=")?;
                    self.arg(d, if *mask { 2 } else { 1 })?;
                }
            }
            Op::Store { mask } | Op::AtomicAdd { mask } | Op::AtomicRmw { mask, .. } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                self.out.write_str(", ")?;
                self.arg(d, 1)?;
                if *mask {
                    self.out.write_str(", mask=")?;
                    self.arg(d, 2)?;
                }
            }
            Op::AtomicCas => {
                self.out.write_str(" ")?;
                self.args_from(d, 0)?;
            }
            Op::For { body, max_iters } => return self.for_op(d, *body, *max_iters, depth),
            Op::While { cond, body, max_iters } => return self.while_op(d, *cond, *body, *max_iters, depth),
            Op::If { then_block, else_block } => {
                self.out.write_str(" ")?;
                self.arg(d, 0)?;
                write_loc(&mut self.out, &d.loc)?;
                self.out.write_str(" {\n")?;
                self.block(*then_block, depth + 1)?;
                self.indent(depth)?;
                self.out.write_str("} else {\n")?;
                self.block(*else_block, depth + 1)?;
                self.indent(depth)?;
                return self.out.write_str("}\n");
            }
        }
        write_loc(&mut self.out, &d.loc)?;
        self.out.write_str("\n")
    }

    fn for_op(&mut self, d: &InstData, body: Block, max_iters: Option<u32>, depth: usize) -> fmt::Result {
        let params: &[Value] = self.k.blocks.get(body.index()).map_or(&[], |b| &b.params);
        self.out.write_str(" ")?;
        match params.first() {
            Some(&iv) => self.typed(iv)?,
            None => self.out.write_str("%?: ?")?,
        }
        self.out.write_str(" = ")?;
        self.arg(d, 0)?;
        self.out.write_str(" to ")?;
        self.arg(d, 1)?;
        self.out.write_str(" step ")?;
        self.arg(d, 2)?;
        if let Some(m) = max_iters {
            write!(self.out, ", max_iters={m}")?;
        }
        self.out.write_str(", iter_args(")?;
        let carried = d.args.len().saturating_sub(3).max(params.len().saturating_sub(1));
        for j in 0..carried {
            if j > 0 {
                self.out.write_str(", ")?;
            }
            match params.get(j + 1) {
                Some(&p) => self.typed(p)?,
                None => self.out.write_str("%?: ?")?,
            }
            self.out.write_str(" = ")?;
            self.arg(d, j + 3)?;
        }
        self.out.write_str(")")?;
        write_loc(&mut self.out, &d.loc)?;
        self.out.write_str(" {\n")?;
        self.block(body, depth + 1)?;
        self.indent(depth)?;
        self.out.write_str("}\n")
    }
}

impl<W: Write> Printer<'_, W> {
    /// `while [max_iters=N, ]iter_args(%a: T = %init, ...) { cond } do (%b: T, ...) { body }`.
    fn while_op(&mut self, d: &InstData, cond: Block, body: Block, max_iters: Option<u32>, depth: usize) -> fmt::Result {
        self.out.write_str(" ")?;
        if let Some(m) = max_iters {
            write!(self.out, "max_iters={m}, ")?;
        }
        self.out.write_str("iter_args(")?;
        let cp: Vec<Value> = self.k.blocks.get(cond.index()).map_or(Vec::new(), |b| b.params.clone());
        for j in 0..d.args.len().max(cp.len()) {
            if j > 0 {
                self.out.write_str(", ")?;
            }
            match cp.get(j) {
                Some(&p) => self.typed(p)?,
                None => self.out.write_str("%?: ?")?,
            }
            self.out.write_str(" = ")?;
            self.arg(d, j)?;
        }
        self.out.write_str(")")?;
        write_loc(&mut self.out, &d.loc)?;
        self.out.write_str(" {\n")?;
        self.block(cond, depth + 1)?;
        self.indent(depth)?;
        self.out.write_str("} do (")?;
        let bp: Vec<Value> = self.k.blocks.get(body.index()).map_or(Vec::new(), |b| b.params.clone());
        for (j, &p) in bp.iter().enumerate() {
            if j > 0 {
                self.out.write_str(", ")?;
            }
            self.typed(p)?;
        }
        self.out.write_str(") {\n")?;
        self.block(body, depth + 1)?;
        self.indent(depth)?;
        self.out.write_str("}\n")
    }
}

/// Writes `k` in the text format.
pub(super) fn write_kernel(k: &Kernel, out: &mut impl Write) -> fmt::Result {
    let mut param_names = vec![None; k.values.len()];
    for p in &k.params {
        if let Some(slot) = param_names.get_mut(p.value.index()) {
            *slot = Some(p.name.as_str());
        }
    }
    Printer { k, out, param_names }.kernel()
}
