//! A pass's tensors in device memory: the device twin of [`Env`](super::super::Env), by name,
//! with the constants the size expressions read. Tensors only grow in number (a name is bound
//! once), so a launch's tensor ids stay valid for the rest of the check.

use super::super::backend::Executor;
use super::super::expr::{Scalar, Scope};
use super::super::steps::pieces::chunk_sizes;
use super::super::steps::{self, eval_shape, split_axis, Bindings, Env, Init, Mode, Step};
use super::super::Expr;
use std::sync::Arc;
use tilegrad_gpu::{device_bytes, Along, DeviceBuffer, DeviceMemory, DeviceTensor, Gpu};
use tilegrad_ir::DType;
use tilegrad_reference::{HostTensor, TensorId};

/// Why the device path stepped aside (the check then runs through host copies).
pub(crate) type Aside = String;

/// What went wrong on the device, in words.
pub(crate) fn dev(e: tilegrad_gpu::GpuError) -> Aside {
    e.to_string()
}

/// One tensor: where it is, its shape, and the allocation that holds it.
struct Held {
    t: DeviceTensor,
    shape: Vec<usize>,
    _buf: Arc<DeviceBuffer>,
}

/// Named tensors in device memory and named constants.
#[derive(Default)]
pub(crate) struct DeviceEnv {
    tensors: Vec<Held>,
    names: Vec<(String, TensorId)>,
    constants: Vec<(String, Scalar)>,
}

impl Scope for DeviceEnv {
    fn constant(&self, name: &str) -> Option<Scalar> {
        self.constants.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
    }
    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        self.tensor_id(name).map(|t| self.tensors[t.0 as usize].shape.clone())
    }
}

impl Bindings for DeviceEnv {
    fn tensor_id(&self, name: &str) -> Option<TensorId> {
        self.names.iter().rev().find(|(n, _)| n == name).map(|(_, t)| *t)
    }
}

impl DeviceEnv {
    /// An environment of these constants and no tensors.
    pub(crate) fn with_constants(constants: Vec<(String, Scalar)>) -> DeviceEnv {
        DeviceEnv { constants, ..DeviceEnv::default() }
    }

    /// Binds `name` to a new zeroed tensor of `dtype` and `shape`; its device description.
    pub(crate) fn add_zeroed(&mut self, gpu: &Gpu, name: &str, dtype: DType, shape: &[usize]) -> Result<DeviceTensor, Aside> {
        if self.tensor_id(name).is_some() {
            return Err(format!("tensor `{name}` is already defined"));
        }
        let numel: usize = shape.iter().product();
        let buf = gpu.alloc_zeroed(numel * device_bytes(dtype)).map_err(dev)?;
        let t = DeviceTensor { name: name.to_string(), dtype, numel, addr: buf.addr() };
        self.names.push((name.to_string(), TensorId(self.tensors.len() as u32)));
        self.tensors.push(Held { t: t.clone(), shape: shape.to_vec(), _buf: Arc::new(buf) });
        Ok(t)
    }

    /// Binds `name` to a copy of host tensor `h`.
    pub(crate) fn add_host(&mut self, gpu: &Gpu, name: &str, h: &HostTensor) -> Result<(), Aside> {
        let t = self.add_zeroed(gpu, name, h.dtype(), h.shape())?;
        gpu.upload_tensor(&t, h).map_err(dev)
    }

    /// An allocation step: `init` as the reference makes it (an `empty` float tensor is NaN).
    pub(crate) fn alloc(&mut self, gpu: &Gpu, name: &str, shape: &[Expr], dtype: DType, init: Init) -> Result<(), Aside> {
        let shape = eval_shape(shape, self)?;
        let t = self.add_zeroed(gpu, name, dtype, &shape)?;
        if init == Init::Empty && dtype.is_float() {
            gpu.fill_nan(t.addr, dtype, t.numel).map_err(dev)?;
        }
        Ok(())
    }

