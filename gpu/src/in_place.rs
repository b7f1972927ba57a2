//! Launches on device memory the caller owns (a PyTorch CUDA tensor's storage): the tensors are
//! used where they are, in the device's primary context (the one PyTorch uses), and nothing is
//! copied to the host unless the reference must settle a launch.
//!
//! A launch in place keeps a device copy of the tensors it writes until it has settled: a
//! launch that the device cannot settle (a conflict between programs, float atomics too many to
//! add in program order, a kernel only the reference runs) is run again from those contents,
//! on the device or, through host copies, on the reference, as a launch on host memory is.

use crate::device::{data_from_device, driver, stored_bytes};
use crate::{GpuError, GpuOptions, Outcome};
use cudarc::driver::{LaunchConfig, PushKernelArg};
use tilegrad_ir::DType;
use tilegrad_reference::{written_tensors, Data, HostTensor, Launch, Memory, TensorId};

/// A tensor in device memory owned by the caller: `numel` elements of `dtype` at `addr`, stored
/// as the device stores them (f16 and bf16 in 16 bits, i1 in a byte).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceTensor {
    /// Name for diagnostics.
    pub name: String,
    /// Element dtype.
    pub dtype: DType,
    /// Elements.
    pub numel: usize,
    /// Device address of element 0, in the primary context of device 0.
    pub addr: u64,
}

impl DeviceTensor {
    /// Bytes of its storage.
    pub fn bytes(&self) -> usize {
        self.numel * device_bytes(self.dtype)
    }
}

/// Bytes of one element in device memory.
pub fn device_bytes(d: DType) -> usize {
    match d {
        DType::I1 => 1,
        DType::F16 | DType::BF16 => 2,
        DType::I32 | DType::F32 => 4,
        DType::I64 | DType::F64 => 8,
    }
}

/// The tensors of launches in place, by [`TensorId`] (the `i`th tensor is `TensorId(i)`), and a
/// host [`Memory`] of empty tensors of the same names and dtypes against which launches check
/// their arguments.
#[derive(Clone, Debug)]
pub struct DeviceMemory {
    tensors: Vec<DeviceTensor>,
    layout: Memory,
}

impl DeviceMemory {
    /// The tensors, checked: no null or misaligned address.
    pub fn new(tensors: Vec<DeviceTensor>) -> Result<DeviceMemory, GpuError> {
        let mut layout = Memory::new();
        for t in &tensors {
            if t.addr == 0 && t.numel > 0 {
                return Err(GpuError::Driver(format!("`{}`: null device address", t.name)));
            }
            if t.addr % device_bytes(t.dtype) as u64 != 0 {
                return Err(GpuError::Driver(format!(
                    "`{}`: device address {:#x} is not aligned to its {} elements",
                    t.name, t.addr, t.dtype
                )));
            }
            layout.add(&t.name, HostTensor::new(t.dtype, &[0], empty(t.dtype))?);
        }
        Ok(DeviceMemory { tensors, layout })
    }

    /// The tensors.
    pub fn tensors(&self) -> &[DeviceTensor] {
        &self.tensors
    }

    /// One tensor.
    pub fn get(&self, t: TensorId) -> &DeviceTensor {
        &self.tensors[t.0 as usize]
    }

    /// Empty host tensors of the same names and dtypes (for [`Launch::check_arguments`]).
    pub fn layout(&self) -> &Memory {
        &self.layout
    }
}

fn empty(d: DType) -> Data {
    match d {
        DType::I1 => Data::I1(Vec::new()),
        DType::I32 => Data::I32(Vec::new()),
        DType::I64 => Data::I64(Vec::new()),
        DType::F16 | DType::BF16 | DType::F32 => Data::F32(Vec::new()),
        DType::F64 => Data::F64(Vec::new()),
    }
}

/// Device memory the GPU backend allocated (a VJP kernel's shadows and tapes), freed when
/// dropped.
pub struct DeviceBuffer {
    _buf: cudarc::driver::CudaSlice<u8>,
    addr: u64,
}

