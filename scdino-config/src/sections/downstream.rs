//! `downstream:`: the analyses after training.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The analyses run after training (scDINO `downstream_analyses`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct DownstreamSection {
    /// New. Also analyse the network as it was before its first step (tag `init`: features,
    /// kNN, evaluation, UMAP and attention maps beside every trained checkpoint's, and in the
    /// report), the baseline every learning claim needs. Training writes
    /// `checkpoint_init.safetensors` when it starts from scratch with this on; a run already
    /// trained without it has no such checkpoint (the initial weights are not kept).
    pub score_untrained: bool,
    pub features: FeaturesSection,
    pub attention: AttentionSection,
    pub knn: KnnSection,
    pub umap: UmapSection,
    pub linear_probe: LinearProbeSection,
    pub metrics: MetricsSection,
    pub profiling: ProfilingSection,
}

/// New (not in scDINO): the profiling field's recipe on a screen as a pipeline stage
/// (`profiling`, after attention): the checkpoint's features of every cell of a screen
/// (`trainer embed`, docs/embedding.md), then `trainer metrics profile` on them (aggregate per
/// well, normalise to the negative controls, select features, replicate and activity mAP;
/// docs/scoring.md), shown in the report. Off by default: it needs a screen whose cells carry
/// a plate, a well, a perturbation and negative controls.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ProfilingSection {
    /// Run the stage.
    pub enabled: bool,
    /// The screen to embed: a run config file whose `data` section names it (`data.screen`,
    /// as `trainer embed --screen` reads it). Null, with `images` null too: this run's own
    /// `data`, which must then be a screen.
    pub screen: Option<String>,
    /// Per-cell TIFFs to embed instead of a screen (a folder, or an `s3://`, `gs://` or
    /// `az://` prefix, as `trainer embed --images`), their `Metadata_*` from `path_pattern`
    /// and `metadata`.
    pub images: Option<String>,
    /// With `images`: `Metadata_*` columns parsed from each image's path, as `trainer embed
    /// --path-pattern` (e.g. `{Plate}/{Well}/{Site}_{Cell}.tiff`).
    pub path_pattern: Option<String>,
    /// With `images`: a CSV joined to the images' metadata, as `trainer embed --metadata`.
    pub metadata: Option<String>,
    /// The recipe of `trainer metrics profile`: the path of a recipe file, or the recipe
    /// itself as a mapping (the keys of docs/scoring.md, "The recipe file"; checked when
    /// `trainer config check` or the stage reads it); null = the default (JUMP) recipe. A
    /// relative path, and an inline recipe's blocklist, are relative to the directory the
    /// trainer runs in.
    pub recipe: Option<serde_json::Value>,
    /// Which checkpoints are profiled (each one embeds the whole screen).
    pub checkpoints: ProfiledCheckpoints,
}

impl Default for ProfilingSection {
    fn default() -> Self {
        Self {
            enabled: false,
            screen: None,
            images: None,
            path_pattern: None,
            metadata: None,
            recipe: None,
            checkpoints: ProfiledCheckpoints::Last,
        }
    }
}

/// `downstream.profiling.checkpoints`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ProfiledCheckpoints {
    /// The newest numbered checkpoint only (the trained network's answer).
    Last,
    /// Every checkpoint the pipeline analyses (`init` too, with `score_untrained`).
    All,
}

/// New (not in scDINO): the image-based profiling field's scores of each evaluated
/// checkpoint's profile table (`trainer metrics`, docs/scoring.md), shown in the report and
/// the combinations table. A score whose columns the table lacks (no donor folders, one donor
/// only) is skipped and the report says why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MetricsSection {
    /// Compute the scores at all.
    pub enabled: bool,
    /// The label column: replicate-retrieval mAP groups its rows, the batch scores keep it.
    pub label: String,
    /// The batch column of the batch scores (batch silhouette, graph connectivity,
    /// leave-one-batch-out F1), also the mAP's `pos_diffby` (replicates across batches).
    pub batch: String,
    /// Draws of the mAP's null distribution (its p-values).
    pub null_size: usize,
    /// Neighbours of graph connectivity's kNN graph, counting the row itself (scanpy's).
    pub n_neighbors: usize,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            enabled: true,
            label: "Metadata_Class".into(),
            batch: "Metadata_Donor".into(),
            null_size: 1000,
            n_neighbors: 15,
        }
    }
}

