//! A report as one self-contained HTML page (`tilegrad check --html FILE`, Python's
//! `report.to_html(path)`): a heatmap per failing tensor, the blame of its worst element with
//! the blamed source lines, and the text report. Inline CSS, SVG and a few lines of script; no
//! network and no external assets, so the page opens offline and can be attached to a CI run.
//!
//! Each heatmap is an `<svg class="heatmap">` of one `<rect class="cell">` per cell of the
//! tensor's [`ErrorMap`], coloured by the fraction of its elements over tolerance (cells holding
//! a NaN are purple, class `nan`); hovering a cell shows its index range, how many of its
//! elements are over tolerance and its worst element's index, expected and got values.

use super::error_map::ErrorMap;
use super::report::{Blame, Report, TensorReport, Worst};
use super::slice::SliceLine;
use std::fmt::Write;

/// Pixels of a heatmap's grid, across and down, at most.
const GRID: (usize, usize) = (768, 320);
/// Room for row labels on the left and column labels above.
const MARGIN: (usize, usize) = (88, 22);
/// The fill of a cell holding a NaN.
const NAN_FILL: &str = "#6a3d9a";
/// Lines of source shown around a blamed line.
const CONTEXT: usize = 2;

const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1100px}\
h1 .fail{color:#b30000}h1 .pass{color:#1a7f37}section.tensor{border-top:1px solid #ccc;margin-top:1.5em}\
.summary{font-weight:600}.tip{font-family:monospace;min-height:1.4em;color:#444}\
svg.heatmap text{font:11px monospace;fill:#555}svg.heatmap rect.cell{stroke:#fff;stroke-width:.5}\
svg.heatmap rect.cell:hover{stroke:#000;stroke-width:1.5}pre{background:#f6f8fa;padding:.8em;overflow-x:auto}pre.blame{white-space:pre-wrap}\
.excerpt{margin:.2em 0 .8em 0}.excerpt mark{background:#ffe08a;display:block}.culprit{border-left:4px solid #b30000}\
.legend span{display:inline-block;width:1.2em;height:1em;vertical-align:middle;border:1px solid #ddd}";

const SCRIPT: &str = "document.querySelectorAll('svg.heatmap').forEach(function(svg){\
var tip=svg.parentNode.querySelector('.tip');\
svg.addEventListener('mouseover',function(e){var t=e.target.getAttribute('data-tip');if(t&&tip){tip.textContent=t;}});});\
document.body.setAttribute('data-ready','yes');";

impl Report {
    /// The report as one self-contained HTML page (see the module docs of `check::html`).
    pub fn to_html(&self) -> String {
        page(std::slice::from_ref(self))
    }
}

/// One page of `reports` (the CLI's `check --html` of several specs), each under its heading.
pub fn page(reports: &[Report]) -> String {
    let title = reports.iter().map(|r| r.name.as_str()).collect::<Vec<_>>().join(", ");
    let body: String = reports.iter().map(report_html).collect();
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>tilegrad: {}</title><style>{STYLE}</style></head>\n\
         <body>\n{body}<script>{SCRIPT}</script>\n</body></html>\n",
        esc(&title)
    )
}

/// One report: its verdict, a section per failing tensor, the elements asked about, the text.
fn report_html(report: &Report) -> String {
    let verdict = if report.passed { "<span class=\"pass\">PASS</span>" } else { "<span class=\"fail\">FAIL</span>" };
    let mut body = format!("<article class=\"report\">\n<h1>check <code>{}</code>: {verdict}</h1>\n", esc(&report.name));
    let mapped = report.forward.iter().map(|r| ("forward output", r)).chain(report.gradients.iter().map(|r| ("gradient", r)));
    for (what, r) in mapped.filter(|(_, r)| r.error_map.is_some()) {
        body.push_str(&section(what, r));
    }
    for x in &report.explained {
        let _ = write!(body, "<section class=\"explained\"><h2>element <code>{}</code> asked about</h2>", esc(&x.tensor));
        body.push_str(&worst_html(&x.element));
        body.push_str("</section>\n");
    }
    let _ = write!(body, "<h2>report</h2>\n<pre class=\"text\">{}</pre>\n</article>\n", esc(&report.to_string()));
    body
}

/// One failing tensor: its numbers, the map's summary, the heatmap, its worst element's blame.
fn section(what: &str, r: &TensorReport) -> String {
    let mut s = format!("<section class=\"tensor\" data-tensor=\"{}\">\n", esc(&r.tensor));
    let of = if r.name == r.tensor { String::new() } else { format!(" of <code>{}</code>", esc(&r.name)) };
    let _ = writeln!(s, "<h2>{what} <code>{}</code>{of}</h2>", esc(&r.tensor));
    let _ = writeln!(
        s,
        "<p>shape {:?}, {}: {} element{} over tolerance (rtol {:.0e}, atol {:.0e}); max abs error {:.3e}</p>",
        r.shape,
        esc(&r.dtype),
        r.over_tolerance,
        if r.over_tolerance == 1 { "" } else { "s" },
        r.tolerance.rtol,
        r.tolerance.atol,
        r.max_abs_err
    );
    if let Some(m) = &r.error_map {
        let _ = writeln!(s, "<p class=\"summary\">{}</p>", esc(&m.summary));
        s.push_str(&heatmap(&r.tensor, m));
        s.push_str("<p class=\"tip\">hover a cell for its elements</p>\n");
        s.push_str(LEGEND);
    }
    if let Some(w) = &r.worst {
        s.push_str(&worst_html(w));
    }
    s.push_str("</section>\n");
    s
}

const LEGEND: &str = "<p class=\"legend\">fraction over tolerance: <span style=\"background:#f2f2f2\"></span> none \
<span style=\"background:rgb(253,219,160)\"></span> some <span style=\"background:rgb(179,0,0)\"></span> all \
<span style=\"background:#6a3d9a\"></span> holds a NaN</p>\n";

/// The heatmap of a map: one `rect.cell` per cell, labelled axes.
fn heatmap(tensor: &str, m: &ErrorMap) -> String {
    let (nr, nc) = (m.row_bins.len(), m.col_bins.len());
    let (cw, ch) = ((GRID.0 / nc).clamp(6, 48), (GRID.1 / nr).clamp(12, 40));
    let (w, h) = (MARGIN.0 + cw * nc, MARGIN.1 + ch * nr);
    let mut s = format!(
        "<svg class=\"heatmap\" data-tensor=\"{}\" data-rows=\"{nr}\" data-cols=\"{nc}\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" role=\"img\">\n",
        esc(tensor)
    );
    for c in (0..nc).step_by(ruler_step(nc, cw)) {
        let _ = writeln!(s, "<text x=\"{}\" y=\"14\">{}</text>", MARGIN.0 + c * cw, m.col_bins[c][0]);
    }
    for r in 0..nr {
        let y = MARGIN.1 + r * ch;
        let label = if m.folded_axes == 0 && m.rows == 1 { String::new() } else { m.row_label(r) };
        let _ = writeln!(s, "<text x=\"{}\" y=\"{}\" text-anchor=\"end\">{label}</text>", MARGIN.0 - 6, y + ch / 2 + 4);
        for c in 0..nc {
            let tip = esc(&cell_tip(m, r, c));
            // A NaN cell is purple, more opaque the more of its elements are over tolerance.
            let f = m.cells[r][c];
            let (class, fill, opacity) =
                if m.has_nan(r, c) { ("cell nan", NAN_FILL.into(), 0.35 + 0.65 * f) } else { ("cell", colour(f), 1.0) };
            let _ = writeln!(
                s,
                "<rect class=\"{class}\" x=\"{}\" y=\"{y}\" width=\"{cw}\" height=\"{ch}\" fill=\"{fill}\" fill-opacity=\"{opacity:.2}\" \
                 data-r=\"{r}\" data-c=\"{c}\" data-tip=\"{tip}\"><title>{tip}</title></rect>",
                MARGIN.0 + c * cw
            );
        }
    }
    s.push_str("</svg>\n");
    s
}

/// Cells between column labels, so that labels of up to six digits do not overlap.
fn ruler_step(nc: usize, cw: usize) -> usize {
    (56usize.div_ceil(cw)).clamp(1, nc.max(1))
}

/// The fill of a cell with `fraction` over tolerance: light grey for none, from pale orange to
/// dark red for some to all.
fn colour(fraction: f64) -> String {
    if fraction <= 0.0 {
        return "#f2f2f2".into();
    }
    let t = fraction.clamp(0.0, 1.0);
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!("rgb({},{},{})", mix(253.0, 179.0), mix(219.0, 0.0), mix(160.0, 0.0))
}

/// What hovering cell `(r, c)` tells.
fn cell_tip(m: &ErrorMap, r: usize, c: usize) -> String {
    let place = if m.folded_axes == 0 && m.rows == 1 {
        format!("elements {}", m.col_label(c))
    } else {
        format!("rows {}, columns {}", m.row_label(r), m.col_label(c))
    };
    let n = m.cell_size(r, c);
    let k = (m.cells[r][c] * n as f64).round() as usize;
    let mut tip = format!("{place}: {k} of {n} over tolerance ({:.0}%)", 100.0 * m.cells[r][c]);
    if m.has_nan(r, c) {
        tip.push_str(", a NaN among them");
    }
    if let Some(w) = &m.worst[r][c] {
        let _ = write!(tip, "; worst {:?}: expected {:e}, got {:e}", w.index, w.expected, w.got);
    }
    tip
}

/// A worst element and its blame: who wrote it, and the source lines its value came through.
fn worst_html(w: &Worst) -> String {
    let mut s = format!("<h3>worst element {:?}: expected {:e}, got {:e}</h3>\n", w.index, w.expected, w.got);
    let Some(b) = &w.blame else { return s };
    let writers = Blame { slice: None, ..b.clone() }.to_string();
    let _ = writeln!(s, "<pre class=\"blame\">{}</pre>", esc(writers.trim_end()));
    if let Some(sl) = &b.slice {
        for d in sl
            .nonfinite
            .iter()
            .map(|n| format!("first non-finite value: {n}"))
            .chain(sl.decided_by.iter().map(|d| format!("decided by {d}")))
        {
            let _ = writeln!(s, "<p>{}</p>", esc(&d));
        }
        s.push_str("<ol class=\"slice\">\n");
        for (i, l) in sl.lines.iter().enumerate() {
            s.push_str(&slice_line(l, i == 0));
        }
        s.push_str("</ol>\n");
    }
    s
}

/// One line of a data-flow slice: where, what it computed, and its source with the line marked.
fn slice_line(l: &SliceLine, culprit: bool) -> String {
    let value = l.value.map_or(String::new(), |v| format!(" = {v:e}"));
    let note = l.note.as_ref().map_or(String::new(), |n| format!(" &larr; {}", esc(n)));
    let mut s = format!(
        "<li{}><code>{}</code> <code>{}</code>{value} [{}] (kernel <code>{}</code>, step {}, program {:?}){note}\n",
        if culprit { " class=\"culprit\"" } else { "" },
        esc(&l.loc),
        esc(&l.op),
        esc(&l.role),
        esc(&l.kernel),
        l.step,
        l.program
    );
    let lines = excerpt(&l.loc).unwrap_or_else(|| vec![(line_of(&l.loc).unwrap_or(0), l.source.clone(), true)]);
    s.push_str("<pre class=\"excerpt\">");
    for (n, text, marked) in lines {
        let row = format!("{n:>5}  {}", esc(&text));
        if marked {
            let _ = write!(s, "<mark>{row}</mark>");
        } else {
            let _ = writeln!(s, "{row}");
        }
    }
    s.push_str("</pre></li>\n");
    s
}

/// The line number of a `file:line:col` location.
fn line_of(loc: &str) -> Option<usize> {
    let mut parts = loc.rsplitn(3, ':');
    let (col, line) = (parts.next()?, parts.next()?);
    col.parse::<usize>().ok()?;
    line.parse().ok()
}

/// The lines around a `file:line:col` location, `(number, text, is the line)`, where the file
/// can be read.
fn excerpt(loc: &str) -> Option<Vec<(usize, String, bool)>> {
    let line = line_of(loc)?;
    let file = loc.rsplitn(3, ':').nth(2)?;
    let text = std::fs::read_to_string(file).ok()?;
    let first = line.saturating_sub(CONTEXT).max(1);
    let lines: Vec<(usize, String, bool)> = text
        .lines()
        .enumerate()
        .map(|(i, t)| (i + 1, t.to_string(), i + 1 == line))
        .skip(first - 1)
        .take(line + CONTEXT + 1 - first)
        .collect();
    lines.iter().any(|l| l.2).then_some(lines)
}

/// Text escaped for HTML.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        match ch {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_markup_and_reads_locations() {
        assert_eq!(esc("<a href=\"x\">&'"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;");
        assert_eq!(line_of("dir/k.py:67:5"), Some(67));
        assert_eq!(line_of("k.py"), None);
        assert_eq!(colour(0.0), "#f2f2f2");
        assert_eq!(colour(1.0), "rgb(179,0,0)");
    }
}
