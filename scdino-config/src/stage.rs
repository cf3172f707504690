//! The pipeline's stages. The trainer runs them (`trainer pipeline`, `trainer pipeline
//! --list-stages`) and the launcher renders one job per stage and chains the jobs by what each
//! stage reads, so both take the order, the names and the dependencies from this one type.

/// One stage of the pipeline; each is also a `trainer` subcommand (its [`Stage::name`]).
/// Declared in pipeline order, so `Ord` is that order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    MeanStd,
    Train,
    Features,
    Knn,
    Evaluate,
    Umap,
    Attention,
    Profiling,
    Report,
}

/// A stage name that is none of [`Stage::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown stage {0:?}; the stages are {names}", names = PIPELINE_STAGES.join(", "))]
pub struct UnknownStage(pub String);

impl Stage {
    /// In pipeline order.
    pub const ALL: [Stage; 9] = [
        Stage::MeanStd,
        Stage::Train,
        Stage::Features,
        Stage::Knn,
        Stage::Evaluate,
        Stage::Umap,
        Stage::Attention,
        Stage::Profiling,
        Stage::Report,
    ];

    /// The stage's subcommand (also its name in `cluster.yaml`'s `stages:`).
    pub const fn name(self) -> &'static str {
        match self {
            Stage::MeanStd => "mean-std",
            Stage::Train => "train",
            Stage::Features => "features",
            Stage::Knn => "knn",
            Stage::Evaluate => "evaluate",
            Stage::Umap => "umap",
            Stage::Attention => "attention",
            Stage::Profiling => "profiling",
            Stage::Report => "report",
        }
    }

    /// The stages whose outputs this one reads: a job waits for theirs, and a stage that is
    /// left out of a run passes its own needs on (the outputs must then exist already).
    pub const fn needs(self) -> &'static [Stage] {
        match self {
            Stage::MeanStd => &[],
            Stage::Train => &[Stage::MeanStd],
            Stage::Features | Stage::Attention | Stage::Evaluate | Stage::Profiling => {
                &[Stage::Train]
            }
            Stage::Knn | Stage::Umap => &[Stage::Features],
            Stage::Report => &[
                Stage::Knn,
                Stage::Evaluate,
                Stage::Umap,
                Stage::Attention,
                Stage::Profiling,
            ],
        }
    }
}

/// Every stage's name, in pipeline order (for messages and for docs that list them).
pub const PIPELINE_STAGES: [&str; 9] = {
    let mut names = [""; 9];
    let mut i = 0;
    while i < Stage::ALL.len() {
        names[i] = Stage::ALL[i].name();
        i += 1;
    }
    names
};

impl std::str::FromStr for Stage {
    type Err = UnknownStage;

    fn from_str(name: &str) -> Result<Self, UnknownStage> {
        Stage::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| UnknownStage(name.to_string()))
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back_and_needs_come_earlier() {
        for stage in Stage::ALL {
            assert_eq!(stage.name().parse::<Stage>(), Ok(stage));
            assert_eq!(stage.to_string(), stage.name());
            for need in stage.needs() {
                assert!(need < &stage, "{stage} needs the later {need}");
            }
        }
        let e = "trian".parse::<Stage>().unwrap_err().to_string();
        assert!(
            e.contains("unknown stage \"trian\"") && e.contains("mean-std, train,"),
            "{e}"
        );
    }
}