impl DeviceBuffer {
    /// Its device address.
    pub fn addr(&self) -> u64 {
        self.addr
    }
}

/// Device copies of the tensors a launch writes ([`crate::Gpu::back_up`]).
pub struct Backup {
    copies: Vec<(TensorId, cudarc::driver::CudaSlice<u8>)>,
}

/// `tg_first_diff`: the least index `i < n` at which elements of `size` bytes (1, 2, 4 or 8) of
/// `a` and `b` differ in their bits, by `atomicMin` into `out` (left as is where none do).
const FIRST_DIFFERENCE: &str = r#"
typedef unsigned long long u64;
extern "C" __global__ void tg_first_diff(const void* a, const void* b, int size, u64 n, u64* out) {
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (u64)gridDim.x * blockDim.x) {
        bool d;
        switch (size) {
            case 8: d = ((const u64*)a)[i] != ((const u64*)b)[i]; break;
            case 4: d = ((const unsigned*)a)[i] != ((const unsigned*)b)[i]; break;
            case 2: d = ((const unsigned short*)a)[i] != ((const unsigned short*)b)[i]; break;
            default: d = ((const unsigned char*)a)[i] != ((const unsigned char*)b)[i];
        }
        if (d) { atomicMin(out, i); return; }
    }
}
"#;

impl crate::Gpu {
    /// Runs a launch on `mem`'s device tensors in place: on success they hold the launch's
    /// results, as [`crate::Gpu::run`] leaves a host memory. The caller's work on those tensors
    /// must be complete (or queued on the legacy default stream) before the call; the launch is
    /// complete when it returns.
    pub fn run_in_place(&self, launch: &Launch, mem: &DeviceMemory, opts: GpuOptions) -> Result<Outcome, GpuError> {
        self.run_place(launch, &mut crate::device::Place::Device { mem, backup: None }, opts)
    }

    /// Copies a device tensor to the host.
    pub fn download_tensor(&self, t: &DeviceTensor) -> Result<HostTensor, GpuError> {
        self.bind()?;
        let data = data_from_device(t.dtype, t.numel, |dst| {
            // SAFETY: the caller's tensor is valid for its bytes (DeviceTensor's contract), and
            // the copy is synchronous.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, t.addr) }.map_err(driver)
        })?;
        Ok(HostTensor::new(t.dtype, &[t.numel], data)?)
    }

    /// Copies every device tensor to a host memory (same names and ids).
    pub fn download_all(&self, mem: &DeviceMemory) -> Result<Memory, GpuError> {
        let mut out = Memory::new();
        for t in mem.tensors() {
            out.add(&t.name, self.download_tensor(t)?);
        }
        Ok(out)
    }

    /// Host copies of the tensors `launch` writes, in a memory of `mem`'s names and ids (the
    /// others empty).
    pub fn download_written(&self, launch: &Launch, mem: &DeviceMemory) -> Result<Memory, GpuError> {
        let mut out = mem.layout().clone();
        for t in written_tensors(launch.kernel(), launch.args()) {
            *out.get_mut(t) = self.download_tensor(mem.get(t))?;
        }
        Ok(out)
    }

    /// Copies a host tensor (of the device tensor's dtype and size) into a device tensor.
    pub fn upload_tensor(&self, t: &DeviceTensor, h: &HostTensor) -> Result<(), GpuError> {
        if h.numel() != t.numel || h.dtype() != t.dtype {
            return Err(GpuError::Driver(format!(
                "`{}`: cannot copy {} elements of {} into {} of {}",
                t.name,
                h.numel(),
                h.dtype(),
                t.numel,
                t.dtype
            )));
        }
        let bytes = stored_bytes(t.dtype, h.data());
        let bytes = &bytes[..t.bytes()];
        if !bytes.is_empty() {
            self.bind()?;
            // SAFETY: as in `download`.
            unsafe { cudarc::driver::result::memcpy_htod_sync(t.addr, bytes) }.map_err(driver)?;
        }
        Ok(())
    }

