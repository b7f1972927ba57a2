//! Loops over a thread's registers, one after another, merged into one loop.
//!
//! Each elementwise op is a loop over the registers a thread holds of its result. Past
//! [`STRAIGHT_REGISTERS`] they stay loops, and a kernel of large tiles has a hundred of them
//! (the layer norm's f64 VJP kernel over 8x4096 tiles: 105 loops of 32 registers). NVVM's loop
//! passes take time for each, so consecutive ops over the same registers that only compute in
//! registers share one loop: `for j { a[j] = ..; b[j] = f(a[j]); }` instead of two. Each
//! register is computed by the same statements in the same order; only the order across
//! registers changes, which is why a body that reads another register (`a[j + 1]`, `a[0]`) of a
//! value the merged loop writes starts a loop of its own. The declarations and comments of the
//! merged ops are written before the loop. Measured on an H100 with NVRTC's `--time`: the layer
//! norm's VJP kernel 2.04-2.09 s as 105 loops, 1.45-1.52 s as 45; the 4-row softmax's 1.85-2.09
//! s as 82 loops, 1.51-1.66 s as 43.

use super::*;

/// The loop being merged: not yet written, so that the next op over as many registers may join
/// it.
pub(super) struct Merged {
    /// Registers it runs over, and the nesting it is written at.
    count: usize,
    depth: usize,
    /// One block a register for each op, in order.
    bodies: Vec<String>,
    /// The values the bodies write.
    written: Vec<u32>,
    /// Declarations and comments of the ops since the loop began: those of the merged ops (the
    /// first `joined`) are written before it, those of the op that ends it after it.
    held: Vec<String>,
    joined: usize,
}

impl Gen<'_> {
    /// Writes a line of code, after the loop being merged (if any).
    pub(super) fn line(&mut self, s: &str) {
        self.write_merged();
        self.write_line(s);
    }

    /// Writes a line that may go before the loop being merged: a declaration or a comment.
    pub(super) fn line_before(&mut self, s: &str) {
        match &mut self.merged {
            Some(m) => m.held.push(s.to_string()),
            None => self.write_line(s),
        }
    }

    /// `body` (a block for register `j`, writing register `j` of `out` from registers in its
    /// thread) for each of `count` registers: joined to the loop being merged where it can be,
    /// written out or as a loop of its own like [`Gen::registers`] otherwise.
    pub(super) fn merge_registers(&mut self, count: usize, out: Value, body: &str) {
        if count <= self.unrolled.min(STRAIGHT_REGISTERS) {
            let text = self.registers(count, body);
            return self.line(&text);
        }
        let depth = self.depth;
        if let Some(m) = &mut self.merged {
            if m.count == count && m.depth == depth && !reads_other_registers(body, &m.written) {
                m.bodies.push(body.to_string());
                m.written.push(out.0);
                m.joined = m.held.len();
                return;
            }
        }
        // The lines held since the last merged op (this op's declaration and comment) go
        // after that loop and before this one.
        let held = match self.merged.take() {
            Some(mut m) => {
                let after = m.held.split_off(m.joined);
                self.merged = Some(m);
                self.write_merged();
                after
            }
            None => Vec::new(),
        };
        for h in &held {
            self.write_line(h);
        }
        self.merged = Some(Merged { count, depth, bodies: vec![body.to_string()], written: vec![out.0], held: Vec::new(), joined: 0 });
    }

    /// Writes the loop being merged, if any, between the lines held for it.
    pub(super) fn write_merged(&mut self) {
        let Some(m) = self.merged.take() else { return };
        for h in &m.held[..m.joined] {
            self.write_line(h);
        }
        let text = self.registers(m.count, &format!("{{ {} }}", m.bodies.join(" ")));
        self.write_line(&text);
        for h in &m.held[m.joined..] {
            self.write_line(h);
        }
    }

    fn write_line(&mut self, s: &str) {
        for _ in 0..self.depth {
            self.out.push_str("    ");
        }
        self.out.push_str(s);
        self.out.push('\n');
    }
}

