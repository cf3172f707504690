//! `train:`: optimisation, schedules, precision, the parallel strategy and iBOT.
use serde::{Deserialize, Serialize};

/// Optimisation and schedules (scDINO `train_scDINO` + `hyperparameters`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// `train_scDINO.epochs`.
    pub epochs: usize,
    /// `train_scDINO.saveckp_freq`: keep `checkpointNNNN` every n epochs (also the analysed epochs).
    pub checkpoint_every: usize,
    /// `train_scDINO.num_gpus`: processes per node, which `trainer launch` starts when its
    /// `--nproc` is not given (the launched command's config decides). A Slurm job's ranks
    /// come from the cluster file (`slurm.gpus_per_node`) instead.
    pub num_gpus: usize,
    /// `train_scDINO.batch_size_per_gpu`.
    pub batch_size_per_gpu: usize,
    /// `train_scDINO.dist_url`: `env://` or `tcp://host:port`.
    pub dist_url: String,
    /// `hyperparameters.momentum_teacher`: start of the EMA momentum schedule (ends at 1).
    pub momentum_teacher: f64,
    /// `hyperparameters.warmup_teacher_temp`.
    pub warmup_teacher_temp: f64,
    /// `hyperparameters.teacher_temp` (misspelled `techer_temp` in scDINO's yaml, hence ignored there).
    pub teacher_temp: f64,
    /// `hyperparameters.warmup_teacher_temp_epochs`.
    pub warmup_teacher_temp_epochs: usize,
    /// `hyperparameters.use_fp16` (true = fp16), extended with bf16.
    pub precision: Precision,
    /// `hyperparameters.weight_decay`: start of the (increasing) cosine schedule.
    pub weight_decay: f64,
    /// `hyperparameters.weight_decay_end`.
    pub weight_decay_end: f64,
    /// `hyperparameters.clip_grad`: per-parameter gradient norm limit; 0 disables.
    pub clip_grad: f64,
    /// `hyperparameters.freeze_last_layer`: epochs during which the head's last layer is frozen.
    pub freeze_last_layer: usize,
    /// `hyperparameters.lr`: peak learning rate for a global batch of 256 (scaled linearly).
    pub lr: f64,
    /// `hyperparameters.warmup_epochs` (misspelled `warump_epochs` in scDINO's yaml).
    pub warmup_epochs: usize,
    /// `hyperparameters.min_lr`.
    pub min_lr: f64,
    /// `hyperparameters.optimizer`.
    pub optimizer: Optimizer,
    /// Iterations between progress lines and metric updates (scDINO prints every 10).
    pub log_every: usize,
    /// How long a collective may wait for the other ranks before the run fails (a dead rank
    /// must end the job, not hang it). The AWS port used 120 s; torch's default is 30 min.
    pub dist_timeout_seconds: u64,
    /// `auto` (the local rank's GPU if libtorch sees one, else CPU), `cpu` or `cuda`. scDINO
    /// always trained on `cuda:{local_rank}`.
    pub device: crate::DeviceChoice,
    /// How several ranks share the work. `ddp` (scDINO's DistributedDataParallel): every
    /// rank holds the whole model and gradients are averaged. `fsdp`: parameters, gradients,
    /// AdamW state and teacher are sharded across ranks (1/N each between steps), for models
    /// whose training state does not fit one device. Same results either way.
    pub strategy: Strategy,
    /// DDP: start each ~25 MB gradient bucket's all-reduce during backward, as soon as its
    /// gradients exist, so communication overlaps compute (PyTorch DDP's behaviour). `false`
    /// reduces all buckets after backward (simpler; for comparison and debugging).
    pub ddp_overlap: bool,
    /// FSDP (PyTorch's `reshard_after_forward`): `true` frees each transformer block's
    /// gathered parameters right after its forward and all-gathers them again just before its
    /// backward, so only about one block is gathered at a time (more communication, least
    /// memory). `false` keeps a block gathered from its first forward until its gradients are
    /// accumulated, so the whole student is gathered between forward and backward (fewer
    /// all-gathers, one full student of extra memory).
    pub fsdp_reshard_after_forward: bool,
    /// Capture the whole training step (teacher and student forward, loss, centre update,
    /// backward, clipping, AdamW, teacher EMA) once per crop-shape set as a CUDA graph and
    /// replay it, so a step costs one graph launch instead of thousands of kernel launches.
    /// Off by default until measured on a GPU. Where a step cannot be captured (a CPU device,
    /// several ranks, fp16 loss scaling, iBOT, KoLeo, Sinkhorn-Knopp centring, `model.channels:
    /// bag` or `tokens`) the run trains as without it and says why in one warning line.
    pub cuda_graphs: bool,
    /// How `lr` follows the global batch B (all ranks): `linear` = lr·B/256 (scDINO, Goyal et
    /// al.), `sqrt` = lr·sqrt(B/256) (often better for Adam at large B). Reported at start.
    pub lr_scaling: LrScaling,
    /// What a detected collapse does (checked every `log_every` iterations after the lr and
    /// teacher-temperature warm-ups): `warn` names it with remedies and goes on, `stop` also
    /// writes a checkpoint and ends training with an error, so a cluster job stops burning
    /// GPU hours on a run that learns nothing (see `trainer::train::collapse`).
    pub on_collapse: OnCollapse,
    /// The peak dense TFLOP/s of one rank's device at the training precision (e.g. 989 for an
    /// H100 SXM in bf16, 312 for an A100 in bf16, 19.5 for an A100 in fp32). With it, the
    /// progress lines, Prometheus and TensorBoard report the model FLOPs utilisation (MFU)
    /// next to the achieved FLOP/s. Without it (the default), a GPU the trainer's peak table
    /// knows by name (`trainer::gpu::peak_tflops`) gets its peak from there; anything else
    /// reports only the FLOP/s.
    pub peak_tflops: Option<f64>,
    /// DINOv2's KoLeo regulariser (`dino.koleo_loss_weight`, 0.1 in DINOv2; 0 = off, scDINO):
    /// this weight times the Kozachenko–Leonenko entropy estimate of the student's
    /// L2-normalised backbone CLS tokens, per global crop and per rank, added to the loss. It
    /// spreads the features apart. A row whose nearest neighbour is the same vector (a
    /// duplicated image, or a batch of one) has no defined estimate: it is left out of the
    /// mean instead of giving DINOv2's huge −log(1e-8) term and its exploding gradient.
    pub koleo_weight: f64,
    /// How the teacher's outputs become targets: `ema` (scDINO, DINO: subtract an EMA centre,
    /// then a sharp softmax) or `sinkhorn_knopp` (DINOv2's `sinkhorn_knopp_teacher`, 3
    /// iterations: targets whose prototypes are used equally across the global batch, the
    /// sums all-reduced over the ranks; no centre).
    pub centering: Centering,
    /// DINOv2's iBOT masked-patch objective (Zhou et al., ICLR 2022), off by default.
    pub ibot: IbotSection,
    /// `model.channels: tokens` only: the channels the teacher sees in a step. `step`
    /// (ChannelViT): the step's sampled subset, as the student. `all`: every channel the
    /// batch's cells hold, so the student on a subset learns to predict the teacher's view of
    /// all of them. With `step` nothing asks a subset's tokens to keep what each channel
    /// carries once another channel is in the image: on the PBMC-like cells a `step` model's
    /// brightfield+DAPI feature fell below its DAPI-alone one (BENCHMARKS.md, run 12). `all`
    /// did not change that (run 13, three seeds): it stays off by default, for experiments.
    pub teacher_channels: TeacherChannels,
    /// `model.channels: tokens` only: the weight of a second DINO term on each channel's own
    /// token — the mean of that channel's patch tokens after the last block (what
    /// `downstream.features.tokens_pool: cls_and_channels` reads), through the DINO head — with
    /// every (image, channel) a sample, as `bag` trains each channel's CLS, and its own
    /// centring (`train.centering`). 0 (the default) leaves it off. Without it a channel's
    /// tokens learn only through iBOT and the CLS's attention, and a dark channel's part of
    /// the feature barely varies between cells (BENCHMARKS.md, run 14). At 1.0 on the
    /// PBMC-like cells it brought BF+DAPI from 12.7 to 5.2 points of 20-NN below `bag` (run 15),
    /// and read with `downstream.features.tokens_pool: joint_and_alone` to 6.3 above (run 16).
    pub channel_dino_weight: f64,
    /// `model.channels: tokens` only: the fraction of training steps that train on one channel
    /// alone (drawn uniformly, in a stream of its own), the others on the sampler's subset
    /// (hierarchical or `model.dichavit.sampling`). A `tokens` feature of a single channel —
    /// and each channel's own part of `tokens_pool: joint_and_alone` — is that channel passed
    /// alone, which hierarchical sampling trains in 1/C² of the steps per channel (4 % at five
    /// channels), where `bag` trains every channel alone in every step. With a channel-mixing
    /// block that pass differs most from the mixed passes that fill the rest of training. 0
    /// (the default) leaves the sampler as it is; 1 trains every step on one channel.
    pub single_channel_steps: f64,
}

