//! Every fenced code block of `README.md` and `docs/*.md` is run, so that the documentation
//! cannot rot. A block's info string names its language, and each language has its runner:
//!
//! - `sh`: one command a line, with an optional trailing `# comment`. `cargo run --release --
//!   ARGS` and `tilegrad ARGS` run the built binary from the repository root; a comment that says
//!   `exit N` gives the exit status expected (0 otherwise). The other commands a page may show
//!   are the ones CI runs itself ([`RUN_BY_CI`]); any other command fails here.
//! - `text`: an output sample. Right after a `sh` block (nothing but blank lines between) it is
//!   what that block's last command prints: each of its lines appears in that output, in order
//!   (the output may have more lines; a `...` line stands for them). Right after a `python`
//!   block, `python/tests/test_docs.py` checks it the same way. Elsewhere it is not run.
//! - `toml`: a spec, loaded as if it were a file of `examples/`, whose check must pass.
//! - `rust`: doctests (`src/lib.rs` includes every page under `cfg(doctest)`). A doctest compiles
//!   a `#[test]` function but does not call it, so each one a page shows is also in this file,
//!   verbatim, and runs here.
//! - `python`: `python/tests/test_docs.py` runs them under pytest.
//!
//! A block with no language, or with one not listed here, fails: a sample or a sketch says `text`
//! (an indented code block is Rust to rustdoc, so the doctests fail on one that is not).
//! `no-run` after the language (`python no-run`) marks a block that cannot be run as shown
//! (rustdoc's own `rust,ignore` for Rust).

use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::check::{check_backward, CheckOptions};
use tilegrad::suite::GradCase;

/// Commands a page shows that CI runs itself (`.ci/run`, through `./test`), not run here.
const RUN_BY_CI: &[&str] = &["./test", "pip install . torch pytest && pytest examples/python"];

/// The languages a block may have.
const LANGUAGES: &[&str] = &["sh", "text", "toml", "rust", "python"];

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One fenced code block of a page.
#[derive(Clone, Debug)]
struct Block {
    page: String,
    /// 1-based line of the opening fence.
    line: usize,
    lang: String,
    attrs: Vec<String>,
    body: String,
    /// Whether the block before it ends right above it (only blank lines between).
    follows_block: bool,
}

impl Block {
    fn at(&self) -> String {
        format!("{}:{}", self.page, self.line)
    }

    fn runs(&self) -> bool {
        !self.attrs.iter().any(|a| a == "no-run" || a == "ignore")
    }
}

/// `README.md` and every page of `docs/`.
fn pages() -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    std::iter::once(root().join("README.md")).chain(docs).collect()
}

/// The fenced blocks of `text`, a page named `page`.
fn blocks_of(page: &str, text: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, String, Vec<&str>)> = None;
    let mut last_close: Option<usize> = None;
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        match open.take() {
            None if l.trim_start().starts_with("```") => open = Some((i, l.trim_start()[3..].trim().to_string(), Vec::new())),
            None => {}
            Some((start, info, body)) if l.trim() == "```" => {
                let follows_block = last_close.is_some_and(|c| lines[c + 1..start].iter().all(|b| b.trim().is_empty()));
                let mut words = info.split([' ', ',']).filter(|w| !w.is_empty()).map(String::from);
                let lang = words.next().unwrap_or_default();
                let body = body.iter().map(|b| format!("{b}\n")).collect();
                out.push(Block { page: page.into(), line: start + 1, lang, attrs: words.collect(), body, follows_block });
                last_close = Some(i);
            }
            Some((start, info, mut body)) => {
                body.push(l);
                open = Some((start, info, body));
            }
        }
    }
    assert!(open.is_none(), "{page}: a code block is not closed");
    out
}

