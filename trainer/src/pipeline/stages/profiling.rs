//! The `profiling` stage (`downstream.profiling`): a screen's answer for a checkpoint. The
//! checkpoint embeds every cell of the screen (`trainer embed`, resumable by its parts), then
//! `trainer metrics profile` runs the recipe on that table. A record written last says what
//! was embedded and which recipe ran, so a rerun skips the stage only while both still match
//! the config: a changed recipe reruns the recipe (the embedded parts are kept), a new
//! checkpoint re-embeds.
use crate::config::Stage;
use crate::config::{Config, ProfiledCheckpoints};
use crate::embed::parts::{parts_dir, PartsError};
use crate::embed::process::EmbedError;
use crate::embed::{EmbedOptions, OnError, ScreenOf};
use crate::pipeline::stage::{up_to_date, At, Checkpoint, Flow, PipelineStage, Ranks};
use crate::pipeline::stage_error::StageError;
use crate::pipeline::target::Target;
use crate::scoring::profile::{self, ProfileSummary};
use crate::scoring::recipe::Recipe;
use crate::scoring::ScoringError;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What an inline recipe is called in messages (it has no file).
pub const INLINE_RECIPE: &str = "downstream.profiling.recipe";

/// The recipe the config names, with the file it was read from (none: inline or default).
#[derive(Debug, Clone)]
pub struct ConfiguredRecipe {
    pub recipe: Recipe,
    pub file: Option<PathBuf>,
}

/// Reads `downstream.profiling.recipe`: a recipe file, the recipe inline, or the defaults.
/// An inline recipe is checked as strictly as a file (unknown keys, bad values).
pub fn configured_recipe(cfg: &Config) -> Result<ConfiguredRecipe, ScoringError> {
    let invalid = |what: String| ScoringError::Invalid {
        path: PathBuf::from(INLINE_RECIPE),
        what,
    };
    match &cfg.downstream.profiling.recipe {
        None => Ok(ConfiguredRecipe {
            recipe: Recipe::default(),
            file: None,
        }),
        Some(serde_json::Value::String(path)) => Ok(ConfiguredRecipe {
            recipe: Recipe::read(Path::new(path))?,
            file: Some(PathBuf::from(path)),
        }),
        Some(value @ serde_json::Value::Object(_)) => {
            let recipe: Recipe = serde_json::from_value(value.clone())
                .map_err(|e| invalid(format!("not a profiling recipe: {e}")))?;
            recipe.check().map_err(invalid)?;
            Ok(ConfiguredRecipe { recipe, file: None })
        }
        Some(other) => Err(invalid(format!(
            "{other} is neither a recipe file's path nor a recipe"
        ))),
    }
}

/// The checkpoints `downstream.profiling.checkpoints` profiles, of those the pipeline
/// analyses (oldest first; `last` is the newest numbered one).
pub fn profiled(cfg: &Config, checkpoints: &[(String, PathBuf)]) -> Vec<(String, PathBuf)> {
    match cfg.downstream.profiling.checkpoints {
        ProfiledCheckpoints::All => checkpoints.to_vec(),
        ProfiledCheckpoints::Last => checkpoints.last().cloned().into_iter().collect(),
    }
}

/// What `profiling.json` records.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub tag: String,
    pub checkpoint: String,
    /// What was embedded ([`embedded`]).
    pub embedded: String,
    /// The recipe as run (every default filled in).
    pub recipe: serde_json::Value,
    pub cells: usize,
}

/// The cells the config embeds, in words (recorded, compared on rerun, shown in the report).
pub fn embedded(cfg: &Config) -> String {
    let p = &cfg.downstream.profiling;
    match (&p.screen, &p.images) {
        (Some(screen), _) => format!("the screen of {screen}"),
        (None, Some(images)) => format!(
            "the images {images}{}{}",
            p.path_pattern
                .as_ref()
                .map(|x| format!(", path pattern {x}"))
                .unwrap_or_default(),
            p.metadata
                .as_ref()
                .map(|x| format!(", metadata {x}"))
                .unwrap_or_default()
        ),
        (None, None) => format!("this run's screen {}", cfg.data.dataset_dir),
    }
}

/// The record of `tag`, when the stage finished it with this checkpoint, these cells and this
/// recipe.
pub fn current_record(t: &Target, tag: &str, ckpt: &Path, recipe: &Recipe) -> Option<Record> {
    let text = std::fs::read_to_string(t.files.profiling_record(tag)).ok()?;
    let record: Record = serde_json::from_str(&text).ok()?;
    let now = (
        ckpt.display().to_string(),
        embedded(t.cfg),
        serde_json::to_value(recipe).ok()?,
    );
    ((
        record.checkpoint.clone(),
        record.embedded.clone(),
        record.recipe.clone(),
    ) == now)
        .then_some(record)
}

