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
    /// Parse and verify a text-IR file and print its kernels.
    Ir {
        /// A `.tgir` file.
        file: std::path::PathBuf,
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
        Command::Ir { file } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            let kernels = tilegrad_ir::text::parse(&text, &file.display().to_string())?;
            if kernels.is_empty() {
                bail!("{}: no kernels", file.display());
            }
            print!("{}", tilegrad_ir::text::print_module(&kernels));
            Ok(true)
        }
    }
}
