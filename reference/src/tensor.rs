//! Host tensors: a dtype, a shape and contiguous row-major data.
//!
//! f16 and bf16 elements are held as f32 values that are exactly representable in the narrow
//! dtype (every write rounds), so arithmetic on them is f32 arithmetic followed by rounding, as on
//! a GPU.

use crate::ExecError;
use std::sync::Arc;
use tilegrad_ir::{DType, Shape};

/// Typed element storage. f16/bf16 use `F32` storage (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    /// i1.
    I1(Vec<bool>),
    /// i32.
    I32(Vec<i32>),
    /// i64.
    I64(Vec<i64>),
    /// f16, bf16 and f32.
    F32(Vec<f32>),
    /// f64.
    F64(Vec<f64>),
}

impl Data {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::I1(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::I64(v) => v.len(),
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Zeros in the storage of `dtype`.
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::I1 => Data::I1(vec![false; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::I64 => Data::I64(vec![0; n]),
            DType::F16 | DType::BF16 | DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
        }
    }

    /// Element `i` as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        match self {
            Data::I1(v) => v[i] as i64 as f64,
            Data::I32(v) => v[i] as f64,
            Data::I64(v) => v[i] as f64,
            Data::F32(v) => v[i] as f64,
            Data::F64(v) => v[i],
        }
    }
}

/// Rounds an f32 to the nearest f16 value (as f32).
pub fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// Rounds an f32 to the nearest bf16 value (as f32).
pub fn round_bf16(x: f32) -> f32 {
    half::bf16::from_f32(x).to_f32()
}

/// Converts an f64 to the value dtype `d` holds, in the storage of `d` (as f64).
pub fn round_to(d: DType, x: f64) -> f64 {
    match d {
        DType::I1 => (x != 0.0) as i64 as f64,
        DType::I32 => (x as i32) as f64,
        DType::I64 => (x as i64) as f64,
        DType::F16 => round_f16(x as f32) as f64,
        DType::BF16 => round_bf16(x as f32) as f64,
        DType::F32 => x as f32 as f64,
        DType::F64 => x,
    }
}

/// Bytes one element of `dtype` takes in host storage (f16 and bf16 are held as f32).
pub fn storage_bytes(dtype: DType) -> usize {
    match dtype {
        DType::I1 => std::mem::size_of::<bool>(),
        DType::I32 | DType::F16 | DType::BF16 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// The element count of `shape`, checked: an error when it, or the stride of any dimension (the
/// product of the dimensions after it, empty ones counted as 1), does not fit 64 bits.
pub fn checked_numel(shape: &[usize]) -> Result<usize, String> {
    let mut n = 1usize;
    let mut stride = 1i64;
    for &d in shape.iter().rev() {
        n = n.checked_mul(d).ok_or_else(|| format!("shape {shape:?} has more elements than fit 64 bits"))?;
        stride = i64::try_from(d.max(1))
            .ok()
            .and_then(|d| stride.checked_mul(d))
            .ok_or_else(|| format!("shape {shape:?}: its strides do not fit 64 bits"))?;
    }
    Ok(n)
}

/// The memory this process can still take, in bytes, where the system says: the least of the
/// machine's (`MemAvailable` in `/proc/meminfo`), what the address-space limit (`ulimit -v`)
/// leaves above the process's current size, and what its cgroup's `memory.max` leaves above
/// `memory.current`.
pub fn available_memory() -> Option<u64> {
    [mem_available(), address_space_left(), cgroup_left()].into_iter().flatten().min()
}

fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    kib_field(&info, "MemAvailable:")
}

/// `field`'s value in kB (as `/proc` writes them), in bytes.
fn kib_field(text: &str, field: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.trim_start_matches(field).trim().trim_end_matches("kB").trim().parse().ok()?;
    kib.checked_mul(1024)
}

/// The soft address-space limit less the process's current virtual size.
fn address_space_left() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max address space"))?;
    let soft: u64 = line.trim_start_matches("Max address space").split_whitespace().next()?.parse().ok()?;
    let size = kib_field(&std::fs::read_to_string("/proc/self/status").ok()?, "VmSize:")?;
    Some(soft.saturating_sub(size))
}

