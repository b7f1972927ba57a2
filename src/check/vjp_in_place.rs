//! The ground truth's VJP of a launch over device memory (a PyTorch CUDA tensor's storage): the
//! launch's VJP kernel runs on its tensors where they are, with its shadows and tapes allocated
//! beside them on the device, so that nothing but the forward's trip counts comes back to the
//! host.

use super::backend::Executor;
use super::ground::vjp_float;
use std::collections::BTreeMap;
use tilegrad_ad::vjp_kernel::{Part, PlanInput, TapeBounds, VjpKernel, VjpPlan};
use tilegrad_ad::{AdError, GradOptions, Precision};
use tilegrad_gpu::{device_bytes, DeviceBuffer, DeviceMemory, DeviceTensor, Gpu};
use tilegrad_ir::{DType, Inst};
use tilegrad_reference::{Launch, Memory, TensorId};

/// A contiguous f64 buffer in device memory: a tensor's cotangent, by the launch's tensor.
pub type Cotangent = (TensorId, u64);

/// The VJP kernel of `launch` over `mem` at `precision` ([`tilegrad_ad::vjp_kernel_for`]) to run
/// on `exec`: `Err` with the refusal where it has none (the evaluator then gives the ground
/// truth; see [`Executor::refuses_vjp_kernel`]).
pub fn vjp_kernel(exec: &Executor, launch: &Launch, mem: &DeviceMemory, precision: Precision) -> Result<VjpKernel, AdError> {
    if let Some(refused) = exec.refuses_vjp_kernel(launch) {
        return Err(refused);
    }
    tilegrad_ad::vjp_kernel_for(launch, mem.layout(), vjp_float(launch.kernel(), precision))
}

/// The VJP of `launch` over `mem` (its tensors as the forward found them) by its VJP kernel
/// `vk` ([`vjp_kernel`]), on the GPU in place: given the cotangents of the final contents of
/// `outputs`, writes those of the initial contents of `inputs` (each a device f64 buffer of its
/// tensor's length).
///
/// `Ok(false)` where it cannot run in place and the caller must go through the host: the VJP
/// kernel computes in f32 (native precision on a kernel without f64 values) or takes a tensor
/// in another dtype than the one it is stored in (an f32 storage of an f64 ground truth).
/// `trips`: each loop's largest trip count in the forward, where known (else a forward run on
/// `mem`, rewound, counts them).
pub fn vjp_in_place(
    exec: &Executor,
    launch: &Launch,
    vk: &VjpKernel,
    mem: &DeviceMemory,
    (inputs, outputs): (&[Cotangent], &[Cotangent]),
    trips: Option<&BTreeMap<Inst, u64>>,
) -> Result<bool, String> {
    let Some(gpu) = exec.gpu() else {
        return Err("device memory is used in place by the GPU backend only".into());
    };
    if vk.float != DType::F64 {
        return Ok(false);
    }
    // Tapes of loops without `max_iters` are sized by the forward's trip counts.
    let max_trips = match trips {
        Some(t) => t.clone(),
        None if vk.tapes.iter().any(|t| t.max_iters.is_none()) => {
            gpu.run_and_rewind(launch, mem, tilegrad_gpu::GpuOptions::default()).map_err(|e| e.to_string())?.summary.max_trips
        }
        None => Default::default(),
    };
    let tensors: Vec<PlanInput> =
        mem.tensors().iter().map(|t| PlanInput { name: t.name.clone(), dtype: t.dtype, shape: vec![t.numel] }).collect();
    let bounds = TapeBounds { max_trips: &max_trips, memory: exec.vjp_launch_memory(GradOptions::default().memory_budget as u64) };
    let plan = VjpPlan::new(vk, launch, &tensors, bounds).map_err(|e| e.to_string())?;
    let Some((vjp_mem, _buffers)) = plan_memory(gpu, &plan, (mem, &rewritten(launch)), outputs)? else {
        return Ok(false);
    };
    for bl in plan.batches() {
        exec.run_vjp_in_place(&bl, &vjp_mem).map_err(|e| e.to_string())?;
    }
    for &(t, dst) in inputs {
        let sh = plan.shadow_of(t).ok_or_else(|| format!("`{}` is not a float tensor of the launch", mem.get(t).name))?;
        gpu.copy_on_device(dst, vjp_mem.get(sh).addr, mem.get(t).numel * 8).map_err(|e| e.to_string())?;
    }
    Ok(true)
}

/// [`vjp_in_place`] of a launch recorded over host memory (the CLI's ground truth on the GPU):
/// `before`'s tensors and the `outputs`' cotangents are copied to the device, the VJP kernel's
/// shadows and tapes are made there, and only the `inputs`' cotangents come back (the host
/// path moves every shadow and tape both ways). `Ok(None)` where it cannot run in place.
pub(crate) fn vjp_through_device(
    exec: &Executor,
    launch: &Launch,
    vk: &VjpKernel,
    before: &Memory,
    (inputs, outputs): (&[TensorId], &[(TensorId, Vec<f64>)]),
    trips: &BTreeMap<Inst, u64>,
) -> Result<Option<Vec<Vec<f64>>>, String> {
    let Some(gpu) = exec.gpu() else { return Ok(None) };
    if vk.float != DType::F64 {
        return Ok(None);
    }
    let err = |e: tilegrad_gpu::GpuError| e.to_string();
    let mut keep = Vec::new();
    let mut tensors = Vec::new();
    for i in 0..before.len() {
        let id = TensorId(i as u32);
        let (t, b) = gpu.upload_new(before.name(id), before.get(id)).map_err(err)?;
        tensors.push(t);
        keep.push(b);
    }
    let mem = DeviceMemory::new(tensors).map_err(err)?;
    let mut outs = Vec::new();
    for (t, v) in outputs {
        let b = gpu.upload_f64(v).map_err(err)?;
        outs.push((*t, b.addr()));
        keep.push(b);
    }
    let mut ins = Vec::new();
    for &t in inputs {
        let b = gpu.alloc_zeroed(mem.get(t).numel * 8).map_err(err)?;
        ins.push((t, b.addr()));
        keep.push(b);
    }
    if !vjp_in_place(exec, launch, vk, &mem, (&ins, &outs), Some(trips))? {
        return Ok(None);
    }
    ins.iter().map(|&(t, addr)| gpu.download_f64(addr, mem.get(t).numel).map_err(err)).collect::<Result<_, _>>().map(Some)
}

