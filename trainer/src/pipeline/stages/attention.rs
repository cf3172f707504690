//! The `attention` stage: attention maps of the picked held-out images with each checkpoint.
use crate::analysis::attention::{self, AttentionImage};
use crate::config::Stage;
use crate::pipeline::stage::{At, Flow, PipelineStage};
use crate::pipeline::stage_error::StageError;
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

    fn reported(&self, at: &At) -> Vec<PathBuf> {
        self.outputs(at)
    }
}
