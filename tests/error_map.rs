//! Error maps and the HTML page of failing reports.
//!
//! - The seeded bugs of `examples/triton/` show their pattern in the map's cells and summary: a
//!   tile offset leaves the last columns of every row unwritten, a store loop over whole blocks
//!   the masked tail columns of every row, a row step of two every other row, an early return the
//!   rows of the ignored labels, a padding test the two rows it confuses, a tail mask the last
//!   element, a carry the first blocks of columns; a rows-per-program loop one short (written
//!   here) every 4th row.
//! - `Report::to_html` and `tilegrad check --html`: one self-contained page with a heatmap of
//!   one `rect.cell` per cell of each failing tensor's map, and no reference to the network;
//!   rendered by headless Chromium where one is installed (skipped with a message where none is).

use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::check::{check_backward, Backward, CheckOptions, ErrorMap, Forward, Inputs, KernelLaunch, Report, Step, TensorReport};
use tilegrad::spec::{self, KernelOverride};
use tilegrad_ir::triton::{convert, ConvertOptions};
use tilegrad_ir::DType;

fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples")
}

/// The report of `examples/<spec>.toml` with kernel `key` replaced by `variant`.
fn check_variant(spec_name: &str, key: &str, variant: &str) -> Report {
    let o = [KernelOverride { key: key.into(), reference: format!("::{variant}") }];
    let s = spec::load_with(&examples().join(format!("{spec_name}.toml")), &o).expect("the spec loads");
    let opts = CheckOptions { trials: 1, ..CheckOptions::default() };
    check_backward(&s.forward, s.backward.as_ref().expect("a backward"), &s.inputs, &opts).expect("the check runs")
}

/// The compared tensor `tensor` of a report, and its map.
fn mapped<'r>(r: &'r Report, tensor: &str) -> (&'r TensorReport, &'r ErrorMap) {
    let t = r.gradients.iter().chain(&r.forward).find(|t| t.tensor == tensor).unwrap_or_else(|| panic!("no `{tensor}`:\n{r}"));
    (t, t.error_map.as_ref().unwrap_or_else(|| panic!("`{tensor}` has no error map:\n{r}")))
}

/// The bins of `bins` that overlap `[lo, hi)`.
fn touching(bins: &[[usize; 2]], lo: usize, hi: usize) -> Vec<usize> {
    (0..bins.len()).filter(|&b| bins[b][0] < hi && bins[b][1] > lo).collect()
}

/// Every cell of the row bins `rows` and column bins `cols`, row-major.
fn cells(rows: &[usize], cols: &[usize]) -> Vec<(usize, usize)> {
    rows.iter().flat_map(|&r| cols.iter().map(move |&c| (r, c))).collect()
}

// ---------------------------------------------------------------- seeded bugs

#[test]
fn a_tile_offset_not_scaled_leaves_the_last_columns_of_every_row() {
    // Column tiles start at 0, 1, 2, 3, 4 instead of 0, 64, 128, ...: columns 0..67 are written.
    let r = check_variant("weighted_sum_desc", "bwd", "weighted_sum_desc_bwd_broken_tile_offset");
    let (t, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "columns 68..299 of every row", "{r}");
    assert_eq!((m.rows, m.cols, m.over), (1000, 300, 1000 * 232));
    let expect = cells(&(0..16).collect::<Vec<_>>(), &touching(&m.col_bins, 68, 300));
    assert_eq!(m.hot_cells(), expect, "{r}");
    assert_eq!(m.nan_cells.len(), expect.len(), "never written: every such cell holds a NaN");
    assert_eq!(t.over_tolerance, m.over);
    let (_, w) = mapped(&r, "grad_w");
    assert_eq!(w.summary, "elements 68..299");
    assert!(r.to_string().contains("error map of `grad_x`: columns 68..299 of every row"), "{r}");
}

#[test]
fn a_store_loop_over_whole_blocks_leaves_the_tail_columns_of_every_row() {
    // 1000 columns in blocks of 128: the store loop stops at 896, its masked tail block is never stored.
    let r = check_variant("layer_norm_saved", "bwd", "layer_norm_bwd_broken_no_tail");
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "columns 896..999 of every row", "{r}");
    assert_eq!((m.rows, m.cols, m.over), (1001, 1000, 1001 * 104));
    let hot = cells(&(0..m.row_bins.len()).collect::<Vec<_>>(), &touching(&m.col_bins, 896, 1000));
    assert_eq!(m.hot_cells(), hot, "{r}");
    for &(row, col) in &hot {
        let [a, e] = m.col_bins[col];
        let share = (e - a.max(896)) as f64 / (e - a) as f64;
        assert!((m.cells[row][col] - share).abs() < 1e-12, "cell ({row}, {col}) of columns {a}..{e}: {}", m.cells[row][col]);
    }
    assert_eq!(m.nan_cells, hot.iter().map(|&(r, c)| [r, c]).collect::<Vec<_>>(), "never written: NaN in every hot cell");
    for partial in ["grad_w", "grad_b"] {
        assert_eq!(mapped(&r, partial).1.summary, "elements 896..999", "{r}");
    }
}

