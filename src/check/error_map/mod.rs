//! Error maps: where in a failing tensor the elements over tolerance sit.
//!
//! A report's numbers say how wrong a gradient is; the *pattern* of where it is wrong usually says
//! why: the last columns of every row (a mask), every 4th row (a grid or stride error), one block
//! (a tile offset), one row (an ignore index). An [`ErrorMap`] bins the tensor's last two axes
//! into at most [`MAX_ROW_BINS`] x [`MAX_COL_BINS`] cells (a 1-D tensor is one row; the leading
//! axes of a tensor of more than two are *folded*: a cell counts its elements in every slice of
//! them), records per cell the fraction of elements over tolerance, whether one is a NaN, and its
//! worst element, and names the pattern in one line when it is a simple one (`pattern`).
//!
//! The map is built in one pass over the elements from the comparison's own elementwise test
//! ([`super::report::compare_by`]), and only for tensors with elements over tolerance.

mod pattern;
mod text;

use serde::Serialize;

pub use text::{shade, SHADES};

/// Row bins at most (the second-to-last axis).
pub const MAX_ROW_BINS: usize = 16;
/// Column bins at most (the last axis).
pub const MAX_COL_BINS: usize = 64;

/// The comparison's verdict on one element.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Judged {
    /// `|got - expected|` over the element's tolerance; infinite for a mismatch of non-finite
    /// values. Over 1 is over tolerance.
    pub ratio: f64,
    /// A non-finite value on either side is not matched exactly.
    pub nonfinite: bool,
    /// Such a mismatch with a NaN on either side.
    pub nan: bool,
}

/// Where the elements over tolerance of one tensor are (see the module docs). In JSON:
/// `rows`, `cols`, `slices`, `row_bins` and `col_bins` (each bin `[start, end)`), `cells` (per
/// row bin, per column bin, the fraction over tolerance), `nan_cells` (`[row bin, column bin]`
/// of the cells holding a NaN), `over` and `summary`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ErrorMap {
    /// Length of the axis binned down (the second-to-last; 1 for a 1-D tensor).
    pub rows: usize,
    /// Length of the axis binned across (the last).
    pub cols: usize,
    /// Slices of the leading axes folded into each cell (their product; 1 for a 1-D or 2-D
    /// tensor).
    pub slices: usize,
    /// Leading axes folded (the tensor's rank less two, or 0).
    pub folded_axes: usize,
    /// Each row bin's rows, `[start, end)`.
    pub row_bins: Vec<[usize; 2]>,
    /// Each column bin's columns, `[start, end)`.
    pub col_bins: Vec<[usize; 2]>,
    /// Per row bin, per column bin: the fraction of the cell's elements over tolerance.
    pub cells: Vec<Vec<f64>>,
    /// Cells holding an element over tolerance that is a NaN (or whose truth is).
    pub nan_cells: Vec<[usize; 2]>,
    /// Elements over tolerance.
    pub over: usize,
    /// The pattern in one line: "columns 256..299 of every row", "rows 0, 4, 8, ..., 60 (every
    /// 4th)", "one 16x64 tile at [32:48, 128:192]", "row 17 only", "everywhere"; or, where
    /// it is no simple one, how many elements are over tolerance within which rows and columns.
    pub summary: String,
    /// Per row bin, per column bin: the cell's worst element (for the HTML page's tooltips).
    #[serde(skip)]
    pub worst: Vec<Vec<Option<CellWorst>>>,
}

/// The worst element of one cell of an [`ErrorMap`].
#[derive(Clone, Debug, PartialEq)]
pub struct CellWorst {
    /// Multi-index in the tensor.
    pub index: Vec<usize>,
    /// Ground truth.
    pub expected: f64,
    /// What the checked code produced.
    pub got: f64,
}

