//! `trainer embed --checkpoint` a timm folder: an off-the-shelf model embeds every channel of
//! each image, in file order, prepared as its `config.json` says
//! ([`crate::analysis::pretrained`]).
use super::{Model, ModelError};
use crate::analysis::features::{Embedder, FeaturesError, Preparer};
use crate::analysis::pretrained;
use std::path::Path;
use tch::Device;

/// Images per forward pass when `--batch-size` is not given (a timm folder records no run
/// config; the features stage's default).
const BATCH_SIZE: usize = 64;

impl Model {
    pub(super) fn from_timm_folder(
        path: &Path,
        channels: Option<&[String]>,
        device: Device,
        bf16: bool,
    ) -> Result<Self, ModelError> {
        if let Some(names) = channels {
            return Err(ModelError::Unusable {
                path: path.to_path_buf(),
                what: format!("--channels {}: a timm folder records no image layout to pick channels by name from; it embeds every channel of each image, in file order (as many as the model's input channels)", names.join(",")),
            });
        }
        let p = pretrained::for_images(path, device).map_err(FeaturesError::from)?;
        let mut vs = p.vs;
        if bf16 {
            vs.bfloat16();
        }
        let embedder = Embedder::fixed(p.vit);
        let dim = embedder.dim(p.channel_names.len()) as usize;
        Ok(Self {
            embedder,
            _vs: vs,
            preparer: Preparer::pretrained(p.input),
            device,
            bf16,
            channel_names: p.channel_names,
            dim,
            batch_size: BATCH_SIZE,
            checkpoint: path.display().to_string(),
            epoch: None,
        })
    }
}