    /// A `sum` step: `dst` is `src` summed over `axis`, as the host sums it.
    pub(crate) fn sum(&mut self, gpu: &Gpu, src: &str, axis: i64, dst: &str) -> Result<(), Aside> {
        let t = self.get(src).ok_or_else(|| format!("no tensor `{src}`"))?.clone();
        let shape = self.shape_of(src).ok_or("no shape")?.to_vec();
        let (a, outer, n, inner) = split_axis(&shape, axis).ok_or_else(|| format!("sum over axis {axis} of `{src}`"))?;
        let mut nshape = shape;
        nshape.remove(a);
        let d = self.add_zeroed(gpu, dst, t.dtype, &nshape)?;
        gpu.sum_axis(t.addr, t.dtype, d.addr, outer, n, inner).map_err(dev)
    }

    /// A `chunk` step: each of torch's chunks of `src` along `axis` a new tensor, one per name
    /// of `dsts` (a count torch would not give steps aside to the host, which explains it).
    pub(crate) fn chunk(&mut self, gpu: &Gpu, src: &str, chunks: usize, axis: i64, dsts: &[String]) -> Result<(), Aside> {
        let (t, shape) = self.tensor_and_shape(src)?;
        let (a, outer, n, inner) = split_axis(&shape, axis).ok_or_else(|| format!("chunk along axis {axis} of `{src}`"))?;
        let sizes = chunk_sizes(n, chunks);
        if chunks == 0 || sizes.len() != dsts.len() {
            return Err(format!("`{src}`.chunk({chunks}, {axis}) into {} tensors", dsts.len()));
        }
        let mut at = 0;
        for (d, len) in dsts.iter().zip(sizes) {
            let mut piece_shape = shape.clone();
            piece_shape[a] = len;
            let piece = self.add_zeroed(gpu, d, t.dtype, &piece_shape)?;
            let along = Along { outer, inner, len, n_src: n, src_at: at, n_dst: len, dst_at: 0 };
            gpu.copy_along(t.addr, piece.addr, t.dtype, along, false).map_err(dev)?;
            at += len;
        }
        Ok(())
    }

    /// A `cat` step of tensors of one dtype (promotions step aside to the host).
    pub(crate) fn cat(&mut self, gpu: &Gpu, srcs: &[String], axis: i64, dst: &str) -> Result<(), Aside> {
        let parts = srcs.iter().map(|n| self.tensor_and_shape(n)).collect::<Result<Vec<_>, _>>()?;
        let (first, first_shape) = parts.first().ok_or("a concatenation of no tensors")?;
        let (a, outer, _, inner) = split_axis(first_shape, axis).ok_or_else(|| format!("cat along axis {axis}"))?;
        let alike =
            |sh: &[usize]| sh.len() == first_shape.len() && sh.iter().zip(first_shape).enumerate().all(|(k, (x, y))| k == a || x == y);
        if parts.iter().any(|(t, sh)| t.dtype != first.dtype || !alike(sh)) {
            return Err("a concatenation of tensors of other dtypes or shapes".into());
        }
        let n: usize = parts.iter().map(|(_, sh)| sh[a]).sum();
        let mut shape = first_shape.clone();
        shape[a] = n;
        let out = self.add_zeroed(gpu, dst, first.dtype, &shape)?;
        let mut at = 0;
        for (t, sh) in &parts {
            let along = Along { outer, inner, len: sh[a], n_src: sh[a], src_at: 0, n_dst: n, dst_at: at };
            gpu.copy_along(t.addr, out.addr, t.dtype, along, false).map_err(dev)?;
            at += sh[a];
        }
        Ok(())
    }