    /// Device copies of the tensors `launch` may write (before it runs), but scratch (bound
    /// only to [`tilegrad_reference::Options::scratch`] parameters: nothing reads it before the
    /// launch writes it).
    pub fn back_up(&self, launch: &Launch, mem: &DeviceMemory) -> Result<Backup, GpuError> {
        let s = &self.cuda()?.stream;
        let scratch = &launch.get_options().scratch;
        let mut copies = Vec::new();
        for t in written_tensors(launch.kernel(), launch.args()) {
            let d = mem.get(t);
            let only_scratch =
                launch.args().iter().filter(|(_, a)| *a == tilegrad_reference::Arg::Tensor(t)).all(|(n, _)| scratch.contains(n));
            if copies.iter().any(|(id, _)| *id == t) || d.bytes() == 0 || only_scratch {
                continue;
            }
            // SAFETY: a fresh buffer, filled below before any read.
            let mut b = unsafe { s.alloc::<u8>(d.bytes()) }.map_err(driver)?;
            {
                use cudarc::driver::DevicePtrMut;
                let (dst, _sync) = b.device_ptr_mut(s);
                // SAFETY: both buffers hold `bytes`; the copy is ordered on the stream.
                unsafe { cudarc::driver::result::memcpy_dtod_async(dst, d.addr, d.bytes(), s.cu_stream()) }.map_err(driver)?;
            }
            copies.push((t, b));
        }
        Ok(Backup { copies })
    }

    /// Puts the contents a [`Backup`] holds back.
    pub fn restore(&self, backup: &Backup, mem: &DeviceMemory) -> Result<(), GpuError> {
        use cudarc::driver::DevicePtr;
        let s = &self.cuda()?.stream;
        for (t, b) in &backup.copies {
            let d = mem.get(*t);
            let (src, _sync) = b.device_ptr(s);
            // SAFETY: as in `back_up`.
            unsafe { cudarc::driver::result::memcpy_dtod_async(d.addr, src, d.bytes(), s.cu_stream()) }.map_err(driver)?;
        }
        s.synchronize().map_err(driver)
    }

    /// Runs `launch` on `mem`'s device tensors and puts what it wrote back as it was: what the
    /// launch reports (its loops' trip counts, for a VJP kernel's tapes) without its effect.
    pub fn run_and_rewind(&self, launch: &Launch, mem: &DeviceMemory, opts: GpuOptions) -> Result<Outcome, GpuError> {
        let backup = self.back_up(launch, mem)?;
        let out = self.run_in_place(launch, mem, opts);
        self.restore(&backup, mem)?;
        out
    }

    /// A device allocation holding `h`'s elements as the device stores them (its dtype's
    /// bytes), freed when dropped, and its description under `name`.
    pub fn upload_new(&self, name: &str, h: &HostTensor) -> Result<(DeviceTensor, DeviceBuffer), GpuError> {
        let b = self.alloc_zeroed(h.numel() * device_bytes(h.dtype()))?;
        let t = DeviceTensor { name: name.to_string(), dtype: h.dtype(), numel: h.numel(), addr: b.addr() };
        self.upload_tensor(&t, h)?;
        Ok((t, b))
    }

    /// A device allocation holding the f64 values `v`, freed when dropped.
    pub fn upload_f64(&self, v: &[f64]) -> Result<DeviceBuffer, GpuError> {
        let b = self.alloc_zeroed(v.len() * 8)?;
        if !v.is_empty() {
            self.bind()?;
            // SAFETY: the buffer holds `v.len()` f64 values; the copy is synchronous.
            unsafe { cudarc::driver::result::memcpy_htod_sync(b.addr(), v) }.map_err(driver)?;
        }
        Ok(b)
    }

    /// The `n` f64 values at device address `addr`.
    pub fn download_f64(&self, addr: u64, n: usize) -> Result<Vec<f64>, GpuError> {
        let mut v = vec![0.0f64; n];
        if n > 0 {
            self.bind()?;
            // SAFETY: the caller's buffer holds `n` f64 values; the copy is synchronous.
            unsafe { cudarc::driver::result::memcpy_dtoh_sync(&mut v[..], addr) }.map_err(driver)?;
        }
        Ok(v)
    }

