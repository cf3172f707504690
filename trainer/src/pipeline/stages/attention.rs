//! The `attention` stage: attention maps of the picked held-out images with each checkpoint.
use crate::analysis::attention::{self, AttentionImage};
use crate::config::Stage;
use crate::pipeline::stage::{At, Flow, PipelineStage};
use crate::pipeline::stage_error::{read_json, StageError};
use crate::pipeline::target::Target;
use std::path::{Path, PathBuf};

/// Attention maps of the picked held-out images with `ckpt`: `attention_images/{tag}/…`.
pub fn run_attention(
    t: &Target,
    ckpt: &Path,
    tag: &str,
) -> Result<Vec<AttentionImage>, StageError> {
    let ms = t.mean_std()?;
    Ok(attention::write_attention_maps(
        t.cfg,
        t.combination,
        ckpt,
        &ms,
        &t.files.attention_dir(tag),
    )?)
}

/// The `attention` stage, on rank 0.
pub struct Attention;

impl PipelineStage for Attention {
    fn stage(&self) -> Stage {
        Stage::Attention
    }

    fn about(&self) -> &'static str {
        "Last-block CLS attention maps of a few held-out images per class (PNG)."
    }

    fn inputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.checkpoint().1.to_path_buf(), at.t.run.mean_std()]
    }

    fn outputs(&self, at: &At) -> Vec<PathBuf> {
        vec![at.t.files.attention_manifest(at.checkpoint().0)]
    }

    fn run(&self, at: &At) -> Result<Flow, StageError> {
        let (tag, ckpt) = at.checkpoint();
        run_attention(at.t, ckpt, tag)?;
        Ok(Flow::Continue)
    }

    /// This run's maps, and the other runs' the report shows beside them, so the report is
    /// rewritten when one of those runs writes newer maps.
    fn reported(&self, at: &At) -> Vec<PathBuf> {
        let mut files = self.outputs(at);
        // An unreadable config is the report's error to give (it names the file).
        files.extend(
            beside_maps(at.t)
                .into_iter()
                .flatten()
                .filter(|b| b.tag.is_some())
                .map(|b| b.dir.join(crate::layout::ATTENTION_MANIFEST)),
        );
        files
    }
}

/// Another run's attention maps of the same channels (`downstream.attention.beside`), for the
/// report to show under this run's, image by image.
#[derive(Debug)]
pub struct BesideMaps {
    /// The run's config, name and model folder, as the report names it.
    pub label: String,
    /// Its newest checkpoint with maps of these channels; `None` before it has any, and when
    /// it has no combination of these channels (`missing` says which).
    pub tag: Option<String>,
    /// The folder its maps' paths are relative to.
    pub dir: PathBuf,
    pub images: Vec<AttentionImage>,
    /// Why there are no maps: the run trains none of this combination.
    pub missing: Option<String>,
}

impl BesideMaps {
    /// Its maps of the image `img` shows, at the same size: both runs pick the same held-out
    /// images when they share the data, the seed and the combination.
    pub fn of(&self, img: &AttentionImage) -> Option<&AttentionImage> {
        self.images
            .iter()
            .find(|o| o.class == img.class && o.file == img.file && o.size == img.size)
    }
}

/// The checkpoint tags `t` has a complete set of maps of (its manifest written last), in
/// training order: read from its attention folder, so a run analysed by `trainer attention`
/// alone counts too.
pub(crate) fn attention_tags(t: &Target) -> Vec<String> {
    let root = t.files.attention_dir("");
    let mut tags: Vec<String> = std::fs::read_dir(&root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|tag| t.files.attention_manifest(tag).exists())
        .collect();
    crate::pipeline::target::sort_tags(&mut tags);
    tags
}

/// The newest maps of every run `t`'s config lists in `downstream.attention.beside`, of the
/// combination with `t`'s channel names in `t`'s order (matched by name, so the other run may
/// order its channels and combinations otherwise).
pub fn beside_maps(t: &Target) -> Result<Vec<BesideMaps>, StageError> {
    let names = t.channel_names();
    let mut all = Vec::new();
    for path in &t.cfg.downstream.attention.beside {
        let other = crate::train::init_layout::load_config(path).map_err(|source| {
            StageError::BesideConfig {
                path: path.clone(),
                source,
            }
        })?;
        let combination = other.channel_sets.iter().position(|set| {
            set.iter()
                .map(|&c| &other.data.channel_names[c])
                .eq(names.iter())
        });
        let mut maps = BesideMaps {
            label: format!("{} ({})", path.display(), other.run.name),
            tag: None,
            dir: PathBuf::new(),
            images: vec![],
            missing: None,
        };
        let Some(combination) = combination else {
            maps.missing = Some(format!(
                "it has no channel combination {}",
                names.join(" + ")
            ));
            all.push(maps);
            continue;
        };
        let o = Target::new(&other, combination)?;
        maps.label = format!("{}, {}", maps.label, other.model_dir_name(&o.channels));
        maps.tag = attention_tags(&o).pop();
        if let Some(tag) = &maps.tag {
            maps.dir = o.files.attention_dir(tag);
            maps.images = read_json(&o.files.attention_manifest(tag))?;
        }
        all.push(maps);
    }
    Ok(all)
}
