//! Running one command on a mutant as a child process, under an address-space cap (`ulimit -v`)
//! and a wall-clock timeout, and judging how it ended: an abort (a signal: stack overflow,
//! allocation failure, SIGKILL), a hang, a panic, an unexpected exit status or an error without a
//! location is a fault; a result, a failed check or a located error is fine.

use std::io::Read;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What a child may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Wall-clock time before the child is killed and counted as a hang.
    pub timeout: Duration,
    /// Address space, KiB (`ulimit -v`).
    pub mem_kib: u64,
}

/// One command: the program, its arguments and the folder it runs in.
#[derive(Clone, Debug)]
pub struct Cmd {
    pub program: PathBuf,
    pub args: Vec<String>,
    pub dir: PathBuf,
    pub env: Vec<(String, String)>,
}

impl Cmd {
    /// `program args...` in `dir`.
    pub fn new(program: &Path, dir: &Path, args: &[&str]) -> Cmd {
        Cmd { program: program.to_path_buf(), args: args.iter().map(|a| a.to_string()).collect(), dir: dir.to_path_buf(), env: Vec::new() }
    }

    /// The command as a shell line, for a reproduction.
    pub fn shell_line(&self, limits: &Limits) -> String {
        let env: String = self.env.iter().map(|(k, v)| format!("{k}={v} ")).collect();
        let args: Vec<String> = self.args.iter().map(|a| shell_quote(a)).collect();
        format!(
            "(cd {} && ulimit -v {} && {env}timeout {} {} {})",
            shell_quote(&self.dir.display().to_string()),
            limits.mem_kib,
            limits.timeout.as_secs(),
            shell_quote(&self.program.display().to_string()),
            args.join(" ")
        )
    }
}

fn shell_quote(s: &str) -> String {
    if s.bytes().all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+".contains(&b)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// How a child ended.
#[derive(Debug)]
pub enum Outcome {
    /// It exited with `code`.
    Exit { code: i32, stdout: Vec<u8>, stderr: String },
    /// A signal ended it.
    Signal { signal: i32, stderr: String },
    /// It ran past the timeout and was killed.
    Timeout,
}

/// What went wrong with a mutant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    Panic,
    Abort,
    Hang,
    Unlocated,
    /// An exit status other than 0, 1 and 2.
    Status,
    /// A result that contradicts its input (a round trip that changes what was read).
    Wrong,
}

impl FaultKind {
    pub const ALL: [FaultKind; 6] =
        [FaultKind::Panic, FaultKind::Abort, FaultKind::Hang, FaultKind::Unlocated, FaultKind::Status, FaultKind::Wrong];

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Panic => "panic",
            FaultKind::Abort => "abort",
            FaultKind::Hang => "hang",
            FaultKind::Unlocated => "unlocated error",
            FaultKind::Status => "exit status",
            FaultKind::Wrong => "wrong result",
        }
    }
}

/// A fault and what shows it.
#[derive(Debug)]
pub struct Fault {
    pub kind: FaultKind,
    pub message: String,
}

impl Fault {
    pub fn new(kind: FaultKind, message: impl Into<String>) -> Fault {
        Fault { kind, message: message.into() }
    }
}