    /// A host step other than those the device runs itself (an item, an elementwise
    /// computation, a cast, a reshape, a reduction, a slice), computed on the host as the host's
    /// check computes it ([`steps::run`]), from copies of only the tensors it reads; what it
    /// makes is copied to the device. A count of labels reads a few KB; a step over a large
    /// tensor copies it both ways, which the check would otherwise do for every tensor.
    pub(crate) fn on_host(&mut self, gpu: &Gpu, step: &Step, mode: Mode, exec: &Executor) -> Result<(), Aside> {
        if matches!(step, Step::Accumulate { .. } | Step::Launch(_) | Step::Alloc { .. }) {
            return Err(format!("step `{}` is not computed on the host for the device", step.describe()));
        }
        let mut host = self.host_copies(gpu, &step.data_reads())?;
        let (given, constants) = (host.names.len(), host.constants.len());
        steps::run(&mut host, std::slice::from_ref(step), mode, None, None, None, exec).map_err(|f| f.error.message())?;
        for (name, id) in &host.names[given..] {
            self.add_host(gpu, name, host.mem.get(*id))?;
        }
        self.constants.extend(host.constants[constants..].iter().cloned());
        Ok(())
    }

    /// A host environment of this one's constants and copies of the tensors among `names`
    /// (others, constants and the like, are left out).
    pub(crate) fn host_copies(&self, gpu: &Gpu, names: &[&str]) -> Result<Env, Aside> {
        let mut host = Env { constants: self.constants.clone(), ..Env::default() };
        for &name in names {
            if host.id(name).is_some() {
                continue;
            }
            if let Ok((t, shape)) = self.tensor_and_shape(name) {
                let h = gpu.download_tensor(&t).map_err(dev)?;
                host.add(name, HostTensor::new(h.dtype(), &shape, h.data().clone()).map_err(|e| e.to_string())?)?;
            }
        }
        Ok(host)
    }

    /// Tensor `name` and its shape.
    fn tensor_and_shape(&self, name: &str) -> Result<(DeviceTensor, Vec<usize>), Aside> {
        let t = self.get(name).ok_or_else(|| format!("no tensor `{name}`"))?.clone();
        Ok((t, self.shape_of(name).ok_or("no shape")?.to_vec()))
    }

    /// The tensor bound to `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&DeviceTensor> {
        self.tensor_id(name).map(|t| &self.tensors[t.0 as usize].t)
    }

    /// The name of tensor `t`.
    pub(crate) fn name_of(&self, t: TensorId) -> &str {
        &self.tensors[t.0 as usize].t.name
    }

    /// The shape of tensor `name`.
    pub(crate) fn shape_of(&self, name: &str) -> Option<&[usize]> {
        self.tensor_id(name).map(|t| &self.tensors[t.0 as usize].shape[..])
    }

    /// Every tensor, by id, as device memory for launches.
    pub(crate) fn memory(&self) -> Result<DeviceMemory, Aside> {
        DeviceMemory::new(self.tensors.iter().map(|h| h.t.clone()).collect()).map_err(dev)
    }

    /// A copy of every tensor (the same ids and names), float tensors in `float` where given
    /// (converted as the host converts them): what a pass that writes tensors of the forward
    /// runs on, or the inputs of the f64 ground truth and of the f32 replay.
    pub(crate) fn copy(&self, gpu: &Gpu, float: Option<DType>) -> Result<DeviceEnv, Aside> {
        let mut out = DeviceEnv::with_constants(self.constants.clone());
        for (name, id) in &self.names {
            let h = &self.tensors[id.0 as usize];
            let dtype = match float {
                Some(f) if h.t.dtype.is_float() => f,
                _ => h.t.dtype,
            };
            let t = out.add_zeroed(gpu, name, dtype, &h.shape)?;
            if dtype == h.t.dtype {
                gpu.copy_on_device(t.addr, h.t.addr, h.t.bytes()).map_err(dev)?;
            } else {
                gpu.convert(h.t.addr, h.t.dtype, t.addr, dtype, t.numel).map_err(dev)?;
            }
        }
        Ok(out)
    }

    /// Tensor `name` as f64 values in a new device buffer (copied, or widened exactly).
    pub(crate) fn as_f64(&self, gpu: &Gpu, name: &str) -> Result<DeviceBuffer, Aside> {
        let t = self.get(name).ok_or_else(|| format!("no tensor `{name}`"))?;
        let b = gpu.alloc_zeroed(t.numel * 8).map_err(dev)?;
        gpu.widen_to_f64(t.addr, t.dtype, b.addr(), t.numel).map_err(dev)?;
        Ok(b)
    }
}
