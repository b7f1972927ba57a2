//! Host memory handed over by Python as raw addresses: a tensor's whole storage (a torch CPU
//! tensor's `untyped_storage()`, a numpy array's base buffer) read into a [`HostTensor`] and the
//! kernel's results written back to the same bytes, so that a launch acts on the caller's memory
//! as it would on a GPU.
//!
//! The caller (the Python package) guarantees that each address is valid for `numel` elements of
//! the dtype for the duration of the call and that no other thread writes it meanwhile.

use tilegrad_ir::DType;
use tilegrad_reference::{Data, HostTensor};

/// One storage: a name for diagnostics, its element dtype (as the Python side spells it), its
/// address and its length in elements.
#[derive(Clone, Debug)]
pub struct RawMem {
    /// Name used in diagnostics (the kernel arguments that point into it).
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Address of element 0.
    pub addr: usize,
    /// Elements.
    pub numel: usize,
}

/// Parses a dtype name as the Python side gives it (`f32`, `bf16`, `i1`, ...).
pub fn dtype(name: &str) -> Result<DType, String> {
    Ok(match name {
        "i1" => DType::I1,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "f16" => DType::F16,
        "bf16" => DType::BF16,
        "f32" => DType::F32,
        "f64" => DType::F64,
        _ => return Err(format!("tensors of dtype `{name}` are not supported (i1, i32, i64, f16, bf16, f32, f64 are)")),
    })
}

