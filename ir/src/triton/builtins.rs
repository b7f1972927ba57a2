//! The Triton language functions (`tl.load`, `tl.sum`, `tl.make_block_ptr`,
//! `tl.make_tensor_descriptor`, ...), tensor methods (`x.to(...)`, `bp.advance(...)`,
//! `desc.load(...)`, `desc.store(...)`) and the few Python builtins a kernel may call, each mapped to
//! the builder method that implements it.

use super::convert::{off, Cx};
use super::errors::{fail, R};
use super::value::{literal_like, tensor, TensorDesc, Val};
use crate::{BlockPtr, DType, DotPrecision, Padding, Value};
use ruff_python_ast::{self as ast, Expr};

/// The evaluated arguments of a call.
pub(crate) struct Args {
    pos: Vec<(Val, u32)>,
    kw: Vec<(String, Val, u32)>,
    off: u32,
}

impl Args {
    /// Binds the arguments to the parameter `names` of function `f` (positional first, then by
    /// keyword); unknown keywords and surplus arguments are errors.
    pub(crate) fn bind(self, f: &str, names: &[&str]) -> R<Vec<Option<Val>>> {
        Ok(self.bind_at(f, names)?.into_iter().map(|a| a.map(|(v, _)| v)).collect())
    }

    /// Like [`Args::bind`], with the offset of each argument given (for errors that point at it).
    pub(crate) fn bind_at(self, f: &str, names: &[&str]) -> R<Vec<Option<(Val, u32)>>> {
        let mut out: Vec<Option<(Val, u32)>> = vec![None; names.len()];
        if self.pos.len() > names.len() {
            return fail(self.pos[names.len()].1, format!("`{f}` takes at most {} positional arguments", names.len()));
        }
        for (i, a) in self.pos.into_iter().enumerate() {
            out[i] = Some(a);
        }
        for (k, v, o) in self.kw {
            match names.iter().position(|n| *n == k) {
                Some(i) if out[i].is_none() => out[i] = Some((v, o)),
                Some(_) => return fail(o, format!("`{f}` got argument `{k}` twice")),
                None => return fail(o, format!("`{f}` has no parameter `{k}` (parameters: {})", names.join(", "))),
            }
        }
        Ok(out)
    }
}

/// The short name of a qualified path: `triton.language.x` becomes `tl.x`,
/// `triton.language.math.x` and the libdevice modules `tl.math.x`, `builtins.x` becomes `x`.
pub(crate) fn canonical(path: &str) -> String {
    // Any backend's libdevice (`triton.language.extra.{cuda,hip,...}.libdevice`).
    if let Some(rest) = path.strip_prefix("triton.language.extra.") {
        if let Some((_, f)) = rest.split_once("libdevice.") {
            return format!("tl.math.{f}");
        }
    }
    for (prefix, short) in [
        ("triton.language.extra.cuda.libdevice.", "tl.math."),
        ("triton.language.extra.libdevice.", "tl.math."),
        ("triton.language.libdevice.", "tl.math."),
        ("triton.language.core.", "tl."),
        ("triton.language.random.", "tl."),
        ("triton.language.", "tl."),
        ("builtins.", ""),
    ] {
        if let Some(rest) = path.strip_prefix(prefix) {
            return format!("{short}{rest}");
        }
    }
    path.to_string()
}

/// Triton's dtype names (`float32`, `int1`, ...).
pub(crate) fn dtype_name(s: &str) -> Option<DType> {
    if matches!(s, "i1" | "i32" | "i64" | "f16" | "f32" | "f64" | "bf16" | "fp16" | "fp32" | "fp64") {
        return None;
    }
    DType::from_name(s)
}

