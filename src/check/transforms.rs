//! What the forward does to an input, the backward must do too. A forward that shifts or scales
//! what it loads from an input by a constant before using it (`offset + w`, Gemma's RMSNorm
//! weight) computes with the transformed input, and so must the backward's derivative: a
//! backward that uses the input as loaded leaves every element wrong, and every line of the
//! slice feeds every wrong element alike. The kernels say it: the forward's load of the input is
//! followed by the constant op, the backward's loads of the same tensor are not.

use tilegrad_ir::{BinaryOp, Inst, Kernel, Lit, Loc, Op, Value};
use tilegrad_reference::{Arg, Memory};

/// A constant op applied to what a load read: the op, the constant and where.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Transform {
    pub op: BinaryOp,
    pub constant: f64,
    pub loc: Loc,
}

/// A launch as the rule needs it: its kernel and arguments.
pub(crate) type LaunchOf<'a> = (&'a Kernel, &'a [(String, Arg)]);

/// The loads of `bwd` (each with the note saying why it is suspect) of a tensor that every load
/// of it in the launches `fwd` transforms by a constant op that no load of it in `bwd` does.
pub(crate) fn untransformed_loads(fwd: &[LaunchOf], bwd: LaunchOf, mem: &Memory) -> Vec<(Inst, String)> {
    let theirs: Vec<(String, Inst, Vec<Transform>)> = fwd.iter().flat_map(|&l| loads(l, mem)).collect();
    let mine = loads(bwd, mem);
    let mut out = Vec::new();
    for (tensor, _, ts) in &mine {
        if !ts.is_empty() {
            continue;
        }
        let fwd_loads: Vec<&Vec<Transform>> = theirs.iter().filter(|(t, ..)| t == tensor).map(|(_, _, ts)| ts).collect();
        let has = |ts: &[Transform], t: &Transform| ts.iter().any(|x| x.op == t.op && x.constant == t.constant);
        let missing = fwd_loads
            .first()
            .into_iter()
            .flat_map(|ts| ts.iter())
            .find(|t| fwd_loads.iter().all(|ts| has(ts, t)) && !mine.iter().any(|(m, _, ts)| m == tensor && has(ts, t)));
        let Some(t) = missing else { continue };
        let file = std::path::Path::new(&*t.loc.file).file_name().map_or(String::new(), |f| f.to_string_lossy().into_owned());
        let note =
            format!("the forward {} what it loads from `{tensor}` ({file}:{}); here `{tensor}` is used as loaded", describe(t), t.loc.line);
        out.extend(mine.iter().filter(|(m, _, ts)| m == tensor && ts.is_empty()).map(|(_, i, _)| (*i, note.clone())));
    }
    out.dedup_by(|a, b| a.0 == b.0);
    out
}

/// "adds 1 to", "multiplies by 0.5".
fn describe(t: &Transform) -> String {
    let c = super::slice::fmt_val(t.constant);
    match t.op {
        BinaryOp::Add => format!("adds {c} to"),
        BinaryOp::Sub => format!("subtracts {c} from"),
        BinaryOp::Mul => format!("multiplies by {c}"),
        _ => format!("divides by {c}"),
    }
}

/// Every load of a tensor argument of `launch`: the tensor's name, the load and the constant
/// ops applied to what it read (through casts and broadcasts).
fn loads((k, args): LaunchOf, mem: &Memory) -> Vec<(String, Inst, Vec<Transform>)> {
    let src = tilegrad_ir::analysis::pointer_sources(k);
    let mut uses: Vec<Vec<Inst>> = vec![Vec::new(); k.values.len()];
    let mut def: Vec<Option<Inst>> = vec![None; k.values.len()];
    let mut found = Vec::new();
    k.walk(&mut |i, d| {
        for &a in &d.args {
            uses[a.index()].push(i);
        }
        for &r in &d.results {
            def[r.index()] = Some(i);
        }
        if matches!(d.op, Op::Load { .. }) {
            found.push(i);
        }
    });
    let tensor_of = |i: Inst| {
        let from = &src[k.inst(i).args[0].index()];
        let mut params = from.iter().enumerate().filter(|(_, &b)| b).map(|(j, _)| j);
        let (Some(j), None) = (params.next(), params.next()) else { return None };
        let name = &k.params[j].name;
        args.iter().find_map(|(n, a)| match a {
            Arg::Tensor(t) if n == name => Some(mem.name(*t).to_string()),
            _ => None,
        })
    };
    let constant = |v: Value| constant(k, &def, args, v);
    found
        .into_iter()
        .filter_map(|i| {
            let tensor = tensor_of(i)?;
            let mut ts = Vec::new();
            let mut stack = vec![k.inst(i).results[0]];
            while let Some(v) = stack.pop() {
                for &u in &uses[v.index()] {
                    let d = k.inst(u);
                    match d.op {
                        Op::Cast | Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape => stack.push(d.results[0]),
                        Op::Binary(op @ (BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div)) => {
                            let other = if d.args[0] == v { d.args[1] } else { d.args[0] };
                            let identity = if matches!(op, BinaryOp::Add | BinaryOp::Sub) { 0.0 } else { 1.0 };
                            if let Some(c) = constant(other).filter(|&c| c != identity) {
                                ts.push(Transform { op, constant: c, loc: d.loc.clone() });
                            }
                        }
                        _ => {}
                    }
                }
            }
            Some((tensor, i, ts))
        })
        .collect()
}

