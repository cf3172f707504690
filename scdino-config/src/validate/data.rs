//! `data:` — splits, sample order, the object-store client and the channels; it also turns
//! `data.channel_combinations` into channel indices, once.
use crate::{
    CellChannels, ChannelCombination, DataFormat, DataSection, Invalid, SampleOrder, ScreenLayout,
    ScreenSection, Validator,
};

impl DataSection {
    /// Returns `data.channel_combinations` as channel indices, in file order.
    pub(crate) fn validate(&self, v: &Validator) -> Result<Vec<Vec<usize>>, Invalid> {
        self.validate_sampling(v)?;
        self.validate_object_store(v)?;
        v.check(
            !self.images_are_rgb,
            "data.images_are_rgb",
            "RGB images are not supported yet; multi-channel TIFFs only",
        )?;
        self.validate_channel_names(v)?;
        self.validate_screen(v)?;
        self.channel_sets(v)
    }

    fn validate_screen(&self, v: &Validator) -> Result<(), Invalid> {
        let Some(screen) = &self.screen else {
            return Ok(());
        };
        v.check(
            screen.box_size >= 1,
            "data.screen.box_size",
            "must be at least 1 (the side of the box cut around each cell, in pixels)",
        )?;
        v.check(
            self.format == DataFormat::Auto,
            "data.format",
            "must be auto with data.screen (a screen is read as its layout says; \
             `trainer data pack` packs its cells into shards, read with data.screen unset)",
        )?;
        if screen.layout == ScreenLayout::Chammi {
            return self.validate_chammi(screen, v);
        }
        v.check(
            screen.cell_channels == CellChannels::Shared,
            "data.screen.layout",
            "reads every channel of every cell, but data.screen.cell_channels: own (each cell \
             with its own channels) is for `layout: chammi`, whose datasets differ in channels",
        )?;
        for (set, key) in [
            (screen.image_root.is_some(), "image_root"),
            (screen.dataset_column.is_some(), "dataset_column"),
            (screen.datasets.is_some(), "datasets"),
            (!screen.rows.is_empty(), "rows"),
            (!screen.dataset_channels.is_empty(), "dataset_channels"),
        ] {
            v.check(
                !set,
                &format!("data.screen.{key}"),
                "is for `layout: chammi` only (CHAMMI's tiled crops)",
            )?;
        }
        v.check(
            screen.objects.is_some() || screen.labels.is_some(),
            "data.screen",
            "names no cells: set `objects` (an object table with each cell's centre) or \
             `labels` (a label image per site)",
        )?;
        v.check(
            !screen.mask_objects || screen.labels.is_some(),
            "data.screen.mask_objects",
            "needs `data.screen.labels` (the label images that say which pixels are the cell's)",
        )?;
        if let Some(c) = &screen.center_columns {
            v.check(
                c.len() == 2,
                "data.screen.center_columns",
                &format!("has {} names but needs two: [X, Y]", c.len()),
            )?;
        }
        v.check(
            screen.site_cache >= 1,
            "data.screen.site_cache",
            "must be at least 1 (decoded sites kept per process)",
        )?;
        Ok(())
    }

    /// CHAMMI's tiled crops are whole cells: the keys that find and cut cells in sites do
    /// not apply, and are refused rather than silently ignored.
    fn validate_chammi(&self, screen: &ScreenSection, v: &Validator) -> Result<(), Invalid> {
        for (set, key) in [
            (screen.objects.is_some(), "objects"),
            (screen.labels.is_some(), "labels"),
            (screen.center_columns.is_some(), "center_columns"),
            (screen.mask_objects, "mask_objects"),
        ] {
            v.check(
                !set,
                &format!("data.screen.{key}"),
                "does not apply to `layout: chammi` (each image is one whole cell)",
            )?;
        }
        v.check(
            screen.cell_channels == CellChannels::Shared || self.order == SampleOrder::Exact,
            "data.order",
            "must be exact with data.screen.cell_channels: own (each global batch is drawn \
             from the cells of one channel set, in an exact shuffle)",
        )?;
        for (dataset, names) in &screen.dataset_channels {
            v.check(
                !names.is_empty(),
                &format!("data.screen.dataset_channels.{dataset}"),
                "names no channels",
            )?;
        }
        Ok(())
    }