/// The cgroup (v2) memory limit less its current use.
fn cgroup_left() -> Option<u64> {
    let max: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.max").ok()?.trim().parse().ok()?;
    let current: u64 = std::fs::read_to_string("/sys/fs/cgroup/memory.current").ok()?.trim().parse().ok()?;
    Some(max.saturating_sub(current))
}

/// A byte count for people (`1.5 GiB`).
pub fn human_bytes(b: u128) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut x = b as f64;
    let mut u = 0;
    while x >= 1024.0 && u + 1 < units.len() {
        x /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} bytes")
    } else {
        format!("{x:.1} {}", units[u])
    }
}

/// Checks that a tensor of `dtype` and `shape` can be held in memory before it is allocated: its
/// element count fits (see [`checked_numel`]) and its storage is no more than the memory
/// available. Returns the element count; the error says what was asked and what is available.
pub fn check_alloc(dtype: DType, shape: &[usize]) -> Result<usize, ExecError> {
    let n = checked_numel(shape).map_err(|message| ExecError::BadTensor { message })?;
    let bytes = n as u128 * storage_bytes(dtype) as u128;
    let too_big = |have: String| ExecError::BadTensor {
        message: format!("a {dtype} tensor of shape {shape:?} needs {} of memory; {have}", human_bytes(bytes)),
    };
    if bytes > isize::MAX as u128 {
        return Err(too_big("no allocation can be that large".into()));
    }
    if let Some(avail) = available_memory() {
        if bytes > avail as u128 {
            return Err(too_big(format!("{} is available", human_bytes(avail as u128))));
        }
    }
    Ok(n)
}

/// A tensor in host memory. Its storage is shared between clones and copied on the first write
/// to a shared one, so that keeping a tensor's state (launch records, blame's traces, the
/// backward's environment) costs nothing until the tensor changes.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    dtype: DType,
    shape: Shape,
    data: Arc<Data>,
}

impl HostTensor {
    /// Checks that data matches dtype and shape.
    pub fn new(dtype: DType, shape: &[usize], data: Data) -> Result<HostTensor, ExecError> {
        let n = checked_numel(shape).map_err(|message| ExecError::BadTensor { message })?;
        let storage_ok = matches!(
            (&data, dtype),
            (Data::I1(_), DType::I1)
                | (Data::I32(_), DType::I32)
                | (Data::I64(_), DType::I64)
                | (Data::F32(_), DType::F16 | DType::BF16 | DType::F32)
                | (Data::F64(_), DType::F64)
        );
        if !storage_ok || data.len() != n {
            return Err(ExecError::BadTensor {
                message: format!("{} elements of the wrong storage or count for a {dtype} tensor of shape {shape:?}", data.len()),
            });
        }
        let mut t = HostTensor { dtype, shape: Shape::from_slice(shape), data: Arc::new(data) };
        if let Data::F32(v) = t.data_mut() {
            match dtype {
                DType::F16 => v.iter_mut().for_each(|x| *x = round_f16(*x)),
                DType::BF16 => v.iter_mut().for_each(|x| *x = round_bf16(*x)),
                _ => {}
            }
        }
        Ok(t)
    }

    /// A tensor of zeros. Panics if the element count overflows (a programming error; sizes from
    /// users go through [`HostTensor::try_full`]).
    pub fn zeros(dtype: DType, shape: &[usize]) -> HostTensor {
        let n = checked_numel(shape).unwrap_or_else(|e| panic!("{e}"));
        HostTensor { dtype, shape: Shape::from_slice(shape), data: Arc::new(Data::zeros(dtype, n)) }
    }