/// The number `v` is for the whole launch: a constant, or a scalar argument, through casts and
/// broadcasts.
fn constant(k: &Kernel, def: &[Option<Inst>], args: &[(String, Arg)], mut v: Value) -> Option<f64> {
    loop {
        let Some(i) = def[v.index()] else {
            let p = k.params.iter().find(|p| p.value == v)?;
            return args.iter().find_map(|(n, a)| match a {
                Arg::Scalar(l) if *n == p.name => Some(l.as_f64()),
                _ => None,
            });
        };
        let d = k.inst(i);
        match &d.op {
            Op::Const { value: Lit::Float(x) } => return Some(*x),
            Op::Const { value: Lit::Int(x) } => return Some(*x as f64),
            Op::Cast | Op::Broadcast | Op::ExpandDims { .. } | Op::Reshape => v = d.args[0],
            _ => return None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_ir::DType;
    use tilegrad_reference::{HostTensor, TensorId};

    const SRC: &str = "
@triton.jit
def fwd(X, W, Y, offset: tl.constexpr):
    cols = tl.arange(0, 4)
    w = tl.load(W + cols).to(tl.float32)
    tl.store(Y + cols, tl.load(X + cols) * (offset + w))

@triton.jit
def bwd(DY, W, DX, offset: tl.constexpr):
    cols = tl.arange(0, 4)
    w = tl.load(W + cols).to(tl.float32)
    tl.store(DX + cols, tl.load(DY + cols) * (w + offset))

@triton.jit
def bwd_raw(DY, W, DX, offset: tl.constexpr):
    cols = tl.arange(0, 4)
    w = tl.load(W + cols).to(tl.float32)
    tl.store(DX + cols, tl.load(DY + cols) * w)
";

    fn kernel(name: &str, ptrs: &[&str]) -> Kernel {
        let opts = ConvertOptions {
            constexprs: vec![("offset".into(), ConstValue::Float(1.0))],
            pointer_dtypes: ptrs.iter().map(|p| (p.to_string(), DType::F32)).collect(),
            ..ConvertOptions::default()
        };
        convert(SRC, "t.py", name, &opts).expect("the test kernel converts")
    }

    #[test]
    fn a_backward_that_uses_an_input_as_loaded_where_the_forward_shifts_it() {
        let mut mem = Memory::new();
        for n in ["x", "w", "y", "dy", "dx"] {
            mem.add(n, HostTensor::zeros(DType::F32, &[4]));
        }
        let t = |n: &str, id: u32| (n.to_string(), Arg::Tensor(TensorId(id)));
        let f = kernel("fwd", &["X", "W", "Y"]);
        let fa = [t("X", 0), t("W", 1), t("Y", 2)];
        let ba = [t("DY", 3), t("W", 1), t("DX", 4)];
        let ok = kernel("bwd", &["DY", "W", "DX"]);
        assert_eq!(untransformed_loads(&[(&f, &fa)], (&ok, &ba), &mem), vec![]);
        let raw = kernel("bwd_raw", &["DY", "W", "DX"]);
        let found = untransformed_loads(&[(&f, &fa)], (&raw, &ba), &mem);
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!(raw.inst(found[0].0).loc.line, 17);
        assert_eq!(found[0].1, "the forward adds 1 to what it loads from `w` (t.py:6); here `w` is used as loaded");
    }
}
