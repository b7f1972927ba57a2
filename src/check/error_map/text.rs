//! The error map as text, for the report's table: one line per row bin, one character per
//! cell, shaded by the fraction of the cell's elements over tolerance, with a ruler of column
//! indices above and row ranges on the left; at most 16 lines of 90 columns.

use super::ErrorMap;
use std::fmt;

/// Shades from none over tolerance (a space) to all (`@`).
pub const SHADES: &[u8; 10] = b" .:-=+*#%@";
/// The mark of a cell holding a NaN over tolerance.
pub const NAN_MARK: char = 'N';
/// Ruler labels are at every this many cells.
const TICK: usize = 16;

/// The shade of a cell with `fraction` of its elements over tolerance: a space for none, `@`
/// for all, the eight between for some (in eighths).
pub fn shade(fraction: f64) -> char {
    if fraction <= 0.0 {
        ' '
    } else if fraction >= 1.0 {
        '@'
    } else {
        SHADES[1 + ((fraction * 8.0) as usize).min(7)] as char
    }
}

/// An [`ErrorMap`] as text under the name of its tensor.
pub struct Text<'a> {
    map: &'a ErrorMap,
    tensor: &'a str,
}

impl ErrorMap {
    /// The map as text, titled with `tensor` (the report prints it after the tensor's lines).
    pub fn text<'a>(&'a self, tensor: &'a str) -> Text<'a> {
        Text { map: self, tensor }
    }

    /// `a..b` (inclusive) of row bin `r`, or `a` for a bin of one row.
    pub fn row_label(&self, r: usize) -> String {
        range(self.row_bins[r])
    }

    /// `a..b` (inclusive) of column bin `c`, or `a` for a bin of one column.
    pub fn col_label(&self, c: usize) -> String {
        range(self.col_bins[c])
    }

    /// The size of the cells: `2-3 rows x 5 columns`, or `5 elements` for a 1-D tensor, with
    /// the leading axes folded into them.
    pub fn cell_words(&self) -> String {
        let cols = spread(&self.col_bins);
        let cells = if self.folded_axes == 0 && self.rows == 1 {
            format!("{cols} element{}", plural(&cols))
        } else {
            let rows = spread(&self.row_bins);
            format!("{rows} row{} x {cols} column{}", plural(&rows), plural(&cols))
        };
        match self.folded_axes {
            0 => cells,
            1 => format!("{cells}, over all {} indices of axis 0", self.slices),
            k => format!("{cells}, over all {} slices of axes 0..{}", self.slices, k - 1),
        }
    }

    /// The cells of row bin `r` as characters.
    fn row_chars(&self, r: usize) -> String {
        let row = &self.cells[r];
        (0..row.len()).map(|c| if self.has_nan(r, c) { NAN_MARK } else { shade(row[c]) }).collect()
    }

    /// The column ruler: the first index of every 16th bin, and the last index at the end.
    fn ruler(&self) -> String {
        let n = self.col_bins.len();
        let last = (self.cols.max(1) - 1).to_string();
        let end_at = n.saturating_sub(last.len());
        let mut line = vec![' '; n.max(last.len())];
        for c in (0..n).step_by(TICK) {
            let label = self.col_bins[c][0].to_string();
            if c + label.len() < end_at {
                line.splice(c..c + label.len(), label.chars());
            }
        }
        line.splice(end_at..end_at + last.len(), last.chars());
        line.into_iter().collect::<String>().trim_end().to_string()
    }
}

/// `a..b` of a `[start, end)` range, or `a` when it holds one index.
fn range([a, b]: [usize; 2]) -> String {
    if b <= a + 1 {
        a.to_string()
    } else {
        format!("{a}..{}", b - 1)
    }
}

/// `5`, or `4-5` when bins differ in size.
fn spread(bins: &[[usize; 2]]) -> String {
    let sizes = bins.iter().map(|b| b[1] - b[0]);
    let (lo, hi) = (sizes.clone().min().unwrap_or(0), sizes.max().unwrap_or(0));
    if lo == hi {
        lo.to_string()
    } else {
        format!("{lo}-{hi}")
    }
}

fn plural(n: &str) -> &'static str {
    if n == "1" {
        ""
    } else {
        "s"
    }
}

impl fmt::Display for Text<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.map;
        writeln!(f, "    error map of `{}`: {}", self.tensor, m.summary)?;
        writeln!(f, "      a cell is {}", m.cell_words())?;
        writeln!(f, "      shade: fraction over tolerance: ' ' none, '.' to '%' some (eighths), '@' all; '{NAN_MARK}' a NaN")?;
        let one_row = m.folded_axes == 0 && m.rows == 1;
        let labels: Vec<String> = (0..m.row_bins.len()).map(|r| if one_row { String::new() } else { m.row_label(r) }).collect();
        let w = labels.iter().map(String::len).max().unwrap_or(0);
        writeln!(f, "      {:w$}  {}", "", m.ruler())?;
        for (r, label) in labels.iter().enumerate() {
            writeln!(f, "      {label:>w$} |{}|", m.row_chars(r))?;
        }
        Ok(())
    }
}