/// Every block of every page.
fn all_blocks() -> Vec<Block> {
    pages()
        .iter()
        .flat_map(|p| {
            let name = p.strip_prefix(root()).unwrap_or(p).display().to_string();
            blocks_of(&name, &std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{name}: {e}")))
        })
        .collect()
}

// ---------------------------------------------------------------- the blocks' languages

#[test]
fn every_block_names_a_language() {
    let blocks = all_blocks();
    assert!(blocks.len() >= 20, "the pages have {} code blocks", blocks.len());
    let unmarked: Vec<String> =
        blocks.iter().filter(|b| !LANGUAGES.contains(&b.lang.as_str())).map(|b| format!("{}: ```{}", b.at(), b.lang)).collect();
    assert!(unmarked.is_empty(), "code blocks without a language this test runs ({LANGUAGES:?}): {unmarked:#?}");
    for b in &blocks {
        let allowed: &[&str] = if b.lang == "rust" { &["ignore", "no_run", "should_panic"] } else { &["no-run"] };
        assert!(b.attrs.iter().all(|a| allowed.contains(&a.as_str())), "{}: unknown attribute in {:?}", b.at(), b.attrs);
    }
}

#[test]
fn the_block_parser_finds_languages_attributes_and_samples() {
    let page = "x\n```sh\ntilegrad zoo\n```\n\n```text\nout\n```\nprose\n```python no-run\nimport gpu\n```\n```\nbare\n```\n";
    let b = blocks_of("p.md", page);
    let seen: Vec<(usize, &str, bool, bool)> = b.iter().map(|b| (b.line, b.lang.as_str(), b.runs(), b.follows_block)).collect();
    assert_eq!(seen, [(2, "sh", true, false), (6, "text", true, true), (10, "python", false, false), (13, "", true, true)]);
    assert_eq!(b[0].body, "tilegrad zoo\n");
}

// ---------------------------------------------------------------- sh and text

/// A command of a `sh` block: the arguments of `tilegrad` and the exit status expected, or
/// `None` for a command CI runs itself.
fn parse_command(line: &str) -> Result<Option<(Vec<String>, i32)>, String> {
    let (command, comment) = match line.find(" #") {
        Some(i) => (line[..i].trim(), &line[i + 2..]),
        None => (line.trim(), ""),
    };
    if RUN_BY_CI.contains(&command) {
        return Ok(None);
    }
    let args = ["cargo run --release -- ", "tilegrad "].iter().find_map(|p| command.strip_prefix(p));
    let args = args.ok_or_else(|| format!("`{command}` is neither a tilegrad command nor one CI runs (RUN_BY_CI)"))?;
    if args.contains(['\'', '"', '$', '|', '>', '<', '&', ';']) {
        return Err(format!("`{command}`: quoting, variables and redirections are not run here"));
    }
    let exit = match comment.split("exit ").nth(1) {
        Some(code) => code.split(|c: char| !c.is_ascii_digit()).next().and_then(|c| c.parse().ok()).ok_or("`exit N` with no number")?,
        None => 0,
    };
    Ok(Some((args.split_whitespace().map(String::from).collect(), exit)))
}

#[test]
fn commands_are_parsed_with_their_exit_status() {
    let cmd = |l| parse_command(l).unwrap().map(|(a, e)| (a.join(" "), e));
    assert_eq!(cmd("cargo run --release -- check a.toml   # a pass"), Some(("check a.toml".into(), 0)));
    assert_eq!(cmd("tilegrad check a.toml --kernel bwd=::b  # exit 1: a check failed"), Some(("check a.toml --kernel bwd=::b".into(), 1)));
    assert_eq!(cmd("./test   # everything"), None);
    assert!(parse_command("rm -rf target").is_err());
    assert!(parse_command("tilegrad check a.toml > out.txt").is_err());
}

/// The output of `tilegrad args` run from the repository root, after checking its exit status.
fn run_command(at: &str, args: &[String], exit: i32) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).current_dir(root()).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(exit), "{at}: `tilegrad {}` exits {:?}:\n{text}", args.join(" "), out.status.code());
    text
}

/// The first line of `sample` (a `...` line aside) that is not among the lines of `output` in
/// order.
fn missing_line<'s>(sample: &'s str, output: &str) -> Option<&'s str> {
    let mut out = output.lines().map(str::trim_end);
    sample.lines().map(str::trim_end).filter(|l| l.trim() != "...").find(|&want| !out.any(|got| got == want))
}

#[test]
fn a_sample_matches_lines_in_order_with_gaps() {
    let output = "a\n  b  \nc\nd\n";
    assert_eq!(missing_line("a\n...\n  b\nd\n", output), None);
    assert_eq!(missing_line("b\n", output), Some("b"), "indentation counts");
    assert_eq!(missing_line("c\na\n", output), Some("a"), "order counts");
}

#[test]
fn shell_blocks_run_and_their_samples_match() {
    let blocks = all_blocks();
    let (mut commands, mut samples) = (0, 0);
    let mut last_output: Option<String> = None;
    for b in &blocks {
        match b.lang.as_str() {
            "sh" if b.runs() => {
                last_output = None;
                for line in b.body.lines().filter(|l| !l.trim().is_empty()) {
                    let parsed = parse_command(line).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
                    last_output = parsed.map(|(args, exit)| run_command(&b.at(), &args, exit));
                    commands += usize::from(last_output.is_some());
                }
            }
            "text" if b.follows_block && last_output.is_some() => {
                let output = last_output.take().unwrap_or_default();
                if let Some(line) = missing_line(&b.body, &output) {
                    panic!("{}: the sample's line\n{line}\nis not in the output (in order):\n{output}", b.at());
                }
                samples += 1;
            }
            _ => last_output = None,
        }
    }
    eprintln!("{commands} tilegrad commands run, {samples} output samples matched");
    assert!(commands >= 8 && samples >= 4, "{commands} commands, {samples} samples");
}

// ---------------------------------------------------------------- toml

/// A folder holding `spec.toml` and links to every entry of `examples/`, so that the spec's
/// paths resolve as in a file of `examples/`.
fn beside_examples(tag: &str, spec: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tilegrad-docs-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(root().join("examples")).unwrap() {
        let e = e.unwrap();
        std::os::unix::fs::symlink(e.path(), dir.join(e.file_name())).unwrap();
    }
    std::fs::write(dir.join("spec.toml"), spec).unwrap();
    dir
}

