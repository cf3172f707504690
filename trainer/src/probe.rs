//! The forward probe behind `trainer forward`: the data path scDINO's training would take
//! (ImageFolder index → seeded split → read → channel selection → min–max) feeding the
//! ViT-DINO student and teacher on one multi-crop batch. It proves config, data and model fit
//! together before any training is launched.
use crate::config::Config;
use crate::data::{self, preprocess::preprocess, PreprocessOptions};
use crate::model::{configs_for, MultiCropNet};
use std::time::Instant;
use tch::{nn, Device, Kind, Tensor};

#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error(transparent)]
    Data(#[from] data::DataError),
    #[error("{0}")]
    Mismatch(String),
}

/// What one forward pass saw and produced.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProbeReport {
    pub dataset_images: usize,
    pub classes: Vec<String>,
    pub train_images: usize,
    pub held_out_images: usize,
    pub channels: Vec<usize>,
    pub batch_images: usize,
    /// Images of the batch with a constant channel or a NaN/∞ pixel, which min–max scaling
    /// guarded (scDINO's training would have dropped them as NaN).
    pub guarded_images: usize,
    pub batch_labels: Vec<String>,
    /// `B×C×H×W` of each crop, in crop order.
    pub crop_shapes: Vec<String>,
    pub student_output_shape: Vec<i64>,
    pub teacher_output_shape: Vec<i64>,
    pub backbone_parameters: i64,
    pub cls_feature_mean: f64,
    pub cls_feature_std: f64,
    pub seconds: f64,
}

/// Runs the probe for the config's `combination`-th channel set on up to `images` training
/// images (default: one per-GPU batch).
pub fn forward_probe(
    cfg: &Config,
    combination: usize,
    images: Option<usize>,
) -> Result<ProbeReport, ProbeError> {
    let start = Instant::now();
    let channels = cfg.channel_sets.get(combination).cloned().ok_or_else(|| {
        ProbeError::Mismatch(format!(
            "channel combination {combination} does not exist (the config lists {})",
            cfg.channel_sets.len()
        ))
    })?;
    let source = data::open_source(&cfg.data)?;
    let index = source.index();
    let split = data::configured_split(index, &cfg.data, cfg.run.seed as u32)?;
    let wanted = images.unwrap_or(cfg.train.batch_size_per_gpu);
    let opts = PreprocessOptions {
        selected_channels: Some(channels.clone()),
        center_crop: cfg.data.center_crop,
    };
    let mut batch = Vec::new();
    let mut labels = Vec::new();
    let mut guarded = 0;
    for &i in split.train.iter().take(wanted) {
        let sample = &index.samples[i];
        let raw = source.read(i)?;
        if raw.channels != cfg.file_channels() {
            return Err(ProbeError::Mismatch(format!(
                "{} has {} channels but data.channel_names lists {}",
                sample.path.display(),
                raw.channels,
                cfg.file_channels()
            )));
        }
        let (img, outcome) = preprocess(&raw, &opts)?;
        if !outcome.constant_channels.is_empty() || outcome.nonfinite_pixels > 0 {
            guarded += 1;
        }
        batch.push(Tensor::from_slice(&img.data).reshape([
            img.channels as i64,
            img.height as i64,
            img.width as i64,
        ]));
        labels.push(sample.label.clone());
    }
    if batch.is_empty() {
        return Err(ProbeError::Mismatch(
            "no training image (the split is empty)".into(),
        ));
    }
    let x = Tensor::stack(&batch, 0);
    let resize = |side: usize| {
        let s = side as i64;
        x.upsample_bicubic2d([s, s], false, None, None)
    };
    let a = &cfg.augment;
    let mut crops = vec![resize(a.global_crop_size), resize(a.global_crop_size)];
    crops.extend((0..a.local_crops_number).map(|_| resize(a.local_crop_size)));

    tch::manual_seed(cfg.run.seed as i64);
    let student_vs = nn::VarStore::new(Device::Cpu);
    let (vit, head) = configs_for(cfg, channels.len(), true);
    let student = MultiCropNet::new(&student_vs.root(), vit, head);
    let mut teacher_vs = nn::VarStore::new(Device::Cpu);
    let (vit_t, head_t) = configs_for(cfg, channels.len(), false);
    let teacher = MultiCropNet::new(&teacher_vs.root(), vit_t, head_t);
    teacher_vs
        .copy(&student_vs)
        .map_err(|e| ProbeError::Mismatch(format!("teacher cannot mirror the student: {e}")))?;

    let (s_out, t_out, cls) = tch::no_grad(|| {
        let s = student.forward_t(&crops, false);
        let t = teacher.forward_t(&crops[..2], false);
        let cls = teacher.backbone.forward_t(&crops[0], false);
        (s, t, cls)
    });
    let cls = cls.to_kind(Kind::Double);
    Ok(ProbeReport {
        dataset_images: index.len(),
        classes: index.classes.clone(),
        train_images: split.train.len(),
        held_out_images: split.held_out.len(),
        channels,
        batch_images: batch.len(),
        guarded_images: guarded,
        batch_labels: labels,
        crop_shapes: crops.iter().map(|c| shape_string(&c.size())).collect(),
        student_output_shape: s_out.size(),
        teacher_output_shape: t_out.size(),
        backbone_parameters: crate::model::count_parameters(&student_vs, "backbone."),
        cls_feature_mean: cls.mean(Kind::Double).double_value(&[]),
        cls_feature_std: cls.std(true).double_value(&[]),
        seconds: start.elapsed().as_secs_f64(),
    })
}

fn shape_string(shape: &[i64]) -> String {
    shape
        .iter()
        .map(i64::to_string)
        .collect::<Vec<_>>()
        .join("x")
}

/// What `config check` can learn about the dataset without loading it all.
#[derive(Debug, Clone)]
pub struct DatasetSummary {
    pub images: usize,
    pub classes: Vec<String>,
    pub labels: Vec<String>,
    /// Channels of the first image, which scDINO assumes every image shares.
    pub first_image_channels: usize,
    pub first_image_size: (usize, usize),
    /// Non-TIFF images that torchvision's ImageFolder would have counted (shifting scDINO's
    /// sample indices and hence its split); we skip them and the user should know.
    pub skipped_other_images: Vec<std::path::PathBuf>,
}

/// Indexes the dataset and reads its first image, checking its channel count against
/// `data.channel_names`. `Ok(None)` when `dataset_dir` does not exist on this machine (a
/// config written for a cluster path).
pub fn check_dataset(cfg: &Config) -> Result<Option<DatasetSummary>, ProbeError> {
    if let Some(dir) = cfg.data.dataset_dir.local() {
        if !dir.exists() {
            return Ok(None);
        }
    }
    let source = data::open_source(&cfg.data)?;
    let index = source.index();
    let first = index.samples.first().ok_or_else(|| {
        ProbeError::Mismatch(format!(
            "{} holds no .tif/.tiff images",
            cfg.data.dataset_dir
        ))
    })?;
    let img = source.read(0)?;
    if img.channels != cfg.file_channels() {
        return Err(ProbeError::Mismatch(format!(
            "{} has {} channels but data.channel_names lists {} ({})",
            first.path.display(),
            img.channels,
            cfg.file_channels(),
            cfg.data.channel_names.join(", ")
        )));
    }
    Ok(Some(DatasetSummary {
        images: index.len(),
        classes: index.classes.clone(),
        labels: index.label_names(),
        first_image_channels: img.channels,
        first_image_size: (img.height, img.width),
        skipped_other_images: index.skipped_other_images.clone(),
    }))
}
