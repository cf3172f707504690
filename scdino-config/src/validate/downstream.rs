//! `downstream:` — one check per analysis (features, attention, kNN, linear probe, UMAP,
//! profiling metrics, the profiling stage); the features' options depend on the model's
//! channel mode and the data's channels, the profiling stage's source on the data.
use crate::{
    AttentionSection, BagPool, ChannelMode, DataSection, DownstreamSection, FeaturesSection,
    Invalid, KnnSection, LinearProbeSection, MetricsSection, MissingChannels, ModelSection,
    ProfilingSection, TokensPool, UmapSection, Validator,
};

impl DownstreamSection {
    pub(crate) fn validate(
        &self,
        v: &Validator,
        model: &ModelSection,
        data: &DataSection,
    ) -> Result<(), Invalid> {
        self.features.validate(v, model, data)?;
        self.attention.validate(v, model)?;
        self.knn.validate(v)?;
        self.linear_probe.validate(v)?;
        self.umap.validate(v)?;
        self.metrics.validate(v)?;
        self.profiling.validate(v, data)
    }
}

impl FeaturesSection {
    fn validate(
        &self,
        v: &Validator,
        model: &ModelSection,
        data: &DataSection,
    ) -> Result<(), Invalid> {
        v.check(
            self.num_gpus > 0,
            "downstream.features.num_gpus",
            "must be at least 1",
        )?;
        v.check(
            self.batch_size_per_gpu > 0,
            "downstream.features.batch_size_per_gpu",
            "must be at least 1",
        )?;
        v.check(
            self.resize_length >= model.patch_size,
            "downstream.features.resize_length",
            "must be at least one patch",
        )?;
        self.validate_adaptation(v, model.channels)?;
        v.check(
            self.bag_pool == BagPool::Concat || model.channels == ChannelMode::Bag,
            "downstream.features.bag_pool",
            &format!(
                "{} pools the per-channel features of model.channels: bag; model.channels: {} gives one feature per image (leave bag_pool out, or train with channels: bag)",
                self.bag_pool.name(),
                model.channels.name()
            ),
        )?;
        v.check(
            self.tokens_pool == TokensPool::Cls || model.channels == ChannelMode::Tokens,
            "downstream.features.tokens_pool",
            &format!(
                "{} pools the channel tokens of model.channels: tokens; model.channels: {} has none (leave tokens_pool out, or train with channels: tokens)",
                self.tokens_pool.name(),
                model.channels.name()
            ),
        )?;
        let n_channels = data.channel_names.len();
        for &c in self.custom_embedding_map.keys() {
            v.check(
                c < n_channels,
                "downstream.features.custom_embedding_map",
                &format!(
                    "maps channel {c}, but the images have {n_channels} channels ({}), numbered 0 to {}",
                    data.channel_names.join(", "),
                    n_channels - 1
                ),
            )?;
        }
        Ok(())
    }

    /// The ways to use a fixed model on other channels: at most one, and only for a fixed
    /// model (an adaptive one takes any subset as it is).
    fn validate_adaptation(&self, v: &Validator, mode: ChannelMode) -> Result<(), Invalid> {
        v.check(
            !self.use_mean_patch_embedding || self.custom_embedding_map.is_empty(),
            "downstream.features.custom_embedding_map",
            "cannot be combined with use_mean_patch_embedding: choose one way to adapt the patch embedding",
        )?;
        for (set, key) in [
            (
                self.use_mean_patch_embedding,
                "downstream.features.use_mean_patch_embedding",
            ),
            (
                !self.custom_embedding_map.is_empty(),
                "downstream.features.custom_embedding_map",
            ),
        ] {
            v.check(
                !set || mode.is_fixed(),
                key,
                &format!(
                    "adapts a fixed model's patch embedding to other channels; model.channels: {} takes any subset of channels as it is",
                    mode.name()
                ),
            )?;
        }
        if self.missing_channels == MissingChannels::Zeros {
            v.check(
                mode.is_fixed(),
                "downstream.features.missing_channels",
                &format!(
                    "zeros stands in for channels a fixed model lacks; model.channels: {} takes any subset of channels as it is",
                    mode.name()
                ),
            )?;
            v.check(
                self.is_unadapted(),
                "downstream.features.missing_channels",
                "zeros cannot be combined with use_mean_patch_embedding or custom_embedding_map: choose one way to use a model on other channels",
            )?;
        }
        Ok(())
    }
}

impl AttentionSection {
    fn validate(&self, v: &Validator, model: &ModelSection) -> Result<(), Invalid> {
        v.check(
            self.image_size >= model.patch_size,
            "downstream.attention.image_size",
            "must be at least one patch",
        )?;
        for (i, path) in self.beside.iter().enumerate() {
            v.check(
                !path.as_os_str().is_empty(),
                &format!("downstream.attention.beside[{i}]"),
                "give the path of another run's config",
            )?;
            v.check(
                !self.beside[..i].contains(path),
                &format!("downstream.attention.beside[{i}]"),
                "this run is listed twice",
            )?;
        }
        Ok(())
    }
}

