//! Loading the host steps that take tensors apart and put them together (`chunk`, `slice`,
//! `cat`) and the host scalars computed from data (`item`), with what follows from the latter:
//! a value known only as a pass runs decides no shape, binds no constexpr, and in the forward
//! is not a float computed from a differentiable input (no gradient would flow through it).

use super::{Loader, SpecError, Static};
use crate::check::expr::{Expr, Scalar};
use crate::check::tensor_expr::Operand;
use crate::check::{split_axis, step_item as item, step_pieces as pieces, Step};
use std::path::Path;
use tilegrad_ir::DType;
use toml::Table;

impl Loader {
    /// The `axis` key of a step (default 0).
    fn axis_of(&self, t: &Table, key: &str) -> Result<i64, SpecError> {
        match t.get("axis") {
            None => Ok(0),
            Some(v) => v.as_integer().ok_or_else(|| self.err(&format!("{key}.axis"), "expected an integer axis")),
        }
    }

    /// The source of a one-source step and the index of its axis.
    fn source_axis(&self, t: &Table, kind: &str, key: &str) -> Result<(String, DType, Vec<usize>, i64, usize), SpecError> {
        let skey = format!("{key}.{kind}");
        let src = self.string(&t[kind], &skey)?;
        let (d, s) = self.known(&src, &skey)?;
        let axis = self.axis_of(t, key)?;
        let Some((a, ..)) = split_axis(&s, axis) else {
            return Err(self.err(&format!("{key}.axis"), format!("axis {axis} of `{src}`, which has shape {s:?}")));
        };
        Ok((src, d, s, axis, a))
    }

    /// `{ chunk = "x", chunks = 2, axis = -1, into = ["a", "b"] }`: `a, b = x.chunk(2, -1)`.
    pub(super) fn chunk(&mut self, t: &Table, key: &str) -> Result<Step, SpecError> {
        self.only(t, key, &["chunk", "chunks", "axis", "into"])?;
        let (src, d, s, axis, a) = self.source_axis(t, "chunk", key)?;
        let ckey = format!("{key}.chunks");
        let chunks = t
            .get("chunks")
            .ok_or_else(|| self.err(&ckey, "missing: how many chunks"))?
            .as_integer()
            .and_then(|c| usize::try_from(c).ok())
            .filter(|&c| c >= 1)
            .ok_or_else(|| self.err(&ckey, "expected a positive integer"))?;
        let ikey = format!("{key}.into");
        let dsts = self.strings(t.get("into").ok_or_else(|| self.err(&ikey, "missing: the chunks' names, as [\"a\", \"b\"]"))?, &ikey)?;
        // An empty axis gives `chunks` empty chunks (torch), however many that is.
        let count = if s[a] == 0 { chunks } else { pieces::chunk_sizes(s[a], chunks).len() };
        if count != dsts.len() {
            let sizes = if s[a] == 0 { "0 each".to_string() } else { format!("{:?}", pieces::chunk_sizes(s[a], chunks)) };
            return Err(self.err(
                &ikey,
                format!(
                    "`{src}`.chunk({chunks}, {axis}) of shape {s:?} gives {count} chunks of sizes {sizes} (torch: ceil({} / \
                     {chunks}) each, the last what remains), {} named",
                    s[a],
                    dsts.len()
                ),
            ));
        }
        let sizes = pieces::chunk_sizes(s[a], chunks);
        for (i, (dst, k)) in dsts.iter().zip(sizes).enumerate() {
            let mut ns = s.clone();
            ns[a] = k;
            self.define(dst, d, ns, &format!("{ikey}[{i}]"))?;
        }
        Ok(Step::Chunk { src, chunks, axis, dsts })
    }