#[test]
fn a_row_step_of_two_leaves_every_other_row() {
    // 4 rows per program at `pid * 4 + 2 * i`: the even rows are written (twice, with the same
    // values), the odd rows never.
    let r = check_variant("softmax", "bwd", "softmax_bwd_broken_row_step");
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "rows 1, 3, 5, ..., 999 (every 2nd)", "{r}");
    assert_eq!((m.rows, m.cols, m.over), (1001, 1000, 500 * 1000));
    for (b, row) in m.cells.iter().enumerate() {
        let [a, e] = m.row_bins[b];
        let odd = (a..e).filter(|i| i % 2 == 1).count() as f64 / (e - a) as f64;
        assert!(row.iter().all(|&f| (f - odd).abs() < 1e-12), "row bin {b} (rows {a}..{e}): {row:?}");
    }
    assert_eq!(m.nan_cells.len(), m.row_bins.len() * m.col_bins.len(), "each cell holds never-written rows");
}

#[test]
fn an_early_return_leaves_the_rows_of_the_ignored_labels() {
    let labels = tilegrad::npy::read(&examples().join("cross_entropy_labels.npy")).expect("labels");
    let ignored: Vec<usize> = labels.to_f64_vec().iter().enumerate().filter(|(_, l)| **l == -100.0).map(|(i, _)| i).collect();
    assert!(ignored.len() > 2, "the example ignores some rows: {ignored:?}");
    let r = check_variant("cross_entropy", "bwd", "liger_cross_entropy_bwd_kernel_broken_ignored");
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, format!("rows {}", runs(&ignored)), "{r}");
    let rows: Vec<usize> =
        (0..m.row_bins.len()).filter(|&b| ignored.iter().any(|&i| m.row_bins[b][0] <= i && i < m.row_bins[b][1])).collect();
    assert_eq!(m.hot_cells(), cells(&rows, &(0..m.col_bins.len()).collect::<Vec<_>>()), "{r}");
    for &b in &rows {
        let [a, e] = m.row_bins[b];
        let share = ignored.iter().filter(|&&i| a <= i && i < e).count() as f64 / (e - a) as f64;
        assert!(m.cells[b].iter().all(|&f| (f - share).abs() < 1e-12), "row bin {b}: {:?}", m.cells[b]);
    }
}

/// `4, 6, 11..12` of sorted indices.
fn runs(v: &[usize]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < v.len() {
        let mut j = i;
        while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
            j += 1;
        }
        out.push(if i == j { v[i].to_string() } else { format!("{}..{}", v[i], v[j]) });
        i = j + 1;
    }
    out.join(", ")
}

#[test]
fn a_padding_test_on_the_position_wrongs_two_whole_rows() {
    // Tokens at position PAD = 3 are skipped (their id's row misses a contribution) and the
    // padding row itself receives gradient: two whole rows of grad_weight, one of them row 3.
    let r = check_variant("embedding", "bwd", "_embedding_bwd_kernel_broken_padding");
    let (_, m) = mapped(&r, "grad_weight");
    let rows: Vec<usize> =
        m.summary.strip_prefix("rows ").unwrap_or_else(|| panic!("{}", m.summary)).split(", ").map(|s| s.parse().unwrap()).collect();
    assert!(rows.len() == 2 && rows.contains(&3), "{}", m.summary);
    assert_eq!(m.over, 2 * 90);
    let hot_rows: Vec<usize> =
        (0..m.row_bins.len()).filter(|&b| rows.iter().any(|&i| m.row_bins[b][0] <= i && i < m.row_bins[b][1])).collect();
    assert_eq!(m.hot_cells(), cells(&hot_rows, &(0..m.col_bins.len()).collect::<Vec<_>>()));
    assert!(m.nan_cells.is_empty(), "wrong values, not NaN");
}

#[test]
fn a_tail_mask_off_by_one_leaves_the_last_element() {
    let r = check_variant("block_sum", "bwd", "block_sum_bwd_broken_tail");
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "element 999 only");
    assert_eq!((m.row_bins.len(), m.hot_cells(), m.nan_cells.clone()), (1, vec![(0, 63)], vec![[0, 63]]));
    let r = check_variant("atomic_sum", "bwd", "atomic_sum_bwd_broken_block_mask");
    let (t, m) = mapped(&r, "grad_x");
    let n = t.shape[0];
    assert_eq!(m.summary, format!("elements 64..{}", n - 1));
    assert_eq!(m.hot_cells(), touching(&m.col_bins, 64, n).into_iter().map(|c| (0, c)).collect::<Vec<_>>());
}