/// `train.teacher_channels`: the teacher's channels in a `tokens` step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TeacherChannels {
    /// The step's subset, as the student (ChannelViT's hierarchical channel sampling).
    #[default]
    Step,
    /// Every channel the batch holds; the student still sees the step's subset.
    All,
}

/// iBOT (`dinov2/loss/ibot_patch_loss.py`, the `ibot` block of DINOv2's config): the student
/// sees some patches of each global crop replaced by a learned mask token and learns to
/// predict, for those patches, the teacher's distribution of the unmasked crop. It trains the
/// patch tokens (attention maps, dense features) besides the CLS token, and adds a second,
/// per-patch target the teacher cannot satisfy by collapsing the CLS alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IbotSection {
    /// `ibot.loss_weight` (1.0 in DINOv2): the patch loss's weight in the total loss; 0 = off
    /// (scDINO, and no mask token in the model).
    pub weight: f64,
    /// `ibot.mask_sample_probability` (0.5): the share of each rank's global-crop images that
    /// get a mask in a step (rounded down); the others are seen whole.
    pub mask_probability: f64,
    /// `ibot.mask_ratio_min_max` (`[0.1, 0.5]`): the share of a masked image's patches that is
    /// masked, spread evenly over this range across the masked images of a step, in block
    /// rectangles (DINOv2's `MaskingGenerator`).
    pub mask_ratio: [f64; 2],
    /// `ibot.separate_head`: `false` (DINOv2's default) projects the masked patch tokens with
    /// the DINO head; `true` gives them their own head, `ibot_head`, with `out_dim` prototypes
    /// and never BatchNorm (DINOv2's heads have none; `model.use_bn_in_head` would
    /// batch-normalise one rank's few masked patches, possibly none), so that a recipe with a
    /// BatchNorm DINO head can keep the patch targets off it.
    pub separate_head: bool,
    /// `ibot.head_n_prototypes`: the separate head's number of prototypes; unset =
    /// `model.out_dim`. Only with `separate_head: true`.
    pub out_dim: Option<usize>,
    /// The teacher temperature of the patch targets; unset = the DINO teacher temperature of
    /// the epoch, as DINOv2 does.
    pub teacher_temp: Option<f64>,
    /// The student temperature of the patch loss (`iBOTPatchLoss.student_temp`).
    pub student_temp: f64,
}

