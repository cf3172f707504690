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
    /// DINOv2's separate iBOT head (`ibot_head.*`), when `train.ibot.separate_head`; otherwise
    /// the DINO head also projects the masked patch tokens.
    pub ibot_head: Option<DinoHead>,
}

/// What one iBOT forward gives: the DINO head's logits and the backbone's CLS features of
/// every crop (`[crops·B, K]`, `[crops·B, D]`, crop order) and the iBOT head's logits of the
/// masked patches of the global crops (`[M, K']`, row-major order of the masks).
pub struct IbotForward {
    pub logits: Tensor,
    pub cls: Tensor,
    pub patch_logits: Tensor,
}

impl MultiCropNet {
    /// Variables live under `backbone.*` and `head.*`, as in scDINO's teacher state dict.
    pub fn new(root: &nn::Path, vit: super::VitConfig, head: super::HeadConfig) -> Self {
        Self {
            backbone: VisionTransformer::new(root / "backbone", vit),
            head: DinoHead::new(root / "head", head),
            ibot_head: None,
        }
    }

    /// Adds DINOv2's separate iBOT head under `ibot_head.*`.
    pub fn with_ibot_head(mut self, root: &nn::Path, head: super::HeadConfig) -> Self {
        self.ibot_head = Some(DinoHead::new(root / "ibot_head", head));
        self
    }

    /// The network's units in forward order (backbone, then head), for the parallel
    /// strategies.
    pub fn units(&self) -> ModelUnits {
        let mut units = self.backbone.units();
        let (head, mut last_layer) = self.head.units();
        units.push(head);
        if let Some(ibot) = &self.ibot_head {
            let (head, last) = ibot.units();
            units.push(head);
            last_layer.extend(last);
        }
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
        let features = Tensor::cat(&self.cls_by_width(crops, channels, train), 0);
        (self.head.forward_t(&features, train), features)
    }

    /// The backbone's CLS features of `crops`, one tensor per run of consecutive crops of
    /// the same width (DINO groups by width only), each run concatenated along the batch for a
    /// single backbone pass.
    fn cls_by_width(&self, crops: &[Tensor], channels: Option<&[i64]>, train: bool) -> Vec<Tensor> {
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
        features
    }

    /// DINOv2's iBOT forward (`ssl_meta_arch.py`): the two global crops (`crops[..2]`) go
    /// through the backbone together and give their CLS and patch tokens; the patches where
    /// `masks` (`[2·B, N]`, bool) is set are selected, and with `mask_input` (the student)
    /// they were replaced by the mask token at the input (the teacher sees the whole crop).
    /// The other crops give their CLS tokens as in [`MultiCropNet::forward_t`]. A shared head
    /// projects the CLS and masked-patch tokens in one call, as DINOv2 concatenates them.
    pub fn forward_ibot_t(
        &self,
        crops: &[Tensor],
        masks: &Tensor,
        mask_input: bool,
        channels: Option<&[i64]>,
        train: bool,
    ) -> IbotForward {
        let global = Tensor::cat(&crops[..2], 0);
        let (cls, patches) =
            self.backbone
                .forward_features_t(&global, channels, mask_input.then_some(masks), train);
        let mut cls = vec![cls];
        cls.extend(self.cls_by_width(&crops[2..], channels, train));
        let cls = Tensor::cat(&cls, 0);
        let index = masks.flatten(0, 1).nonzero().squeeze_dim(1);
        let masked = patches.flatten(0, 1).index_select(0, &index);
        let (logits, patch_logits) = match &self.ibot_head {
            Some(ibot) => (
                self.head.forward_t(&cls, train),
                ibot.forward_t(&masked, train),
            ),
            None => {
                let rows = cls.size()[0];
                let both = self
                    .head
                    .forward_t(&Tensor::cat(&[&cls, &masked], 0), train);
                let m = both.size()[0] - rows;
                (both.narrow(0, 0, rows), both.narrow(0, rows, m))
            }
        };
        IbotForward {
            logits,
            cls,
            patch_logits,
        }
    }
}
