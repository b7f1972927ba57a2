//! Padded lanes added into sums: the lanes of a tile past the end of a row (a load's mask is
//! false there, and it reads 0) must stay 0 until a sum over the tile, or the sum counts them.
//! `xc = x - mean` without `tl.where(mask, ..., 0.)` makes them `-mean`, and the variance summed
//! from `xc * xc` then adds `mean^2` for every padded lane: every element of the row is wrong and
//! every line of its slice feeds every wrong element alike. The recorded values of the program
//! say which op first made a padded lane other than 0 on its way into a sum.

use tilegrad_ir::{Inst, Kernel, Op, ReduceOp, Value};
use tilegrad_reference::{ProgramRecord, Recorded};

/// Padded lanes, at most, looked at per sum.
const LANES: usize = 64;

/// An op that made a padded lane other than 0, and the sum that added it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct PaddingSum {
    /// The op whose result is not 0 at the padded lane although its operands from the load are.
    pub op: Inst,
    /// The sum over the tile.
    pub sum: Inst,
    /// The masked load whose lane it is.
    pub load: Inst,
    /// The lane (of the summed tile) and the op's value there.
    pub lane: usize,
    pub value: f64,
}

/// The first op (nearest the load) on the way from a masked load into each sum that `summed`
/// admits (the sums on a slice), whose value at a lane the load masked off is not 0 where the
/// load read 0 there.
pub(crate) fn padding_into_sums(k: &Kernel, rec: &ProgramRecord, summed: impl Fn(Value) -> bool) -> Vec<PaddingSum> {
    let mut def: Vec<Option<Inst>> = vec![None; k.values.len()];
    let mut sums = Vec::new();
    k.walk(&mut |i, d| {
        for &r in &d.results {
            def[r.index()] = Some(i);
        }
        if matches!(d.op, Op::Reduce { kind: ReduceOp::Sum, .. }) && d.results.first().is_some_and(|&r| summed(r)) {
            sums.push(i);
        }
    });
    let at = |v: Value, l: usize| match rec.values.get(v.index()) {
        Some(Some(r @ Recorded::Num { .. })) => Some(r.at(l)),
        _ => None,
    };
    let mut out = Vec::new();
    for sum in sums {
        let v = k.inst(sum).args[0];
        let (loads, from_load) = masked_loads(k, &def, v);
        let found = loads.iter().find_map(|&load| {
            let d = k.inst(load);
            let (m, other) = (d.args[1], d.args.get(2).copied());
            let padded = (0..k.ty(v).shape.iter().product::<usize>())
                .filter(|&l| at(m, l) == Some(0.0) && other.is_none_or(|o| at(o, l) == Some(0.0)))
                .take(LANES);
            padded.filter(|&l| at(v, l).is_some_and(|x| x != 0.0)).find_map(|lane| {
                let op = first_nonzero(k, &def, &from_load, v, lane, &at)?;
                Some(PaddingSum { op, sum, load, lane, value: at(k.inst(op).results[0], lane)? })
            })
        });
        out.extend(found);
    }
    out
}

/// The masked loads of the shape of `v` that `v` is computed from elementwise, and per value
/// whether it is (one of those loads or an elementwise op of the shape of `v` on one).
fn masked_loads(k: &Kernel, def: &[Option<Inst>], v: Value) -> (Vec<Inst>, Vec<bool>) {
    let shape = &k.ty(v).shape;
    let mut from = vec![false; k.values.len()];
    let mut loads = Vec::new();
    let mut stack = vec![v];
    let mut seen = vec![false; k.values.len()];
    let mut order = Vec::new();
    while let Some(u) = stack.pop() {
        if std::mem::replace(&mut seen[u.index()], true) || &k.ty(u).shape != shape {
            continue;
        }
        let Some(i) = def[u.index()] else { continue };
        let d = k.inst(i);
        match d.op {
            Op::Load { mask: true, .. } => {
                loads.push(i);
                from[u.index()] = true;
            }
            Op::Binary(_) | Op::Unary(_) | Op::Cast => {
                stack.extend(d.args.iter().copied());
                order.push(u);
            }
            _ => {}
        }
    }
    // Operands before results: an op is on the loads' way when an operand is.
    for &u in order.iter().rev() {
        let d = k.inst(def[u.index()].expect("defined above"));
        from[u.index()] = d.args.iter().any(|a| from[a.index()]);
    }
    (loads, from)
}

/// Going down from `v` along operands on the loads' way that are not 0 at `lane`: the op whose
/// such operands are all 0 there (it made the lane what it is).
fn first_nonzero(
    k: &Kernel,
    def: &[Option<Inst>],
    from: &[bool],
    mut v: Value,
    lane: usize,
    at: &impl Fn(Value, usize) -> Option<f64>,
) -> Option<Inst> {
    loop {
        let i = def[v.index()]?;
        let d = k.inst(i);
        if matches!(d.op, Op::Load { .. }) {
            return None;
        }
        match d.args.iter().find(|&&a| from[a.index()] && at(a, lane).is_some_and(|x| x != 0.0)) {
            Some(&a) => v = a,
            None => return Some(i),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
    use tilegrad_ir::DType;
    use tilegrad_reference::{Grid, HostTensor, Launch, Memory, TensorId};

    const SRC: &str = "
@triton.jit
def var(X, Y, n, BLOCK: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    x = tl.load(X + cols, mask=cols < n, other=0.0)
    mean = tl.sum(x, axis=0) / n
    xc = x - mean
    xm = tl.where(cols < n, x - mean, 0.0)
    tl.store(Y, tl.sum(xc * xc, axis=0) + tl.sum(xm * xm, axis=0))
";

    #[test]
    fn the_op_that_made_a_padded_lane_other_than_zero_before_a_sum() {
        let opts = ConvertOptions {
            constexprs: vec![("BLOCK".into(), ConstValue::Int(8))],
            pointer_dtypes: vec![("X".into(), DType::F32), ("Y".into(), DType::F32)],
            ..ConvertOptions::default()
        };
        let k = convert(SRC, "v.py", "var", &opts).expect("the test kernel converts");
        let mut mem = Memory::new();
        mem.add("x", HostTensor::from_f32(&[6], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]));
        mem.add("y", HostTensor::zeros(DType::F32, &[1]));
        let l = Launch::new(&k, Grid([1, 1, 1])).arg("X", TensorId(0)).arg("Y", TensorId(1)).arg("n", 6);
        let rec = l.record_program(&mem, [0, 0, 0], None).expect("the program runs");
        let found = padding_into_sums(&k, &rec, |_| true);
        // Only the unmasked `x - mean` (line 7) reaches a sum with padded lanes 6 and 7 at -3.5;
        // the sum of `x` itself and the masked `xm` add zeros there.
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((k.inst(found[0].op).loc.line, found[0].lane, found[0].value), (7, 6, -3.5));
    }
}
