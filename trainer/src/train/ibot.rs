//! DINOv2's iBOT masked-patch objective, its pieces: which patches of each global crop the
//! student sees masked (`dinov2/data/masking.py` `MaskingGenerator` and the mask part of
//! `dinov2/data/collate.py`), the teacher's targets for those patches (the EMA-centred
//! softmax of `dinov2/loss/ibot_patch_loss.py`; Sinkhorn-Knopp is [`super::loss::sinkhorn_knopp`],
//! whose result does not depend on the number of rows, so the masked patches' own count needs
//! no extra all-reduce), and the loss (`iBOTPatchLoss.forward_masked`).
//!
//! Masks are drawn from the run's seeded generator, not Python's `random`: the same
//! distribution as DINOv2 (block rectangles of log-uniform aspect ratio, per-image mask ratios
//! spread evenly over the configured range), not the same draws.
use super::loss::{sinkhorn_knopp, SINKHORN_ITERATIONS};
use super::loss_term::{
    LossTerm, MaskRequest, StepContext, StudentOutputs, TeacherOutputs, TermInfo,
};
use crate::config::Centering;
use crate::distributed::group::DistError;
use crate::distributed::Collective;
use scdino_base::rng::SplitMix64;
use tch::{Kind, Tensor};

/// Uniform in `[lo, hi)`, from 53 random bits.
fn uniform(rng: &mut SplitMix64, lo: f64, hi: f64) -> f64 {
    lo + (hi - lo) * ((rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64)
}

/// DINOv2's `MaskingGenerator`: masks of a `height × width` patch grid made of random
/// rectangles (area at least `min_num_patches`, aspect ratio log-uniform in
/// `[min_aspect, 1/min_aspect]`) until the asked number of patches is masked or no rectangle
/// fits any more.
#[derive(Debug, Clone)]
pub struct MaskingGenerator {
    pub height: usize,
    pub width: usize,
    pub min_num_patches: usize,
    pub max_num_patches: usize,
    log_aspect: (f64, f64),
}

impl MaskingGenerator {
    /// DINOv2's settings (`ssl_meta_arch`/`train.py`): at least 4 patches a rectangle, at most
    /// half the grid, aspect 0.3 to 1/0.3.
    pub fn new(height: usize, width: usize) -> Self {
        let min_aspect: f64 = 0.3;
        Self {
            height,
            width,
            min_num_patches: 4,
            max_num_patches: height * width / 2,
            log_aspect: (min_aspect.ln(), (1.0 / min_aspect).ln()),
        }
    }

    /// One rectangle, up to ten tries; the number of newly masked patches.
    fn add_rectangle(
        &self,
        mask: &mut [bool],
        max_mask_patches: usize,
        rng: &mut SplitMix64,
    ) -> usize {
        let mut delta = 0;
        for _ in 0..10 {
            let target_area = uniform(rng, self.min_num_patches as f64, max_mask_patches as f64);
            let aspect = uniform(rng, self.log_aspect.0, self.log_aspect.1).exp();
            let h = (target_area * aspect).sqrt().round() as usize;
            let w = (target_area / aspect).sqrt().round() as usize;
            if w < self.width && h < self.height {
                let top = rng.below((self.height - h + 1) as u64) as usize;
                let left = rng.below((self.width - w + 1) as u64) as usize;
                let rows = top..top + h;
                let masked: usize = rows
                    .clone()
                    .map(|i| {
                        mask[i * self.width + left..i * self.width + left + w]
                            .iter()
                            .filter(|&&m| m)
                            .count()
                    })
                    .sum();
                let new = h * w - masked;
                if 0 < new && new <= max_mask_patches {
                    for i in rows {
                        for m in &mut mask[i * self.width + left..i * self.width + left + w] {
                            if !*m {
                                *m = true;
                                delta += 1;
                            }
                        }
                    }
                }
                if delta > 0 {
                    break;
                }
            }
        }
        delta
    }

    /// A row-major mask with at most `num_masking_patches` patches set.
    pub fn mask(&self, num_masking_patches: usize, rng: &mut SplitMix64) -> Vec<bool> {
        let mut mask = vec![false; self.height * self.width];
        let mut count = 0;
        while count < num_masking_patches {
            let room = (num_masking_patches - count).min(self.max_num_patches);
            let delta = self.add_rectangle(&mut mask, room, rng);
            if delta == 0 {
                break;
            }
            count += delta;
        }
        mask
    }
}

/// The masks of one step's `b` global-crop images (DINOv2's collate): `floor(b ·
/// probability)` images get a mask whose target ratio is drawn in the i-th of as many equal
/// slices of `ratio`, the others none, in a shuffled order. `[b, height·width]`, bool.
pub fn collate_masks(
    generator: &MaskingGenerator,
    b: usize,
    probability: f64,
    ratio: (f64, f64),
    rng: &mut SplitMix64,
) -> Tensor {
    let n = generator.height * generator.width;
    let masked = (b as f64 * probability) as usize;
    let step = (ratio.1 - ratio.0) / masked.max(1) as f64;
    let mut masks: Vec<Vec<bool>> = (0..b)
        .map(|i| {
            if i < masked {
                let lo = ratio.0 + step * i as f64;
                let target = (n as f64 * uniform(rng, lo, lo + step)) as usize;
                generator.mask(target, rng)
            } else {
                vec![false; n]
            }
        })
        .collect();
    // Fisher-Yates, as random.shuffle.
    for i in (1..masks.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        masks.swap(i, j);
    }
    let flat: Vec<bool> = masks.into_iter().flatten().collect();
    Tensor::from_slice(&flat).reshape([b as i64, n as i64])
}

/// iBOT's loss on the masked patches (`forward_masked`): `student`: the student head's logits
/// of the masked patches `[M, K]` (row-major order of `masks`), `teacher`: the teacher's
/// target distributions of the same patches `[M, K]`, `masks`: `[B, N]`. Each image's masked
/// patches weigh 1/(its count), the sum is divided by B: every masked image counts alike.
pub fn patch_loss(student: &Tensor, teacher: &Tensor, masks: &Tensor, student_temp: f64) -> Tensor {
    let b = masks.size()[0];
    let per_patch = (teacher.to_kind(Kind::Float)
        * (student.to_kind(Kind::Float) / student_temp).log_softmax(-1, Kind::Float))
    .sum_dim_intlist(-1, false, Kind::Float);
    let counts = masks.sum_dim_intlist(-1, true, Kind::Float).clamp_min(1.0);
    let weights = counts.reciprocal().expand_as(masks).masked_select(masks);
    -(per_patch * weights).sum(Kind::Float) / b as f64
}

/// The EMA centre of the teacher's patch logits (`iBOTPatchLoss`'s `center`), kept apart from
/// the CLS centre.
#[derive(Debug)]
pub struct PatchCenter {
    /// `[1, K]`, float32.
    pub center: Tensor,
    pub momentum: f64,
}

impl PatchCenter {
    pub fn new(out_dim: i64, momentum: f64, device: tch::Device) -> Self {
        Self {
            center: Tensor::zeros([1, out_dim], (Kind::Float, device)),
            momentum,
        }
    }

    /// `softmax((teacher - center) / temp)` of the masked patches' teacher logits `[M, K]`.
    pub fn targets(&self, teacher: &Tensor, temp: f64) -> Tensor {
        tch::no_grad(|| {
            ((teacher.to_kind(Kind::Float) - &self.center) / temp).softmax(-1, Kind::Float)
        })
    }

    /// DINOv2's update after the step's targets (`reduce_center_update` and
    /// `apply_center_update`): the mean over this rank's masked patches, averaged over the
    /// ranks. A rank without masked patches adds zero (DINOv2's mean of none would be NaN).
    pub fn update(
        &mut self,
        teacher: &Tensor,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        tch::no_grad(|| {
            let rows = teacher.size()[0].max(1);
            let mut mean = teacher
                .to_kind(Kind::Float)
                .sum_dim_intlist(0, true, Kind::Float)
                / rows as f64;
            group.all_reduce_sum(&mut mean)?;
            let batch = mean / group.world_size() as f64;
            self.center = &self.center * self.momentum + batch * (1.0 - self.momentum);
            Ok(())
        })
    }
}

/// The seed of a step's masks on `rank`: a function of the step's seed (itself one of the run
/// seed and the iteration), so that a resumed run draws the same masks, and of the rank, so
/// that ranks mask their different images independently.
pub fn mask_seed(step_seed: i64, rank: usize) -> u64 {
    scdino_base::rng::mix64(step_seed as u64 ^ (rank as u64).rotate_left(32))
}

/// `train.ibot` as one step uses it: the masking, the loss's settings and the patch centre;
/// the iBOT term of the step's loss.
#[derive(Debug)]
pub struct IbotObjective {
    pub weight: f64,
    pub mask_probability: f64,
    pub mask_ratio: (f64, f64),
    /// None: the DINO teacher temperature of the epoch.
    pub teacher_temp: Option<f64>,
    pub student_temp: f64,
    /// The EMA centre of the patch targets (`ibot_patch_loss.center` in checkpoints); unused
    /// with Sinkhorn-Knopp centring.
    pub center: PatchCenter,
    /// `train.centering`: the patch targets are centred as the CLS targets are.
    pub centering: Centering,
    /// This step's patch targets, between [`LossTerm::targets`] and the update.
    targets: Option<Tensor>,
}

/// DINOv2's `iBOTPatchLoss` centre momentum.
pub const PATCH_CENTER_MOMENTUM: f64 = 0.9;

impl IbotObjective {
    /// The objective `cfg` asks for, None when `train.ibot` is off. The centre has the
    /// prototypes of the head that projects the patches (the separate head's, or the DINO
    /// head's).
    pub fn from_config(cfg: &crate::config::Config, device: tch::Device) -> Option<Self> {
        let ibot = &cfg.train.ibot;
        ibot.enabled().then(|| {
            let out_dim = ibot.prototypes(cfg.model.out_dim);
            Self {
                weight: ibot.weight,
                mask_probability: ibot.mask_probability,
                mask_ratio: (ibot.mask_ratio[0], ibot.mask_ratio[1]),
                teacher_temp: ibot.teacher_temp,
                student_temp: ibot.student_temp,
                center: PatchCenter::new(out_dim as i64, PATCH_CENTER_MOMENTUM, device),
                centering: cfg.train.centering,
                targets: None,
            }
        })
    }

    pub const INFO: TermInfo = TermInfo {
        name: "ibot",
        label: "iBOT",
        help: "iBOT masked-patch term of the last iteration's loss, weight included",
    };

    /// The masks of one step's `images` global-crop images of `grid` patches (rows, columns),
    /// drawn from `seed` (a function of the run seed, the iteration and the rank, so a
    /// resumed run draws the same masks and the ranks draw different ones).
    pub fn masks(&self, images: usize, grid: (usize, usize), seed: u64) -> Tensor {
        let generator = MaskingGenerator::new(grid.0, grid.1);
        let mut rng = SplitMix64::new(seed);
        collate_masks(
            &generator,
            images,
            self.mask_probability,
            self.mask_ratio,
            &mut rng,
        )
    }

    /// [`IbotObjective::masks`] over the patch tokens of a model whose images give
    /// `token_channels` tokens per patch position (ChannelViT tokens: one per channel, laid
    /// out channel-major; 1 otherwise): a masked position is masked in every channel, so the
    /// student cannot read it from another stain. `[images, token_channels·patches]`.
    pub fn token_masks(
        &self,
        images: usize,
        grid: (usize, usize),
        token_channels: usize,
        seed: u64,
    ) -> Tensor {
        self.masks(images, grid, seed)
            .repeat([1, token_channels as i64])
    }
}

impl LossTerm for IbotObjective {
    fn uncapturable(&self) -> Option<&'static str> {
        Some("iBOT draws each step's masks on the host")
    }
    fn info(&self) -> &'static TermInfo {
        &Self::INFO
    }

    /// Which patch tokens of this rank's global crops the student sees masked.
    fn masks(&self, r: &MaskRequest) -> Option<Tensor> {
        let seed = mask_seed(r.step_seed, r.rank);
        Some(
            self.token_masks(r.images, r.grid, r.token_channels, seed)
                .to_device(r.device),
        )
    }

    /// The masked patches' targets, centred as the CLS targets are.
    fn targets(
        &mut self,
        teacher: &TeacherOutputs,
        ctx: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        let t = teacher
            .patch_logits
            .as_ref()
            .expect("iBOT's masks give the teacher's patch logits");
        let temp = self.teacher_temp.unwrap_or(ctx.teacher_temp);
        self.targets = Some(match self.centering {
            Centering::SinkhornKnopp => sinkhorn_knopp(t, temp, SINKHORN_ITERATIONS, group)?,
            Centering::Ema => self.center.targets(t, temp),
        });
        Ok(())
    }

    fn value(&self, student: &StudentOutputs, _: &TeacherOutputs, ctx: &StepContext) -> Tensor {
        let expect = "iBOT's masks give the student's patch logits and the targets";
        let (Some(s), Some(targets), Some(masks)) =
            (&student.patch_logits, &self.targets, ctx.masks)
        else {
            panic!("{expect}");
        };
        patch_loss(s, targets, masks, self.student_temp) * self.weight
    }

    /// Moves the EMA patch centre past this step's teacher patch logits.
    fn update(
        &mut self,
        teacher: &TeacherOutputs,
        _: &StepContext,
        group: &mut dyn Collective,
    ) -> Result<(), DistError> {
        self.targets = None;
        if let (Some(t), Centering::Ema) = (&teacher.patch_logits, self.centering) {
            self.center.update(&t.to_kind(Kind::Float), group)?;
        }
        Ok(())
    }

    fn state(&self) -> Vec<(&'static str, Tensor)> {
        vec![("ibot_patch_loss.center", self.center.center.shallow_clone())]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_are_rectangles_within_the_asked_count() {
        let g = MaskingGenerator::new(14, 14);
        let mut rng = SplitMix64::new(3);
        for target in [0, 4, 20, 60, 98, 150] {
            for _ in 0..50 {
                let m = g.mask(target, &mut rng);
                let count = m.iter().filter(|&&x| x).count();
                assert!(count <= target, "{count} > {target}");
                if target >= 4 {
                    assert!(count > 0, "no rectangle for {target}");
                }
            }
        }
    }

    #[test]
    fn a_share_of_the_images_is_masked_with_ratios_across_the_range() {
        let g = MaskingGenerator::new(14, 14);
        let mut rng = SplitMix64::new(11);
        let masks = collate_masks(&g, 64, 0.5, (0.1, 0.5), &mut rng);
        assert_eq!(masks.size(), [64, 196]);
        let counts = Vec::<i64>::try_from(masks.sum_dim_intlist(1, false, Kind::Int64)).unwrap();
        let masked = counts.iter().filter(|&&c| c > 0).count();
        assert_eq!(masked, 32);
        assert!(counts.iter().all(|&c| c <= (196.0 * 0.5) as i64));
        let mut sorted: Vec<i64> = counts.into_iter().filter(|&c| c > 0).collect();
        sorted.sort();
        assert!(sorted[0] <= 30 && sorted[31] >= 70, "{sorted:?}");
    }
}
