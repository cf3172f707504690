//! `augment:`: the multi-crop augmentation.
use serde::{Deserialize, Serialize};

/// Multi-crop augmentation (scDINO `DataAugmentationDINO`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AugmentSection {
    /// `hyperparameters.global_crops_scale` (yaml default; scDINO's argparse default is (0.4, 1)).
    pub global_crops_scale: (f64, f64),
    /// Side of the two global crops (224 in scDINO).
    pub global_crop_size: usize,
    /// `hyperparameters.local_crops_number`.
    pub local_crops_number: usize,
    /// `hyperparameters.local_crops_scale` (yaml default; argparse default is (0.05, 0.4)).
    pub local_crops_scale: (f64, f64),
    /// Side of the local crops (96 in scDINO).
    pub local_crop_size: usize,
    /// Where the crops are made (ours; scDINO always augmented in its DataLoader workers).
    /// `cpu`: the loader's worker threads decode and augment (exact torchvision parity).
    /// `device`: workers only decode and min–max scale, and the crops are batched tensor
    /// operations on the training device, which frees CPU cores for fast GPUs; same random
    /// parameters, bicubic `grid_sample` instead of crop + `interpolate` (differs only at
    /// crop edges). Needs equally sized images (use `data.center_crop` otherwise).
    pub augment_on: AugmentOn,
    /// Horizontal and vertical flips, p 0.5 each (scDINO: always). Off where orientation
    /// carries meaning (digits: a flipped 6 is a 9; oriented tissue).
    pub flips: bool,
    /// Per-channel brightness, p 0.8 (scDINO: always).
    pub brightness: bool,
    /// Gaussian blur, p 1.0/0.1/0.5 on global 1/global 2/locals (scDINO: always).
    pub blur: bool,
    /// Solarisation of global crop 2, p 0.2 (scDINO: always). Off for small, low-contrast
    /// images, where it inverts most of the signal.
    pub solarize: bool,
}

/// `augment.augment_on`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum AugmentOn {
    #[default]
    Cpu,
    Device,
}

impl Default for AugmentSection {
    fn default() -> Self {
        Self {
            global_crops_scale: (0.14, 1.0),
            global_crop_size: 224,
            local_crops_number: 8,
            local_crops_scale: (0.05, 0.14),
            local_crop_size: 96,
            augment_on: AugmentOn::Cpu,
            flips: true,
            brightness: true,
            blur: true,
            solarize: true,
        }
    }
}
