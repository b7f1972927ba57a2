//! Binning and pattern detection on synthetic masks.

use super::*;
use crate::check::report::{compare, unravel, Tolerance};
use tilegrad_ir::DType;

/// The map of a tensor of `shape` whose elements at the multi-indices `bad` selects are over
/// tolerance (NaN where `nan` selects).
fn map_with(shape: &[usize], bad: impl Fn(&[usize]) -> bool + Sync, nan: impl Fn(&[usize]) -> bool + Sync) -> ErrorMap {
    let judge = |i: usize| {
        let ix = unravel(i, shape);
        let (b, n) = (bad(&ix), nan(&ix));
        Judged {
            ratio: if n {
                f64::INFINITY
            } else if b {
                5.0
            } else {
                0.5
            },
            nonfinite: n,
            nan: n,
        }
    };
    let values = |i: usize| (1.0, if judge(i).nan { f64::NAN } else { 1.0 + judge(i).ratio });
    ErrorMap::build(shape, judge, values)
}

fn map(shape: &[usize], bad: impl Fn(&[usize]) -> bool + Sync) -> ErrorMap {
    map_with(shape, bad, |_| false)
}

/// The cells whose elements are all over tolerance.
fn full_cells(m: &ErrorMap) -> Vec<(usize, usize)> {
    m.hot_cells().into_iter().filter(|&(r, c)| m.cells[r][c] == 1.0).collect()
}

/// The bins of `bins` that overlap `[lo, hi)`.
fn touching(bins: &[[usize; 2]], lo: usize, hi: usize) -> Vec<usize> {
    (0..bins.len()).filter(|&b| bins[b][0] < hi && bins[b][1] > lo).collect()
}

#[test]
fn bins_cover_an_axis_in_order_whatever_its_length() {
    for (n, k) in [(300, 64), (37, 16), (16, 16), (1, 1), (65, 64), (1000, 64), (5, 5)] {
        let b = bins(n, k);
        assert_eq!(b.len(), k);
        assert_eq!((b[0][0], b[k - 1][1]), (0, n));
        assert!(b.windows(2).all(|w| w[0][1] == w[1][0]), "{n} in {k}: {b:?}");
        assert!(b.iter().all(|x| x[1] > x[0]), "an empty bin: {n} in {k}: {b:?}");
        let sizes: Vec<usize> = b.iter().map(|x| x[1] - x[0]).collect();
        assert!(sizes.iter().max().unwrap() - sizes.iter().min().unwrap() <= 1, "{sizes:?}");
        for i in 0..n {
            let at = bin_of(i, n, k);
            assert!(b[at][0] <= i && i < b[at][1], "{i} of {n} in bin {at}: {:?}", b[at]);
        }
    }
}

#[test]
fn a_view_folds_leading_axes() {
    assert_eq!(view(&[]), (1, 1, 1));
    assert_eq!(view(&[7]), (1, 1, 7));
    assert_eq!(view(&[3, 7]), (1, 3, 7));
    assert_eq!(view(&[2, 3, 4, 5]), (6, 4, 5));
}

#[test]
fn a_tail_of_columns_is_the_last_cells_of_every_row() {
    let m = map(&[64, 300], |ix| ix[1] >= 256);
    assert_eq!(m.summary, "columns 256..299 of every row");
    assert_eq!((m.row_bins.len(), m.col_bins.len(), m.over), (16, 64, 64 * 44));
    let cols = touching(&m.col_bins, 256, 300);
    let hot: Vec<(usize, usize)> = m.hot_cells();
    assert_eq!(hot, (0..16).flat_map(|r| cols.iter().map(move |&c| (r, c))).collect::<Vec<_>>());
    // 300 columns in 64 bins of 4 or 5: the bin holding column 256 is partly over.
    let first = cols[0];
    assert!(m.col_bins[first][0] <= 256 && m.cells[0][first] > 0.0);
    assert!(cols[1..].iter().all(|&c| m.cells[5][c] == 1.0));
}