    /// A tensor with every element `value` (converted to `dtype`), after checking with
    /// [`check_alloc`] that the machine can hold it; the allocation itself failing is an error
    /// too, not an abort.
    pub fn try_full(dtype: DType, shape: &[usize], value: f64) -> Result<HostTensor, ExecError> {
        let n = check_alloc(dtype, shape)?;
        /// `n` copies of `x`; `zero` says that `x`'s bytes are all zero, which a zeroed
        /// allocation gives without writing a page (the system commits them when first
        /// touched: a tensor of zeros that is never read, such as a loop tape a GPU keeps, costs
        /// no memory here).
        fn fill<T: Clone>(n: usize, x: T, zero: bool, what: impl Fn() -> ExecError) -> Result<Vec<T>, ExecError> {
            if zero && n > 0 && std::mem::size_of::<T>() > 0 {
                let layout = std::alloc::Layout::array::<T>(n).map_err(|_| what())?;
                // SAFETY: the layout's size is not zero; `T` is a number or `bool` (the callers
                // below), for which all-zero bytes are a valid value (`zero` says they are `x`);
                // the vector owns the allocation, made by the global allocator with the layout
                // of `n` elements it frees it with.
                unsafe {
                    let p = std::alloc::alloc_zeroed(layout).cast::<T>();
                    if p.is_null() {
                        return Err(what());
                    }
                    return Ok(Vec::from_raw_parts(p, n, n));
                }
            }
            let mut v = Vec::new();
            v.try_reserve_exact(n).map_err(|_| what())?;
            v.resize(n, x);
            Ok(v)
        }
        let what = || ExecError::BadTensor { message: format!("could not allocate a {dtype} tensor of shape {shape:?}") };
        let x = round_to(dtype, value);
        let data = match dtype {
            DType::I1 => Data::I1(fill(n, x != 0.0, x == 0.0, what)?),
            DType::I32 => Data::I32(fill(n, x as i32, x as i32 == 0, what)?),
            DType::I64 => Data::I64(fill(n, x as i64, x as i64 == 0, what)?),
            DType::F16 | DType::BF16 | DType::F32 => Data::F32(fill(n, x as f32, (x as f32).to_bits() == 0, what)?),
            DType::F64 => Data::F64(fill(n, x, x.to_bits() == 0, what)?),
        };
        Ok(HostTensor { dtype, shape: Shape::from_slice(shape), data: Arc::new(data) })
    }

    /// An f32 tensor. Panics if `data.len()` does not match the shape (a programming error).
    pub fn from_f32(shape: &[usize], data: Vec<f32>) -> HostTensor {
        HostTensor::new(DType::F32, shape, Data::F32(data)).expect("data length matches shape")
    }

    /// An f64 tensor. Panics if `data.len()` does not match the shape.
    pub fn from_f64(shape: &[usize], data: Vec<f64>) -> HostTensor {
        HostTensor::new(DType::F64, shape, Data::F64(data)).expect("data length matches shape")
    }

    /// An i32 tensor. Panics if `data.len()` does not match the shape.
    pub fn from_i32(shape: &[usize], data: Vec<i32>) -> HostTensor {
        HostTensor::new(DType::I32, shape, Data::I32(data)).expect("data length matches shape")
    }

    /// An i64 tensor. Panics if `data.len()` does not match the shape.
    pub fn from_i64(shape: &[usize], data: Vec<i64>) -> HostTensor {
        HostTensor::new(DType::I64, shape, Data::I64(data)).expect("data length matches shape")
    }

    /// A tensor of any dtype from f64 values, rounded/converted to `dtype`. Panics if the length
    /// does not match the shape.
    pub fn from_f64_as(dtype: DType, shape: &[usize], values: &[f64]) -> HostTensor {
        let n = checked_numel(shape).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(n, values.len(), "data length matches shape");
        let data = match dtype {
            DType::I1 => Data::I1(values.iter().map(|&x| x != 0.0).collect()),
            DType::I32 => Data::I32(values.iter().map(|&x| x as i32).collect()),
            DType::I64 => Data::I64(values.iter().map(|&x| x as i64).collect()),
            DType::F16 | DType::BF16 | DType::F32 => Data::F32(values.iter().map(|&x| round_to(dtype, x) as f32).collect()),
            DType::F64 => Data::F64(values.to_vec()),
        };
        HostTensor { dtype, shape: Shape::from_slice(shape), data: Arc::new(data) }
    }

    /// Element dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// Contiguous (row-major) strides in elements.
    pub fn strides(&self) -> Vec<i64> {
        let mut s = vec![1i64; self.shape.len()];
        for d in (0..self.shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * self.shape[d + 1] as i64;
        }
        s
    }

    /// Stride of dimension `d` in elements (as `x.stride(d)` in PyTorch).
    pub fn stride(&self, d: usize) -> i64 {
        self.strides()[d]
    }