impl KnnSection {
    fn validate(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(
            !self.k.is_empty(),
            "downstream.knn.k",
            "list at least one k",
        )?;
        for (i, &k) in self.k.iter().enumerate() {
            v.check(
                k > 0,
                &format!("downstream.knn.k[{i}]"),
                "k must be at least 1",
            )?;
        }
        v.positive(self.temperature, "downstream.knn.temperature")
    }
}

impl LinearProbeSection {
    fn validate(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(
            !self.l2.is_empty(),
            "downstream.linear_probe.l2",
            "list at least one L2 strength",
        )?;
        for (i, &l2) in self.l2.iter().enumerate() {
            v.check(
                l2.is_finite() && l2 >= 0.0,
                &format!("downstream.linear_probe.l2[{i}]"),
                "must be a finite number ≥ 0",
            )?;
        }
        v.fraction_open(
            self.validation_fraction,
            "downstream.linear_probe.validation_fraction",
        )?;
        v.check(
            self.max_iterations > 0,
            "downstream.linear_probe.max_iterations",
            "must be at least 1",
        )
    }
}

impl UmapSection {
    fn validate(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(
            self.n_neighbors >= 2,
            "downstream.umap.n_neighbors",
            "must be at least 2",
        )?;
        v.non_negative(self.min_dist, "downstream.umap.min_dist")?;
        v.positive(self.spread, "downstream.umap.spread")?;
        v.check(
            self.min_dist <= self.spread,
            "downstream.umap.min_dist",
            &format!(
                "is {} but must not exceed spread ({})",
                self.min_dist, self.spread
            ),
        )?;
        v.check(
            self.n_components == 2,
            "downstream.umap.n_components",
            "must be 2: the embedding exists to be plotted in 2-D",
        )?;
        v.check(
            !self.topometry_plots,
            "downstream.umap.topometry_plots",
            "is not supported (TopOMetry is a Python library); set it to false",
        )?;
        v.check(
            self.epochs >= 1,
            "downstream.umap.epochs",
            "must be at least 1",
        )
    }
}

impl MetricsSection {
    /// Column names of the profile tables and sizes that make sense.
    fn validate(&self, v: &Validator) -> Result<(), Invalid> {
        for (value, key) in [
            (&self.label, "downstream.metrics.label"),
            (&self.batch, "downstream.metrics.batch"),
        ] {
            v.check(
                value.starts_with("Metadata_") && value.len() > "Metadata_".len(),
                key,
                "must name a metadata column of the profile table (`Metadata_…`)",
            )?;
        }
        v.check(
            self.label != self.batch,
            "downstream.metrics.batch",
            "must differ from downstream.metrics.label",
        )?;
        v.check(
            self.null_size > 0,
            "downstream.metrics.null_size",
            "must be at least 1",
        )?;
        v.check(
            self.n_neighbors >= 2,
            "downstream.metrics.n_neighbors",
            "must be at least 2",
        )
    }
}

impl ProfilingSection {
    /// One thing to embed, options only where they apply, and a recipe that is a path or a
    /// mapping (its keys are the trainer's to check: the recipe type lives with
    /// `trainer metrics profile`).
    fn validate(&self, v: &Validator, data: &DataSection) -> Result<(), Invalid> {
        for (value, key) in [
            (&self.screen, "downstream.profiling.screen"),
            (&self.images, "downstream.profiling.images"),
            (&self.path_pattern, "downstream.profiling.path_pattern"),
            (&self.metadata, "downstream.profiling.metadata"),
        ] {
            v.check(
                value.as_ref().is_none_or(|s| !s.trim().is_empty()),
                key,
                "must not be empty (leave it out instead)",
            )?;
        }
        v.check(
            self.screen.is_none() || self.images.is_none(),
            "downstream.profiling.images",
            "cannot be combined with downstream.profiling.screen: name one set of cells to embed",
        )?;
        for (set, key) in [
            (
                self.path_pattern.is_some(),
                "downstream.profiling.path_pattern",
            ),
            (self.metadata.is_some(), "downstream.profiling.metadata"),
        ] {
            v.check(
                !set || self.images.is_some(),
                key,
                "applies to downstream.profiling.images only (a screen's cells carry their plate, well and site)",
            )?;
        }
        v.check(
            !self.enabled
                || self.screen.is_some()
                || self.images.is_some()
                || data.screen.is_some(),
            "downstream.profiling.enabled",
            "profiles a screen, and this run's data is not one (data.screen is not set): name one with downstream.profiling.screen (a config with data.screen) or per-cell images with downstream.profiling.images",
        )?;
        let recipe_ok = match &self.recipe {
            None | Some(serde_json::Value::Object(_)) => true,
            Some(serde_json::Value::String(path)) => !path.trim().is_empty(),
            Some(_) => false,
        };
        v.check(
            recipe_ok,
            "downstream.profiling.recipe",
            "must be the path of a recipe file or the recipe as a mapping (docs/scoring.md, \"The recipe file\")",
        )
    }
}