#[test]
fn every_fourth_row() {
    let m = map(&[64, 128], |ix| ix[0] % 4 == 0);
    assert_eq!(m.summary, "rows 0, 4, 8, ..., 60 (every 4th)");
    // Bins of four rows: each holds one bad row.
    assert!(m.cells.iter().flatten().all(|&f| f == 0.25), "{:?}", m.cells);
    let m = map(&[16, 128], |ix| ix[0] % 4 == 1);
    assert_eq!(m.summary, "rows 1, 5, 9, 13 (every 4th)");
    assert_eq!(full_cells(&m).len(), 4 * 64);
    assert!(full_cells(&m).iter().all(|&(r, _)| r % 4 == 1));
}

#[test]
fn one_tile() {
    let m = map(&[128, 512], |ix| (32..48).contains(&ix[0]) && (128..192).contains(&ix[1]));
    assert_eq!(m.summary, "one 16x64 tile at [32:48, 128:192]");
    // Bins of 8 rows and 8 columns: rows 32..48 are bins 4 and 5, columns 128..192 bins 16..24.
    let expect: Vec<(usize, usize)> = (4..6).flat_map(|r| (16..24).map(move |c| (r, c))).collect();
    assert_eq!(m.hot_cells(), expect);
    assert_eq!(full_cells(&m), expect);
}

#[test]
fn a_tile_on_bins_of_uneven_size() {
    let m = map(&[37, 101], |ix| (5..10).contains(&ix[0]) && (50..61).contains(&ix[1]));
    assert_eq!(m.summary, "one 5x11 tile at [5:10, 50:61]");
    let expect: Vec<(usize, usize)> =
        touching(&m.row_bins, 5, 10).into_iter().flat_map(|r| touching(&m.col_bins, 50, 61).into_iter().map(move |c| (r, c))).collect();
    assert_eq!(m.hot_cells(), expect);
    // Fractions are over the cell's own elements: the over-tolerance count adds up.
    let total: f64 = m.hot_cells().iter().map(|&(r, c)| m.cells[r][c] * m.cell_size(r, c) as f64).sum();
    assert_eq!(total.round() as usize, 55);
}

#[test]
fn one_row_and_a_few_rows() {
    let m = map(&[40, 300], |ix| ix[0] == 17);
    assert_eq!(m.summary, "row 17 only");
    assert!(m.hot_cells().iter().all(|&(r, _)| m.row_bins[r][0] <= 17 && 17 < m.row_bins[r][1]));
    assert_eq!(m.hot_cells().len(), 64);
    assert_eq!(map(&[40, 300], |ix| ix[0] < 4 || (8..12).contains(&ix[0])).summary, "rows 0..3, 8..11");
    assert_eq!(map(&[40, 30], |ix| [1, 2, 7, 20, 33].contains(&ix[0])).summary, "rows 1..2, 7, 20, 33");
    assert_eq!(map(&[40, 30], |ix| ix[0] % 4 == 0 || ix[0] == 39).summary, "11 rows in 0..39");
    assert_eq!(map(&[40, 30], |ix| ix[0] == 3 && ix[1] == 4).summary, "element [3, 4] only");
    assert_eq!(map(&[40, 30], |ix| ix[0] != 5 && ix[0] != 9).summary, "every row but 5, 9");
    assert_eq!(map(&[40, 30], |ix| ix[0] % 2 == 0 && ix[1] == 4).summary, "column 4 of rows 0, 2, 4, ..., 38 (every 2nd)");
}

#[test]
fn everywhere_and_scattered() {
    let m = map(&[10, 10], |_| true);
    assert_eq!(m.summary, "everywhere");
    assert!(m.cells.iter().flatten().all(|&f| f == 1.0));
    let m = map(&[64, 64], |ix| (ix[0] * 7 + ix[1] * 13) % 11 == 0 && ix[0] >= 8);
    assert!(m.summary.starts_with("scattered: ") && m.summary.ends_with("within rows 8..63"), "{}", m.summary);
    let m = map(&[64, 64], |ix| ix[0] == ix[1]);
    assert_eq!(m.summary, "scattered: 64 of 4096 elements");
}

