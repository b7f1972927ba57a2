//! Module-level bindings through specs and the command line: `examples/softplus.toml` binds its
//! helpers by a Triton version check and an environment switch; the spec's `[check]` keys and
//! the flags `--triton-version`, `--env` and `--device` say what the program sees, and a binding
//! the conversion cannot decide is noted on stderr with its file:line:column.

use std::path::{Path, PathBuf};
use std::process::Command;
use tilegrad::spec::{self, ConvertSettings, KernelOverride};

fn tilegrad(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tilegrad")).args(args).current_dir(env!("CARGO_MANIFEST_DIR")).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/softplus.toml")
}

#[test]
fn the_example_passes_its_broken_variant_fails_and_other_programs_bind_other_helpers() {
    let (code, out, err) = tilegrad(&["check", "examples/softplus.toml"]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (code, out, err) = tilegrad(&["check", "examples/softplus.toml", "--kernel", "bwd=::softplus_bwd_broken_sign"]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(out.contains("examples/triton/softplus.py:67:"), "{out}");
    // The environment switch selects the inline-assembly helper, which cannot be checked.
    let (code, out, err) = tilegrad(&["check", "examples/softplus.toml", "--env", "EXAMPLE_FAST_OPS=1"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("inline_asm_elementwise"), "{err}");
    // Under Triton 2 the module defines its own `triton_cast`, which calls `.to` on an int.
    let (code, out, err) = tilegrad(&["check", "examples/softplus.toml", "--triton-version", "2.3.0"]);
    assert_eq!(code, 2, "{out}\n{err}");
    assert!(err.contains("softplus.py:22:") && err.contains("the int 20"), "{err}");
    let (code, _, err) = tilegrad(&["check", "examples/softplus.toml", "--triton-version", "latest"]);
    assert_eq!(code, 2);
    assert!(err.contains("--triton-version `latest`"), "{err}");
    let (code, _, err) = tilegrad(&["check", "examples/softplus.toml", "--env", "NOEQUALS"]);
    assert_eq!(code, 2);
    assert!(err.contains("NAME=VALUE"), "{err}");
}

#[test]
fn spec_keys_set_the_version_environment_and_device_and_flags_override_them() {
    let s = spec::load(&example()).unwrap();
    assert!(s.notes.is_empty(), "{:?}", s.notes);
    let over = |v: &str| ConvertSettings { triton_version: Some(v.into()), ..ConvertSettings::default() };
    let e = spec::load_configured(&example(), &[], &over("2.3.0")).unwrap_err().to_string();
    assert!(e.contains("no method"), "{e}");
    let fast = ConvertSettings { env: vec![("EXAMPLE_FAST_OPS".into(), "1".into())], ..ConvertSettings::default() };
    let e = spec::load_configured(&example(), &[KernelOverride { key: "bwd".into(), reference: "::softplus_bwd".into() }], &fast)
        .unwrap_err()
        .to_string();
    assert!(e.contains("inline_asm_elementwise"), "{e}");
    // Bad values name their key.
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module-bindings");
    std::fs::create_dir_all(dir.join("triton")).unwrap();
    std::fs::copy(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton/softplus.py"), dir.join("triton/softplus.py")).unwrap();
    let text = std::fs::read_to_string(example()).unwrap();
    for (from, to, key) in [
        ("triton_version = \"3.6.0\"", "triton_version = \"three\"", "check.triton_version"),
        ("device = \"sm_90\"", "device = \"hopper\"", "check.device"),
        ("env = { EXAMPLE_FAST_OPS = \"0\" }", "env = { EXAMPLE_FAST_OPS = 0 }", "check.env.EXAMPLE_FAST_OPS"),
    ] {
        let p = dir.join("bad.toml");
        std::fs::write(&p, text.replace(from, to)).unwrap();
        let e = spec::load(&p).unwrap_err();
        assert_eq!(e.key, key, "{e}");
    }
}

#[test]
fn an_undecided_binding_is_noted_on_stderr_with_its_location() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("module-bindings-note");
    std::fs::create_dir_all(dir.join("triton")).unwrap();
    let src = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/triton/softplus.py")).unwrap();
    let src = src.replace("if os.environ.get(\"EXAMPLE_FAST_OPS\", \"0\") == \"1\":", "if is_blackwell():");
    std::fs::write(dir.join("triton/softplus.py"), src).unwrap();
    let text = std::fs::read_to_string(example()).unwrap();
    let spec_path = dir.join("softplus.toml");
    std::fs::write(&spec_path, text).unwrap();
    let s = spec::load(&spec_path).unwrap();
    assert_eq!(s.notes.len(), 1, "{:?}", s.notes);
    let (code, out, err) = tilegrad(&["check", spec_path.to_str().unwrap()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("note: ") && err.contains("softplus.py:25:4: `exp` is bound under `if is_blackwell()`"), "{err}");
}