/// `(slices, rows, cols)`: the tensor of `shape` seen as a stack of matrices.
pub fn view(shape: &[usize]) -> (usize, usize, usize) {
    match shape {
        [] => (1, 1, 1),
        [n] => (1, 1, *n),
        [lead @ .., r, c] => (lead.iter().product(), *r, *c),
    }
}

/// The bin (of `bins`) of position `i` on an axis of `n`.
fn bin_of(i: usize, n: usize, bins: usize) -> usize {
    i * bins / n
}

/// The `[start, end)` of each of `bins` bins of an axis of `n` (every bin non-empty when
/// `bins <= n`), consistent with `bin_of`.
pub fn bins(n: usize, bins: usize) -> Vec<[usize; 2]> {
    let start = |b: usize| (b * n).div_ceil(bins);
    (0..bins).map(|b| [start(b), start(b + 1)]).collect()
}

/// What a band of rows collects: [`Tally`]'s figures, with the slices and rows it hit listed
/// (a band holds few of them) and its columns as flags.
struct Band {
    slices_hit: Vec<usize>,
    rows_hit: Vec<usize>,
    cols_hit: Vec<bool>,
    over: Vec<usize>,
    nan: Vec<bool>,
    worst: Vec<Option<(f64, usize)>>,
}

impl Band {
    fn new(cols: usize, cells: usize) -> Band {
        Band {
            slices_hit: Vec::new(),
            rows_hit: Vec::new(),
            cols_hit: vec![false; cols],
            over: vec![0; cells],
            nan: vec![false; cells],
            worst: vec![None; cells],
        }
    }

    /// Element `i` at `(s, r, c)` of cell `cell` is over tolerance (elements come in order).
    fn add(&mut self, (s, r, c): (usize, usize, usize), cell: usize, i: usize, j: Judged) {
        if self.slices_hit.last() != Some(&s) {
            self.slices_hit.push(s);
        }
        if self.rows_hit.last() != Some(&r) {
            self.rows_hit.push(r);
        }
        self.cols_hit[c] = true;
        self.over[cell] += 1;
        self.nan[cell] |= j.nan;
        if self.worst[cell].is_none_or(|(w, _)| j.ratio > w) {
            self.worst[cell] = Some((j.ratio, i));
        }
    }
}

/// What one pass over the elements collects.
struct Tally {
    slices_hit: Vec<bool>,
    rows_hit: Vec<bool>,
    cols_hit: Vec<bool>,
    over: Vec<usize>,
    nan: Vec<bool>,
    /// Per cell: the worst element's ratio and flat index.
    worst: Vec<Option<(f64, usize)>>,
}

impl Tally {
    fn new(slices: usize, rows: usize, cols: usize, cells: usize) -> Tally {
        Tally {
            slices_hit: vec![false; slices],
            rows_hit: vec![false; rows],
            cols_hit: vec![false; cols],
            over: vec![0; cells],
            nan: vec![false; cells],
            worst: vec![None; cells],
        }
    }

    /// A band's tally, the bands merged in the elements' order (a cell's worst element is its
    /// first of the largest ratio).
    fn merge(&mut self, b: Band) {
        for s in b.slices_hit {
            self.slices_hit[s] = true;
        }
        for r in b.rows_hit {
            self.rows_hit[r] = true;
        }
        for (hit, c) in self.cols_hit.iter_mut().zip(b.cols_hit) {
            *hit |= c;
        }
        for (k, w) in b.worst.into_iter().enumerate() {
            self.over[k] += b.over[k];
            self.nan[k] |= b.nan[k];
            if let Some((ratio, i)) = w {
                if self.worst[k].is_none_or(|(m, _)| ratio > m) {
                    self.worst[k] = Some((ratio, i));
                }
            }
        }
    }
}

