//! The ground truth's VJP of a launch over device memory (a PyTorch CUDA tensor's storage): the
//! launch's VJP kernel runs on its tensors where they are, with its shadows and tapes allocated
//! beside them on the device, so that nothing but the forward's trip counts comes back to the
//! host.

use super::backend::Executor;
use super::ground::vjp_float;
use tilegrad_ad::vjp_kernel::{Part, PlanInput, TapeBounds, VjpKernel, VjpPlan};
use tilegrad_ad::{AdError, GradOptions, Precision};
use tilegrad_gpu::{device_bytes, DeviceBuffer, DeviceMemory, DeviceTensor, Gpu};
use tilegrad_ir::DType;
use tilegrad_reference::{Launch, TensorId};

/// A contiguous f64 buffer in device memory: a tensor's cotangent, by the launch's tensor.
pub type Cotangent = (TensorId, u64);

/// The VJP kernel of `launch` over `mem` at `precision` ([`tilegrad_ad::vjp_kernel_for`]):
/// `Err` with the refusal where it has none (the evaluator then gives the ground truth).
pub fn vjp_kernel(launch: &Launch, mem: &DeviceMemory, precision: Precision) -> Result<VjpKernel, AdError> {
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
pub fn vjp_in_place(
    exec: &Executor,
    launch: &Launch,
    vk: &VjpKernel,
    mem: &DeviceMemory,
    inputs: &[Cotangent],
    outputs: &[Cotangent],
) -> Result<bool, String> {
    let Some(gpu) = exec.gpu() else {
        return Err("device memory is used in place by the GPU backend only".into());
    };
    if vk.float != DType::F64 {
        return Ok(false);
    }
    // Tapes of loops without `max_iters` are sized by the forward's trip counts.
    let max_trips = if vk.tapes.iter().any(|t| t.max_iters.is_none()) {
        gpu.run_and_rewind(launch, mem, tilegrad_gpu::GpuOptions::default()).map_err(|e| e.to_string())?.summary.max_trips
    } else {
        Default::default()
    };
    let tensors: Vec<PlanInput> =
        mem.tensors().iter().map(|t| PlanInput { name: t.name.clone(), dtype: t.dtype, shape: vec![t.numel] }).collect();
    let bounds = TapeBounds { max_trips: &max_trips, memory: exec.vjp_launch_memory(GradOptions::default().memory_budget as u64) };
    let plan = VjpPlan::new(vk, launch, &tensors, bounds).map_err(|e| e.to_string())?;
    let Some((vjp_mem, _buffers)) = plan_memory(gpu, &plan, mem, outputs)? else {
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

/// The device memory of `plan`'s launches: `mem`'s tensors themselves, shadows seeded with the
/// `outputs`' cotangents (else zeros) and tapes, both allocated here (the buffers must outlive
/// the launches). `None` where the VJP kernel takes a tensor in another dtype than `mem`'s.
fn plan_memory(
    gpu: &Gpu,
    plan: &VjpPlan,
    mem: &DeviceMemory,
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
                (dtype, d.numel, d.addr)
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
