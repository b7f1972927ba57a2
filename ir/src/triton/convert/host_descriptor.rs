//! Kernel parameters that are tensor descriptors built on the host (see
//! [`crate::triton::HostDescriptor`]): each becomes a pointer and per-dim shape and stride
//! scalars, bound in the kernel body to the same descriptor value `tl.make_tensor_descriptor`
//! builds, so that both lower alike.

use super::Cx;
use crate::triton::errors::{fail, R};
use crate::triton::value::{TensorDesc, Val};
use crate::triton::HostDescriptor;
use crate::DType;

impl Cx<'_> {
    /// Declares the parameters of host descriptor `name` and binds it.
    pub(super) fn host_descriptor(&mut self, name: &str, hd: &HostDescriptor, o: u32) -> R<()> {
        let n = hd.block_shape.len();
        if n == 0 || n > crate::MAX_RANK || hd.block_shape.contains(&0) {
            return fail(
                o,
                format!("descriptor `{name}` needs a block shape of 1 to {} positive dims, found {:?}", crate::MAX_RANK, hd.block_shape),
            );
        }
        let base = self.b.ptr_param(name, hd.dtype);
        let shape = (0..n).map(|i| self.b.scalar_param(&HostDescriptor::shape_param(name, i), DType::I64)).collect();
        let strides = (0..n).map(|i| self.b.scalar_param(&HostDescriptor::stride_param(name, i), DType::I64)).collect();
        self.env.insert(name.to_string(), Val::TensorDesc(TensorDesc { base, shape, strides, block_shape: hd.block_shape.clone() }));
        Ok(())
    }
}