    /// The storage.
    pub fn data(&self) -> &Data {
        &self.data
    }

    /// The storage, mutably (copied first if another clone shares it). Writes to f16/bf16
    /// tensors must store representable values.
    pub fn data_mut(&mut self) -> &mut Data {
        Arc::make_mut(&mut self.data)
    }

    /// The storage, taken (copied if another clone shares it).
    pub fn into_data(self) -> Data {
        Arc::try_unwrap(self.data).unwrap_or_else(|d| (*d).clone())
    }

    /// The storage, taken, unless another clone shares it.
    pub fn try_into_data(self) -> Option<Data> {
        Arc::try_unwrap(self.data).ok()
    }

    /// Whether no clone shares this tensor's storage.
    pub fn is_unique(&self) -> bool {
        Arc::strong_count(&self.data) == 1 && Arc::weak_count(&self.data) == 0
    }

    /// Whether `other` is a clone sharing this tensor's storage (no element was written since).
    pub fn shares_storage(&self, other: &HostTensor) -> bool {
        Arc::ptr_eq(&self.data, &other.data)
    }

    /// f32 storage (f16, bf16 and f32 tensors).
    pub fn as_f32(&self) -> Option<&[f32]> {
        match &*self.data {
            Data::F32(v) => Some(v),
            _ => None,
        }
    }

    /// f64 storage.
    pub fn as_f64(&self) -> Option<&[f64]> {
        match &*self.data {
            Data::F64(v) => Some(v),
            _ => None,
        }
    }

    /// i32 storage.
    pub fn as_i32(&self) -> Option<&[i32]> {
        match &*self.data {
            Data::I32(v) => Some(v),
            _ => None,
        }
    }

    /// i64 storage.
    pub fn as_i64(&self) -> Option<&[i64]> {
        match &*self.data {
            Data::I64(v) => Some(v),
            _ => None,
        }
    }

    /// All elements converted to f64.
    pub fn to_f64_vec(&self) -> Vec<f64> {
        (0..self.numel()).map(|i| self.data.get_f64(i)).collect()
    }

    /// Element at flat index `i`, as f64.
    pub fn get_f64(&self, i: usize) -> f64 {
        self.data.get_f64(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_storage_until_one_is_written() {
        let a = HostTensor::from_f32(&[3], vec![1.0, 2.0, 3.0]);
        let mut b = a.clone();
        assert!(b.shares_storage(&a));
        let Data::F32(v) = b.data_mut() else { panic!("f32 storage") };
        v[1] = -5.0;
        assert!(!b.shares_storage(&a));
        assert_eq!(a.to_f64_vec(), vec![1.0, 2.0, 3.0]);
        assert_eq!(b.to_f64_vec(), vec![1.0, -5.0, 3.0]);
        // Taking the storage of a shared tensor copies it; of a sole one, does not.
        let c = b.clone();
        assert!(c.clone().try_into_data().is_none());
        assert_eq!(c.into_data(), Data::F32(vec![1.0, -5.0, 3.0]));
        assert_eq!(b.try_into_data(), Some(Data::F32(vec![1.0, -5.0, 3.0])));
    }

    #[test]
    fn filled_tensors_hold_their_value_zeros_included() {
        // Zeros come from a zeroed allocation; -0.0 and other values are written.
        for dt in [DType::I1, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64] {
            for (value, n) in [(0.0, 1000), (0.0, 0), (-0.0, 7), (2.0, 5)] {
                let t = HostTensor::try_full(dt, &[n], value).unwrap();
                let want = round_to(dt, value);
                let want = if dt == DType::I1 { (want != 0.0) as u8 as f64 } else { want };
                assert_eq!(t.numel(), n);
                assert!(
                    t.to_f64_vec().iter().all(|x| x.to_bits() == want.to_bits() || (dt.is_int() || dt == DType::I1) && *x == want),
                    "{dt} {value}"
                );
            }
        }
        // Growing a zeroed tensor's storage frees and reallocates it as any vector's.
        let Data::F64(mut v) = HostTensor::try_full(DType::F64, &[3], 0.0).unwrap().into_data() else { panic!("f64") };
        v.extend([1.0; 100]);
        assert_eq!(v.iter().sum::<f64>(), 100.0);
    }
}