#[test]
fn a_carry_of_the_last_block_only_wrongs_the_blocks_before_the_last_two() {
    // 300 columns in blocks of 64: the carry into block b must sum every later block; the bug
    // carries the last one only, right for block 3 (only block 4 follows) and block 4 (none).
    let r = check_variant("cumsum", "bwd", "_cumsum_bwd_broken_carry");
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "columns 0..191 of every row", "{r}");
    assert_eq!(m.hot_cells(), cells(&(0..m.row_bins.len()).collect::<Vec<_>>(), &touching(&m.col_bins, 0, 192)));
}

const ROWS_SRC: &str = r#"
import triton
import triton.language as tl

@triton.jit
def triple(x_ptr, y_ptr, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + cols, mask=cols < N)
    tl.store(y_ptr + row * N + cols, 3.0 * x, mask=cols < N)

@triton.jit
def triple_bwd_rows(gy_ptr, gx_ptr, N, BLOCK: tl.constexpr, ROWS: tl.constexpr):
    cols = tl.arange(0, BLOCK)
    for i in range(ROWS - 1):
        row = tl.program_id(0) * ROWS + i
        gy = tl.load(gy_ptr + row * N + cols, mask=cols < N)
        tl.store(gx_ptr + row * N + cols, 3.0 * gy, mask=cols < N)
"#;

#[test]
fn a_rows_per_program_loop_one_short_leaves_every_4th_row() {
    let opts = ConvertOptions::with_constexprs(&[("BLOCK", 128), ("ROWS", 4)]);
    let fwd_k = convert(ROWS_SRC, "rows.py", "triple", &opts).unwrap();
    let bwd_k = convert(ROWS_SRC, "rows.py", "triple_bwd_rows", &opts).unwrap();
    let launch =
        |k, grid: &str, args: &[(&str, &str)]| args.iter().fold(KernelLaunch::new(k, &[grid]).unwrap(), |l, (p, a)| l.arg(p, a).unwrap());
    let fwd = Forward::new(&["x"], &["y"]).step(Step::alloc("y", &["M", "N"], DType::F32).unwrap()).step(Step::Launch(launch(
        fwd_k,
        "M",
        &[("x_ptr", "x"), ("y_ptr", "y"), ("N", "N")],
    )));
    let bwd = Backward::new(&[("x", "grad_x")]).step(Step::alloc("grad_x", &["M", "N"], DType::F32).unwrap()).step(Step::Launch(launch(
        bwd_k,
        "cdiv(M, 4)",
        &[("gy_ptr", "grad_y"), ("gx_ptr", "grad_x"), ("N", "N")],
    )));
    let inputs = Inputs::new().constant_int("M", 64).constant_int("N", 100).random("x", DType::F32, &[64, 100], Default::default());
    let r = check_backward(&fwd, &bwd, &inputs, &CheckOptions { trials: 1, ..CheckOptions::default() }).unwrap();
    let (_, m) = mapped(&r, "grad_x");
    assert_eq!(m.summary, "rows 3, 7, 11, ..., 63 (every 4th)", "{r}");
    // Bins of 4 rows: each holds one row never written, a quarter of every cell, all NaN.
    assert!(m.cells.iter().flatten().all(|&f| f == 0.25), "{r}");
    assert_eq!(m.nan_cells.len(), 16 * 64);
}

// ---------------------------------------------------------------- the HTML page

/// A failing report with a wrong gradient (blamed, with a data-flow slice) and a map per
/// failing tensor.
fn failing_report() -> Report {
    check_variant("rms_norm_f16", "bwd", "_rms_norm_backward_kernel_broken_no_offset")
}

/// The `rect class="cell` elements of each `svg class="heatmap"` of a page, by tensor.
fn heatmaps(html: &str) -> Vec<(String, usize)> {
    html.split("<svg class=\"heatmap\"")
        .skip(1)
        .map(|svg| {
            let tensor = svg.split("data-tensor=\"").nth(1).and_then(|s| s.split('"').next()).unwrap_or_default().to_string();
            let body = svg.split("</svg>").next().unwrap_or_default();
            (tensor, body.matches("<rect class=\"cell").count())
        })
        .collect()
}

/// The `(tensor, cells)` a page of `r` must show: every tensor with a map.
fn expected_heatmaps(r: &Report) -> Vec<(String, usize)> {
    let maps = r.forward.iter().chain(&r.gradients).filter_map(|t| t.error_map.as_ref().map(|m| (t.tensor.clone(), m)));
    maps.map(|(t, m)| (t, m.row_bins.len() * m.col_bins.len())).collect()
}