    /// `{ slice = "x", axis = 1, start = "0", stop = "H", step = 1, into = "x1" }`:
    /// `x1 = x[:, 0:H]` (start, stop and step optional).
    pub(super) fn slice(&mut self, t: &Table, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        self.only(t, key, &["slice", "axis", "start", "stop", "step", "into"])?;
        let (src, d, s, axis, a) = self.source_axis(t, "slice", key)?;
        let dst = self.target(t, key)?;
        let mut exprs: [Option<Expr>; 3] = [None, None, None];
        let mut values = [None; 3];
        for (i, k) in ["start", "stop", "step"].into_iter().enumerate() {
            let Some(v) = t.get(k) else { continue };
            let bkey = format!("{key}.{k}");
            let e = self.expr(v, &bkey)?;
            self.fixed(std::slice::from_ref(&e), &bkey, "a slice bound")?;
            let scope = Static { constants, tensors: &self.tensors };
            values[i] = Some(e.eval_int(&scope).map_err(|err| self.err(&bkey, format!("`{e}`: {err}")))?);
            exprs[i] = Some(e);
        }
        let pos = pieces::slice_positions(s[a], values[0], values[1], values[2]).map_err(|m| self.err(&format!("{key}.step"), m))?;
        let mut ns = s.clone();
        ns[a] = pos.len();
        self.define(&dst, d, ns, &format!("{key}.into"))?;
        let [start, stop, step] = exprs;
        Ok(Step::Slice { src, axis, start, stop, step, dst })
    }

    /// `{ cat = ["a", "b"], axis = -1, into = "c" }`: `c = torch.cat([a, b], -1)`.
    pub(super) fn cat(&mut self, t: &Table, key: &str) -> Result<Step, SpecError> {
        self.only(t, key, &["cat", "axis", "into"])?;
        let ckey = format!("{key}.cat");
        let srcs = self.strings(&t["cat"], &ckey)?;
        if srcs.is_empty() {
            return Err(self.err(&ckey, "expected the tensors to concatenate, as [\"a\", \"b\"]"));
        }
        let axis = self.axis_of(t, key)?;
        let dst = self.target(t, key)?;
        let known = srcs.iter().enumerate().map(|(i, n)| self.known(n, &format!("{ckey}[{i}]"))).collect::<Result<Vec<_>, _>>()?;
        if split_axis(&known[0].1, axis).is_none() {
            return Err(self.err(&format!("{key}.axis"), format!("axis {axis} of `{}`, which has shape {:?}", srcs[0], known[0].1)));
        }
        let parts: Vec<(&str, DType, &[usize])> = srcs.iter().zip(&known).map(|(n, (d, s))| (n.as_str(), *d, &s[..])).collect();
        let (shape, dtype, _) = pieces::cat_type(&parts, axis).map_err(|m| self.err(&ckey, m))?;
        self.define(&dst, dtype, shape, &format!("{key}.into"))?;
        Ok(Step::Cat { srcs, axis, dst })
    }

    /// `{ item = "sum(target != IGNORE)", into = "n_non_ignore" }`: a host scalar from data.
    pub(super) fn item(&mut self, t: &Table, key: &str, constants: &[(String, Scalar)]) -> Result<Step, SpecError> {
        self.only(t, key, &["item", "into"])?;
        let ikey = format!("{key}.item");
        let text = self.string(&t["item"], &ikey)?;
        let dst = self.target(t, key)?;
        let (reduce, expr) = item::parse(&text).map_err(|e| self.err(&ikey, format!("`{text}`: {e}")))?;
        let lookup = |n: &str| match self.tensors.iter().find(|(x, ..)| x == n) {
            Some((_, d, s)) => Some(Operand::Tensor(*d, s.clone())),
            None => constants.iter().find(|(c, _)| c == n).map(|(_, v)| Operand::Scalar(*v)),
        };
        let typed = expr.check(&lookup).map_err(|e| self.err(&ikey, format!("`{text}`: {e}")))?;
        let float = item::is_float(reduce, typed.dtype).map_err(|m| self.err(&ikey, format!("`{text}`: {m}")))?;
        if constants.iter().any(|(c, _)| *c == dst) || self.tensors.iter().any(|(n, ..)| *n == dst) {
            return Err(self.err(&format!("{key}.into"), format!("`{dst}` is already defined")));
        }
        if let Some(from) = typed.tensors.iter().find(|n| float && self.tainted.as_ref().is_some_and(|t| t.contains(n))) {
            return Err(self.err(
                &ikey,
                format!(
                    "`{text}` is a float computed from `{from}`, which depends on a differentiable input: no gradient flows \
                     through a host scalar, so the ground truth would miss it (an integer count, such as \
                     `sum(target != IGNORE)`, is piecewise constant and fine)"
                ),
            ));
        }
        self.items.push((dst.clone(), if float { Scalar::Float(1.0) } else { Scalar::Int(1) }, ikey));
        Ok(Step::Item { reduce, expr, dst })
    }

