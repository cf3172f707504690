//! DINO's MultiCropWrapper: crops of equal resolution share one backbone call, then the head
//! runs once on all CLS features.
use super::head::DinoHead;
use super::units::ModelUnits;
use super::vit::VisionTransformer;
use tch::{nn, Tensor};

#[derive(Debug)]
pub struct MultiCropNet {
    pub backbone: VisionTransformer,
    pub head: DinoHead,
}

impl MultiCropNet {
    /// Variables live under `backbone.*` and `head.*`, as in scDINO's teacher state dict.
    pub fn new(root: &nn::Path, vit: super::VitConfig, head: super::HeadConfig) -> Self {
        Self {
            backbone: VisionTransformer::new(root / "backbone", vit),
            head: DinoHead::new(root / "head", head),
        }
    }

    /// The network's units in forward order (backbone, then head), for the parallel
    /// strategies.
    pub fn units(&self) -> ModelUnits {
        let mut units = self.backbone.units();
        let (head, last_layer) = self.head.units();
        units.push(head);
        ModelUnits::new(units, last_layer)
    }

    /// `crops[i]`: `[B, C, Hᵢ, Wᵢ]` → logits `[crops·B, out_dim]` in crop order.
    ///
    /// Consecutive crops with the same last-dimension size form one group (as in DINO, which
    /// groups by width only), concatenated along the batch for a single backbone pass.
    pub fn forward_t(&self, crops: &[Tensor], train: bool) -> Tensor {
        self.forward_channels_t(crops, None, train)
    }

    /// [`MultiCropNet::forward_t`] on crops holding the model's channels `channels` (channel
    /// tokens only; None: all of them, in order).
    pub fn forward_channels_t(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        train: bool,
    ) -> Tensor {
        self.forward_with_backbone_t(crops, channels, train).0
    }

    /// [`MultiCropNet::forward_channels_t`] that also returns the backbone's CLS features of
    /// every crop, `[crops·B, D]` in crop order (what DINOv2's KoLeo reads on the global
    /// crops).
    pub fn forward_with_backbone_t(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        train: bool,
    ) -> (Tensor, Tensor) {
        let mut features = Vec::new();
        let mut start = 0;
        while start < crops.len() {
            let width = crops[start].size()[3];
            let end = start
                + crops[start..]
                    .iter()
                    .take_while(|c| c.size()[3] == width)
                    .count();
            let batch = Tensor::cat(&crops[start..end], 0);
            features.push(self.backbone.forward_channels_t(&batch, channels, train));
            start = end;
        }
        let features = Tensor::cat(&features, 0);
        (self.head.forward_t(&features, train), features)
    }
}