impl ErrorMap {
    /// The map of a tensor of `shape` whose element `i` the comparison judged `judge(i)`;
    /// `values(i)` is its `(expected, got)`. One pass over the elements, in bands of whole rows
    /// on rayon's threads (tens of millions of elements at training sizes), their tallies merged
    /// in order: the map does not depend on the number of threads.
    pub fn build(shape: &[usize], judge: impl Fn(usize) -> Judged + Sync, values: impl Fn(usize) -> (f64, f64)) -> ErrorMap {
        use rayon::prelude::*;
        let (slices, rows, cols) = view(shape);
        let (nr, nc) = (rows.clamp(1, MAX_ROW_BINS), cols.clamp(1, MAX_COL_BINS));
        // Bands of about `CHUNK` elements (one row at least), rows counted across slices.
        let band = (super::chunked::CHUNK / cols.max(1)).max(1);
        let all_rows = slices * rows;
        let tally_band = |b: usize| {
            let mut t = Band::new(cols, nr * nc);
            for q in b * band..((b + 1) * band).min(all_rows) {
                let (sl, r) = (q / rows, q % rows);
                let br = bin_of(r, rows, nr);
                for c in 0..cols {
                    let i = q * cols + c;
                    let j = judge(i);
                    if j.ratio > 1.0 {
                        t.add((sl, r, c), br * nc + bin_of(c, cols, nc), i, j);
                    }
                }
            }
            t
        };
        let bands: Vec<Band> = (0..all_rows.div_ceil(band)).into_par_iter().map(tally_band).collect();
        let mut t = Tally::new(slices, rows, cols, nr * nc);
        for b in bands {
            t.merge(b);
        }
        ErrorMap::from_tally(shape, t, (nr, nc), values)
    }

    fn from_tally(shape: &[usize], t: Tally, (nr, nc): (usize, usize), values: impl Fn(usize) -> (f64, f64)) -> ErrorMap {
        let (slices, rows, cols) = view(shape);
        let (row_bins, col_bins) = (bins(rows, nr), bins(cols, nc));
        let size = |b: [usize; 2]| b[1] - b[0];
        let cells = (0..nr)
            .map(|r| (0..nc).map(|c| t.over[r * nc + c] as f64 / (size(row_bins[r]) * size(col_bins[c]) * slices).max(1) as f64).collect())
            .collect();
        let nan_cells = (0..nr * nc).filter(|&k| t.nan[k]).map(|k| [k / nc, k % nc]).collect();
        let worst = (0..nr)
            .map(|r| {
                (0..nc)
                    .map(|c| {
                        t.worst[r * nc + c].map(|(_, i)| {
                            let (expected, got) = values(i);
                            CellWorst { index: super::report::unravel(i, shape), expected, got }
                        })
                    })
                    .collect()
            })
            .collect();
        let over = t.over.iter().sum();
        let hits = pattern::Hits { slices: &t.slices_hit, rows: &t.rows_hit, cols: &t.cols_hit, rank: shape.len() };
        ErrorMap {
            rows,
            cols,
            slices,
            folded_axes: shape.len().saturating_sub(2),
            row_bins,
            col_bins,
            cells,
            nan_cells,
            over,
            summary: pattern::summary(&hits, over),
            worst,
        }
    }

    /// Whether cell `(r, c)` holds a NaN over tolerance.
    pub fn has_nan(&self, r: usize, c: usize) -> bool {
        self.nan_cells.contains(&[r, c])
    }

    /// The elements of cell `(r, c)` (over every folded slice).
    pub fn cell_size(&self, r: usize, c: usize) -> usize {
        let (rb, cb) = (self.row_bins[r], self.col_bins[c]);
        (rb[1] - rb[0]) * (cb[1] - cb[0]) * self.slices
    }

    /// The cells with any element over tolerance, as `(row bin, column bin)`.
    pub fn hot_cells(&self) -> Vec<(usize, usize)> {
        let mut v = Vec::new();
        for (r, row) in self.cells.iter().enumerate() {
            v.extend(row.iter().enumerate().filter(|(_, f)| **f > 0.0).map(|(c, _)| (r, c)));
        }
        v
    }
}

#[cfg(test)]
mod tests;
