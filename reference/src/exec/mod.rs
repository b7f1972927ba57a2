//! Execution of a launch.
use crate::launch::{Bound, Launch, LaunchSummary, Memory};
use crate::ExecError;

pub(crate) fn execute(l: &Launch, bound: &[Bound], mem: &mut Memory) -> Result<LaunchSummary, ExecError> {
    let _ = (l, bound, mem);
    todo!()
}
