//! RGB to greyscale on a 2-D grid: `program_id(0)` walks tiles of rows, `program_id(1)` tiles of
//! columns; the three channels are strided loads from one interleaved `[H, W, 3]` image.

use super::{dims, grid_for, tile};
use tilegrad_ir::{DType, IrError, Kernel, KernelBuilder};
use tilegrad_reference::{ExecError, Launch, LaunchSummary, Memory, TensorId};

/// The weights of the red, green and blue channels (ITU-R BT.601 luma), as the kernel uses them
/// (f32 constants).
pub const GREY_WEIGHTS: [f32; 3] = [0.2989, 0.5870, 0.1140];

/// `grey[h, w] = sum_c GREY_WEIGHTS[c] * img[h, w, c]`, tiles of `block_h` x `block_w` pixels.
///
/// Parameters: `img_ptr`, `grey_ptr`, `H`, `W`, `stride_ih`, `stride_iw`, `stride_ic`,
/// `stride_gh`, `stride_gw` (i32), `BLOCK_H`, `BLOCK_W` (constexpr).
pub fn rgb_to_grey(block_h: usize, block_w: usize) -> Result<Kernel, IrError> {
    let mut b = KernelBuilder::new("rgb_to_grey");
    let img = b.ptr_param("img_ptr", DType::F32);
    let grey = b.ptr_param("grey_ptr", DType::F32);
    let h = b.scalar_param("H", DType::I32);
    let w = b.scalar_param("W", DType::I32);
    let s_ih = b.scalar_param("stride_ih", DType::I32);
    let s_iw = b.scalar_param("stride_iw", DType::I32);
    let s_ic = b.scalar_param("stride_ic", DType::I32);
    let s_gh = b.scalar_param("stride_gh", DType::I32);
    let s_gw = b.scalar_param("stride_gw", DType::I32);
    let bh = b.constexpr("BLOCK_H", block_h as i64);
    let bw = b.constexpr("BLOCK_W", block_w as i64);

    let pid_h = b.program_id(0);
    let pid_w = b.program_id(1);
    let row0 = b.mul(pid_h, bh);
    let col0 = b.mul(pid_w, bw);
    let ar_h = b.arange(0, block_h as i64);
    let ar_w = b.arange(0, block_w as i64);
    let rows = b.add(row0, ar_h);
    let cols = b.add(col0, ar_w);
    let rows2 = b.expand_dims(rows, 1); // [BLOCK_H, 1]
    let cols2 = b.expand_dims(cols, 0); // [1, BLOCK_W]
    let row_ok = b.lt(rows2, h);
    let col_ok = b.lt(cols2, w);
    let mask = b.and(row_ok, col_ok); // [BLOCK_H, BLOCK_W]

    let ro = b.mul(rows2, s_ih);
    let co = b.mul(cols2, s_iw);
    let pix = b.add(ro, co);
    let mut grey_v = None;
    for (c, wc) in GREY_WEIGHTS.iter().enumerate() {
        let c_v = b.i32(c as i32);
        let c_off = b.mul(c_v, s_ic);
        let offs = b.add(pix, c_off);
        let p = b.add(img, offs);
        let v = b.load(p, Some(mask), None);
        let wv = b.f32(*wc);
        let term = b.mul(v, wv);
        grey_v = Some(match grey_v {
            None => term,
            Some(acc) => b.add(acc, term),
        });
    }
    let grey_v = grey_v.expect("three channels");

    let gro = b.mul(rows2, s_gh);
    let gco = b.mul(cols2, s_gw);
    let goffs = b.add(gro, gco);
    let pg = b.add(grey, goffs);
    b.store(pg, grey_v, Some(mask));
    b.finish()
}

/// Reference: `img` is `[h, w, 3]` row-major; returns `[h, w]`.
pub fn rgb_to_grey_ref(img: &[f64], h: usize, w: usize) -> Vec<f64> {
    let mut out = vec![0.0; h * w];
    for i in 0..h {
        for j in 0..w {
            let px = &img[(i * w + j) * 3..(i * w + j) * 3 + 3];
            out[i * w + j] = (0..3).map(|c| GREY_WEIGHTS[c] as f64 * px[c]).sum();
        }
    }
    out
}

/// The launch of [`rgb_to_grey`] on `img` (`[H, W, 3]` f32) writing `grey` (`[H, W]` f32).
pub fn rgb_to_grey_launch<'k>(kernel: &'k Kernel, mem: &Memory, img: TensorId, grey: TensorId) -> Result<Launch<'k>, ExecError> {
    let s = dims(kernel, mem, img, "img_ptr", 3)?;
    dims(kernel, mem, grey, "grey_ptr", 2)?;
    let (bh, bw) = (tile(kernel, "BLOCK_H")?, tile(kernel, "BLOCK_W")?);
    let (ti, tg) = (mem.get(img), mem.get(grey));
    Ok(Launch::new(kernel, (grid_for(s[0], bh), grid_for(s[1], bw)))
        .arg("img_ptr", img)
        .arg("grey_ptr", grey)
        .arg("H", s[0])
        .arg("W", s[1])
        .arg("stride_ih", ti.stride(0))
        .arg("stride_iw", ti.stride(1))
        .arg("stride_ic", ti.stride(2))
        .arg("stride_gh", tg.stride(0))
        .arg("stride_gw", tg.stride(1)))
}

/// Launches [`rgb_to_grey`] on `img` (`[H, W, 3]` f32) writing `grey` (`[H, W]` f32).
pub fn launch_rgb_to_grey(kernel: &Kernel, mem: &mut Memory, img: TensorId, grey: TensorId) -> Result<LaunchSummary, ExecError> {
    rgb_to_grey_launch(kernel, mem, img, grey)?.run(mem)
}