#[test]
fn a_1d_tensor_is_one_row() {
    let m = map(&[1000], |ix| ix[0] >= 990);
    assert_eq!(m.summary, "elements 990..999");
    assert_eq!((m.row_bins.len(), m.col_bins.len()), (1, 64));
    assert_eq!(m.hot_cells(), touching(&m.col_bins, 990, 1000).into_iter().map(|c| (0, c)).collect::<Vec<_>>());
    assert_eq!(map(&[1000], |ix| ix[0] == 999).summary, "element 999 only");
    assert_eq!(map(&[1000], |ix| ix[0] % 100 == 0).summary, "elements 0, 100, 200, ..., 900 (every 100th)");
    assert_eq!(map(&[1000], |ix| ![5, 70, 71].contains(&ix[0])).summary, "every element but 5, 70, 71");
    let m = map(&[1000], |ix| (ix[0] * 7) % 10 < 4);
    assert_eq!(m.summary, "scattered: 400 of 1000 elements");
    assert_eq!(
        map(&[1000], |ix| ix[0] > 500 && ix[0] % 3 == 0 && ix[0] % 7 != 0).summary,
        "scattered: 143 of 1000 elements within 501..999"
    );
    let m = map(&[5], |ix| ix[0] == 2);
    assert_eq!((m.col_bins.len(), m.hot_cells()), (5, vec![(0, 2)]));
}

#[test]
fn a_3d_tensor_folds_its_leading_axis() {
    // Column 9 wrong in one of 4 slices: a quarter of each cell of that column.
    let m = map(&[4, 8, 10], |ix| ix[0] == 2 && ix[2] == 9);
    assert_eq!(m.summary, "column 9 of every row, in index 2 of axis 0");
    assert_eq!((m.slices, m.folded_axes), (4, 1));
    assert_eq!(m.hot_cells(), (0..8).map(|r| (r, 9)).collect::<Vec<_>>());
    assert!(m.hot_cells().iter().all(|&(r, c)| m.cells[r][c] == 0.25));
    // In every slice: whole cells, no slice named.
    let m = map(&[4, 8, 10], |ix| ix[2] == 9);
    assert_eq!(m.summary, "column 9 of every row");
    assert!(m.hot_cells().iter().all(|&(r, c)| m.cells[r][c] == 1.0));
    // Worst elements carry the full multi-index.
    assert_eq!(m.worst[0][9].as_ref().map(|w| w.index.len()), Some(3));
    let m = map(&[2, 3, 4, 5], |ix| ix[0] == 1 && ix[1] < 2);
    assert_eq!((m.slices, m.folded_axes), (6, 2));
    assert_eq!(m.summary, "every element, in slices 3..4 of axes 0..1 (flattened)");
}

#[test]
fn nan_cells_are_marked() {
    let m = map_with(&[16, 64], |ix| ix[1] >= 60, |ix| ix[0] == 3 && ix[1] == 63);
    assert_eq!(m.nan_cells, vec![[3, 63]]);
    let w = m.worst[3][63].as_ref().unwrap();
    assert!(w.got.is_nan() && w.index == vec![3, 63]);
    let text = m.text("grad_x").to_string();
    let row3 = text.lines().find(|l| l.trim_start().starts_with("3 |")).unwrap();
    assert!(row3.ends_with("@@@N|"), "{text}");
}

#[test]
fn shades_go_from_none_to_all() {
    assert_eq!(shade(0.0), ' ');
    assert_eq!(shade(1e-9), '.');
    assert_eq!(shade(0.5), '+');
    assert_eq!(shade(0.999), '%');
    assert_eq!(shade(1.0), '@');
}