    /// A zeroed device allocation of `bytes` (at least one), freed when dropped.
    pub fn alloc_zeroed(&self, bytes: usize) -> Result<DeviceBuffer, GpuError> {
        let s = &self.cuda()?.stream;
        let buf = s.alloc_zeros::<u8>(bytes.max(1)).map_err(driver)?;
        s.synchronize().map_err(driver)?;
        let addr = {
            use cudarc::driver::DevicePtr;
            buf.device_ptr(s).0
        };
        Ok(DeviceBuffer { _buf: buf, addr })
    }

    /// Copies `bytes` from device address `src` to `dst` (both in the primary context of device
    /// 0, valid for `bytes`), complete when it returns.
    pub fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), GpuError> {
        if bytes == 0 {
            return Ok(());
        }
        let s = &self.cuda()?.stream;
        // SAFETY: both ranges are valid device memory for `bytes` by the caller's word; the
        // copy is ordered on the stream and waited for.
        unsafe { cudarc::driver::result::memcpy_dtod_async(dst, src, bytes, s.cu_stream()) }.map_err(driver)?;
        s.synchronize().map_err(driver)
    }

    /// The first element of tensor `t` of `mem` whose bits differ from its copy in `backup` (a
    /// backup of `mem`), with the backup's value and `mem`'s as f64; `None` where all agree or
    /// the backup holds no copy of `t`. Compared on the device: only the index and the two
    /// elements come to the host.
    pub fn first_difference(&self, backup: &Backup, mem: &DeviceMemory, t: TensorId) -> Result<Option<(usize, f64, f64)>, GpuError> {
        use cudarc::driver::DevicePtr;
        let Some((_, copy)) = backup.copies.iter().find(|(u, _)| *u == t) else { return Ok(None) };
        let d = mem.get(t);
        if d.numel == 0 {
            return Ok(None);
        }
        let f = self.utility(FIRST_DIFFERENCE, "tg_first_diff")?;
        let s = &self.cuda()?.stream;
        let out = s.clone_htod(&[u64::MAX]).map_err(driver)?;
        let (size, n) = (device_bytes(d.dtype) as i32, d.numel as u64);
        let blocks = self.summary_blocks(d.numel);
        let cfg = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (256, 1, 1), shared_mem_bytes: 0 };
        let (a, sync) = copy.device_ptr(s);
        // SAFETY: the copy and the tensor both hold `numel` elements of `size` bytes.
        unsafe { s.launch_builder(&f).arg(&a).arg(&d.addr).arg(&size).arg(&n).arg(&out).launch(cfg) }.map_err(driver)?;
        drop(sync);
        let first = s.clone_dtoh(&out).map_err(driver)?[0];
        if first == u64::MAX {
            return Ok(None);
        }
        let i = first as usize;
        Ok(Some((i, self.element_f64(a, d.dtype, i)?, self.element_f64(d.addr, d.dtype, i)?)))
    }

    /// Element `i` of the values of `dtype` at device address `addr`, as f64.
    fn element_f64(&self, addr: u64, dtype: DType, i: usize) -> Result<f64, GpuError> {
        self.bind()?;
        let at = addr + (i * device_bytes(dtype)) as u64;
        // SAFETY: the caller's values hold more than `i` elements; the copy is synchronous.
        let data = data_from_device(dtype, 1, |dst| unsafe { cudarc::driver::result::memcpy_dtoh_sync(dst, at) }.map_err(driver))?;
        Ok(HostTensor::new(dtype, &[1], data)?.get_f64(0))
    }

    /// Runs `launch` on the reference over host copies of `mem`, and copies the tensors it
    /// writes back.
    pub fn reference_in_place(&self, launch: &Launch, mem: &DeviceMemory, why: &str) -> Result<Outcome, GpuError> {
        let mut host = self.download_all(mem)?;
        let out = crate::device::reference(launch, &mut host, why)?;
        for t in written_tensors(launch.kernel(), launch.args()) {
            self.upload_tensor(mem.get(t), host.get(t))?;
        }
        Ok(out)
    }
}