    fn validate_sampling(&self, v: &Validator) -> Result<(), Invalid> {
        v.fraction_open(self.train_fraction, "data.train_fraction")?;
        v.check(
            self.mean_std_fraction > 0.0 && self.mean_std_fraction <= 1.0,
            "data.mean_std_fraction",
            &format!(
                "is {} but must be in (0, 1]: the share of images used to estimate mean/std",
                self.mean_std_fraction
            ),
        )?;
        v.check(
            self.shuffle_buffer >= 1,
            "data.shuffle_buffer",
            "must be at least 1 (1 keeps each shard's stored order)",
        )?;
        v.check(
            !(self.order == SampleOrder::ShardSequential && self.format == DataFormat::Folder),
            "data.order",
            "shard_sequential needs a packed dataset (data.format: shards or auto); \
             pack one with `trainer data pack`",
        )?;
        v.check(
            self.order != SampleOrder::Sites || self.screen.is_some(),
            "data.screen",
            "is needed by `data.order: sites`, which reads a screen's cells site by site \
             (for per-cell images use data.order: exact, for packed shards shard_sequential)",
        )
    }

    fn validate_object_store(&self, v: &Validator) -> Result<(), Invalid> {
        let store = &self.object_store;
        v.check(
            store.max_concurrency > 0,
            "data.object_store.max_concurrency",
            "must be at least 1 (GET requests in flight)",
        )?;
        v.check(
            store.shard_chunk_bytes > 0,
            "data.object_store.shard_chunk_bytes",
            "must be at least 1 (bytes per chunk GET; 64 MiB by default)",
        )?;
        if let Some(ep) = &store.endpoint {
            v.check(
                ep.starts_with("http://") || ep.starts_with("https://"),
                "data.object_store.endpoint",
                &format!("{ep:?} must start with http:// or https://"),
            )?;
            v.check(
                !ep.starts_with("http://") || store.allow_http,
                "data.object_store.endpoint",
                &format!("{ep:?} is plain HTTP: set data.object_store.allow_http: true (local S3-compatible servers only)"),
            )?;
        }
        Ok(())
    }

    fn validate_channel_names(&self, v: &Validator) -> Result<(), Invalid> {
        v.check(
            !self.channel_names.is_empty(),
            "data.channel_names",
            "name at least one channel (one name per channel of the TIFF files, in file order)",
        )?;
        for (i, name) in self.channel_names.iter().enumerate() {
            let key = format!("data.channel_names[{i}]");
            v.check(!name.is_empty(), &key, "channel names must not be empty")?;
            v.check(
                !name.contains('_') && !name.contains('/'),
                &key,
                &format!("channel name {name:?} must not contain '_' or '/' (they are used in folder names)"),
            )?;
            if self.channel_names[..i].contains(name) {
                return Err(v.err(&key, &format!("channel name {name:?} appears twice")));
            }
        }
        Ok(())
    }

    fn channel_sets(&self, v: &Validator) -> Result<Vec<Vec<usize>>, Invalid> {
        let n_channels = self.channel_names.len();
        v.check(
            !self.channel_combinations.is_empty(),
            "data.channel_combinations",
            "list at least one channel combination, e.g. \"01234\" for all five channels",
        )?;
        let mut channel_sets = Vec::with_capacity(self.channel_combinations.len());
        for (i, combo) in self.channel_combinations.iter().enumerate() {
            let key = format!("data.channel_combinations[{i}]");
            let set = channel_set(combo).map_err(|m| v.err(&key, &m))?;
            for &c in &set {
                v.check(
                    c < n_channels,
                    &key,
                    &format!(
                        "channel {c} does not exist: the images have {n_channels} channels ({}), numbered 0 to {}",
                        self.channel_names.join(", "),
                        n_channels - 1
                    ),
                )?;
            }
            if channel_sets.contains(&set) {
                return Err(v.err(&key, "this channel combination is listed twice"));
            }
            channel_sets.push(set);
        }
        Ok(channel_sets)
    }
}

/// Parses `"01234"` or `[0, 1]` into channel indices (order kept, duplicates refused).
fn channel_set(combo: &ChannelCombination) -> Result<Vec<usize>, String> {
    let set: Vec<usize> = match combo {
        ChannelCombination::Digits(s) => s
            .chars()
            .map(|ch| {
                ch.to_digit(10).map(|d| d as usize).ok_or_else(|| {
                    format!("{s:?} must be channel digits like \"024\" (found {ch:?}); use a list like [10, 11] for channels above 9")
                })
            })
            .collect::<Result<_, _>>()?,
        ChannelCombination::Indices(v) => v.clone(),
    };
    if set.is_empty() {
        return Err("a channel combination needs at least one channel".into());
    }
    for (i, c) in set.iter().enumerate() {
        if set[..i].contains(c) {
            return Err(format!("channel {c} is selected twice"));
        }
    }
    Ok(set)
}