/// New (DINO's standard evaluation, not in scDINO): multinomial logistic regression on the
/// frozen, L2-normalised CLS features (`trainer evaluate`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LinearProbeSection {
    /// L2 strengths λ tried (objective: mean cross-entropy + λ/2·‖W‖², the bias unpenalised;
    /// scikit-learn's `C` is 1/(λ·n)); the best on the validation split is refit on all
    /// training features.
    pub l2: Vec<f64>,
    /// Share of the training features held out to choose λ (seeded by `run.seed`).
    pub validation_fraction: f64,
    /// L-BFGS iterations at most per fit.
    pub max_iterations: usize,
}

impl Default for LinearProbeSection {
    fn default() -> Self {
        Self {
            l2: vec![1e-6, 1e-5, 1e-4, 1e-3, 1e-2],
            validation_fraction: 0.2,
            max_iterations: 500,
        }
    }
}

/// `downstream_analyses.compute_cls_features`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeaturesSection {
    /// Apply the dataset mean/std before the backbone.
    pub normalize: bool,
    /// scDINO `num_gpus` of `compute_cls_features`.
    pub num_gpus: usize,
    /// Images per forward pass of the features stage.
    pub batch_size_per_gpu: usize,
    /// scDINO `num_workers` of `compute_cls_features`.
    pub num_workers: usize,
    /// Which network of the checkpoint to embed with.
    pub checkpoint_key: CheckpointKey,
    /// Resize each image (bilinear) to `resize_length` before the backbone.
    pub resize: bool,
    /// Side the images are resized to when `resize` is on.
    pub resize_length: usize,
    /// scDINO `use_mean_patch_embedding`, for a checkpoint trained on other channels: the
    /// patch-embedding kernel is averaged over the checkpoint's input channels and repeated
    /// once per selected channel. Applies whenever set, even if the counts match (as scDINO).
    pub use_mean_patch_embedding: bool,
    /// scDINO `custom_embedding_map` (its `use_custom_embedding_map` is implied by a non-empty
    /// map): image channel index -> checkpoint input channel, e.g. `{2: 0, 4: 1}` embeds
    /// channel 2 with the checkpoint's channel 0. Every selected channel needs an entry.
    /// Cannot be combined with `use_mean_patch_embedding` (scDINO silently preferred the mean).
    pub custom_embedding_map: BTreeMap<usize, usize>,
    /// A `fixed` model asked for a combination that lacks some of its trained channels:
    /// `refuse` (default), or `zeros`: the missing channels are fed as zeros after
    /// normalisation (each one at its dataset mean), how the all-channel model of scDINO's
    /// way is scored against channel-adaptive models on a subset.
    pub missing_channels: MissingChannels,
    /// `model.channels: bag` only: how a combination's per-channel CLS features become its
    /// one feature, for every analysis (the features files and profiles, kNN, evaluate, the
    /// linear probe, UMAP, the combinations table and the report all use it).
    pub bag_pool: BagPool,
    /// `model.channels: tokens` only: what a combination's feature is made of, for every
    /// analysis (as `bag_pool` for bag models). The TorchScript export gives the same feature of every channel.
    pub tokens_pool: TokensPool,
}

/// `downstream.features.tokens_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokensPool {
    /// The CLS token after the final norm (D): ChannelViT's and DiChaViT's feature.
    #[default]
    Cls,
    /// The CLS token, then for each channel of the combination in order the mean of its patch
    /// tokens, each part L2-normalised, concatenated ((k+1)·D for k channels): DINO's linear
    /// evaluation adds the average-pooled patch tokens to the CLS token, here per channel, so a
    /// combination keeps every channel's own dimensions as bag's `concat` does.
    ClsAndChannels,
    /// `cls_and_channels` of the pass over the combination's channels together (the joint
    /// view, where channels read each other), then for each channel in order its
    /// `cls_and_channels` from a pass over that channel alone (bag's view of it), each view
    /// weighing the same ((3k+1)·D for k channels; a single channel's feature is its
    /// `cls_and_channels`, 2·D). Costs k+1 passes. In a joint pass a bright channel's
    /// tokens overwrite a dark one's, so a combination's channel parts lose what each channel
    /// alone shows; the alone views keep it, the joint view keeps what only the channels
    /// together show (BENCHMARKS.md, issue 48 run 16).
    JointAndAlone,
}

