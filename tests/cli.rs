//! The `tilegrad` binary: the README's main job, `ir` on text IR and on Triton source, and
//! exit codes (0 ok, 1 a check failed, 2 bad input).

use std::process::Command;

fn tilegrad(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn zoo_cases_run_and_match_their_references() {
    let (code, out, err) = tilegrad(&["zoo", "weighted_sum_fwd", "softmax", "--seed", "3"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("weighted_sum_fwd") && out.contains("softmax"), "{out}");
    assert!(out.contains("2 of 2 cases match their reference (seed 3)"), "{out}");
    let (code, _, err) = tilegrad(&["zoo", "no_such_case"]);
    assert_eq!(code, 2);
    assert!(err.contains("no zoo case named `no_such_case`"), "{err}");
}

#[test]
fn ir_prints_text_ir_and_converted_triton() {
    let (code, out, err) = tilegrad(&["ir", "examples/vector_add.tgir"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("kernel vector_add("), "{out}");
    let (code, out, err) = tilegrad(&["ir", "examples/triton/vector_add.py::vector_add", "--const", "BLOCK=64"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("%BLOCK: constexpr i32 = 64") && out.contains("arange 0, 64"), "{out}");
    assert!(out.contains("\"examples/triton/vector_add.py\":8:11"), "{out}");
    let (code, _, err) = tilegrad(&["ir", "examples/triton/vector_add.py::vector_add"]);
    assert_eq!(code, 2);
    assert!(err.contains("examples/triton/vector_add.py:7:42: constexpr parameter `BLOCK` has no value"), "{err}");
    let (code, _, err) = tilegrad(&["ir", "examples/triton/vector_add.py::vector_add", "--const", "BLOCK"]);
    assert_eq!(code, 2);
    assert!(err.contains("expected NAME=VALUE"), "{err}");
}

#[test]
fn a_closed_stdout_ends_the_process_without_a_panic() {
    use std::process::Stdio;
    let mut child = Command::new(env!("CARGO_BIN_EXE_tilegrad"))
        .args(["check", "examples/weighted_sum.toml"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    // The report is printed after the check, long after the pipe closed: the process ends with the
    // status of one ended by SIGPIPE.
    assert_eq!(out.status.code(), Some(141), "{err}");
}

#[test]
fn timings_list_every_phase_of_a_check() {
    let (code, out, err) = tilegrad(&["check", "examples/vector_add.toml", "--timings", "--trials", "1"]);
    assert_eq!(code, 0, "{out}{err}");
    let t = &out[out.find("timings").unwrap_or_else(|| panic!("no timings: {out}"))..];
    for phase in [
        "spec and kernels",
        "inputs",
        "forward in the kernels' dtypes",
        "forward of the ground truth",
        "ground truth",
        "backward",
        "comparison",
        "output",
        "total",
    ] {
        assert!(t.contains(phase), "no `{phase}` in {t}");
    }
    let (code, out, err) = tilegrad(&["check", "examples/vector_add.toml", "--json", "--non-finite-is-not-a-flag"]);
    assert_eq!(code, 2, "{out}{err}");
    let (code, out, _) = tilegrad(&["check", "examples/vector_add.toml", "--json", "--trials", "1"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v[0]["schema_version"], tilegrad::check::SCHEMA_VERSION);
    assert!(v[0]["timings"]["phases"].as_array().unwrap().len() >= 6, "{out}");
    assert_eq!(v[0]["findings"].as_array().unwrap().len(), 0, "{out}");
}
