//! Conflicts between programs whose outcome does not depend on their order are not races: two
//! programs storing the same bits to one element (recomputed halos, a row statistic every program
//! of the row stores), a load of an element every store left as it was, lanes of one store writing
//! one element the same bits. Any other conflict stays a race, named by its element's multi-index.

use rand::{Rng, SeedableRng};
use tilegrad_ir::{DType, Kernel, KernelBuilder, Value};
use tilegrad_reference::{ExecError, HostTensor, Launch, Memory, RaceKind};

fn rand_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n).map(|_| r.gen_range(-2.0f32..2.0)).collect()
}

/// Program p stores `y[c] = x[c] * 2 (+ p * bias)` for the 16 elements from `p * 14 - 1` (a
/// block of 14 and a halo of one element each side, masked to the tensor): neighbours overlap on
/// two elements.
fn halo_kernel(bias: f32) -> Kernel {
    let mut b = KernelBuilder::new("halo");
    let x = b.ptr_param("x", DType::F32);
    let y = b.ptr_param("y", DType::F32);
    let n = b.scalar_param("n", DType::I32);
    let pid = b.program_id(0);
    let bs = b.i32(14);
    let one = b.i32(1);
    let start = b.mul(pid, bs);
    let start = b.sub(start, one);
    let ar = b.arange(0, 16);
    let offs = b.add(start, ar);
    let zero = b.i32(0);
    let lo = b.ge(offs, zero);
    let hi = b.lt(offs, n);
    let mask = b.and(lo, hi);
    let px = b.add(x, offs);
    let v = b.load(px, Some(mask), None);
    let two = b.f32(2.0);
    let v = b.mul(v, two);
    let pf = b.cast(pid, DType::F32);
    let bias = b.f32(bias);
    let shift = b.mul(pf, bias);
    let v = b.add(v, shift);
    let py = b.add(y, offs);
    b.store(py, v, Some(mask));
    b.finish().unwrap()
}

fn run_halo(bias: f32) -> (Result<tilegrad_reference::LaunchSummary, ExecError>, Vec<f32>, Vec<f32>) {
    let (rows, cols) = (7usize, 13usize);
    let n = rows * cols;
    let xs = rand_vec(n, 11);
    let k = halo_kernel(bias);
    let mut mem = Memory::new();
    let x = mem.add("x", HostTensor::from_f32(&[rows, cols], xs.clone()));
    let y = mem.add("y", HostTensor::zeros(DType::F32, &[rows, cols]));
    let r = Launch::new(&k, n.div_ceil(14) as u32).arg("x", x).arg("y", y).arg("n", n as i32).run(&mut mem);
    let ys = mem[y].as_f32().unwrap().to_vec();
    (r, xs, ys)
}

#[test]
fn overlapping_halos_storing_the_same_values_are_not_races() {
    let (r, xs, ys) = run_halo(0.0);
    let s = r.unwrap();
    for (i, (x, y)) in xs.iter().zip(&ys).enumerate() {
        assert_eq!(*y, x * 2.0, "element {i}");
    }
    // 91 elements in blocks of 14: 6 boundaries, each with two elements stored by both sides.
    assert_eq!(s.same_value_races, 12);
    let first = &s.same_value[0];
    assert_eq!((first.kind, first.tensor.as_str(), first.offset), (RaceKind::WriteWrite, "y", 13));
    assert_eq!(first.index, vec![1, 0], "element 13 of a [7, 13] tensor");
    assert_eq!((first.first.pid[0], first.second.pid[0]), (0, 1));
}

#[test]
fn overlapping_halos_storing_different_values_race_at_a_multi_index() {
    let (r, ..) = run_halo(1.0);
    let e = r.unwrap_err();
    let ExecError::Race(race) = &e else { panic!("expected a race, got {e}") };
    assert_eq!((race.kind, race.offset, race.index.clone()), (RaceKind::WriteWrite, 13, vec![1, 0]));
    assert!(e.to_string().contains("two programs store to `y`[1, 0]"), "{e}");
}

/// Every program stores `y[0] = 1`; then program `p` stores `y[0] = 1 + (p == changer)`.
fn same_then_changed(changer: i32) -> Kernel {
    let mut b = KernelBuilder::new("same_then_changed");
    let y = b.ptr_param("y", DType::F32);
    let pid = b.program_id(0);
    let one = b.f32(1.0);
    b.store(y, one, None);
    let c = b.i32(changer);
    let is = b.eq(pid, c);
    let two = b.f32(2.0);
    let v = b.where_(is, two, one);
    b.store(y, v, None);
    b.finish().unwrap()
}

