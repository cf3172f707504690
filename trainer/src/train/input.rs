//! What the training loop feeds the model, for `augment.augment_on: cpu | device`: the
//! loader's per-sample work for an epoch, and the crops of each loaded batch.
//!
//! * `cpu`: workers read, min–max scale and run [`MultiCropAugment`] straight into their
//!   slots of the batch's crop tensors; [`TrainInput::crops`] only moves them to the device.
//! * `device`: workers read and min–max scale into one `[B, C, H, W]` tensor;
//!   [`TrainInput::crops`] moves it to the device and runs [`DeviceAugment`] there, with the
//!   same `(seed, epoch, index)` keys. The training loop calls it through
//!   [`super::ahead`], on a thread of its own one batch ahead, so the augmentation of batch
//!   k+1 overlaps step k: on the CPU both run at once; on a GPU the augmentation kernels are
//!   launched while the step's are still queued (both on the default stream, so the GPU runs
//!   them in turn, but the launch work and host-side parameter sampling overlap).
//!
//! Workers reuse per-thread buffers for the file bytes, the decoded and the preprocessed
//! image, and write crops straight into the batch tensors: no allocation per sample.
use super::loader::{LoadError, LoadedBatch, Samples};
use crate::augment::{AugmentError, DeviceAugment, MultiCropAugment, SampleKey};
use crate::config::AugmentOn;
use crate::data::ImageChw;
use std::cell::RefCell;
use std::sync::Arc;
use tch::{Device, Tensor};

/// Reads and preprocesses one dataset index into the given buffer, reusing its allocation
/// (`Ok(false)`: dropped, e.g. an undecodable image under `data.on_corrupt: skip`).
pub type ImageFn = dyn Fn(usize, &mut ImageChw) -> Result<bool, LoadError> + Send + Sync;

thread_local! {
    /// A loader thread's preprocessed image, reused for every sample it handles.
    static IMAGE: RefCell<ImageChw> = RefCell::new(ImageChw::default());
}

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

    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, LoadError> {
        IMAGE.with(|img| {
            let img = &mut *img.borrow_mut();
            if !(self.image)(i, img)? {
                return Ok(false);
            }
            self.augment
                .apply_into(img, SampleKey::new(self.seed, self.epoch, i as u64), out)
                .map_err(|source| LoadError::Augment { index: i, source })?;
            Ok(true)
        })
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

    fn copy_checked(
        &self,
        i: usize,
        img: &ImageChw,
        out: &mut [&mut [f32]],
    ) -> Result<bool, LoadError> {
        let got = [img.channels, img.height, img.width];
        if got != self.shape[0] {
            return Err(LoadError::Shape {
                index: i,
                detail: format!(
                    "{}×{}×{} but the first image of the epoch is {}×{}×{}; \
                     augment.augment_on: device needs equally sized images (set data.center_crop)",
                    got[0], got[1], got[2], self.shape[0][0], self.shape[0][1], self.shape[0][2]
                ),
            });
        }
        out[0].copy_from_slice(&img.data);
        Ok(true)
    }
}

impl Samples for ScaledSamples {
    fn shapes(&self) -> &[[usize; 3]] {
        &self.shape
    }

    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, LoadError> {
        IMAGE.with(|img| {
            let img = &mut *img.borrow_mut();
            if !(self.image)(i, img)? {
                return Ok(false);
            }
            self.copy_checked(i, img, out)
        })
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
    ) -> Result<Arc<dyn Samples>, LoadError> {
        if self.device_augment.is_none() {
            return Ok(Arc::new(AugmentedSamples::new(
                image,
                self.augment.clone(),
                self.seed,
                epoch,
            )));
        }
        let mut shape = None;
        let mut img = ImageChw::default();
        for &i in order {
            if image(i, &mut img)? {
                shape = Some([img.channels, img.height, img.width]);
                break;
            }
        }
        let shape = shape.ok_or(LoadError::NoUsableImage)?;
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