#[test]
fn the_text_fits_100_columns_with_a_ruler() {
    let m = map(&[4, 1000, 3000], |ix| ix[2] >= 2954);
    let text = m.text("grad_weight_of_a_long_name").to_string();
    assert!(text.lines().all(|l| l.len() <= 100), "{text}");
    assert_eq!(text.lines().count(), 4 + 16, "{text}");
    let ruler = text.lines().nth(3).unwrap();
    assert!(ruler.trim_start().starts_with("0 ") && ruler.ends_with("2999"), "{text}");
    assert!(text.contains("a cell is 62-63 rows x 46-47 columns, over all 4 indices of axis 0"), "{text}");
    let row = text.lines().nth(4).unwrap();
    assert!(row.trim_start().starts_with("0..62 |") && row.ends_with(" @|"), "{text}");
}

#[test]
fn the_map_counts_what_the_comparison_counts() {
    let e: Vec<f64> = (0..600).map(|i| ((i * 37 % 101) as f64 - 50.0) / 7.0).collect();
    let mut g = e.clone();
    for (i, x) in g.iter_mut().enumerate() {
        match i % 29 {
            0 => *x = f64::NAN,
            1 => *x = f64::INFINITY,
            2 => *x *= 1.0 + 1e-3,
            3 => *x *= 1.0 + 1e-7,
            _ => {}
        }
    }
    let (r, _) = compare("x", "grad_x", DType::F32, &[20, 30], Tolerance::for_dtype(DType::F32, false), &e, &g, 0);
    let m = r.error_map.as_ref().unwrap();
    assert_eq!(m.over, r.over_tolerance);
    let nan_cells: std::collections::BTreeSet<(usize, usize)> =
        (0..600).filter(|i| i % 29 == 0).map(|i| (bin_of(i / 30, 20, 16), i % 30)).collect();
    assert_eq!(m.nan_cells.len(), nan_cells.len());
    let (ok, _) = compare("x", "grad_x", DType::F32, &[20, 30], Tolerance::for_dtype(DType::F32, false), &e, &e, 0);
    assert!(ok.error_map.is_none());
}

/// The map built in bands of rows on many threads is the one a single pass over the elements in
/// order builds (counts, NaN cells, each cell's first worst element, the hit rows, columns and
/// slices behind the summary), on shapes of many bands and of rows longer than a band.
#[test]
fn bands_of_rows_build_the_map_one_pass_in_order_builds() {
    let cases: [&[usize]; 4] = [&[3, 700, 50], &[211, 997], &[2, 3, 70_001], &[150_001]];
    for shape in cases {
        let n: usize = shape.iter().product();
        // Scattered wrong elements with repeated ratios (ties), a few NaNs, a wrong block.
        let ratio = |i: usize| -> f64 {
            let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
            if h % 97 == 0 || (n / 3..n / 3 + 500).contains(&i) {
                1.0 + (h % 5) as f64
            } else {
                0.25
            }
        };
        let judge = |i: usize| {
            let nan = i % 40_009 == 7;
            Judged { ratio: if nan { f64::INFINITY } else { ratio(i) }, nonfinite: nan, nan }
        };
        let values = |i: usize| (1.0, 1.0 + ratio(i));
        let got = ErrorMap::build(shape, judge, values);
        // The reference: one pass in order.
        let (slices, rows, cols) = view(shape);
        let (nr, nc) = (rows.clamp(1, MAX_ROW_BINS), cols.clamp(1, MAX_COL_BINS));
        let mut t = Tally::new(slices, rows, cols, nr * nc);
        for i in 0..n {
            let j = judge(i);
            if j.ratio > 1.0 {
                let (s, r, c) = (i / (rows * cols), (i / cols) % rows, i % cols);
                let cell = bin_of(r, rows, nr) * nc + bin_of(c, cols, nc);
                (t.slices_hit[s], t.rows_hit[r], t.cols_hit[c]) = (true, true, true);
                t.over[cell] += 1;
                t.nan[cell] |= j.nan;
                if t.worst[cell].is_none_or(|(w, _)| j.ratio > w) {
                    t.worst[cell] = Some((j.ratio, i));
                }
            }
        }
        let want = ErrorMap::from_tally(shape, t, (nr, nc), values);
        assert!(want.over > 0 && !want.nan_cells.is_empty(), "{shape:?}");
        assert_eq!(got, want, "{shape:?}");
    }
}