#[test]
fn a_program_that_changes_the_shared_value_afterwards_races() {
    let run = |changer: i32| {
        let mut mem = Memory::new();
        let y = mem.add("y", HostTensor::zeros(DType::F32, &[1]));
        let r = Launch::new(&same_then_changed(changer), 3).arg("y", y).run(&mut mem);
        (r, mem[y].as_f32().unwrap()[0])
    };
    // Nobody changes it: every program's last store is 1 (programs 1 and 2 each meet the one
    // before them).
    let (r, v) = run(-1);
    assert_eq!((r.unwrap().same_value_races, v), (2, 1.0));
    // Program 1 stores 2 after agreeing on 1: the result depends on the order on a GPU. Program
    // 2's store meets program 1's 2 and fails at once; a change by the last program is found
    // when the launch settles.
    for changer in [1, 2] {
        let e = run(changer).0.unwrap_err();
        let ExecError::Race(race) = &e else { panic!("expected a race, got {e}") };
        assert_eq!(race.kind, RaceKind::WriteWrite, "changer {changer}");
    }
}

/// Program 0 stores `y[0] = y[0] + delta`; program 1 loads `y[0]` into `z[0]`.
fn store_and_read(delta: f32) -> Kernel {
    let mut b = KernelBuilder::new("store_and_read");
    let y = b.ptr_param("y", DType::F32);
    let z = b.ptr_param("z", DType::F32);
    let pid = b.program_id(0);
    let zero = b.i32(0);
    let is0 = b.eq(pid, zero);
    let old = b.load(y, None, None);
    let d = b.f32(delta);
    let new = b.add(old, d);
    b.store(y, new, Some(is0));
    let one = b.i32(1);
    let is1 = b.eq(pid, one);
    b.store(z, old, Some(is1));
    b.finish().unwrap()
}

#[test]
fn reading_an_element_another_program_leaves_unchanged_is_not_a_race() {
    let run = |delta: f32| {
        let mut mem = Memory::new();
        let y = mem.add("y", HostTensor::from_f32(&[1], vec![0.75]));
        let z = mem.add("z", HostTensor::zeros(DType::F32, &[1]));
        Launch::new(&store_and_read(delta), 2).arg("y", y).arg("z", z).run(&mut mem).map(|s| (s, mem[z].as_f32().unwrap()[0]))
    };
    let (s, z) = run(0.0).unwrap();
    assert_eq!(z, 0.75);
    assert_eq!(s.same_value.iter().map(|r| r.kind).collect::<Vec<_>>(), [RaceKind::ReadWrite]);
    let e = run(0.5).unwrap_err();
    assert!(matches!(&e, ExecError::Race(r) if r.kind == RaceKind::ReadWrite), "{e}");
}

/// One store whose lanes all write `y[0]`: `value` per lane, or the lane's index when `None`.
fn all_lanes_to_one(value: Option<f32>) -> Kernel {
    let mut b = KernelBuilder::new("all_lanes_to_one");
    let y = b.ptr_param("y", DType::F32);
    let offs = b.zeros(&[8], DType::I32);
    let v: Value = match value {
        Some(v) => b.full(&[8], v, DType::F32),
        None => {
            let ar = b.arange(0, 8);
            b.cast(ar, DType::F32)
        }
    };
    let py = b.add(y, offs);
    b.store(py, v, None);
    b.finish().unwrap()
}

#[test]
fn lanes_of_one_store_writing_one_element_the_same_bits_are_fine() {
    let run = |k: Kernel| {
        let mut mem = Memory::new();
        let y = mem.add("y", HostTensor::zeros(DType::F32, &[1]));
        Launch::new(&k, 1).arg("y", y).run(&mut mem).map(|_| mem[y].as_f32().unwrap()[0])
    };
    assert_eq!(run(all_lanes_to_one(Some(3.5))).unwrap(), 3.5);
    let e = run(all_lanes_to_one(None)).unwrap_err();
    assert!(matches!(&e, ExecError::Race(r) if r.kind == RaceKind::DuplicateLanes), "{e}");
}
