//! Tensor maths on candle-core CPU tensors, knowing nothing of MIL: conversions between
//! storage dtypes and f32, elementwise and broadcast ops, matmul / convolution / einsum,
//! softmax / normalisation / reductions, and index-based data movement. Float work is done
//! in f32 and rounded once to the storage dtype; heavy loops run on rayon (candle's gemm
//! threads itself). Uses nothing else in milkit.

pub mod attention;
pub mod attention_panel;
pub mod blend;
pub mod convert;
pub mod data;
pub mod elementwise;
pub mod fastmath;
pub mod gemm;
pub mod gemv;
pub mod index;
pub mod linalg;
pub mod norm;

pub use attention::{
    attention, attention_blended, attention_probs, attention_with, Attention, Kernel,
};
pub use data::{cast, from_f32, from_vec, to_f32, to_f32_vec, to_vec, unpack_bits};
pub use elementwise::{
    binary, broadcast_shape, compare, logical, map_f32, map_gelu, map_i64, select, BinOp, CmpOp,
    LogicOp,
};
pub use gemv::{Packed, PackedWeight};
pub use index::{pad, strided_assign, strided_slice, take, take_along, PadMode, Span};
pub use linalg::{conv, einsum, matmul, ConvParams};
pub use norm::{
    channel_affine, layer_norm, layer_norm_on, layer_norm_rows, reduce, softmax, Reduce,
};

/// Calls `f` with this thread's value of `key`, or with a fresh default one where it is
/// already in use further up the stack: per-thread scratch that the decode-step kernels
/// reuse from call to call, so their parallel loops allocate nothing (with glibc's one
/// arena, `crate::alloc::one_arena`, two workers' allocations wait on each other).
pub(crate) fn with_local<T: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|c| match c.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut T::default()),
    })
}