    /// The first host scalar of an `item` step that `e` uses.
    pub(super) fn dependent(&self, e: &Expr) -> Option<String> {
        e.names().into_iter().find(|n| self.items.iter().any(|(i, ..)| i == n))
    }

    /// Refuses expressions that use a host scalar from data where `what` is fixed at loading.
    pub(super) fn fixed(&self, exprs: &[Expr], key: &str, what: &str) -> Result<(), SpecError> {
        for e in exprs {
            if let Some(n) = self.dependent(e) {
                let at = self.items.iter().find(|(i, ..)| *i == n).map_or("", |(.., k)| k.as_str());
                return Err(self.err(
                    key,
                    format!("`{e}` uses `{n}`, which `{at}` computes from data: {what} is fixed when the spec loads, before any data"),
                ));
            }
        }
        Ok(())
    }

    /// The dtype of launch argument `n` = `e` when it uses a host scalar from data: passed as a
    /// runtime scalar (i32 or f32, as Triton passes a Python int or float), not folded into the
    /// kernel; `None` for any other argument.
    pub(super) fn runtime_arg(
        &self,
        e: &Expr,
        n: &str,
        file: &Path,
        kernel: &str,
        key: &str,
        scope: &Static,
    ) -> Result<Option<DType>, SpecError> {
        let Some(item) = self.dependent(e) else { return Ok(None) };
        let shown = file.display().to_string();
        let params = tilegrad_ir::triton::parameters(&self.sources[file], &shown, kernel).map_err(|err| self.err(key, err.to_string()))?;
        if params.iter().any(|(p, constexpr)| p == n && *constexpr) {
            return Err(
                self.err(key, format!("`{e}` uses `{item}`, which an `item` step computes from data: it cannot bind the constexpr `{n}`"))
            );
        }
        let float = match e.eval(scope) {
            Ok(v) => matches!(v, Scalar::Float(_)),
            Err(_) => self.items.iter().any(|(i, v, _)| *i == item && matches!(v, Scalar::Float(_))),
        };
        Ok(Some(if float { DType::F32 } else { DType::I32 }))
    }

    /// While the forward loads: marks what `step` makes from tensors that depend on a
    /// differentiable input (a launch: the tensors it may write, when it is passed any).
    pub(super) fn spread_taint(&mut self, step: &Step) {
        let Some(tainted) = self.tainted.as_mut() else { return };
        let made: Vec<String> = match step {
            Step::Launch(kl) => {
                let tensors: Vec<&str> = kl.args.iter().filter_map(|(_, e)| e.as_name()).collect();
                if !tensors.iter().any(|n| tainted.iter().any(|t| t == n)) {
                    return;
                }
                let uses = tilegrad_ir::analysis::param_uses(&kl.kernel);
                kl.kernel
                    .params
                    .iter()
                    .zip(&uses)
                    .filter(|(_, u)| u.stored || u.atomic)
                    .filter_map(|(p, _)| kl.args.iter().find(|(n, _)| *n == p.name).and_then(|(_, e)| e.as_name()).map(str::to_string))
                    .collect()
            }
            Step::Sum { src, dst, .. }
            | Step::Reshape { src, dst, .. }
            | Step::Scale { src, dst, .. }
            | Step::Cast { src, dst, .. }
            | Step::Reduce { src, dst, .. }
            | Step::Slice { src, dst, .. }
            | Step::Accumulate { src, dst } => {
                if !tainted.contains(src) {
                    return;
                }
                vec![dst.clone()]
            }
            Step::Chunk { src, dsts, .. } => {
                if !tainted.contains(src) {
                    return;
                }
                dsts.clone()
            }
            Step::Cat { srcs, dst, .. } => {
                if !srcs.iter().any(|n| tainted.contains(n)) {
                    return;
                }
                vec![dst.clone()]
            }
            Step::Compute { expr, dst, .. } => {
                if !expr.names().iter().any(|n| tainted.iter().any(|t| t == n)) {
                    return;
                }
                vec![dst.clone()]
            }
            Step::Alloc { .. } | Step::Item { .. } => return,
        };
        tainted.extend(made);
    }
}
