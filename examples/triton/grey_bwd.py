"""Backward of rgb_to_grey (grey = RED * r + GREEN * g + BLUE * b per pixel of an [H, W, 3]
image): grad_img[h, w, c] = coef[c] * grad_grey[h, w].

`rgb_to_grey_bwd` is correct; each `rgb_to_grey_bwd_broken_*` differs from it in one line,
marked with a comment saying what is wrong.
"""
import triton
import triton.language as tl

RED = 0.2989
GREEN = 0.5870
BLUE = 0.1140


@triton.jit
def rgb_to_grey_bwd(grad_grey_ptr, grad_img_ptr, H, W, stride_ih, stride_iw, stride_ic, stride_gh, stride_gw,
                    BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    g = tl.load(grad_grey_ptr + rows[:, None] * stride_gh + cols[None, :] * stride_gw, mask=mask, other=0.0)
    pix = rows[:, None] * stride_ih + cols[None, :] * stride_iw
    tl.store(grad_img_ptr + pix, g * RED, mask=mask)
    tl.store(grad_img_ptr + pix + stride_ic, g * GREEN, mask=mask)
    tl.store(grad_img_ptr + pix + 2 * stride_ic, g * BLUE, mask=mask)


@triton.jit
def rgb_to_grey_bwd_broken_transpose(grad_grey_ptr, grad_img_ptr, H, W, stride_ih, stride_iw, stride_ic, stride_gh,
                                     stride_gw, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    g = tl.load(grad_grey_ptr + rows[:, None] * stride_gw + cols[None, :] * stride_gh, mask=mask, other=0.0)  # BUG: strides swapped (transposed index)
    pix = rows[:, None] * stride_ih + cols[None, :] * stride_iw
    tl.store(grad_img_ptr + pix, g * RED, mask=mask)
    tl.store(grad_img_ptr + pix + stride_ic, g * GREEN, mask=mask)
    tl.store(grad_img_ptr + pix + 2 * stride_ic, g * BLUE, mask=mask)


@triton.jit
def rgb_to_grey_bwd_broken_channel_stride(grad_grey_ptr, grad_img_ptr, H, W, stride_ih, stride_iw, stride_ic,
                                          stride_gh, stride_gw, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    g = tl.load(grad_grey_ptr + rows[:, None] * stride_gh + cols[None, :] * stride_gw, mask=mask, other=0.0)
    pix = rows[:, None] * stride_ih + cols[None, :] * stride_iw
    tl.store(grad_img_ptr + pix, g * RED, mask=mask)
    tl.store(grad_img_ptr + pix + stride_ic, g * GREEN, mask=mask)
    tl.store(grad_img_ptr + pix + 2 * stride_iw, g * BLUE, mask=mask)  # BUG: pixel stride instead of channel stride


@triton.jit
def rgb_to_grey_bwd_broken_col_mask(grad_grey_ptr, grad_img_ptr, H, W, stride_ih, stride_iw, stride_ic, stride_gh,
                                    stride_gw, BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = rows[:, None] < H  # BUG: column mask missing, the last column tile runs past W
    g = tl.load(grad_grey_ptr + rows[:, None] * stride_gh + cols[None, :] * stride_gw, mask=mask, other=0.0)
    pix = rows[:, None] * stride_ih + cols[None, :] * stride_iw
    tl.store(grad_img_ptr + pix, g * RED, mask=mask)
    tl.store(grad_img_ptr + pix + stride_ic, g * GREEN, mask=mask)
    tl.store(grad_img_ptr + pix + 2 * stride_ic, g * BLUE, mask=mask)
