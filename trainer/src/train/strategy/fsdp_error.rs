//! FSDP's own error, apart from the strategy so that the step (which returns it from the
//! strategy's hooks) does not import the strategy that imports the step.
use crate::distributed::group::DistError;
use crate::distributed::hooks::HookError;
use crate::model::UndeclaredParameter;

/// Why sharding, a step or a hook of FSDP failed. A failure inside an autograd or block hook
/// cannot return; it is kept (the first one) and fails the step at its next check.
#[derive(Debug, thiserror::Error)]
pub enum FsdpError {
    /// An all-gather, reduce-scatter or all-reduce failed.
    #[error("collective failed (another rank may have died): {0}")]
    Collective(#[from] DistError),
    /// The storage trick failed in the shim: reallocating or freeing a unit's full buffer,
    /// dropping a gradient, registering a hook. `what` names the operation.
    #[error("FSDP: {what}: {source}")]
    Storage {
        what: &'static str,
        #[source]
        source: HookError,
    },
    /// A trainable parameter that no unit of the model declares: it has no place in a shard.
    #[error("FSDP: setup: {0}")]
    Undeclared(#[from] UndeclaredParameter),
    /// The student has a trainable parameter the teacher lacks (the two must match to shard
    /// them alike).
    #[error("FSDP: setup: teacher has no {0}")]
    NoTeacherParameter(String),
    /// Ranks disagree on which parameters got a gradient: their shards would diverge.
    #[error("FSDP: backward: parameter {name} received a gradient on {ranks} of {world} ranks; every rank must use the same parameters")]
    UnevenGradients {
        name: String,
        ranks: usize,
        world: usize,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The messages a user saw when these were `DistError { what: "FSDP: …" }`.
    #[test]
    fn messages_name_fsdp_and_the_operation() {
        let hook = HookError {
            what: "resize_storage".into(),
            message: "not resizable".into(),
        };
        let storage = FsdpError::Storage {
            what: "gather",
            source: hook,
        };
        assert_eq!(
            storage.to_string(),
            "FSDP: gather: resize_storage: not resizable"
        );
        assert_eq!(
            FsdpError::NoTeacherParameter("head.w".into()).to_string(),
            "FSDP: setup: teacher has no head.w"
        );
        assert_eq!(
            FsdpError::Undeclared(UndeclaredParameter("x.w".into())).to_string(),
            "FSDP: setup: parameter x.w is not declared by any unit of the model (model/units.rs)"
        );
        let uneven = FsdpError::UnevenGradients {
            name: "blocks.0.w".into(),
            ranks: 1,
            world: 2,
        };
        assert_eq!(
            uneven.to_string(),
            "FSDP: backward: parameter blocks.0.w received a gradient on 1 of 2 ranks; every rank must use the same parameters"
        );
        let dist = DistError {
            what: "all_gather".into(),
            message: "peer closed".into(),
        };
        assert_eq!(
            FsdpError::from(dist).to_string(),
            "collective failed (another rank may have died): all_gather: peer closed"
        );
    }
}