#[test]
fn toml_blocks_are_specs_that_pass() {
    let blocks: Vec<Block> = all_blocks().into_iter().filter(|b| b.lang == "toml" && b.runs()).collect();
    assert!(!blocks.is_empty(), "no TOML spec in the pages");
    for (i, b) in blocks.iter().enumerate() {
        let dir = beside_examples(&i.to_string(), &b.body);
        let s = tilegrad::spec::load(&dir.join("spec.toml")).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
        let backward = s.backward.as_ref().unwrap_or_else(|| panic!("{}: the spec has no backward", b.at()));
        let r = check_backward(&s.forward, backward, &s.inputs, &CheckOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", b.at()));
        assert!(r.passed, "{}:\n{r}", b.at());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

// ---------------------------------------------------------------- rust

/// Each `#[test]` function of a `rust` block, from its attribute to the block's end.
fn shown_tests() -> Vec<(String, String)> {
    let blocks = all_blocks();
    let rust = blocks.iter().filter(|b| b.lang == "rust" && b.runs());
    rust.filter_map(|b| b.body.find("#[test]").map(|i| (b.at(), b.body[i..].to_string()))).collect()
}

#[test]
fn the_test_functions_the_pages_show_run_here() {
    let here = include_str!("docs.rs");
    let shown = shown_tests();
    assert!(!shown.is_empty(), "no `#[test]` in the pages' Rust blocks");
    for (at, f) in shown {
        assert!(here.contains(&f), "{at}: this `#[test]` is not in tests/docs.rs verbatim, so nothing runs it:\n{f}");
    }
}

// The `#[test]` functions of README.md and docs/rust.md, as they show them.
#[test]
fn weighted_sum_backward() {
    GradCase::from_spec("examples/weighted_sum.toml").unwrap().trials(3).assert_passes();
}

#[test]
fn every_page_is_included_for_its_doctests() {
    let lib = include_str!("../src/lib.rs");
    for p in pages() {
        let rel = p.strip_prefix(root()).unwrap().display().to_string();
        assert!(lib.contains(&format!("include_str!(\"../{rel}\")")), "src/lib.rs does not include {rel}: its Rust blocks would not run");
    }
}

// ---------------------------------------------------------------- help

/// `tilegrad ARGS --help`.
fn help(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).arg("--help").output().unwrap();
    assert!(out.status.success(), "{args:?} --help");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The subcommands the top-level help lists (`help` aside).
fn subcommands() -> Vec<String> {
    let top = help(&[]);
    let listed = top.split("Commands:\n").nth(1).expect("a command list").lines().take_while(|l| !l.trim().is_empty());
    listed.filter_map(|l| l.split_whitespace().next()).filter(|c| *c != "help").map(String::from).collect()
}

/// The `docs/NAME.md` (and `#anchor`) references of a text.
fn doc_links(text: &str) -> Vec<String> {
    let starts = text.match_indices("docs/").map(|(i, _)| &text[i..]);
    let link = |s: &str| s.split(|c: char| !(c.is_ascii_alphanumeric() || "/.-_#".contains(c))).next().unwrap_or("").to_string();
    starts.map(link).map(|l| l.trim_end_matches('.').to_string()).filter(|l| l.contains(".md")).collect()
}

/// GitHub's anchor of a heading.
fn slug(heading: &str) -> String {
    let kept =
        heading.trim().to_lowercase().chars().filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_').collect::<String>();
    kept.replace(' ', "-")
}

#[test]
fn the_help_of_tilegrad_and_of_each_command_points_to_a_page() {
    let commands = subcommands();
    assert!(commands.len() >= 6 && commands.iter().any(|c| c == "check"), "{commands:?}");
    let mut all: Vec<Vec<&str>> = vec![vec![]];
    all.extend(commands.iter().map(|c| vec![c.as_str()]));
    for args in all {
        let text = help(&args);
        let links = doc_links(&text);
        assert!(!links.is_empty(), "`tilegrad {} --help` names no page of docs/:\n{text}", args.join(" "));
        for l in links {
            let (file, anchor) = l.split_once('#').map_or((l.as_str(), None), |(f, a)| (f, Some(a)));
            let page = std::fs::read_to_string(root().join(file)).unwrap_or_else(|e| panic!("`{}` help: {file}: {e}", args.join(" ")));
            if let Some(a) = anchor {
                let headings: Vec<String> =
                    page.lines().filter_map(|h| h.strip_prefix('#')).map(|h| slug(h.trim_start_matches('#'))).collect();
                assert!(headings.iter().any(|h| h == a), "`{}` help: no heading `#{a}` in {file}: {headings:?}", args.join(" "));
            }
        }
    }
    assert_eq!(slug("Computing a ground-truth gradient"), "computing-a-ground-truth-gradient");
    assert_eq!(doc_links("See docs/spec.md#x-y (z), docs/rust.md."), ["docs/spec.md#x-y", "docs/rust.md"]);
}
