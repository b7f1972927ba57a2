//! The `tilegrad` command line.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tilegrad::zoo;

#[derive(Parser)]
#[command(name = "tilegrad", version, about = "Ground-truth gradients for GPU tile kernels")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run kernels of the built-in zoo on random data through the CPU reference interpreter and
    /// compare them with plain-Rust f64 references (all cases when none is named).
    Zoo {
        /// Case names (see --list).
        cases: Vec<String>,
        /// Seed of the random inputs.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// List the cases and exit.
        #[arg(long)]
        list: bool,
    },
    /// Print the IR of a text-IR file (`FILE.tgir`) or of a Triton kernel (`FILE.py::NAME`),
    /// verified.
    Ir {
        /// A `.tgir` file, or `path/to/file.py::kernel_name`.
        file: String,
        /// Constexpr bindings for a Triton kernel, `NAME=VALUE` (repeatable).
        #[arg(long = "const", value_name = "NAME=VALUE")]
        consts: Vec<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Runs a command; `Ok(false)` means it ran and found a failure.
fn run(cli: Cli) -> Result<bool> {
    match cli.command {
        Command::Zoo { cases, seed, list } => {
            if list {
                for n in zoo::names() {
                    println!("{n}");
                }
                return Ok(true);
            }
            let cases: Vec<String> = if cases.is_empty() { zoo::names().iter().map(|s| s.to_string()).collect() } else { cases };
            println!(
                "{:<18} {:>8} {:>8} {:>10} {:>10} {:>11} {:>11} {:>10} {:>10}  result",
                "case", "programs", "launches", "loaded", "stored", "max abs err", "max rel err", "tolerance", "time"
            );
            let mut passed = 0usize;
            for c in &cases {
                let r = zoo::run_case(c, seed).with_context(|| format!("zoo case `{c}`"))?;
                let ok = r.passed();
                passed += ok as usize;
                println!(
                    "{:<18} {:>8} {:>8} {:>10} {:>10} {:>11.3e} {:>11.3e} {:>10.1e} {:>8.2}ms  {}",
                    r.name,
                    r.programs,
                    r.launches,
                    r.elements_loaded,
                    r.elements_stored + r.elements_atomic,
                    r.max_abs_err,
                    r.max_rel_err,
                    r.tolerance,
                    r.elapsed.as_secs_f64() * 1e3,
                    if ok { "ok" } else { "MISMATCH" }
                );
                for (name, shape) in &r.outputs {
                    println!("{:<18}   output `{name}` {shape:?}", "");
                }
            }
            println!("{passed} of {} cases match their reference (seed {seed})", cases.len());
            Ok(passed == cases.len())
        }
        Command::Ir { file, consts } => {
            if let Some((path, name)) = file.split_once("::") {
                let src = std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
                let mut bindings = Vec::new();
                for c in &consts {
                    let (n, v) = c.split_once('=').with_context(|| format!("--const `{c}`: expected NAME=VALUE"))?;
                    let v: i64 = v.trim().parse().with_context(|| format!("--const `{c}`: `{v}` is not an integer"))?;
                    bindings.push((n.trim().to_string(), v));
                }
                let refs: Vec<(&str, i64)> = bindings.iter().map(|(n, v)| (n.as_str(), *v)).collect();
                let opts = tilegrad_ir::triton::ConvertOptions::with_constexprs(&refs);
                let k = tilegrad_ir::triton::convert(&src, path, name, &opts)?;
                print!("{k}");
                return Ok(true);
            }
            if !consts.is_empty() {
                bail!("--const applies to Triton kernels (FILE.py::NAME)");
            }
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {file}"))?;
            let kernels = tilegrad_ir::text::parse(&text, &file)?;
            if kernels.is_empty() {
                bail!("{file}: no kernels");
            }
            print!("{}", tilegrad_ir::text::print_module(&kernels));
            Ok(true)
        }
    }
}
