import triton
import triton.language as tl

RED = 0.2989
GREEN = 0.5870
BLUE = 0.1140


@triton.jit
def rgb_to_grey(img_ptr, grey_ptr, H, W, stride_ih, stride_iw, stride_ic, stride_gh, stride_gw,
                BLOCK_H: tl.constexpr, BLOCK_W: tl.constexpr):
    pid_h = tl.program_id(0)
    pid_w = tl.program_id(1)
    rows = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)
    cols = pid_w * BLOCK_W + tl.arange(0, BLOCK_W)
    mask = (rows[:, None] < H) & (cols[None, :] < W)
    pix = rows[:, None] * stride_ih + cols[None, :] * stride_iw
    r = tl.load(img_ptr + pix, mask=mask)
    g = tl.load(img_ptr + pix + stride_ic, mask=mask)
    b = tl.load(img_ptr + pix + 2 * stride_ic, mask=mask)
    grey = r * RED + g * GREEN + b * BLUE
    tl.store(grey_ptr + rows[:, None] * stride_gh + cols[None, :] * stride_gw, grey, mask=mask)
