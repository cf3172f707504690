//! The pipeline's stages, as one registry ([`STAGES`]) of what both binaries must agree on: the
//! order, the names, what each stage reads and what kind of job it is. The trainer runs them
//! (`trainer pipeline`, `trainer pipeline --list-stages`) and the launcher, which links no
//! libtorch, renders one job per stage and chains the jobs by what each stage reads, so these
//! facts live here and nowhere else. What a stage does, its files and its report section are
//! the trainer's (`trainer/src/pipeline/stages/`).

/// One stage of the pipeline; each is also a `trainer` subcommand (its [`Stage::name`]).
/// Declared in pipeline order, so `Ord` is that order; its facts are its line in [`STAGES`].
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

/// What kind of job a stage is on a cluster: the launcher shapes its Slurm job from this.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// One task, no GPU.
    Cpu,
    /// One task with one GPU when the cluster has GPUs: the stage runs the model.
    OneGpu,
    /// Data parallel over every GPU of `slurm.nodes` nodes, one job chain per trained model
    /// (`training.segments` jobs, each resuming the last), preemptible: training.
    Training,
}

/// The facts of one stage that the trainer and the launcher share.
#[derive(Debug, Clone, Copy)]
pub struct StageFacts {
    pub stage: Stage,
    /// Its `trainer` subcommand, and its name in `cluster.yaml`'s `stages:`.
    pub name: &'static str,
    /// The stages whose outputs it reads: a job waits for theirs, and a stage that is left out
    /// of a run passes its own needs on (the outputs must then exist already).
    pub needs: &'static [Stage],
    pub job: JobKind,
}

/// Every stage, one line each, in pipeline order (the order of [`Stage`]'s variants, which a
/// compile-time check below holds).
pub const STAGES: &[StageFacts] = &[
    facts(Stage::MeanStd, "mean-std", &[], JobKind::Cpu),
    facts(Stage::Train, "train", &[Stage::MeanStd], JobKind::Training),
    facts(
        Stage::Features,
        "features",
        &[Stage::Train],
        JobKind::OneGpu,
    ),
    facts(Stage::Knn, "knn", &[Stage::Features], JobKind::Cpu),
    facts(
        Stage::Evaluate,
        "evaluate",
        &[Stage::Train],
        JobKind::OneGpu,
    ),
    facts(Stage::Umap, "umap", &[Stage::Features], JobKind::Cpu),
    facts(
        Stage::Attention,
        "attention",
        &[Stage::Train],
        JobKind::OneGpu,
    ),
    // It embeds a screen's cells with the model.
    facts(
        Stage::Profiling,
        "profiling",
        &[Stage::Train],
        JobKind::OneGpu,
    ),
    facts(
        Stage::Report,
        "report",
        &[
            Stage::Knn,
            Stage::Evaluate,
            Stage::Umap,
            Stage::Attention,
            Stage::Profiling,
        ],
        JobKind::Cpu,
    ),
];

const fn facts(
    stage: Stage,
    name: &'static str,
    needs: &'static [Stage],
    job: JobKind,
) -> StageFacts {
    StageFacts {
        stage,
        name,
        needs,
        job,
    }
}

/// [`STAGES`] is in [`Stage`]'s order, one line per variant, so a stage's facts are found by
/// its position; the build fails otherwise.
const _: () = {
    let mut i = 0;
    while i < STAGES.len() {
        assert!(
            STAGES[i].stage as usize == i,
            "STAGES is not in Stage's order"
        );
        i += 1;
    }
    assert!(
        Stage::Report as usize + 1 == STAGES.len(),
        "a stage without its line in STAGES"
    );
};

/// A stage name that is none of [`Stage::ALL`]'s.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown stage {0:?}; the stages are {names}", names = PIPELINE_STAGES.join(", "))]
pub struct UnknownStage(pub String);

impl Stage {
    /// In pipeline order.
    pub const ALL: [Stage; STAGES.len()] = {
        let mut all = [Stage::MeanStd; STAGES.len()];
        let mut i = 0;
        while i < STAGES.len() {
            all[i] = STAGES[i].stage;
            i += 1;
        }
        all
    };

    /// Its line in [`STAGES`].
    pub const fn facts(self) -> &'static StageFacts {
        &STAGES[self as usize]
    }

    /// The stage's subcommand (also its name in `cluster.yaml`'s `stages:`).
    pub const fn name(self) -> &'static str {
        self.facts().name
    }

    /// The stages whose outputs this one reads ([`StageFacts::needs`]).
    pub const fn needs(self) -> &'static [Stage] {
        self.facts().needs
    }

    /// The kind of job it is on a cluster.
    pub const fn job(self) -> JobKind {
        self.facts().job
    }
}

/// Every stage's name, in pipeline order (for messages and for docs that list them).
pub const PIPELINE_STAGES: [&str; STAGES.len()] = {
    let mut names = [""; STAGES.len()];
    let mut i = 0;
    while i < STAGES.len() {
        names[i] = STAGES[i].name;
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
