//! Batched tiles: the values of one IR value for a batch of program instances, in f64.
//!
//! The ground-truth evaluator holds every value in f64: floats are computed in f64 (or rounded to
//! their IR dtype in native-precision mode), and integers and booleans are held exactly (i32 and
//! i1 always fit; i64 values must stay within +-2^53, which the rules check). One storage type
//! keeps forward evaluation, reverse mode and rounding in one place.

use tilegrad_ir::Shape;

/// `batch` tiles of one shape, program-major: program `b`'s tile is
/// `data[b * numel .. (b + 1) * numel]`.
#[derive(Clone, Debug, PartialEq)]
pub struct BTile {
    /// Number of program instances.
    pub batch: usize,
    /// The per-program tile shape (empty for scalars).
    pub shape: Shape,
    /// `batch * numel` values.
    pub data: Vec<f64>,
}

impl BTile {
    /// A batch from data; `data.len()` must be `batch * numel(shape)`.
    pub fn new(batch: usize, shape: &[usize], data: Vec<f64>) -> BTile {
        debug_assert_eq!(data.len(), batch * shape.iter().product::<usize>());
        BTile { batch, shape: Shape::from_slice(shape), data }
    }

    /// Zeros.
    pub fn zeros(batch: usize, shape: &[usize]) -> BTile {
        let n: usize = shape.iter().product();
        BTile { batch, shape: Shape::from_slice(shape), data: vec![0.0; batch * n] }
    }

    /// The same value `v` in every element.
    pub fn full(batch: usize, shape: &[usize], v: f64) -> BTile {
        let n: usize = shape.iter().product();
        BTile { batch, shape: Shape::from_slice(shape), data: vec![v; batch * n] }
    }

    /// Elements per program.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    /// Program `b`'s tile.
    pub fn row(&self, b: usize) -> &[f64] {
        let n = self.numel();
        &self.data[b * n..(b + 1) * n]
    }

    /// Program `b`'s tile, mutably.
    pub fn row_mut(&mut self, b: usize) -> &mut [f64] {
        let n = self.numel();
        &mut self.data[b * n..(b + 1) * n]
    }
}