impl IbotSection {
    /// Whether the objective is on (a weight above zero).
    pub fn enabled(&self) -> bool {
        self.weight > 0.0
    }

    /// The prototypes the masked patches are projected to: the separate head's `out_dim`
    /// (default `model_out_dim`), or the DINO head's `model_out_dim`.
    pub fn prototypes(&self, model_out_dim: usize) -> usize {
        match (self.separate_head, self.out_dim) {
            (true, Some(k)) => k,
            _ => model_out_dim,
        }
    }
}

impl Default for IbotSection {
    fn default() -> Self {
        Self {
            weight: 0.0,
            mask_probability: 0.5,
            mask_ratio: [0.1, 0.5],
            separate_head: false,
            out_dim: None,
            teacher_temp: None,
            student_temp: 0.1,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Centering {
    Ema,
    SinkhornKnopp,
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            epochs: 10,
            checkpoint_every: 2,
            num_gpus: 2,
            batch_size_per_gpu: 30,
            dist_url: "env://".into(),
            momentum_teacher: 0.996,
            warmup_teacher_temp: 0.04,
            teacher_temp: 0.04,
            warmup_teacher_temp_epochs: 0,
            precision: Precision::Fp16,
            weight_decay: 0.04,
            weight_decay_end: 0.4,
            clip_grad: 3.0,
            freeze_last_layer: 1,
            lr: 0.0005,
            warmup_epochs: 5,
            min_lr: 1e-6,
            optimizer: Optimizer::Adamw,
            log_every: 10,
            dist_timeout_seconds: 1800,
            device: crate::DeviceChoice::Auto,
            strategy: Strategy::Ddp,
            ddp_overlap: true,
            fsdp_reshard_after_forward: true,
            cuda_graphs: false,
            lr_scaling: LrScaling::Linear,
            on_collapse: OnCollapse::Warn,
            peak_tflops: None,
            koleo_weight: 0.0,
            centering: Centering::Ema,
            ibot: IbotSection::default(),
            teacher_channels: TeacherChannels::Step,
            channel_dino_weight: 0.0,
            single_channel_steps: 0.0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Strategy {
    Ddp,
    Fsdp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnCollapse {
    Warn,
    Stop,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LrScaling {
    Linear,
    Sqrt,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Precision {
    Fp32,
    Bf16,
    Fp16,
}

/// `train.optimizer`: the values validation accepts are exactly these variants (serde
/// refuses any other spelling), and the reference page lists them from this declaration, so
/// the two cannot disagree. scDINO's `sgd` and `lars` are not implemented, hence not here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Optimizer {
    Adamw,
}