/// Runs `cmd` under `limits`.
pub fn run(cmd: &Cmd, limits: &Limits) -> Outcome {
    // The shell sets the cap and becomes the program (`exec`): the pid killed on a timeout is the program's.
    let script = format!("ulimit -v {} && exec \"$0\" \"$@\"", limits.mem_kib);
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(&cmd.program)
        .args(&cmd.args)
        .current_dir(&cmd.dir)
        .envs(cmd.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawning sh");
    let out = drain(child.stdout.take().expect("stdout"));
    let err = drain(child.stderr.take().expect("stderr"));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("waiting for a child") {
            break Some(s);
        }
        if start.elapsed() > limits.timeout {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let (stdout, stderr) = (out.join().unwrap_or_default(), String::from_utf8_lossy(&err.join().unwrap_or_default()).into_owned());
    match status {
        None => Outcome::Timeout,
        Some(s) => match (s.code(), s.signal()) {
            (Some(code), _) => Outcome::Exit { code, stdout, stderr },
            (None, Some(signal)) => Outcome::Signal { signal, stderr },
            (None, None) => Outcome::Signal { signal: -1, stderr },
        },
    }
}

/// Reads a pipe to its end on a thread (a child blocks on a full pipe otherwise).
fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// The fault in `o`, if any: exit 0 (a result) and 1 (a failed check) are fine, and so is 2
/// (bad input) when the error says where.
pub fn fault(o: &Outcome) -> Option<Fault> {
    match o {
        Outcome::Timeout => Some(Fault::new(FaultKind::Hang, "no end within the timeout")),
        Outcome::Signal { signal, stderr } => Some(Fault::new(FaultKind::Abort, format!("ended by signal {signal}: {}", tail(stderr)))),
        Outcome::Exit { stderr, .. } if stderr.contains("panicked") => Some(Fault::new(FaultKind::Panic, tail(stderr))),
        Outcome::Exit { code: 0 | 1, .. } => None,
        Outcome::Exit { code: 2, stderr, .. } if located(stderr) => None,
        Outcome::Exit { code: 2, stderr, .. } => Some(Fault::new(FaultKind::Unlocated, tail(stderr))),
        Outcome::Exit { code, stderr, .. } => Some(Fault::new(FaultKind::Status, format!("exit status {code}: {}", tail(stderr)))),
    }
}

/// The last 600 characters of `s`, on one line.
pub fn tail(s: &str) -> String {
    let s = s.trim().replace('\n', " | ");
    let n = s.chars().count();
    s.chars().skip(n.saturating_sub(600)).collect()
}

/// Whether `s` holds a `:LINE:COL` location.
pub fn has_line_col(s: &str) -> bool {
    let b = s.as_bytes();
    let digits = |from: usize| (from..b.len()).take_while(|&j| b[j].is_ascii_digit()).count();
    (0..b.len()).any(|i| {
        b[i] == b':' && {
            let n = digits(i + 1);
            n > 0 && b.get(i + 1 + n) == Some(&b':') && digits(i + 2 + n) > 0
        }
    })
}

/// The top-level keys of a spec.
const SPEC_TABLES: [&str; 7] = ["name", "kernels", "constants", "inputs", "forward", "backward", "check"];

/// Whether the command line's error says where: `FILE:LINE:COL` in a kernel or text IR; in a
/// spec, the key (`constants.N`), the TOML line and column, the step, or the tensor and element
/// of a value computed from the data.
pub fn located(stderr: &str) -> bool {
    let Some(at) = stderr.find("error: ") else { return false };
    let e = &stderr[at + "error: ".len()..];
    if has_line_col(e) {
        return true;
    }
    let Some(rest) = e.split_once(".toml: ").map(|(_, r)| r) else { return false };
    let first = rest.split(": ").next().unwrap_or("");
    // A key: one word (`constants.N`, `inputs.x.init`, an unknown `kernls`), or one that starts
    // with a top-level table and goes on with ` = value`.
    let key = (!first.is_empty() && first != "-" && !first.contains(' '))
        || SPEC_TABLES.iter().any(|t| first.strip_prefix(t).is_some_and(|r| r.starts_with('.') && r.contains(" = ")));
    let toml_position = first == "-" && rest.contains("line ") && rest.contains(", column ");
    let step = rest.starts_with("forward step ") || rest.starts_with("backward step ");
    let element = rest.contains('`') && rest.contains(" at [");
    key || toml_position || step || element
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How `sh -c script` ends under a 300 ms timeout, and its fault.
    fn judged(script: &str) -> (Outcome, Option<FaultKind>) {
        let cmd = Cmd::new(Path::new("/bin/sh"), Path::new("/"), &["-c", script]);
        let o = run(&cmd, &Limits { timeout: Duration::from_millis(300), mem_kib: 1 << 20 });
        let f = fault(&o).map(|f| f.kind);
        (o, f)
    }

    #[test]
    fn endings_are_judged() {
        assert!(matches!(judged("sleep 5"), (Outcome::Timeout, Some(FaultKind::Hang))));
        assert!(matches!(judged("kill -ABRT $$"), (Outcome::Signal { signal: 6, .. }, Some(FaultKind::Abort))));
        assert!(matches!(judged("echo 'error: k.py:3:4: bad' >&2; exit 2"), (Outcome::Exit { code: 2, .. }, None)));
        assert!(matches!(judged("echo 'error: bad' >&2; exit 2"), (_, Some(FaultKind::Unlocated))));
        assert!(matches!(judged("echo \"thread 'main' panicked at x.rs:1:1\" >&2; exit 101"), (_, Some(FaultKind::Panic))));
        assert!(matches!(judged("exit 3"), (_, Some(FaultKind::Status))));
        let (o, f) = judged("echo out; exit 1");
        assert!(matches!(o, Outcome::Exit { code: 1, ref stdout, .. } if stdout == b"out\n") && f.is_none(), "{o:?}");
        // The address-space cap is set.
        let (o, _) = judged("ulimit -v");
        assert!(matches!(o, Outcome::Exit { ref stdout, .. } if stdout == b"1048576\n"), "{o:?}");
    }

    #[test]
    fn locations_are_recognised() {
        assert!(located("error: k.py:3:14: unsupported function `tl.lood`"));
        assert!(located("error: s.toml: constants.N: `(1 +`: column 5: expected a value"));
        assert!(located("error: s.toml: -: line 1, column 9: invalid table header\nexpected `.`"));
        assert!(located("error: s.toml: forward step 1 (launch `copy`): parameter `dst_ptr` names no tensor"));
        assert!(located("error: s.toml: the ground truth's forward output `dst` is -inf at [0]: not finite"));
        assert!(located("error: s.toml: backward.gradients.x = `g`: the backward defines no tensor `g`"));
        assert!(located("error: s.toml: inputs.w(: unknown key"));
        assert!(!located("error: s.toml: the backward must name one gradient tensor for input `w`, it names 0"));
        assert!(!located("error: s.toml: -: invalid spec"));
        assert!(!located("error: something went wrong"));
        assert!(!located("error: s.toml: the inputs are not finite"));
    }
}