const UNARY: &[&str] = &["exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "abs", "sigmoid", "floor", "ceil", "erf", "tanh"];

fn need_int(v: &Option<Val>, what: &str, o: u32) -> R<i64> {
    match v {
        Some(Val::Int(i)) => Ok(*i),
        Some(Val::Bool(b)) => Ok(*b as i64),
        Some(other) => fail(o, format!("{what} must be a constant int, found {}", other.kind())),
        None => fail(o, format!("{what} is missing")),
    }
}

fn opt_axis(v: &Option<Val>, o: u32) -> R<Option<isize>> {
    match v {
        None | Some(Val::None) => Ok(None),
        Some(v) => Ok(Some(need_int(&Some(v.clone()), "`axis`", o)? as isize)),
    }
}

fn flag(v: &Option<Val>, what: &str, o: u32) -> R<bool> {
    match v {
        None | Some(Val::None) => Ok(false),
        Some(Val::Bool(b)) => Ok(*b),
        Some(Val::Int(i)) => Ok(*i != 0),
        Some(other) => fail(o, format!("{what} must be a constant bool, found {}", other.kind())),
    }
}

/// A static shape: a tuple or list of positive constant ints (or one int).
fn shape(v: &Option<Val>, o: u32) -> R<Vec<usize>> {
    let items = match v {
        Some(Val::Tuple(items)) => items.clone(),
        Some(Val::Int(i)) => vec![Val::Int(*i)],
        Some(other) => return fail(o, format!("a shape must be a tuple of constant ints, found {}", other.kind())),
        None => return fail(o, "the shape is missing"),
    };
    if items.len() > crate::MAX_RANK {
        return fail(o, format!("a tile has at most {} dims", crate::MAX_RANK));
    }
    items
        .iter()
        .map(|x| match x {
            Val::Int(i) if *i > 0 && *i <= 1 << 24 => Ok(*i as usize),
            other => fail(o, format!("shape entries must be positive constant ints (at most 2^24), found {}", other.kind())),
        })
        .collect()
}

fn ints(v: &Option<Val>, what: &str, o: u32) -> R<Vec<i64>> {
    match v {
        None | Some(Val::None) => Ok(Vec::new()),
        Some(Val::Tuple(items)) => items.iter().map(|x| need_int(&Some(x.clone()), what, o)).collect(),
        Some(Val::Int(i)) => Ok(vec![*i]),
        Some(other) => fail(o, format!("{what} must be a tuple of constant ints, found {}", other.kind())),
    }
}

fn dtype(v: &Option<Val>, o: u32) -> R<Option<DType>> {
    match v {
        None | Some(Val::None) => Ok(None),
        Some(Val::DType(d)) => Ok(Some(*d)),
        Some(Val::OtherDType(d)) => fail(
            o,
            format!("`tl.{d}` is not a dtype tilegrad computes in (i1, i32, i64, f16, bf16, f32, f64): it can be bound and compared only"),
        ),
        Some(other) => fail(o, format!("expected a dtype such as `tl.float32`, found {}", other.kind())),
    }
}

/// `tl.where(c, a, b)` (also the conditional expression on tensors).
pub(crate) fn where_(cx: &mut Cx, c: Val, a: Val, b: Val, o: u32) -> R<Val> {
    let c = tensor(&mut cx.b, &c, o, "the condition")?;
    let (a, b) = match (&a, &b) {
        (Val::Tensor(x), v) if v.is_const() => (*x, literal_like(&mut cx.b, v, *x, o, "a value")?),
        (v, Val::Tensor(y)) if v.is_const() => (literal_like(&mut cx.b, v, *y, o, "a value")?, *y),
        _ => (tensor(&mut cx.b, &a, o, "a value")?, tensor(&mut cx.b, &b, o, "a value")?),
    };
    Ok(Val::Tensor(cx.b.where_(c, a, b)))
}

impl Cx<'_> {
    /// Evaluates the arguments of a call.
    pub(crate) fn args(&mut self, c: &ast::ExprCall) -> R<Args> {
        let mut pos = Vec::new();
        for a in c.arguments.args.iter() {
            if let Expr::Starred(s) = a {
                return fail(off(s), "`*args` in calls is not supported");
            }
            pos.push((self.expr(a)?, off(a)));
        }
        let mut kw = Vec::new();
        for k in c.arguments.keywords.iter() {
            let Some(name) = &k.arg else { return fail(off(k), "`**kwargs` in calls is not supported") };
            kw.push((name.id.to_string(), self.expr(&k.value)?, off(k)));
        }
        Ok(Args { pos, kw, off: off(c) })
    }

    /// A call expression: a Triton function, a method, a helper, or a Python builtin.
    pub(crate) fn call(&mut self, c: &ast::ExprCall) -> R<Val> {
        let o = off(c);
        if let Expr::Attribute(a) = &*c.func {
            let recv = self.expr(&a.value)?;
            if !matches!(recv, Val::Module(_) | Val::SourceModule(_)) {
                let mut args = self.args(c)?;
                self.at(o);
                return self.method(recv, &a.attr.id, &mut args, o);
            }
        }
        let f = self.expr(&c.func)?;
        let args = self.args(c)?;
        self.at(o);
        match f {
            Val::Func(file, name) => self.call_helper(file, &name, args, o),
            Val::Module(p) => {
                let name = canonical(&p);
                self.builtin(&name, args, o)
            }
            Val::DType(d) => self.dtype_call(d, args, o),
            other => fail(o, format!("{} is not callable", other.kind())),
        }
    }

    fn method(&mut self, recv: Val, name: &str, args: &mut Args, o: u32) -> R<Val> {
        let a = std::mem::replace(args, Args { pos: Vec::new(), kw: Vec::new(), off: o });
        match (name, &recv) {
            ("to", Val::Tensor(t)) => {
                let b = a.bind("to", &["dtype", "fp_downcast_rounding", "bitcast"])?;
                match dtype(&b[0], o)? {
                    Some(d) => Ok(Val::Tensor(self.b.cast(*t, d))),
                    None => fail(o, "`.to` needs a dtype"),
                }
            }
            ("load", Val::TensorDesc(d)) => {
                let b = a.bind_at("load", &["offsets"])?;
                let offs = self.desc_offsets(d, &b[0], o)?;
                Ok(Val::Tensor(self.desc_load(d, &offs)))
            }
            ("store", Val::TensorDesc(d)) => {
                let b = a.bind_at("store", &["offsets", "value"])?;
                let offs = self.desc_offsets(d, &b[0], o)?;
                let v = match &b[1] {
                    Some((v, vo)) => tensor(&mut self.b, v, *vo, "the value")?,
                    None => return fail(o, "`desc.store` needs offsets and a value: `desc.store([off0, ...], value)`"),
                };
                self.desc_store(d, &offs, v);
                Ok(Val::None)
            }
            (_, Val::TensorDesc(_)) => {
                fail(o, format!("a tensor descriptor has no method `{name}` (supported: `.load(offsets)`, `.store(offsets, value)`)"))
            }
            ("load" | "store", _) => fail(
                o,
                format!(
                    "`.{name}` is a method of tensor descriptors (`tl.make_tensor_descriptor`), not of {}: use `tl.{name}(pointer, ...)`",
                    recv.kind()
                ),
            ),
            ("advance", Val::BlockPtr(_)) => {
                let mut a = a;
                a.pos.insert(0, (recv, o));
                self.builtin("tl.advance", a, o)
            }
            (_, Val::Tensor(_)) => {
                let mut a = a;
                a.pos.insert(0, (recv, o));
                self.builtin(&format!("tl.{name}"), a, o)
            }
            _ => fail(o, format!("{} has no method `{name}`", recv.kind())),
        }
    }

    /// `tl.make_tensor_descriptor(base, shape, strides, block_shape, padding_option="zero")`.
    fn make_tensor_descriptor(&mut self, a: Args, o: u32) -> R<Val> {
        let name = "tl.make_tensor_descriptor";
        let b = a.bind_at(name, &["base", "shape", "strides", "block_shape", "padding_option"])?;
        let missing =
            |what: &str| fail(o, format!("`{name}` needs `{what}` (`{name}(base, shape=[...], strides=[...], block_shape=[...])`)"));
        let Some((base, bo)) = &b[0] else { return missing("base") };
        let base = tensor(&mut self.b, base, *bo, "the base")?;
        let bt = self.b.ty(base);
        if !bt.is_ptr() || !bt.is_scalar() {
            return fail(*bo, format!("the base of a tensor descriptor must be a scalar pointer, found {bt}"));
        }
        let Some((bs, bso)) = &b[3] else { return missing("block_shape") };
        let bso = *bso;
        let block_shape = match bs {
            Val::Tuple(items) if !items.is_empty() && items.len() <= crate::MAX_RANK => items
                .iter()
                .map(|x| match x {
                    Val::Int(i) if *i > 0 && *i <= 1 << 24 => Ok(*i as usize),
                    other => {
                        fail(bso, format!("`block_shape` entries must be positive constant ints (constexprs), found {}", other.kind()))
                    }
                })
                .collect::<R<Vec<usize>>>()?,
            Val::Tuple(items) => return fail(bso, format!("a tensor descriptor has 1 to {} dims, found {}", crate::MAX_RANK, items.len())),
            other => return fail(bso, format!("`block_shape` must be a list of constant ints, found {}", other.kind())),
        };
        let n = block_shape.len();
        let mut parts = Vec::new();
        for (i, what) in [(1, "shape"), (2, "strides")] {
            let Some((v, vo)) = &b[i] else { return missing(what) };
            let Val::Tuple(items) = v else { return fail(*vo, format!("`{what}` must be a list or tuple, found {}", v.kind())) };
            if items.len() != n {
                return fail(*vo, format!("`{what}` has {} entries but `block_shape` has {n}: they must have one length", items.len()));
            }
            if what == "strides" {
                if let Some(last @ (Val::Int(_) | Val::Bool(_) | Val::Float(_))) = items.last() {
                    if !matches!(last, Val::Int(1)) {
                        return fail(*vo, format!("the last stride of a tensor descriptor must be 1 (contiguous), found {}", last.kind()));
                    }
                }
            }
            let mut vals = Vec::new();
            for x in items {
                let t = tensor(&mut self.b, x, *vo, &format!("`{what}` entries"))?;
                let ty = self.b.ty(t);
                if !ty.is_scalar() || !ty.dtype().is_some_and(|d| d.is_int()) {
                    return fail(*vo, format!("`{what}` entries must be integer scalars, found {ty}"));
                }
                vals.push(t);
            }
            parts.push(vals);
        }
        match &b[4] {
            None | Some((Val::None, _)) => {}
            Some((Val::Str(s), _)) if s == "zero" => {}
            Some((v, vo)) => {
                return fail(*vo, format!("tensor descriptors pad with zeros: `padding_option` must be \"zero\", found {}", v.kind()))
            }
        }
        let strides = parts.pop().unwrap_or_default();
        let shape = parts.pop().unwrap_or_default();
        Ok(Val::TensorDesc(TensorDesc { base, shape, strides, block_shape }))
    }

    /// `tl._experimental_descriptor_load(desc, offsets, shape, dtype)` and
    /// `tl._experimental_descriptor_store(desc, value, offsets)` on a host-built descriptor: the
    /// same accesses as `desc.load`/`desc.store`, with the block shape and dtype given at the
    /// call checked against the descriptor's.
    fn experimental_descriptor(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        let load = name.ends_with("load");
        let b = if load {
            a.bind_at(name, &["desc_pointer", "offsets", "shape", "dtype"])?
        } else {
            a.bind_at(name, &["desc_pointer", "value", "offsets"])?
        };
        let d = match &b[0] {
            Some((Val::TensorDesc(d), _)) => d.clone(),
            Some((v, vo)) => {
                return fail(
                    *vo,
                    format!(
                        "`{name}` needs a tensor descriptor (a kernel argument the spec passes as `descriptor(t, [..])`), found {}",
                        v.kind()
                    ),
                )
            }
            None => return fail(o, format!("`{name}` needs a descriptor")),
        };
        let offs = self.desc_offsets(&d, &b[if load { 1 } else { 2 }], o)?;
        if !load {
            let v = match &b[1] {
                Some((v, vo)) => tensor(&mut self.b, v, *vo, "the value")?,
                None => return fail(o, format!("`{name}` needs a value")),
            };
            self.desc_store(&d, &offs, v);
            return Ok(Val::None);
        }
        let (so, dto) = (b[2].as_ref().map_or(o, |x| x.1), b[3].as_ref().map_or(o, |x| x.1));
        let s = shape(&b[2].as_ref().map(|x| x.0.clone()), so)?;
        if s != d.block_shape {
            return fail(so, format!("`{name}` reads blocks of {s:?}, but the descriptor's block shape is {:?}", d.block_shape));
        }
        let want = dtype(&b[3].as_ref().map(|x| x.0.clone()), dto)?;
        let have = self.b.ty(d.base).elem;
        if let (Some(w), crate::Elem::Ptr(h)) = (want, have) {
            if w != h && !(self.promoted && h == DType::F64 && w.is_float()) {
                return fail(dto, format!("`{name}` reads {w}, but the descriptor's tensor holds {h}"));
            }
        }
        Ok(Val::Tensor(self.desc_load(&d, &offs)))
    }

    /// The offsets of a descriptor access: a list or tuple of one integer scalar per dim.
    fn desc_offsets(&mut self, d: &TensorDesc, v: &Option<(Val, u32)>, o: u32) -> R<Vec<Value>> {
        let n = d.block_shape.len();
        let Some((v, vo)) = v else {
            return fail(o, format!("a descriptor access needs offsets: a list of {n} element offsets, e.g. `desc.load([off0, ...])`"));
        };
        let items = match v {
            Val::Tuple(items) => items,
            other => return fail(*vo, format!("descriptor offsets must be a list or tuple of {n} ints, found {}", other.kind())),
        };
        if items.len() != n {
            return fail(*vo, format!("{} offsets for a tensor descriptor of rank {n}", items.len()));
        }
        items
            .iter()
            .map(|x| {
                let t = tensor(&mut self.b, x, *vo, "an offset")?;
                let ty = self.b.ty(t);
                if !ty.is_scalar() || !ty.dtype().is_some_and(|d| d.is_int()) {
                    return fail(*vo, format!("descriptor offsets must be integer scalars, found {ty}"));
                }
                Ok(t)
            })
            .collect()
    }

    /// The block pointer of a descriptor access (row-major order).
    fn desc_block_ptr(&mut self, d: &TensorDesc, offsets: &[Value]) -> BlockPtr {
        let order: Vec<usize> = (0..d.block_shape.len()).rev().collect();
        self.b.make_block_ptr(d.base, &d.shape, &d.strides, offsets, &d.block_shape, &order)
    }

    /// `desc.load(offsets)`: the block at `offsets`, zero outside the view in every dim.
    fn desc_load(&mut self, d: &TensorDesc, offsets: &[Value]) -> Value {
        let bp = self.desc_block_ptr(d, offsets);
        let all: Vec<usize> = (0..d.block_shape.len()).collect();
        self.b.load_block(&bp, &all, Padding::Zero)
    }

    /// `desc.store(offsets, value)`: writes the in-bounds elements of the block at `offsets`.
    fn desc_store(&mut self, d: &TensorDesc, offsets: &[Value], value: Value) {
        let bp = self.desc_block_ptr(d, offsets);
        let all: Vec<usize> = (0..d.block_shape.len()).collect();
        self.b.store_block(&bp, value, &all);
    }

    fn t(&mut self, v: &Option<Val>, what: &str, o: u32) -> R<Value> {
        match v {
            Some(v) => tensor(&mut self.b, v, o, what),
            None => fail(o, format!("{what} is missing")),
        }
    }

    fn opt_t(&mut self, v: &Option<Val>, what: &str, o: u32) -> R<Option<Value>> {
        match v {
            None | Some(Val::None) => Ok(None),
            Some(v) => Ok(Some(tensor(&mut self.b, v, o, what)?)),
        }
    }

    fn scalars(&mut self, v: &Option<Val>, what: &str, o: u32) -> R<Vec<Value>> {
        match v {
            Some(Val::Tuple(items)) => items.iter().map(|x| tensor(&mut self.b, x, o, what)).collect(),
            Some(other) => fail(o, format!("{what} must be a tuple, found {}", other.kind())),
            None => fail(o, format!("{what} is missing")),
        }
    }

    fn padding(&mut self, v: &Option<Val>, o: u32) -> R<Padding> {
        match v {
            None | Some(Val::None) => Ok(Padding::None),
            Some(Val::Str(s)) if s.is_empty() => Ok(Padding::None),
            Some(Val::Str(s)) if s == "zero" => Ok(Padding::Zero),
            Some(Val::Str(s)) if s == "nan" => Ok(Padding::Nan),
            Some(other) => fail(o, format!("`padding_option` must be \"zero\" or \"nan\", found {}", other.kind())),
        }
    }

    fn boundary(&mut self, v: &Option<Val>, o: u32) -> R<Vec<usize>> {
        ints(v, "`boundary_check`", o)?
            .into_iter()
            .map(|d| usize::try_from(d).map_or_else(|_| fail(o, "`boundary_check` dims must be non-negative"), Ok))
            .collect()
    }

    /// `tl.float32(x)`: a dtype called on a value is a cast to it (a Python number becomes a
    /// scalar of that dtype).
    fn dtype_call(&mut self, d: DType, a: Args, o: u32) -> R<Val> {
        let b = a.bind(&format!("tl.{d}"), &["x"])?;
        let x = match &b[0] {
            Some(Val::Tensor(t)) => *t,
            Some(v @ (Val::Int(_) | Val::Float(_) | Val::Bool(_))) => {
                let lit = match v {
                    Val::Int(i) => crate::Lit::Int(*i),
                    Val::Float(f) => crate::Lit::Float(*f),
                    _ => crate::Lit::Bool(super::value::truthy(v) == Some(true)),
                };
                if d.is_int() && matches!(lit, crate::Lit::Float(_)) {
                    let c = tensor(&mut self.b, v, o, "the operand")?;
                    return Ok(Val::Tensor(self.b.cast(c, d)));
                }
                return Ok(Val::Tensor(self.b.constant(lit, d)));
            }
            Some(other) => return fail(o, format!("`tl.{d}(...)` casts a tensor or a number, found {}", other.kind())),
            None => return fail(o, format!("`tl.{d}(...)` needs a value to cast")),
        };
        Ok(Val::Tensor(self.b.cast(x, d)))
    }

    /// `min(a, b, ...)`/`max(a, b, ...)` with a tensor among the arguments: Triton folds them into
    /// `tl.minimum`/`tl.maximum`, left to right.
    fn minmax_tensors(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        if !a.kw.is_empty() {
            return fail(a.kw[0].2, format!("`{name}` on tensors takes positional arguments only"));
        }
        let mut it = a.pos.into_iter();
        let Some((mut acc, _)) = it.next() else { return fail(o, format!("`{name}` needs arguments")) };
        for (v, vo) in it {
            let (x, y) = match (&acc, &v) {
                (Val::Tensor(x), w) if w.is_const() => (*x, literal_like(&mut self.b, w, *x, vo, "an operand")?),
                (w, Val::Tensor(y)) if w.is_const() => (literal_like(&mut self.b, w, *y, vo, "an operand")?, *y),
                _ if acc.is_const() && v.is_const() => {
                    let lt = super::value::fold_binary("<", &v, &acc, vo)?;
                    if let Some(Val::Bool(l)) = lt {
                        if l == (name == "min") {
                            acc = v;
                        }
                    }
                    continue;
                }
                _ => (tensor(&mut self.b, &acc, vo, "an operand")?, tensor(&mut self.b, &v, vo, "an operand")?),
            };
            acc = Val::Tensor(if name == "min" { self.b.minimum(x, y) } else { self.b.maximum(x, y) });
        }
        Ok(acc)
    }

    /// A Triton function or Python builtin, by canonical name (see [`canonical`]).
    fn builtin(&mut self, name: &str, a: Args, o: u32) -> R<Val> {
        // libdevice names that are Triton ops under another name, or compose from them.
        let name = match name {
            "tl.math.fast_expf" | "tl.math.expf" => "tl.math.exp",
            "tl.math.fast_logf" | "tl.math.logf" => "tl.math.log",
            "tl.math.fabs" | "tl.math.fabsf" => "tl.math.abs",
            "tl.math.sqrt_rn" | "tl.math.sqrtf" => "tl.math.sqrt",
            "tl.math.rsqrtf" => "tl.math.rsqrt",
            "tl.math.tanhf" => "tl.math.tanh",
            "tl.math.erff" => "tl.math.erf",
            "tl.math.floorf" => "tl.math.floor",
            "tl.math.ceilf" => "tl.math.ceil",
            "tl.math.pow" | "tl.math.powf" => "tl.math.pow",
            n => n,
        };
        if matches!(name, "tl.math.pow" | "tl.math.fast_dividef" | "tl.math.div_rn" | "tl.fdiv" | "tl.math.fdiv") {
            let b = a.bind(name, &["x", "y", "ieee_rounding"])?;
            let (Some(x), Some(y)) = (b[0].clone(), b[1].clone()) else { return fail(o, format!("`{name}` needs two operands")) };
            return self.binop(if name == "tl.math.pow" { "**" } else { "/" }, x, y, o);
        }
        if matches!(name, "tl.math.log1p" | "tl.math.expm1") {
            let b = a.bind(name, &["x"])?;
            let x = self.t(&b[0], "the operand", o)?;
            return Ok(Val::Tensor(if name == "tl.math.log1p" {
                let one = literal_like(&mut self.b, &Val::Int(1), x, o, "one")?;
                let s = self.b.add(x, one);
                self.b.log(s)
            } else {
                let e = self.b.exp(x);
                let one = literal_like(&mut self.b, &Val::Int(1), e, o, "one")?;
                self.b.sub(e, one)
            }));
        }
        if matches!(name, "min" | "max") && a.pos.iter().any(|(v, _)| matches!(v, Val::Tensor(_))) {
            return self.minmax_tensors(name, a, o);
        }
        let short = name.strip_prefix("tl.math.").or_else(|| name.strip_prefix("tl.")).unwrap_or(name);
        if name.starts_with("tl.") && UNARY.contains(&short) {
            let b = a.bind(name, &["x"])?;
            let x = self.t(&b[0], "the operand", o)?;
            let r = match short {
                "exp" => self.b.exp(x),
                "exp2" => self.b.exp2(x),
                "log" => self.b.log(x),
                "log2" => self.b.log2(x),
                "sqrt" => self.b.sqrt(x),
                "rsqrt" => self.b.rsqrt(x),
                "sin" => self.b.sin(x),
                "cos" => self.b.cos(x),
                "abs" => self.b.abs(x),
                "sigmoid" => self.b.sigmoid(x),
                "floor" => self.b.floor(x),
                "ceil" => self.b.ceil(x),
                "erf" => self.b.erf(x),
                _ => self.b.tanh(x),
            };
            return Ok(Val::Tensor(r));
        }
        let ao = a.off;
        match name {
            "tl.program_id" | "tl.num_programs" => {
                let b = a.bind(name, &["axis"])?;
                let axis = need_int(&b[0], "`axis`", o)?;
                if !(0..3).contains(&axis) {
                    return fail(o, format!("`axis` must be 0, 1 or 2, found {axis}"));
                }
                Ok(Val::Tensor(if name == "tl.program_id" { self.b.program_id(axis as u8) } else { self.b.num_programs(axis as u8) }))
            }
            "tl.arange" => {
                let b = a.bind(name, &["start", "end"])?;
                let (s, e) = (need_int(&b[0], "`start`", o)?, need_int(&b[1], "`end`", o)?);
                if e <= s || e - s > 1 << 24 {
                    return fail(o, format!("`tl.arange({s}, {e})` needs start < end (and at most 2^24 lanes)"));
                }
                Ok(Val::Tensor(self.b.arange(s, e)))
            }
            "tl.zeros" | "tl.full" => {
                let full = name == "tl.full";
                let b = if full { a.bind(name, &["shape", "value", "dtype"])? } else { a.bind(name, &["shape", "dtype"])? };
                let s = shape(&b[0], o)?;
                let d = dtype(&b[if full { 2 } else { 1 }], o)?.map_or_else(|| fail(o, format!("`{name}` needs a dtype")), Ok)?;
                if !full {
                    return Ok(Val::Tensor(self.b.zeros(&s, d)));
                }
                let v = match &b[1] {
                    Some(Val::Int(i)) => crate::Lit::Int(*i),
                    Some(Val::Float(f)) => crate::Lit::Float(*f),
                    Some(Val::Bool(x)) => crate::Lit::Bool(*x),
                    Some(Val::Tensor(t)) => {
                        let c = self.b.cast(*t, d);
                        return Ok(Val::Tensor(self.b.broadcast_to(c, &s)));
                    }
                    _ => return fail(o, "`tl.full` needs a value"),
                };
                Ok(Val::Tensor(self.b.full(&s, v, d)))
            }
            "tl.load" => {
                let b = a.bind(
                    name,
                    &["pointer", "mask", "other", "boundary_check", "padding_option", "cache_modifier", "eviction_policy", "volatile"],
                )?;
                if let Some(Val::TensorDesc(_)) = &b[0] {
                    return fail(o, "`tl.load` does not take a tensor descriptor: use `desc.load([off0, ...])`");
                }
                if let Some(Val::BlockPtr(bp)) = &b[0] {
                    if b[1].is_some() || b[2].is_some() {
                        return fail(o, "`mask`/`other` cannot be used with a block pointer: use `boundary_check` and `padding_option`");
                    }
                    let bc = self.boundary(&b[3], o)?;
                    let pad = self.padding(&b[4], o)?;
                    return Ok(Val::Tensor(self.b.load_block(bp, &bc, pad)));
                }
                let p = self.t(&b[0], "the pointer", o)?;
                let m = self.opt_t(&b[1], "the mask", o)?;
                let other = self.opt_t(&b[2], "`other`", o)?;
                Ok(Val::Tensor(self.b.load(p, m, other)))
            }
            "tl.store" => {
                let b = a.bind(name, &["pointer", "value", "mask", "boundary_check", "cache_modifier", "eviction_policy"])?;
                if let Some(Val::TensorDesc(_)) = &b[0] {
                    return fail(o, "`tl.store` does not take a tensor descriptor: use `desc.store([off0, ...], value)`");
                }
                if let Some(Val::BlockPtr(bp)) = &b[0] {
                    if b[2].is_some() {
                        return fail(o, "`mask` cannot be used with a block pointer: use `boundary_check`");
                    }
                    let bc = self.boundary(&b[3], o)?;
                    let v = self.t(&b[1], "the value", o)?;
                    self.b.store_block(bp, v, &bc);
                    return Ok(Val::None);
                }
                let p = self.t(&b[0], "the pointer", o)?;
                let v = self.t(&b[1], "the value", o)?;
                let m = self.opt_t(&b[2], "the mask", o)?;
                self.b.store(p, v, m);
                Ok(Val::None)
            }
            _ if super::atomics::is_atomic(name) => self.atomic(name, a, o),
            _ if super::random::is_random(name) => self.random(name, a, o),
            "tl.dot" => {
                let b = a.bind(name, &["input", "other", "acc", "input_precision", "allow_tf32", "max_num_imprecise_acc", "out_dtype"])?;
                let x = self.t(&b[0], "the first operand", o)?;
                let y = self.t(&b[1], "the second operand", o)?;
                let acc = self.opt_t(&b[2], "the accumulator", o)?;
                let prec = match (&b[3], &b[4]) {
                    (Some(Val::Str(s)), _) => match s.as_str() {
                        "ieee" => Some(DotPrecision::Ieee),
                        "tf32" | "tf32x3" => Some(DotPrecision::Tf32),
                        _ => return fail(o, format!("unknown `input_precision` \"{s}\" (supported: \"ieee\", \"tf32\")")),
                    },
                    (_, Some(Val::Bool(false))) => Some(DotPrecision::Ieee),
                    _ => None,
                };
                Ok(Val::Tensor(match prec {
                    Some(p) => self.b.dot_with(x, y, acc, p),
                    None => self.b.dot(x, y, acc),
                }))
            }
            "tl.sum" | "tl.max" | "tl.min" | "tl.argmax" | "tl.argmin" => {
                let b =
                    a.bind(name, &["input", "axis", "keep_dims", "return_indices", "return_indices_tie_break_left", "tie_break_left"])?;
                if flag(&b[3], "`return_indices`", o)? {
                    return fail(o, "`return_indices=True` is not supported: call `tl.argmax`/`tl.argmin`");
                }
                let x = self.t(&b[0], "the input", o)?;
                let axis = opt_axis(&b[1], o)?;
                let keep = flag(&b[2], "`keep_dims`", o)?;
                Ok(Val::Tensor(match name {
                    "tl.sum" => self.b.sum(x, axis, keep),
                    "tl.max" => self.b.max(x, axis, keep),
                    "tl.min" => self.b.min(x, axis, keep),
                    "tl.argmax" => self.b.argmax(x, axis, keep),
                    _ => self.b.argmin(x, axis, keep),
                }))
            }
            "tl.cumsum" => {
                let b = a.bind(name, &["input", "axis", "reverse"])?;
                let x = self.t(&b[0], "the input", o)?;
                let axis = opt_axis(&b[1], o)?.unwrap_or(0);
                let rev = flag(&b[2], "`reverse`", o)?;
                Ok(Val::Tensor(self.b.cumsum(x, axis, rev)))
            }
            "tl.where" => {
                let b = a.bind(name, &["condition", "x", "y"])?;
                match (&b[0], &b[1], &b[2]) {
                    (Some(c), Some(x), Some(y)) => where_(self, c.clone(), x.clone(), y.clone(), o),
                    _ => fail(o, "`tl.where` needs a condition and two values"),
                }
            }
            "tl.maximum" | "tl.minimum" => {
                let b = a.bind(name, &["x", "y", "propagate_nan"])?;
                let (Some(x), Some(y)) = (&b[0], &b[1]) else { return fail(o, format!("`{name}` needs two operands")) };
                let (x, y) = match (x, y) {
                    (Val::Tensor(x), v) if v.is_const() => (*x, literal_like(&mut self.b, v, *x, o, "an operand")?),
                    (v, Val::Tensor(y)) if v.is_const() => (literal_like(&mut self.b, v, *y, o, "an operand")?, *y),
                    _ => (tensor(&mut self.b, x, o, "an operand")?, tensor(&mut self.b, y, o, "an operand")?),
                };
                Ok(Val::Tensor(if name == "tl.maximum" { self.b.maximum(x, y) } else { self.b.minimum(x, y) }))
            }
            "tl.cdiv" | "triton.cdiv" => {
                let b = a.bind(name, &["x", "div"])?;
                let (Some(x), Some(y)) = (&b[0], &b[1]) else { return fail(o, "`cdiv` needs two operands") };
                if let (Val::Int(x), Val::Int(y)) = (x, y) {
                    if *y == 0 {
                        return fail(o, "`cdiv` by zero");
                    }
                    return match x.checked_div_euclid(*y) {
                        Some(q) => Ok(Val::Int(q + (x.rem_euclid(*y) != 0) as i64)),
                        None => fail(o, format!("integer overflow in `cdiv({x}, {y})`")),
                    };
                }
                let (x, y) = match (x, y) {
                    (Val::Tensor(x), v) if v.is_const() => (*x, literal_like(&mut self.b, v, *x, o, "an operand")?),
                    (v, Val::Tensor(y)) if v.is_const() => (literal_like(&mut self.b, v, *y, o, "an operand")?, *y),
                    _ => (tensor(&mut self.b, x, o, "an operand")?, tensor(&mut self.b, y, o, "an operand")?),
                };
                Ok(Val::Tensor(self.b.cdiv(x, y)))
            }
            "tl.cast" => {
                let b = a.bind(name, &["input", "dtype", "fp_downcast_rounding", "bitcast"])?;
                let x = self.t(&b[0], "the input", o)?;
                let d = dtype(&b[1], o)?.map_or_else(|| fail(o, "`tl.cast` needs a dtype"), Ok)?;
                Ok(Val::Tensor(self.b.cast(x, d)))
            }
            "tl.trans" | "tl.permute" => {
                let (x, dims) = match a.pos.len() {
                    n if n > 2 && name == "tl.trans" => {
                        let mut it = a.pos.into_iter();
                        let x = it.next().map(|v| v.0);
                        let dims: Vec<Val> = it.map(|v| v.0).collect();
                        (x, Some(Val::Tuple(dims)))
                    }
                    _ => {
                        let b = a.bind(name, &["input", "dims"])?;
                        (b[0].clone(), b[1].clone())
                    }
                };
                let x = self.t(&x, "the input", o)?;
                let dims = ints(&dims, "`dims`", o)?;
                if dims.is_empty() {
                    return Ok(Val::Tensor(self.b.trans(x)));
                }
                let perm: Vec<usize> = dims.iter().map(|&d| d.clamp(0, 64) as usize).collect();
                Ok(Val::Tensor(self.b.permute(x, &perm)))
            }
            "tl.reshape" | "tl.view" => {
                let b = a.bind(name, &["input", "shape", "can_reorder"])?;
                let x = self.t(&b[0], "the input", o)?;
                let s = shape(&b[1], o)?;
                Ok(Val::Tensor(self.b.reshape(x, &s)))
            }
            "tl.expand_dims" => {
                let b = a.bind(name, &["input", "axis"])?;
                let x = self.t(&b[0], "the input", o)?;
                let axis = need_int(&b[1], "`axis`", o)?;
                if self.b.ty(x).rank() >= crate::MAX_RANK {
                    return fail(o, format!("a tile has at most {} dims", crate::MAX_RANK));
                }
                Ok(Val::Tensor(self.b.expand_dims(x, axis.clamp(-64, 64) as isize)))
            }
            "tl.broadcast_to" => {
                let b = a.bind(name, &["input", "shape"])?;
                let x = self.t(&b[0], "the input", o)?;
                let s = shape(&b[1], o)?;
                Ok(Val::Tensor(self.b.broadcast_to(x, &s)))
            }
            "tl.make_block_ptr" => {
                let b = a.bind(name, &["base", "shape", "strides", "offsets", "block_shape", "order"])?;
                let base = self.t(&b[0], "the base", o)?;
                let sh = self.scalars(&b[1], "`shape`", o)?;
                let st = self.scalars(&b[2], "`strides`", o)?;
                let of = self.scalars(&b[3], "`offsets`", o)?;
                let bs = shape(&b[4], o)?;
                let order: Vec<usize> = ints(&b[5], "`order`", o)?.iter().map(|&d| d.clamp(0, 64) as usize).collect();
                if sh.len() != bs.len() || st.len() != bs.len() || of.len() != bs.len() || order.len() != bs.len() {
                    return fail(o, "`shape`, `strides`, `offsets`, `block_shape` and `order` must have one length");
                }
                Ok(Val::BlockPtr(self.b.make_block_ptr(base, &sh, &st, &of, &bs, &order)))
            }
            "tl.advance" => {
                let b = a.bind(name, &["base", "offsets"])?;
                let Some(Val::BlockPtr(bp)) = &b[0] else { return fail(o, "`tl.advance` needs a block pointer") };
                let bp: BlockPtr = bp.clone();
                let d = self.scalars(&b[1], "`offsets`", o)?;
                if d.len() != bp.offsets.len() {
                    return fail(o, format!("{} offsets for a block pointer of rank {}", d.len(), bp.offsets.len()));
                }
                Ok(Val::BlockPtr(self.b.advance(&bp, &d)))
            }
            "tl.static_assert" | "tl.device_assert" => {
                let b = a.bind(name, &["cond", "msg", "mask"])?;
                let msg = match &b[1] {
                    Some(Val::Str(s)) => s.clone(),
                    _ => String::new(),
                };
                match &b[0] {
                    Some(v) if v.is_const() => {
                        if super::value::truthy(v) == Some(false) {
                            return fail(o, format!("`{name}` failed: {msg}"));
                        }
                        Ok(Val::None)
                    }
                    Some(Val::Tensor(_)) if name == "tl.device_assert" => Ok(Val::None),
                    _ => fail(o, format!("`{name}` needs a constant condition")),
                }
            }
            "tl.multiple_of" | "tl.max_contiguous" | "tl.max_constancy" => {
                let b = a.bind(name, &["input", "values"])?;
                b[0].clone().map_or_else(|| fail(o, format!("`{name}` needs an input")), Ok)
            }
            "tl.constexpr" => {
                let b = a.bind(name, &["value"])?;
                b[0].clone().map_or_else(|| fail(o, "`tl.constexpr` needs a value"), Ok)
            }
            "tl.debug_barrier" | "tl.static_print" | "tl.device_print" | "print" => Ok(Val::None),
            "min" | "max" => {
                let mut best: Option<Val> = None;
                for (v, vo) in a.pos {
                    best = Some(match best {
                        None => v,
                        Some(b) => {
                            let lt = super::value::fold_binary("<", &v, &b, vo)?;
                            match lt {
                                Some(Val::Bool(l)) => {
                                    if l == (name == "min") {
                                        v
                                    } else {
                                        b
                                    }
                                }
                                _ => return fail(vo, format!("`{name}` is only supported on constants: use `tl.minimum`/`tl.maximum`")),
                            }
                        }
                    });
                }
                best.map_or_else(|| fail(ao, format!("`{name}` needs arguments")), Ok)
            }
            "int" | "float" | "abs" => {
                let b = a.bind(name, &["x"])?;
                match (name, &b[0]) {
                    ("int", Some(Val::Int(i))) => Ok(Val::Int(*i)),
                    ("int", Some(Val::Float(f))) if f.is_finite() && f.abs() < 9e18 => Ok(Val::Int(*f as i64)),
                    ("float", Some(Val::Int(i))) => Ok(Val::Float(*i as f64)),
                    ("float", Some(Val::Float(f))) => Ok(Val::Float(*f)),
                    ("float", Some(Val::Str(s))) => match s.trim().to_ascii_lowercase().as_str() {
                        "inf" | "+inf" | "infinity" => Ok(Val::Float(f64::INFINITY)),
                        "-inf" | "-infinity" => Ok(Val::Float(f64::NEG_INFINITY)),
                        "nan" => Ok(Val::Float(f64::NAN)),
                        t => t.parse::<f64>().map(Val::Float).map_or_else(|_| fail(o, format!("cannot convert \"{s}\" to float")), Ok),
                    },
                    ("abs", Some(Val::Int(i))) => i.checked_abs().map(Val::Int).map_or_else(|| fail(o, "integer overflow"), Ok),
                    ("abs", Some(Val::Float(f))) => Ok(Val::Float(f.abs())),
                    ("abs", Some(Val::Tensor(t))) => Ok(Val::Tensor(self.b.abs(*t))),
                    _ => fail(o, format!("`{name}` is only supported on constants")),
                }
            }
            "range" | "tl.range" | "tl.static_range" => fail(o, format!("`{name}` can only be iterated by a `for` loop")),
            "tl.make_tensor_descriptor" => self.make_tensor_descriptor(a, o),
            "tl._experimental_descriptor_load" | "tl._experimental_descriptor_store" => self.experimental_descriptor(name, a, o),
            "tl.load_tensor_descriptor" | "tl.store_tensor_descriptor" => {
                let load = name == "tl.load_tensor_descriptor";
                let b = if load { a.bind_at(name, &["desc", "offsets"])? } else { a.bind_at(name, &["desc", "offsets", "value"])? };
                let d = match &b[0] {
                    Some((Val::TensorDesc(d), _)) => d.clone(),
                    Some((v, vo)) => return fail(*vo, format!("`{name}` needs a tensor descriptor, found {}", v.kind())),
                    None => return fail(o, format!("`{name}` needs a tensor descriptor")),
                };
                let offs = self.desc_offsets(&d, &b[1], o)?;
                if load {
                    return Ok(Val::Tensor(self.desc_load(&d, &offs)));
                }
                let v = match &b[2] {
                    Some((v, vo)) => tensor(&mut self.b, v, *vo, "the value")?,
                    None => return fail(o, format!("`{name}` needs a value")),
                };
                self.desc_store(&d, &offs, v);
                Ok(Val::None)
            }
            _ => {
                let helpers = self.helpers_in_scope();
                let helpers = if helpers.is_empty() { "none".to_string() } else { helpers.join(", ") };
                fail(
                    o,
                    format!(
                        "unsupported function `{name}` (supported: tl.load/store/atomic_add, arange, zeros/full, program_id, num_programs, \
                         dot, sum/max/min/argmax/argmin, cumsum, where, maximum/minimum, exp/log/sqrt/... and tl.math.*, cdiv, \
                         rand/randn/randint/randint4x/philox/umulhi, trans/permute/reshape/expand_dims/broadcast_to, make_block_ptr/advance, make_tensor_descriptor, static_assert, \
                         and the jit helpers of this file and of the modules it imports: {helpers})"
                    ),
                )
            }
        }
    }
}