fn elem_size(d: DType) -> usize {
    match d {
        DType::I1 => 1,
        DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

impl RawMem {
    fn check(&self) -> Result<(), String> {
        if self.addr == 0 && self.numel > 0 {
            return Err(format!("`{}`: null data pointer", self.name));
        }
        if self.addr % elem_size(self.dtype) != 0 {
            return Err(format!("`{}`: data pointer {:#x} is not aligned to its {} elements", self.name, self.addr, self.dtype));
        }
        Ok(())
    }

    /// Reads the storage; floats promoted to f64 when `promote`.
    pub fn read(&self, promote: bool) -> Result<HostTensor, String> {
        self.check()?;
        let n = self.numel;
        // SAFETY: the caller guarantees `addr` is valid for `n` elements of the dtype (module docs);
        // alignment was checked above.
        let data = unsafe {
            match self.dtype {
                DType::I1 => Data::I1(std::slice::from_raw_parts(self.addr as *const u8, n).iter().map(|&b| b != 0).collect()),
                DType::I32 => Data::I32(std::slice::from_raw_parts(self.addr as *const i32, n).to_vec()),
                DType::I64 => Data::I64(std::slice::from_raw_parts(self.addr as *const i64, n).to_vec()),
                DType::F32 => Data::F32(std::slice::from_raw_parts(self.addr as *const f32, n).to_vec()),
                DType::F64 => Data::F64(std::slice::from_raw_parts(self.addr as *const f64, n).to_vec()),
                DType::F16 => Data::F32(
                    std::slice::from_raw_parts(self.addr as *const u16, n).iter().map(|&b| half::f16::from_bits(b).to_f32()).collect(),
                ),
                DType::BF16 => Data::F32(
                    std::slice::from_raw_parts(self.addr as *const u16, n).iter().map(|&b| half::bf16::from_bits(b).to_f32()).collect(),
                ),
            }
        };
        let t = HostTensor::new(self.dtype, &[n], data).map_err(|e| e.to_string())?;
        Ok(if promote && self.dtype.is_float() { HostTensor::from_f64(&[n], t.to_f64_vec()) } else { t })
    }

    /// Writes `t` (of this storage's dtype, or f64 for a promoted float storage) back.
    pub fn write(&self, t: &HostTensor) -> Result<(), String> {
        self.check()?;
        if t.numel() != self.numel {
            return Err(format!("`{}`: {} elements to write back into a storage of {}", self.name, t.numel(), self.numel));
        }
        let n = self.numel;
        // SAFETY: as in `read`; the caller also guarantees nobody else accesses the bytes now.
        unsafe {
            match (self.dtype, t.data()) {
                (DType::I1, Data::I1(v)) => {
                    let dst = std::slice::from_raw_parts_mut(self.addr as *mut u8, n);
                    dst.iter_mut().zip(v).for_each(|(d, &b)| *d = b as u8);
                }
                (DType::I32, Data::I32(v)) => std::slice::from_raw_parts_mut(self.addr as *mut i32, n).copy_from_slice(v),
                (DType::I64, Data::I64(v)) => std::slice::from_raw_parts_mut(self.addr as *mut i64, n).copy_from_slice(v),
                (DType::F32, Data::F32(v)) => std::slice::from_raw_parts_mut(self.addr as *mut f32, n).copy_from_slice(v),
                (DType::F64, Data::F64(v)) => std::slice::from_raw_parts_mut(self.addr as *mut f64, n).copy_from_slice(v),
                (DType::F32, Data::F64(v)) => {
                    let dst = std::slice::from_raw_parts_mut(self.addr as *mut f32, n);
                    dst.iter_mut().zip(v).for_each(|(d, &x)| *d = x as f32);
                }
                (DType::F16, d @ (Data::F32(_) | Data::F64(_))) => {
                    let dst = std::slice::from_raw_parts_mut(self.addr as *mut u16, n);
                    for (i, o) in dst.iter_mut().enumerate() {
                        *o = half::f16::from_f64(d.get_f64(i)).to_bits();
                    }
                }
                (DType::BF16, d @ (Data::F32(_) | Data::F64(_))) => {
                    let dst = std::slice::from_raw_parts_mut(self.addr as *mut u16, n);
                    for (i, o) in dst.iter_mut().enumerate() {
                        *o = half::bf16::from_f64(d.get_f64(i)).to_bits();
                    }
                }
                (d, _) => return Err(format!("`{}`: cannot write {} data into {d} memory", self.name, t.dtype())),
            }
        }
        Ok(())
    }
}

/// The `n` f64 values at `addr` (a contiguous f64 buffer), borrowed for the call.
///
/// # Safety
/// The caller guarantees (module docs) that the buffer is valid and unchanged while the slice
/// is used.
pub unsafe fn f64_slice<'a>(addr: usize, n: usize) -> Result<&'a [f64], String> {
    if n == 0 {
        return Ok(&[]);
    }
    f64_aligned(addr)?;
    // SAFETY: checked non-null and aligned; valid for `n` elements by the caller's word.
    Ok(unsafe { std::slice::from_raw_parts(addr as *const f64, n) })
}

/// The `n` f64 values at `addr` (a contiguous f64 buffer), borrowed mutably for the call.
///
/// # Safety
/// As [`f64_slice`], and nothing else reads or writes the buffer while the slice is used.
pub unsafe fn f64_slice_mut<'a>(addr: usize, n: usize) -> Result<&'a mut [f64], String> {
    if n == 0 {
        return Ok(&mut []);
    }
    f64_aligned(addr)?;
    // SAFETY: checked non-null and aligned; valid and unshared for `n` elements by the caller's word.
    Ok(unsafe { std::slice::from_raw_parts_mut(addr as *mut f64, n) })
}

/// An error where `addr` is null or not aligned to f64.
fn f64_aligned(addr: usize) -> Result<(), String> {
    if addr == 0 || addr % std::mem::align_of::<f64>() != 0 {
        return Err(format!("buffer address {addr:#x} is null or not aligned to f64"));
    }
    Ok(())
}

/// Reads `n` f64 values at `addr` (a contiguous f64 buffer).
pub fn read_f64(addr: usize, n: usize) -> Result<Vec<f64>, String> {
    RawMem { name: "buffer".into(), dtype: DType::F64, addr, numel: n }.read(false).map(|t| t.to_f64_vec())
}

/// Writes f64 values to `addr` (a contiguous f64 buffer of `v.len()` elements).
pub fn write_f64(addr: usize, v: Vec<f64>) -> Result<(), String> {
    let n = v.len();
    RawMem { name: "buffer".into(), dtype: DType::F64, addr, numel: n }.write(&HostTensor::from_f64(&[n], v))
}