/// The inputs whose change reruns the stage: the checkpoint and a recipe file.
pub fn inputs(ckpt: &Path, recipe: &ConfiguredRecipe) -> Vec<PathBuf> {
    std::iter::once(ckpt.to_path_buf())
        .chain(recipe.file.clone())
        .collect()
}

/// Embeds the cells with `ckpt` (every rank its share of the parts; rank 0 merges), then, on
/// rank 0, runs the recipe and writes the record. Returns the summary on rank 0.
pub fn run_profiling(
    t: &Target,
    tag: &str,
    ckpt: &Path,
    recipe: &ConfiguredRecipe,
) -> Result<Option<ProfileSummary>, StageError> {
    let cells = t.files.profiling_cells(tag);
    let dir = t.files.profiling_dir(tag);
    std::fs::create_dir_all(&dir).map_err(|source| StageError::Io {
        path: dir.clone(),
        source,
    })?;
    let opts = embed_options(t, ckpt, &cells)?;
    match crate::embed::run(&opts) {
        // Parts of another checkpoint (retrained) or of other cells: start them again.
        Err(EmbedError::Parts(PartsError::OtherJob { differs, .. })) => {
            tracing::info!(
                "profiling {tag}: the embedded parts differ in {differs}; embedding again"
            );
            remove(&parts_dir(&cells))?;
            crate::embed::run(&opts)?
        }
        other => other?,
    };
    if crate::distributed::env::DistEnv::from_process_env()?.rank != 0 {
        return Ok(None);
    }
    let summary = profile::profile(
        &cells,
        &recipe.recipe,
        Some(recipe.file.as_deref().unwrap_or(Path::new(INLINE_RECIPE))),
        &t.files.profile_dir(tag),
    )?;
    let record = Record {
        tag: tag.to_string(),
        checkpoint: ckpt.display().to_string(),
        embedded: embedded(t.cfg),
        recipe: serde_json::to_value(&recipe.recipe).expect("a recipe serialises"),
        cells: summary.cells_rows,
    };
    let path = t.files.profiling_record(tag);
    let text = serde_json::to_string_pretty(&record).expect("the record serialises");
    scdino_base::fs::write_atomic(&path, text.as_bytes())
        .map_err(|source| StageError::Io { path, source })?;
    Ok(Some(summary))
}

/// `trainer embed`'s options for the configured cells, as the features stage embeds: this
/// combination's channels, the run's device, fp32, the features' batch size.
fn embed_options(t: &Target, ckpt: &Path, cells: &Path) -> Result<EmbedOptions, StageError> {
    let p = &t.cfg.downstream.profiling;
    let screen = match (&p.screen, &p.images) {
        (Some(file), _) => Some(ScreenOf::File(PathBuf::from(file))),
        (None, Some(_)) => None,
        (None, None) => Some(ScreenOf::Config(
            t.cfg.clone(),
            "this run's config".to_string(),
        )),
    };
    Ok(EmbedOptions {
        checkpoint: ckpt.to_path_buf(),
        images: p.images.clone().unwrap_or_default(),
        screen,
        out: cells.to_path_buf(),
        list: None,
        metadata: p.metadata.as_ref().map(PathBuf::from),
        path_pattern: p.path_pattern.clone(),
        channels: Some(t.channel_names()),
        on_error: OnError::Fail,
        batch_size: None,
        device: crate::device::resolve_for_this_process(t.cfg.train.device)?,
        bf16: false,
        shard: None,
        merge_only: false,
        part_size: 1024,
        readers: 2,
    })
}

