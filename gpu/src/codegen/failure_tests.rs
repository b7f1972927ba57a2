//! How generated code records failures: where lanes are checked at their accesses, each lane's
//! failure posts its key at once; where they are tested first, the path taken only when a lane
//! failed notes the lanes' failures and posts once. Every check leaves through one exit.

use super::*;
use tilegrad_ir::KernelBuilder;

/// `y[i] = x[i] + 1` for `i < n`, 1024-wide tiles.
fn incremented() -> Kernel {
    let mut b = KernelBuilder::new("incremented");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let pid = b.program_id(0);
    let width = b.i32(1024);
    let base = b.mul(pid, width);
    let lanes = b.arange(0, 1024);
    let offs = b.add(base, lanes);
    let mask = b.lt(offs, n);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let one = b.f32(1.0);
    let v1 = b.add(v, one);
    let py = b.add(y, offs);
    b.store(py, v1, Some(mask));
    b.finish().unwrap()
}

/// The body of the kernel's source, after the macros.
fn body(source: &str) -> &str {
    let at = source.find("#define TG_SYNC").expect("the check macro");
    &source[at..]
}

#[test]
fn lanes_tested_first_note_their_failures_and_post_once() {
    let k = incremented();
    let vjp_like = generate_flavor(&k, Flavor::VJP).unwrap();
    let code = body(&vjp_like.source);
    // The load and the store: tested first, noted lane by lane, posted once each.
    assert_eq!(code.matches("if (tg_bad) {").count(), 2, "{code}");
    assert!(code.matches("TG_NOTE(").count() >= 2, "{code}");
    assert_eq!(code.matches("TG_POST;").count(), 2, "{code}");
    assert!(!code.contains("TG_FAIL("), "{code}");
    // Each post follows its op's notes, inside the path of a failed lane.
    for part in code.split("if (tg_bad) {").skip(1) {
        let (note, post, other) = (part.find("TG_NOTE(").unwrap(), part.find("TG_POST;").unwrap(), part.find("} else {").unwrap());
        assert!(note < post && post < other, "{part}");
    }
}

#[test]
fn lanes_checked_at_their_accesses_post_each_failure() {
    let k = incremented();
    let marked = generate_flavor(&k, Flavor::default()).unwrap();
    let code = body(&marked.source);
    assert!(code.matches("TG_FAIL(").count() >= 2, "{code}");
    assert!(!code.contains("TG_NOTE(") && !code.contains("TG_POST;") && !code.contains("tg_bad"), "{code}");
    // The macro that records at once posts the key: the block's smallest is known at the check.
    let fail = marked.source.lines().find(|l| l.starts_with("#define TG_FAIL")).unwrap();
    assert!(fail.contains("atomicMin") && fail.contains("tg_sh_key"), "{fail}");
}

#[test]
fn every_check_leaves_through_one_exit() {
    let k = incremented();
    for flavor in [Flavor::default(), Flavor::VJP] {
        let src = generate_flavor(&k, flavor).unwrap().source;
        let sync = src.lines().find(|l| l.starts_with("#define TG_SYNC")).unwrap();
        assert!(sync.contains("goto tg_fail;") && !sync.contains("TG_ERR"), "{sync}");
        assert!(src.matches("TG_SYNC;").count() >= 2, "{src}");
        // One exit, which the normal path jumps over, writes the report.
        assert_eq!(src.matches("tg_fail:").count(), 1);
        assert_eq!(src.matches("TG_ERR + ").count(), 1);
        let (skip, exit, end) = (src.find("goto tg_end;").unwrap(), src.find("tg_fail:").unwrap(), src.find("tg_end: ;").unwrap());
        assert!(skip < exit && exit < end);
    }
}
