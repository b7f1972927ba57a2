//! The broken backward variants of `examples/triton/`, and what a check of each must report:
//! shared by the spec tests and the GPU backend's tests.

/// What the report of a broken variant must say. Lines are in the backward's file.
#[derive(Clone, Copy, Debug)]
#[allow(dead_code)] // each test binary reads some of the fields
pub enum Expect {
    /// The backward stops with an out-of-bounds access at this line.
    Oob(usize),
    /// The backward stops with a race, one of whose accesses is at this line.
    Race(usize),
    /// Gradient of `input` is finite but wrong; its worst element was written by the variant's
    /// store (or atomic_add) at `line`.
    Wrong { input: &'static str, line: usize },
    /// Gradient of `input` holds NaN written by the variant's store at `line`.
    NanWritten { input: &'static str, line: usize },
    /// Gradient of `input` holds NaN because elements of `tensor` were never written.
    Unwritten { input: &'static str, tensor: &'static str },
    /// Gradient of `input` is finite but wrong; its worst element was written by the correct
    /// kernel `kernel` at `file:line` from what the variant, an earlier launch of the backward or
    /// a launch of the forward, wrote for it.
    Downstream { input: &'static str, kernel: &'static str, file: &'static str, line: usize },
    /// The variant is a forward kernel whose launch fails as it would on a GPU (`what`: "race"
    /// or "out-of-bounds"), one of its accesses at this line of the forward's file.
    ForwardFails { what: &'static str, line: usize },
}

use Expect::*;

/// One broken variant: the variant, the spec (`examples/<spec>.toml`), the kernel key it
/// replaces, what the report must say, and why that is not the `# BUG:` line (empty when it is).
pub type Case = (&'static str, &'static str, &'static str, Expect, &'static str);

#[rustfmt::skip]
pub const CASES: &[Case] = &[
    ("vector_add_bwd_broken_mask", "vector_add", "bwd", Oob(25), ""),
    ("vector_add_bwd_broken_off_by_one", "vector_add", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "mask: the last element is not written"),
    // Overlapping programs store the same values (deterministic on a GPU, not a race); the
    // elements past the last program's tile are never written.
    ("vector_add_bwd_broken_tile_start", "vector_add", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "tile start: elements are never written"),
    ("copy_bwd_broken_mask", "copy", "bwd", Oob(25), ""),
    ("copy_bwd_broken_shift", "copy", "bwd", Wrong { input: "src", line: 34 }, "wrong load: blamed on the store of the loaded value"),
    ("copy_bwd_broken_accumulate", "copy", "bwd", NanWritten { input: "src", line: 43 }, "reads the NaN buffer: blamed on the store"),
    ("softplus_bwd_broken_sign", "softplus", "bwd", Wrong { input: "x", line: 67 }, ""),
    // With H < W the swapped strides read past grad_grey (with H > W the value is only wrong).
    ("rgb_to_grey_bwd_broken_transpose", "grey", "bwd", Oob(38), ""),
    // Blue at `2 * stride_iw` lands on the red channel two pixels on: the tile's last columns
    // collide with the next column tile's red store (line 55).
    ("rgb_to_grey_bwd_broken_channel_stride", "grey", "bwd", Race(57), ""),
    // Columns past W wrap into the next row, which the first column tile writes.
    // The columns past W wrap into the next row and store the very values its first column tile
    // stores (the same bits: not a race); the last row's wrap reads past grad_grey.
    ("rgb_to_grey_bwd_broken_col_mask", "grey", "bwd", Oob(68), "mask: the access past the end is the load that uses it"),
    ("weighted_sum_bwd_broken_partial_row", "weighted_sum", "bwd", Race(102), "block pointer: the race is at the store through it"),
    ("weighted_sum_bwd_broken_no_advance", "weighted_sum", "bwd", Unwritten { input: "w", tensor: "partial_grad_w" }, "partial tiles past the first are never written"),
    // Columns past D wrap into the next row, the next program's at a row tile's end.
    ("weighted_sum_bwd_broken_boundary", "weighted_sum", "bwd", Race(195), ""),
    ("weighted_sum_desc_bwd_broken_partial_row", "weighted_sum_desc", "bwd", Race(78), ""),
    ("weighted_sum_desc_bwd_broken_tile_offset", "weighted_sum_desc", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "column tiles past the first are never written"),
    ("weighted_sum_desc_bwd_broken_stride", "weighted_sum_desc", "bwd", Oob(140), "descriptor: the access is at its load"),
    // With N > K the swapped strides read past b (with N < K the value is only wrong).
    ("matmul_bwd_da_broken_transpose", "matmul", "bwd_da", Oob(65), ""),
    ("matmul_bwd_da_broken_accumulate", "matmul", "bwd_da", Wrong { input: "a", line: 88 }, "dot: blamed on the store of the accumulator"),
    ("matmul_bwd_db_broken_mask", "matmul", "bwd_db", Oob(103), "mask: the access is at the load that uses it"),
    ("l2_norm_bwd_broken_scale", "l2_norm", "bwd", Wrong { input: "x", line: 30 }, ""),
    ("l2_norm_bwd_broken_factor_two", "l2_norm", "bwd", Wrong { input: "x", line: 41 }, ""),
    ("l2_norm_bwd_broken_norm_index", "l2_norm", "bwd", Oob(50), ""),
    ("atomic_sum_bwd_broken_mask", "atomic_sum", "bwd", Oob(25), ""),
    ("atomic_sum_bwd_broken_mean", "atomic_sum", "bwd", Wrong { input: "x", line: 34 }, "scaled load: blamed on the store"),
    ("atomic_sum_bwd_broken_block_mask", "atomic_sum", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "mask: programs past the first write nothing"),
    ("softmax_bwd_broken_row_mask", "softmax", "bwd", Oob(30), "mask: the access is at the load that uses it"),
    ("softmax_bwd_broken_axis", "softmax", "bwd", Wrong { input: "x", line: 47 }, "reduction: blamed on the store"),
    ("softmax_bwd_broken_no_dot", "softmax", "bwd", Wrong { input: "x", line: 60 }, "expression: blamed on the store"),
    // Programs overlap on the even rows (the same values: a note), the odd rows are never written.
    ("softmax_bwd_broken_row_step", "softmax", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "row step: the odd rows are never written"),
    ("layer_norm_rows_bwd_broken_race", "layer_norm", "bwd", Race(66), ""),
    ("layer_norm_rows_bwd_broken_mean_scale", "layer_norm", "bwd", Wrong { input: "x", line: 90 }, "expression: blamed on the store"),
    ("layer_norm_rows_bwd_broken_var_mask", "layer_norm", "bwd", Wrong { input: "x", line: 115 }, "mask in a reduction: blamed on the store"),
    ("layer_norm_bwd_broken_accumulate", "layer_norm_saved", "bwd", Wrong { input: "x", line: 191 }, "loop accumulator: blamed on the store"),
    ("layer_norm_bwd_broken_partial_row", "layer_norm_saved", "bwd", Race(230), ""),
    ("layer_norm_bwd_broken_mask", "layer_norm_saved", "bwd", Oob(261), ""),
    ("layer_norm_bwd_broken_no_tail", "layer_norm_saved", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "loop bound: the tail columns are never written"),
    ("layer_norm_bwd_dx_fused_broken_no_lock", "layer_norm_lock", "dx", Race(101), "unlocked read-modify-write: the race is at its store"),
    ("layer_norm_bwd_dx_fused_broken_c2", "layer_norm_lock", "dx", Wrong { input: "x", line: 130 }, "expression: blamed on the store"),
    ("row_scale_bwd_broken_offsets", "row_scale_desc", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "swapped tile offsets: tiles off the transposed grid are never written"),
    ("row_scale_bwd_broken_tanh", "row_scale_desc", "bwd", Wrong { input: "x", line: 58 }, "expression: blamed on the store"),
    ("attn_bwd_broken_sm_scale", "flash_attention", "bwd", Wrong { input: "q", line: 108 }, ""),
    ("attn_bwd_broken_key_mask", "flash_attention", "bwd", Wrong { input: "q", line: 155 }, "mask: blamed on the store of grad_q"),
    ("attn_bwd_broken_race", "flash_attention", "bwd", Race(196), ""),
    ("attn_bwd_broken_dq_accumulate", "flash_attention", "bwd", Wrong { input: "q", line: 249 }, "dot: blamed on the store of the accumulator"),
    ("attn_bwd_causal_broken_mask", "flash_attention_causal", "bwd", Wrong { input: "q", line: 139 }, "mask: blamed on the store of grad_q"),
    ("attn_bwd_causal_broken_diagonal", "flash_attention_causal", "bwd", Wrong { input: "q", line: 200 }, "loop bound: blamed on the store of grad_q"),
    ("attn_bwd_causal_broken_strict", "flash_attention_causal", "bwd", Wrong { input: "q", line: 261 }, "mask in a loop: blamed on the store of grad_q"),
    ("attn_bwd_causal_broken_no_delta", "flash_attention_causal", "bwd", Wrong { input: "q", line: 322 }, "missing factor: blamed on the store of grad_q"),
    ("_rms_norm_backward_kernel_broken_dw", "rms_norm", "bwd", Wrong { input: "w", line: 104 }, ""),
    ("_rms_norm_backward_kernel_broken_no_offset", "rms_norm_f16", "bwd", Wrong { input: "x", line: 73 }, "weight load: blamed on the store of grad_x"),
    ("liger_cross_entropy_bwd_kernel_broken_ignored", "cross_entropy", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "early return: the ignored rows are never written"),
    ("liger_cross_entropy_bwd_kernel_broken_reduction", "cross_entropy", "bwd", Wrong { input: "x", line: 137 }, "constexpr branch: blamed on the store"),
    ("_activation_bwd_broken_slope", "activation", "bwd", Wrong { input: "x", line: 49 }, "expression: blamed on the store"),
    ("_activation_bwd_broken_gelu", "activation_gelu_bf16", "bwd", Wrong { input: "x", line: 71 }, "expression: blamed on the store"),
    ("_activation_bwd_broken_half", "activation_gelu_bf16", "bwd", Wrong { input: "x", line: 94 }, "expression: blamed on the store"),
    ("_rope_backward_broken_sign", "rope", "bwd", Wrong { input: "q", line: 75 }, "helper call: blamed on the store of the half the worst element is in"),
    ("_kl_div_bwd_kernel_broken_scale", "kl_div", "bwd", Wrong { input: "y", line: 101 }, "reduction scale: blamed on the store of grad_y"),
    ("_kl_div_bwd_kernel_broken_log_target", "kl_div_log_target", "bwd", Wrong { input: "gt", line: 148 }, "expression: blamed on the store of grad_gt"),
    ("_jsd_bwd_kernel_broken_beta", "jsd", "bwd", Wrong { input: "x", line: 101 }, "expression: blamed on the store of grad_x"),
    ("_jsd_bwd_kernel_broken_grad_output", "jsd", "bwd", Wrong { input: "y", line: 148 }, ""),
    ("_glu_backward_kernel_broken_silu", "glu", "bwd", Wrong { input: "a", line: 56 }, "expression: blamed on the in-place store of grad_a"),
    ("_glu_backward_kernel_broken_gelu", "glu_geglu_bf16", "bwd", Wrong { input: "a", line: 78 }, "expression: blamed on the in-place store of grad_a"),
    // Blamed through the host's `torch.cat([dgate, dup], -1)` on the store of dgate.
    ("swiglu_bwd_kernel_broken_sigmoid", "swiglu_chunk", "bwd", Wrong { input: "gate_up", line: 39 }, "expression: blamed on the store of dgate"),
    ("_embedding_bwd_kernel_broken_store", "embedding", "bwd", Race(52), ""),
    ("_embedding_bwd_kernel_broken_padding", "embedding", "bwd", Wrong { input: "weight", line: 74 }, "early-return condition: blamed on the atomic_add into the padding row"),
    ("_pointwise_loss_bwd_broken_sign", "pointwise_loss", "bwd", Wrong { input: "t", line: 88 }, ""),
    ("_pointwise_loss_bwd_broken_delta", "pointwise_loss", "bwd", Wrong { input: "x", line: 126 }, "builtin min/max: blamed on the store of grad_x"),
    ("_pointwise_loss_bwd_broken_mask", "pointwise_loss_smooth_l1_f16", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "mask: the last element is never written"),
    ("_bce_logits_bwd_broken_pos_weight", "bce_with_logits", "bwd", Wrong { input: "x", line: 86 }, "expression: blamed on the store of grad_x"),
    ("_bce_logits_bwd_broken_mean", "bce_with_logits", "bwd", Wrong { input: "t", line: 123 }, "reduction scale: blamed on the store of grad_t"),
    ("_cumsum_bwd_broken_forward", "cumsum_exclusive", "bwd", Wrong { input: "x", line: 44 }, "scan direction: blamed on the store"),
    ("_cumsum_bwd_broken_carry", "cumsum", "bwd", Wrong { input: "x", line: 63 }, "while-loop carry: blamed on the store of the next block"),
    ("_group_norm_bwd_broken_count", "group_norm", "bwd", Wrong { input: "x", line: 102 }, "reduction scale: blamed on the store of grad_x"),
    ("_group_norm_bwd_broken_dw", "group_norm", "bwd", Wrong { input: "w", line: 154 }, "expression: blamed on the store of the partial dw"),
    ("_fused_add_rms_norm_bwd_broken_residual", "fused_add_rms_norm", "bwd", Wrong { input: "x", line: 67 }, "wrong load: blamed on the in-place store into grad_h"),
    ("_fused_add_rms_norm_bwd_broken_rstd", "fused_add_rms_norm", "bwd", Wrong { input: "residual", line: 96 }, "expression: blamed on the in-place store into grad_h"),
    ("_log_softmax_bwd_broken_exp", "log_softmax", "bwd", Wrong { input: "x", line: 51 }, "expression: blamed on the store"),
    ("_linear_act_bwd_da_broken_mask", "linear_act", "bwd_da", Oob(141), ""),
    ("_linear_act_bwd_db_broken_axis", "linear_act", "bwd_db", Wrong { input: "bias", line: 186 }, "reduction axis: blamed on the store of grad_bias"),
    ("linear_tf32_bwd_dx_broken_acc", "linear_tf32", "bwd_dx", Wrong { input: "x", line: 59 }, "tf32 dots, accumulator overwritten: blamed on the store"),
    ("_layer_scale_bwd_broken_last", "layer_scale", "bwd", Unwritten { input: "gamma", tensor: "grad_gamma" }, "ticket condition: no program is the last, dgamma is never written"),
    ("_layer_scale_bwd_broken_dx", "layer_scale", "bwd", Wrong { input: "x", line: 110 }, ""),
    ("_dyt_bwd_broken_tanh_grad", "dyt", "bwd", Wrong { input: "x", line: 82 }, "expression: blamed on the store of grad_x"),
    ("_dyt_bwd_broken_dgamma", "dyt", "bwd", Wrong { input: "gamma", line: 119 }, ""),
    ("_dyt_bwd_broken_dropped_term", "dyt", "bwd", Wrong { input: "x", line: 153 }, "a constant left of an expression: blamed on the store"),
    ("_batch_norm_bwd_broken_bessel", "batch_norm", "bwd", Wrong { input: "x", line: 105 }, "reduction scale: blamed on the store of grad_x"),
    ("_batch_norm_bwd_broken_row_mask", "batch_norm", "bwd", Oob(136), "mask: the access is at the load that uses it"),
    ("_smooth_ce_bwd_broken_target", "smooth_ce", "bwd", Wrong { input: "x", line: 81 }, "expression: blamed on the store"),
    ("_smooth_ce_bwd_broken_z_loss", "smooth_ce", "bwd", Wrong { input: "x", line: 117 }, "constexpr-guarded expression: blamed on the store"),
    ("block_sum_bwd_broken_tail", "block_sum", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "mask: the last element is not written"),
    ("layer_norm_tail_bwd_broken_block_mean", "layer_norm_tail", "bwd", Wrong { input: "x", line: 51 }, "expression: blamed on the store"),
    ("layer_norm_tail_bwd_broken_dw", "layer_norm_tail", "bwd", Wrong { input: "w", line: 72 }, ""),
    ("row_rms_scale_bwd_broken_partial_dg", "row_rms_scale", "bwd", Race(52), ""),
    ("row_rms_scale_fwd_broken_block_rms", "row_rms_scale", "fwd", ForwardFails { what: "race", line: 44 }, "a statistic over the block: the programs of a row store different values"),
    ("_dropout_add_bwd_broken_offset", "dropout", "bwd", Wrong { input: "x", line: 32 }, "a mask drawn at other offsets: blamed on the store"),
    ("_dropout_add_bwd_broken_scale", "dropout", "bwd", Wrong { input: "x", line: 44 }, ""),
    // The formula is right (the exact replay agrees); the f16 accumulation is 12 units of f16
    // roundoff off, beyond the rounding budget.
    ("col_scale_bwd_dw_broken_f16_acc", "col_scale_f16", "bwd_dw", Wrong { input: "w", line: 55 }, "accumulator dtype: blamed on the store of the sum"),
    // A conditional expression guarding a load on the wrong condition: the last chunk loads
    // past its row (for the last row, past the tensor).
    ("chunk_cumsum_bwd_broken_guard", "chunk_cumsum", "bwd", Oob(33), ""),
    // The total carried in from the next chunk read one element too far: a wrong value, blamed
    // on the store.
    ("chunk_cumsum_bwd_broken_carry", "chunk_cumsum", "bwd", Wrong { input: "x", line: 47 }, "a wrong element read back: blamed on the store"),
    // The bug is in the first of two backward launches: the second writes the wrong elements
    // from the buffer the first wrote.
    ("_leaky_relu_bwd_broken_slope", "scale_leaky_relu", "act", Downstream { input: "x", kernel: "_scale_bwd", file: "scale_leaky_relu_bwd.py", line: 45 }, "an earlier launch: blamed on the later launch's store"),
    // The bug is in the forward, which leaves the gradient in a buffer that the backward scales.
    ("cross_entropy_fwd_grad_kernel_broken_precedence", "cross_entropy_fused", "fwd", Downstream { input: "x", kernel: "element_mul_kernel", file: "cross_entropy_fused_bwd.py", line: 16 }, "a forward launch: blamed on the backward's in-place store"),
    ("chunk_cumsum_bwd_broken_last_guard", "chunk_cumsum", "bwd", Wrong { input: "x", line: 60 }, "a guard in the loop: blamed on the store"),
    // A persistent kernel (loops inside a loop).
    ("row_norm_persistent_bwd_broken_no_norm", "row_norm_persistent", "bwd", Wrong { input: "x", line: 46 }, "a scale: blamed on the store"),
    ("row_norm_persistent_bwd_broken_first_chunk", "row_norm_persistent", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "loop start: each row's first chunk is never written"),
    // A forward that advances a pointer in its loop.
    ("row_sq_sum_bwd_broken_factor", "row_sq_sum", "bwd", Wrong { input: "x", line: 44 }, ""),
    ("row_sq_sum_bwd_broken_last_chunk", "row_sq_sum", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "loop bound: each row's last chunk is never written"),
    // A forward whose `while` loop reads back what it stored (with `--ground kernels` its launch
    // is differentiated by the evaluator, with a note: `tests/vjp_kernels.rs`).
    ("cube_root_bwd_broken_factor", "cube_root", "bwd", Wrong { input: "x", line: 42 }, ""),
    ("cube_root_bwd_broken_mask", "cube_root", "bwd", Unwritten { input: "x", tensor: "grad_x" }, "mask: the last element is never written"),
];
