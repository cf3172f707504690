//! What the training loop feeds the model, for `augment.augment_on: cpu | device`: the
//! loader's per-sample work for an epoch, and the crops of each loaded batch.
//!
//! * `cpu`: workers read, min–max scale and run [`MultiCropAugment`] straight into their
//!   slots of the batch's crop tensors; [`TrainInput::crops`] only moves them to the device.
//! * `device`: workers read and min–max scale into one `[B, C, H, W]` tensor;
//!   [`TrainInput::crops`] moves it to the device and runs [`DeviceAugment`] there, with the
//!   same `(seed, epoch, index)` keys, on the training thread right before the step. On a
//!   GPU its kernels queue on the step's stream (so they do not overlap the previous step's
//!   kernels, but the CPU is free while they run); on the CPU it is simply sequential.
use super::loader::{LoadedBatch, Samples};
use crate::augment::{AugmentError, DeviceAugment, MultiCropAugment, SampleKey};
use crate::config::AugmentOn;
use crate::data::ImageChw;
use std::sync::Arc;
use tch::{Device, Tensor};

/// Reads and preprocesses one dataset index (`None`: dropped, e.g. NaN after min–max).
pub type ImageFn = dyn Fn(usize) -> Result<Option<ImageChw>, String> + Send + Sync;

/// CPU path: the full multi-crop augmentation on the worker.
pub struct AugmentedSamples {
    image: Arc<ImageFn>,
    augment: Arc<MultiCropAugment>,
    seed: u64,
    epoch: u64,
    shapes: Vec<[usize; 3]>,
}

impl AugmentedSamples {
    pub fn new(image: Arc<ImageFn>, augment: Arc<MultiCropAugment>, seed: u64, epoch: u64) -> Self {
        let c = augment.channels();
        let shapes = (0..augment.num_crops())
            .map(|k| {
                let s = augment.policy(k).size;
                [c, s, s]
            })
            .collect();
        Self {
            image,
            augment,
            seed,
            epoch,
            shapes,
        }
    }
}

impl Samples for AugmentedSamples {
    fn shapes(&self) -> &[[usize; 3]] {
        &self.shapes
    }

    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, String> {
        let Some(img) = (self.image)(i)? else {
            return Ok(false);
        };
        self.augment
            .apply_into(&img, SampleKey::new(self.seed, self.epoch, i as u64), out)
            .map_err(|e| format!("sample {i}: {e}"))?;
        Ok(true)
    }
}

/// Device path: the min–max-scaled image itself, which must have the epoch's fixed shape.
pub struct ScaledSamples {
    image: Arc<ImageFn>,
    shape: [[usize; 3]; 1],
}

impl ScaledSamples {
    pub fn new(image: Arc<ImageFn>, shape: [usize; 3]) -> Self {
        Self {
            image,
            shape: [shape],
        }
    }
}

impl Samples for ScaledSamples {
    fn shapes(&self) -> &[[usize; 3]] {
        &self.shape
    }

    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, String> {
        let Some(img) = (self.image)(i)? else {
            return Ok(false);
        };
        let got = [img.channels, img.height, img.width];
        if got != self.shape[0] {
            return Err(format!(
                "sample {i} is {}×{}×{} but the first image of the epoch is {}×{}×{}; \
                 augment.augment_on: device needs equally sized images (set data.center_crop)",
                got[0], got[1], got[2], self.shape[0][0], self.shape[0][1], self.shape[0][2]
            ));
        }
        out[0].copy_from_slice(&img.data);
        Ok(true)
    }
}

/// The training input for one run (see the module docs).
#[derive(Debug, Clone)]
pub struct TrainInput {
    augment: Arc<MultiCropAugment>,
    device_augment: Option<DeviceAugment>,
    seed: u64,
}

impl TrainInput {
    pub fn new(augment: Arc<MultiCropAugment>, on: AugmentOn, seed: u64) -> Self {
        let device_augment = (on == AugmentOn::Device).then(|| DeviceAugment::new(augment.clone()));
        Self {
            augment,
            device_augment,
            seed,
        }
    }

    pub fn on(&self) -> AugmentOn {
        if self.device_augment.is_some() {
            AugmentOn::Device
        } else {
            AugmentOn::Cpu
        }
    }

    /// The loader's per-sample work for `epoch`. On the device path the batch shape is that
    /// of the first usable image in `order` (read once more here).
    pub fn samples(
        &self,
        image: Arc<ImageFn>,
        epoch: u64,
        order: &[usize],
    ) -> Result<Arc<dyn Samples>, String> {
        if self.device_augment.is_none() {
            return Ok(Arc::new(AugmentedSamples::new(
                image,
                self.augment.clone(),
                self.seed,
                epoch,
            )));
        }
        let mut shape = None;
        for &i in order {
            if let Some(img) = image(i)? {
                shape = Some([img.channels, img.height, img.width]);
                break;
            }
        }
        let shape = shape.ok_or("no usable image in this epoch's samples")?;
        Ok(Arc::new(ScaledSamples::new(image, shape)))
    }

    /// The model's crops `[global1, global2, local...]` of a loaded batch, on `device`.
    pub fn crops(
        &self,
        batch: &LoadedBatch,
        epoch: u64,
        device: Device,
    ) -> Result<Vec<Tensor>, AugmentError> {
        match &self.device_augment {
            None => Ok(batch.crops.iter().map(|c| c.to_device(device)).collect()),
            Some(aug) => {
                let keys: Vec<SampleKey> = batch
                    .indices
                    .iter()
                    .map(|&i| SampleKey::new(self.seed, epoch, i as u64))
                    .collect();
                aug.apply(&batch.crops[0].to_device(device), &keys)
            }
        }
    }
}