#[test]
fn the_page_has_a_heatmap_per_failing_tensor_and_no_network_reference() {
    let r = failing_report();
    assert!(!r.passed);
    let html = r.to_html();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    let maps = expected_heatmaps(&r);
    assert!(!maps.is_empty());
    assert_eq!(heatmaps(&html), maps);
    for tag in ["section", "svg", "rect", "pre", "ol", "li", "script", "style", "article"] {
        assert_eq!(html.matches(&format!("<{tag}")).count(), html.matches(&format!("</{tag}>")).count(), "<{tag}> unbalanced");
    }
    for external in ["http://", "https://", " src=", " href=", "<link", "@import", "url("] {
        assert!(!html.contains(external), "the page refers to `{external}`");
    }
    // Hover text of a cell: its index range and its worst element.
    assert!(html.contains("data-tip=\"rows 0..1, columns 0..3: "), "{}", &html[..2000.min(html.len())]);
    assert!(html.contains("; worst [") && html.contains("expected ") && html.contains(", got "));
    // The blamed lines with their source, the first marked.
    assert!(html.contains("<li class=\"culprit\">") && html.contains("<mark>"), "no blamed line marked");
    assert!(html.contains("rms_norm_bwd.py:73"), "the store that wrote the worst element");
    // The text report, escaped.
    assert!(html.contains("error map of `grad_x`"));
}

#[test]
fn a_passing_report_has_no_heatmap() {
    let s = spec::load(&examples().join("block_sum.toml")).unwrap();
    let r = check_backward(&s.forward, s.backward.as_ref().unwrap(), &s.inputs, &CheckOptions::default()).unwrap();
    assert!(r.passed, "{r}");
    assert!(r.gradients.iter().all(|g| g.error_map.is_none()));
    let html = r.to_html();
    assert!(heatmaps(&html).is_empty() && html.contains("PASS"));
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["gradients"][0]["error_map"].is_null());
}

#[test]
fn json_carries_the_map() {
    let r = check_variant("block_sum", "bwd", "block_sum_bwd_broken_tail");
    let json = serde_json::to_value(&r).unwrap();
    let m = &json["gradients"][0]["error_map"];
    assert_eq!(m["summary"], "element 999 only");
    assert_eq!(m["cells"].as_array().map(|rows| rows.len()), Some(1));
    assert_eq!(m["cells"][0].as_array().map(|c| c.len()), Some(64));
    assert_eq!(m["col_bins"][63], serde_json::json!([985, 1000]));
    assert_eq!(m["nan_cells"], serde_json::json!([[0, 63]]));
    assert!(m.get("worst").is_none(), "per-cell worst elements stay out of the JSON");
}

fn temp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tilegrad-error-map-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn cli_check_html_writes_the_page() {
    let dir = temp_dir("cli");
    let page = dir.join("report.html");
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad"))
        .args(["check", "examples/block_sum.toml", "--kernel", "bwd=::block_sum_bwd_broken_tail", "--html"])
        .arg(&page)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("error map of `grad_x`: element 999 only"), "{stdout}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(heatmaps(&html), vec![("grad_x".to_string(), 64)]);
    let bad = Command::new(env!("CARGO_BIN_EXE_tilegrad"))
        .args(["check", "examples/block_sum.toml", "--html"])
        .arg(dir.join("no-such-dir").join("x.html"))
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2), "a page that cannot be written is an error");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A headless Chromium, where one is installed (`TILEGRAD_CHROMIUM` names another).
fn chromium() -> Option<PathBuf> {
    let named = std::env::var_os("TILEGRAD_CHROMIUM").map(PathBuf::from);
    let on_path = ["chromium", "chromium-browser", "google-chrome"]
        .iter()
        .find_map(|b| std::env::var_os("PATH").and_then(|p| std::env::split_paths(&p).map(|d| d.join(b)).find(|f| f.is_file())));
    named.or(on_path)
}

#[test]
fn the_page_renders_in_headless_chromium() {
    let Some(browser) = chromium() else {
        eprintln!("skipped: no Chromium installed (set TILEGRAD_CHROMIUM to a browser to run this test)");
        return;
    };
    let r = failing_report();
    let dir = temp_dir("chromium");
    let page = dir.join("report.html");
    std::fs::write(&page, r.to_html()).unwrap();
    let out = Command::new(&browser)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"])
        .args(["--disable-sync", "--no-first-run", "--enable-logging=stderr", "--v=0"])
        .arg(format!("--user-data-dir={}", dir.join("profile").display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{browser:?} failed: {log}");
    // The script ran to its end (it marks the body), and nothing was logged to the console.
    assert!(dom.contains("data-ready=\"yes\""), "the page's script did not run:\n{log}");
    assert!(!log.contains("CONSOLE") && !log.contains("Uncaught"), "console output:\n{log}");
    assert_eq!(heatmaps(&dom), expected_heatmaps(&r), "the rendered DOM's heatmaps");
    let _ = std::fs::remove_dir_all(&dir);
}