/// The tensors `launch` both reads and writes (stores or adds atomically into): its VJP kernel
/// recomputes the forward, stores included, so it runs on a copy of each, leaving `mem` as the
/// forward found it for the next VJP over it (a later cotangent trial's). A tensor the launch
/// only writes is written again with the same values, and nothing reads what it held.
pub(crate) fn rewritten(launch: &Launch) -> Vec<TensorId> {
    let k = launch.kernel();
    let uses = tilegrad_ir::analysis::param_uses(k);
    k.params
        .iter()
        .zip(&uses)
        .filter(|(_, u)| u.loaded && (u.stored || u.atomic))
        .filter_map(|(p, _)| match launch.args().iter().find(|(n, _)| *n == p.name) {
            Some((_, tilegrad_reference::Arg::Tensor(t))) => Some(*t),
            _ => None,
        })
        .collect()
}

/// The device memory of `plan`'s launches: `mem`'s tensors themselves (a copy of those in
/// `copied`: see [`rewritten`]), shadows seeded with the
/// `outputs`' cotangents (else zeros) and tapes, both allocated here (the buffers must outlive
/// the launches). `None` where the VJP kernel takes a tensor in another dtype than `mem`'s.
fn plan_memory(
    gpu: &Gpu,
    plan: &VjpPlan,
    (mem, copied): (&DeviceMemory, &[TensorId]),
    outputs: &[Cotangent],
) -> Result<Option<(DeviceMemory, Vec<DeviceBuffer>)>, String> {
    let err = |e: tilegrad_gpu::GpuError| e.to_string();
    let mut buffers = Vec::new();
    let mut tensors = Vec::new();
    for (name, part) in &plan.tensors {
        let (dtype, numel, addr) = match *part {
            Part::Primal { of, dtype } => {
                let d = mem.get(of);
                if dtype != d.dtype {
                    return Ok(None);
                }
                if copied.contains(&of) {
                    let bytes = d.numel * device_bytes(dtype);
                    let b = gpu.alloc_zeroed(bytes).map_err(err)?;
                    gpu.copy_on_device(b.addr(), d.addr, bytes).map_err(err)?;
                    let addr = b.addr();
                    buffers.push(b);
                    (dtype, d.numel, addr)
                } else {
                    (dtype, d.numel, d.addr)
                }
            }
            Part::Shadow { of, dtype } => {
                let numel = mem.get(of).numel;
                let b = gpu.alloc_zeroed(numel * device_bytes(dtype)).map_err(err)?;
                if let Some(&(_, src)) = outputs.iter().find(|(o, _)| *o == of) {
                    gpu.copy_on_device(b.addr(), src, numel * 8).map_err(err)?;
                }
                let addr = b.addr();
                buffers.push(b);
                (dtype, numel, addr)
            }
            Part::Tape { dtype, numel } => {
                let b = gpu.alloc_zeroed(numel * device_bytes(dtype)).map_err(err)?;
                let addr = b.addr();
                buffers.push(b);
                (dtype, numel, addr)
            }
        };
        tensors.push(DeviceTensor { name: name.clone(), dtype, numel, addr });
    }
    Ok(Some((DeviceMemory::new(tensors).map_err(err)?, buffers)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tilegrad_ir::KernelBuilder;
    use tilegrad_reference::HostTensor;

    /// Of a launch that reads and overwrites `x` (a gradient over its logits), only writes `y`,
    /// only reads `z` and adds atomically into `w` after reading it, the VJP runs on copies of `x`
    /// and `w`.
    #[test]
    fn tensors_read_and_written_are_copied_for_the_vjp() {
        let mut b = KernelBuilder::new("k");
        let (x, y, z, w) =
            (b.ptr_param("x", DType::F32), b.ptr_param("y", DType::F32), b.ptr_param("z", DType::F32), b.ptr_param("w", DType::F32));
        let r = b.arange(0, 4);
        let (px, py, pz, pw) = (b.add(x, r), b.add(y, r), b.add(z, r), b.add(w, r));
        let (vx, vz, vw) = (b.load(px, None, None), b.load(pz, None, None), b.load(pw, None, None));
        let g = b.mul(vx, vz);
        b.store(px, g, None);
        b.store(py, vz, None);
        b.atomic_add(pw, vw, None);
        let k = b.finish().unwrap();
        let mut mem = Memory::new();
        let ids: Vec<TensorId> =
            ["x", "y", "z", "w"].iter().map(|n| mem.add(n, HostTensor::from_f64_as(DType::F32, &[4], &[0.5, 1.5, -2.0, 3.0]))).collect();
        let launch = Launch::new(&k, 1).arg("x", ids[0]).arg("y", ids[1]).arg("z", ids[2]).arg("w", ids[3]);
        assert_eq!(rewritten(&launch), [ids[0], ids[3]]);
    }
}