/// Whether C code `body` reads a register other than `[j]` of one of `values` (`v12[0]`,
/// `v12[j + 1]`): merged into a loop that writes them, it would read it before its turn.
fn reads_other_registers(body: &str, values: &[u32]) -> bool {
    let b = body.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let starts_name = b[i] == b'v' && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'));
        if !starts_name {
            i += 1;
            continue;
        }
        let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        let after = i + 1 + digits;
        if digits == 0 || b.get(after) != Some(&b'[') {
            i += 1;
            continue;
        }
        let id: u32 = body[i + 1..after].parse().unwrap_or(u32::MAX);
        // The index, to the matching bracket.
        let mut depth = 0usize;
        let mut end = after;
        for (k, &c) in b.iter().enumerate().skip(after) {
            match c {
                b'[' => depth += 1,
                b']' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k;
                        break;
                    }
                }
                _ => {}
            }
        }
        if values.contains(&id) && body[after + 1..end].trim() != "j" {
            return true;
        }
        i = end.max(i + 1);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_register_j_of_a_merged_value_may_be_read() {
        let w = [12, 30];
        assert!(!reads_other_registers("{ v40[j] = v12[j] + v30[j]; }", &w));
        assert!(!reads_other_registers("{ v40[j] = v12[ j ] * v7[0] + v5[e % 3]; }", &w));
        assert!(reads_other_registers("{ v40[j] = v12[0]; }", &w));
        assert!(reads_other_registers("{ v40[j] = v30[j + 1]; }", &w));
        assert!(reads_other_registers("{ v40[j] = v30[v2[j]]; }", &w));
        // Names that only end in `v12`, and values not merged, are not reads of it.
        assert!(!reads_other_registers("{ tgv12[3] = 0; v120[0] = v13[2]; }", &w));
    }

    /// Kernels with 32 registers a value (8 x 4096 tiles in 1024 threads): elementwise ops merge
    /// into one loop; an op reading another register of a merged value, and any op that is not
    /// elementwise, start another.
    #[test]
    fn consecutive_elementwise_ops_over_as_many_registers_share_a_loop() {
        use tilegrad_ir::triton::{convert, ConstValue, ConvertOptions};
        const SRC: &str = r#"
import triton
import triton.language as tl

@triton.jit
def k(x_ptr, y_ptr, R: tl.constexpr, C: tl.constexpr):
    r = tl.program_id(0) * R + tl.arange(0, R)
    c = tl.arange(0, C)
    x = tl.load(x_ptr + r[:, None] * C + c[None, :])
    y = x * 2.0 + 1.0
    y = tl.where(y > 0.0, y, -y)
    tl.store(y_ptr + r[:, None] * C + c[None, :], y - tl.max(y, axis=1)[:, None])
"#;
        let constexprs = vec![("R".to_string(), ConstValue::Int(8)), ("C".to_string(), ConstValue::Int(4096))];
        let k = convert(SRC, "k.py", "k", &ConvertOptions { constexprs, ..ConvertOptions::default() }).unwrap();
        let g = generate_flavor_unrolling(&k, Flavor::default(), UNROLLED_REGISTERS).unwrap();
        assert_eq!(g.threads, 1024);
        let loops: Vec<&str> = g.source.lines().filter(|l| l.starts_with("for (int j = 0; j < 32; ++j)")).collect();
        // `* 2.0`, `+ 1.0`, `> 0.0`, `-y` and `where` in one loop, with the offsets computed
        // before the load.
        let merged = loops.iter().find(|l| l.contains(" ? ")).expect("the where's loop");
        assert!(merged.matches("{ const int e = tid + j * 1024;").count() >= 5, "{merged}");
        // Fewer loops than the ops over 32 registers.
        let ops = g.source.matches("// ").count();
        assert!(loops.len() * 2 < ops, "{} loops, {ops} ops", loops.len());
        // Every value is declared before the loop that writes it.
        for l in &loops {
            for id in l.match_indices("] = ").filter_map(|(at, _)| {
                let name = &l[..at];
                let start = name.rfind('v')?;
                name[start + 1..].split('[').next()?.parse::<u32>().ok()
            }) {
                let decl = g.source.find(&format!(" v{id}[32];")).unwrap_or(usize::MAX);
                assert!(decl < g.source.find(*l).unwrap(), "v{id} declared after its loop");
            }
        }
    }
}
