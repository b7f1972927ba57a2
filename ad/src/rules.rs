//! One forward rule and one VJP rule per compute op, in one place.
//!
//! Both work on [`BTile`]s (batched f64 tiles). Memory ops (`load`, `store`, `atomic_add`,
//! `addptr`), program ids and control flow (`for`, `if`, `yield`) are the evaluator's business;
//! for them these functions return [`AdError::Unsupported`]-style [`AdError::Rule`] errors.

use crate::{AdError, BTile};
use tilegrad_ir::{Op, Type};

/// How values are rounded while evaluating.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Precision {
    /// Every float op in f64 (the ground truth); `dot` is exact.
    #[default]
    F64,
    /// Every float result rounded to its IR dtype (f32, f16, bf16), `dot` honouring its
    /// `input_precision`, as the reference interpreter computes.
    Native,
}

/// Evaluates compute op `op` on a batch.
pub fn eval(op: &Op, args: &[&BTile], arg_types: &[&Type], result_type: &Type, precision: Precision) -> Result<BTile, AdError> {
    let _ = (op, args, arg_types, result_type, precision);
    todo!("rules::eval")
}

/// The VJP of compute op `op`: one cotangent per operand, `None` where it is symbolically zero
/// (integer and boolean operands, conditions, indices).
pub fn vjp(op: &Op, args: &[&BTile], arg_types: &[&Type], result: &BTile, result_type: &Type, cot: &BTile) -> Result<Vec<Option<BTile>>, AdError> {
    let _ = (op, args, arg_types, result, result_type, cot);
    todo!("rules::vjp")
}
