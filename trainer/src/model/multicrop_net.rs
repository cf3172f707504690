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
    /// `train.channel_dino_weight` (channel tokens): the forwards also give each channel's
    /// own token (the mean of its patch tokens) through the DINO head.
    pub channel_tokens_out: bool,
}

/// One forward of every crop: the DINO head's logits and the backbone's CLS features
/// (`[crops·B, K]`, `[crops·B, D]`, crop order) and, with [`MultiCropNet::channel_tokens_out`],
/// the head's logits of each channel's own token, `[crops·B·k, K]` in (crop, image, channel)
/// order, so that the DINO loss's per-crop chunks pair the same (image, channel) across crops.
pub struct CropsForward {
    pub logits: Tensor,
    pub cls: Tensor,
    pub channel_logits: Option<Tensor>,
}

/// What one iBOT forward gives: the DINO head's logits and the backbone's CLS features of
/// every crop (`[crops·B, K]`, `[crops·B, D]`, crop order) and the iBOT head's logits of the
/// masked patches of the global crops (`[M, K']`, row-major order of the masks).
pub struct IbotForward {
    pub logits: Tensor,
    pub cls: Tensor,
    pub patch_logits: Tensor,
    /// As [`CropsForward::channel_logits`].
    pub channel_logits: Option<Tensor>,
}

/// Each channel's own token of `patches` (`[I, k·n, D]`, channel-major): the mean of its n
/// patch tokens, `[I·k, D]` in (image, channel) order.
fn channel_tokens(patches: &Tensor, k: i64) -> Tensor {
    let (images, _, d) = patches.size3().expect("patch tokens are [I, k·n, D]");
    patches
        .reshape([images, k, -1, d])
        .mean_dim(2, false, None)
        .flatten(0, 1)
}

impl MultiCropNet {
    /// Variables live under `backbone.*` and `head.*`, as in scDINO's teacher state dict.
    pub fn new(root: &nn::Path, vit: super::VitConfig, head: super::HeadConfig) -> Self {
        Self {
            backbone: VisionTransformer::new(root / "backbone", vit),
            head: DinoHead::new(root / "head", head),
            ibot_head: None,
            channel_tokens_out: false,
        }
    }

    /// The forwards also give each channel's own token's logits (`train.channel_dino_weight`).
    pub fn with_channel_tokens_out(mut self) -> Self {
        self.channel_tokens_out = true;
        self
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
        let out = self.forward_crops_t(crops, channels, train);
        (out.logits, out.cls)
    }

    /// Every crop through the backbone and the head: [`CropsForward`].
    pub fn forward_crops_t(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        train: bool,
    ) -> CropsForward {
        let (cls, tokens): (Vec<Tensor>, Vec<Option<Tensor>>) = self
            .cls_by_width(crops, channels, train)
            .into_iter()
            .unzip();
        let cls = Tensor::cat(&cls, 0);
        let channel_logits = self.channel_logits(tokens, train);
        CropsForward {
            logits: self.head.forward_t(&cls, train),
            cls,
            channel_logits,
        }
    }

    /// The head's logits of the channel tokens of each run of crops, concatenated in crop
    /// order (one head call); None without [`MultiCropNet::channel_tokens_out`].
    fn channel_logits(&self, tokens: Vec<Option<Tensor>>, train: bool) -> Option<Tensor> {
        let tokens: Option<Vec<Tensor>> = tokens.into_iter().collect();
        tokens.map(|t| self.head.forward_t(&Tensor::cat(&t, 0), train))
    }

    /// The backbone's CLS features of `crops`, one tensor per run of consecutive crops of
    /// the same width (DINO groups by width only), each run concatenated along the batch for a
    /// single backbone pass; with [`MultiCropNet::channel_tokens_out`] also the run's channel
    /// tokens ([`channel_tokens`]).
    fn cls_by_width(
        &self,
        crops: &[Tensor],
        channels: Option<&[i64]>,
        train: bool,
    ) -> Vec<(Tensor, Option<Tensor>)> {
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
            features.push(if self.channel_tokens_out {
                let (cls, patches) = self
                    .backbone
                    .forward_features_t(&batch, channels, None, train);
                (cls, Some(channel_tokens(&patches, batch.size()[1])))
            } else {
                (
                    self.backbone.forward_channels_t(&batch, channels, train),
                    None,
                )
            });
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
        let global_tokens = self
            .channel_tokens_out
            .then(|| channel_tokens(&patches, global.size()[1]));
        let (mut cls, mut tokens) = (vec![cls], vec![global_tokens]);
        for (c, t) in self.cls_by_width(&crops[2..], channels, train) {
            cls.push(c);
            tokens.push(t);
        }
        let cls = Tensor::cat(&cls, 0);
        let channel_logits = self.channel_logits(tokens, train);
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
            channel_logits,
        }
    }
}