impl TokensPool {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            TokensPool::Cls => "cls",
            TokensPool::ClsAndChannels => "cls_and_channels",
            TokensPool::JointAndAlone => "joint_and_alone",
        }
    }
}

/// `downstream.features.bag_pool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BagPool {
    /// DINO Bag-of-Channels: each channel's L2-normalised CLS feature, concatenated in channel
    /// order (k·D for k channels; every channel keeps its own dimensions).
    #[default]
    Concat,
    /// The mean of the channels' L2-normalised CLS features, L2-normalised (D whatever the
    /// combination): features of different channel subsets lie in one space and compare.
    Mean,
}

impl BagPool {
    /// The YAML spelling.
    pub fn name(&self) -> &'static str {
        match self {
            BagPool::Concat => "concat",
            BagPool::Mean => "mean",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MissingChannels {
    Refuse,
    Zeros,
}

impl FeaturesSection {
    /// Neither of scDINO's patch-embedding adapters is configured: a fixed model is used on
    /// exactly the channels it was trained on.
    pub fn is_unadapted(&self) -> bool {
        !self.use_mean_patch_embedding && self.custom_embedding_map.is_empty()
    }
}

impl Default for FeaturesSection {
    fn default() -> Self {
        Self {
            normalize: true,
            num_gpus: 2,
            batch_size_per_gpu: 24,
            num_workers: 8,
            checkpoint_key: CheckpointKey::Teacher,
            resize: true,
            resize_length: 224,
            use_mean_patch_embedding: false,
            custom_embedding_map: BTreeMap::new(),
            missing_channels: MissingChannels::Refuse,
            bag_pool: BagPool::Concat,
            tokens_pool: TokensPool::Cls,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointKey {
    Teacher,
    Student,
}

/// `downstream_analyses.attention_visualisation`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AttentionSection {
    /// `num_images_per_class`.
    pub images_per_class: usize,
    /// `resize_attention_image`.
    pub resize: bool,
    /// `image_size`: side of the image the attention is computed on.
    pub image_size: usize,
    /// The run configs of other models of the same images (e.g. a `bag` run beside a
    /// `tokens` one), whose attention maps the report shows under this run's, image by image:
    /// which channel each model looks at, and where, side by side. Relative paths are relative
    /// to the directory the trainer runs in. Not in scDINO.
    pub beside: Vec<PathBuf>,
}

impl Default for AttentionSection {
    fn default() -> Self {
        Self {
            images_per_class: 1,
            resize: true,
            image_size: 480,
            beside: vec![],
        }
    }
}

/// `downstream_analyses.kNN.global`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KnnSection {
    /// `n_neighbors`: every k evaluated.
    pub k: Vec<usize>,
    /// `temperature` of the exp(sim/T) vote weights.
    pub temperature: f64,
}

impl Default for KnnSection {
    fn default() -> Self {
        Self {
            k: vec![5, 10, 50, 100, 200, 500],
            temperature: 0.1,
        }
    }
}

/// `downstream_analyses.umap_eval` (scDINO ignored n_neighbors and min_dist; we honour them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UmapSection {
    /// UMAP's `n_neighbors`: the size of the neighbourhood of the fuzzy graph.
    pub n_neighbors: usize,
    /// UMAP's `min_dist`: how tightly embedded points may pack (at most `spread`).
    pub min_dist: f64,
    /// Dimensions of the embedding; must be 2 (it exists to be plotted).
    pub n_components: usize,
    /// The distance between CLS features.
    pub metric: UmapMetric,
    /// UMAP's `spread`: the scale of the embedded points.
    pub spread: f64,
    /// Optimisation epochs of the layout.
    pub epochs: usize,
    /// scDINO's TopOMetry plots; must be false (TopOMetry is a Python library).
    pub topometry_plots: bool,
}

impl Default for UmapSection {
    fn default() -> Self {
        Self {
            n_neighbors: 30,
            min_dist: 0.4,
            n_components: 2,
            metric: UmapMetric::Euclidean,
            spread: 1.1,
            epochs: 100,
            topometry_plots: false,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UmapMetric {
    Euclidean,
    Cosine,
    Manhattan,
    Correlation,
}