fn remove(dir: &Path) -> Result<(), StageError> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StageError::Io {
            path: dir.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

/// One checkpoint the stage profiles, and whether its outputs are current.
#[derive(Debug, Clone)]
pub struct Planned {
    pub tag: String,
    pub checkpoint: PathBuf,
    /// Its record matches (checkpoint, cells, recipe) and is newer than the checkpoint and
    /// the recipe file.
    pub done: bool,
}

/// The checkpoints `downstream.profiling` profiles among `checkpoints`, each with whether it
/// is done: the pipeline and `trainer profiling` decide alike.
pub fn plan(
    t: &Target,
    checkpoints: &[(String, PathBuf)],
    recipe: &ConfiguredRecipe,
) -> Vec<Planned> {
    profiled(t.cfg, checkpoints)
        .into_iter()
        .map(|(tag, checkpoint)| Planned {
            done: is_done(t, &tag, &checkpoint, recipe),
            tag,
            checkpoint,
        })
        .collect()
}

/// Its record matches (checkpoint, cells, recipe) and is newer than the checkpoint and the
/// recipe file.
fn is_done(t: &Target, tag: &str, ckpt: &Path, recipe: &ConfiguredRecipe) -> bool {
    current_record(t, tag, ckpt, &recipe.recipe).is_some()
        && up_to_date(&[t.files.profiling_record(tag)], &inputs(ckpt, recipe))
}

/// The `profiling` stage: collective (every rank embeds its share of the cells), for the
/// checkpoints `downstream.profiling` names; none when it is off.
pub struct Profiling;

impl PipelineStage for Profiling {
    fn stage(&self) -> Stage {
        Stage::Profiling
    }

    fn about(&self) -> &'static str {
        "A screen's profiling recipe with the kept checkpoints (`downstream.profiling`): embeds its cells, then `metrics profile` (replicate and activity mAP)."
    }

    fn ranks(&self) -> Ranks {
        Ranks::All
    }

    fn checkpoints(&self, t: &Target, all: &[Checkpoint]) -> Vec<Checkpoint> {
        if !t.cfg.downstream.profiling.enabled {
            return vec![];
        }
        profiled(t.cfg, all)
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        let ckpt = at.checkpoint().1;
        match configured_recipe(at.t.cfg) {
            Ok(recipe) => inputs(ckpt, &recipe),
            Err(_) => vec![ckpt.to_path_buf()],
        }
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.profiling_record(at.checkpoint().0)]
    }

    /// Decided as [`plan`] decides; a recipe that does not read is not done, and
    /// [`Self::run`] says why.
    fn done(&self, at: &At) -> bool {
        let (tag, ckpt) = at.checkpoint();
        configured_recipe(at.t.cfg).is_ok_and(|recipe| is_done(at.t, tag, ckpt, &recipe))
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let (tag, ckpt) = at.checkpoint();
        let recipe = configured_recipe(at.t.cfg)?;
        run_profiling(at.t, tag, ckpt, &recipe)?;
        Ok(Flow::Continue)
    }

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        self.outputs(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(profiling: &str) -> Config {
        Config::from_yaml(&format!("downstream:\n  profiling:\n{profiling}"), "t.yaml").unwrap()
    }

    fn refusal(profiling: &str) -> String {
        configured_recipe(&config(profiling))
            .unwrap_err()
            .to_string()
    }

    /// An inline recipe is read as strictly as a recipe file: defaults filled in, a misspelt
    /// key or a bad value refused naming `downstream.profiling.recipe`.
    #[test]
    fn an_inline_recipe_is_read_strictly() {
        let r = configured_recipe(&config(
            "    recipe:\n      perturbation: Metadata_Treatment\n      normalize: {by: []}\n",
        ))
        .unwrap();
        assert_eq!(r.file, None);
        assert_eq!(r.recipe.perturbation, "Metadata_Treatment");
        assert!(r.recipe.normalize.by.is_empty());
        assert_eq!(r.recipe.map, Recipe::default().map);
        let e = refusal("    recipe:\n      perturbaton: Metadata_Treatment\n");
        assert!(
            e.contains(INLINE_RECIPE) && e.contains("unknown field `perturbaton`"),
            "{e}"
        );
        let e = refusal("    recipe:\n      map: {threshold: 2.0}\n");
        assert!(
            e.contains(INLINE_RECIPE) && e.contains("map.threshold: 2 is not a probability"),
            "{e}"
        );
        let e = refusal("    recipe:\n      normalize: {method: zscore}\n");
        assert!(e.contains(INLINE_RECIPE) && e.contains("zscore"), "{e}");
    }

    /// A recipe path is read as `metrics profile --recipe` reads it (errors name the file); no
    /// recipe is the default one.
    #[test]
    fn a_recipe_file_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r.yaml");
        std::fs::write(&path, "plate: Metadata_Batch\n").unwrap();
        let r = configured_recipe(&config(&format!("    recipe: {}\n", path.display()))).unwrap();
        assert_eq!(r.file.as_deref(), Some(path.as_path()));
        assert_eq!(r.recipe.plate, "Metadata_Batch");
        std::fs::write(&path, "plates: Metadata_Batch\n").unwrap();
        let e = refusal(&format!("    recipe: {}\n", path.display()));
        assert!(e.contains("r.yaml") && e.contains("plates"), "{e}");
        let r = configured_recipe(&config("    enabled: false\n")).unwrap();
        assert_eq!((r.recipe, r.file), (Recipe::default(), None));
    }

    #[test]
    fn last_profiles_the_newest_checkpoint_and_all_every_one() {
        let kept: Vec<(String, PathBuf)> = ["init", "epoch0", "epoch4"]
            .iter()
            .map(|t| (t.to_string(), PathBuf::from(format!("{t}.safetensors"))))
            .collect();
        let tags = |c: &Config| -> Vec<String> {
            profiled(c, &kept).into_iter().map(|(t, _)| t).collect()
        };
        assert_eq!(tags(&config("    enabled: false\n")), ["epoch4"]);
        assert_eq!(
            tags(&config("    checkpoints: all\n")),
            ["init", "epoch0", "epoch4"]
        );
        assert!(profiled(&config("    checkpoints: all\n"), &[]).is_empty());
    }
}
