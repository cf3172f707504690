//! From the dataset to the crops of a step, epoch by epoch. The sample order, the reads and
//! the augmentation are functions of (seed, epoch, rank, index) only, so a resumed epoch starts
//! at its batch without replaying the ones before; reads run on loader threads and crops one
//! batch ahead of the step, and batch tensors are recycled through a pool so that a step
//! allocates no input memory.
use super::{RunShape, TrainError};
use crate::augment::{AugmentOps, MultiCropAugment, MultiCropConfig};
use crate::config::{Config, OnCorrupt};
use crate::data::preprocess::preprocess_into;
use crate::data::quality;
use crate::data::{ImageChw, ImageSource, PreprocessOptions, SharedSource};
use crate::model::channels::for_mode;
use crate::model::channels::BagOfChannels;
use crate::train::ahead::{ahead, Ahead};
use crate::train::channel_set_batches::ChannelSets;
use crate::train::input::{ImageFn, TrainInput};
use crate::train::loader::{BufferPool, EpochLoader, LoadError, LoadedBatch};
use crate::train::sampler::{configured_epoch_order, iters_per_epoch, site_window_warning};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tch::Tensor;

/// What the epochs shuffle: the training split's images, or with Bag-of-Channels its
/// (image, channel) items.
pub struct TrainItems {
    pub bag: Option<Arc<BagOfChannels>>,
    pub items: Vec<usize>,
    /// The images grouped by the channels they hold, where cells bring their own
    /// (`data.screen.cell_channels: own`) and a step needs one set (not `bag`, whose items
    /// are single channels).
    pub sets: Option<ChannelSets>,
}

impl TrainItems {
    /// `train`: the training split of `source`; `mean`/`std`: of the selected channels.
    pub fn new(
        cfg: &Config,
        source: &dyn ImageSource,
        train: &[usize],
        mean: &[f32],
        std: &[f32],
    ) -> Self {
        let bag = for_mode(cfg.model.channels)
            .channel_items()
            .then(|| Arc::new(BagOfChannels::new(mean, std)));
        let (items, sets) = match &bag {
            // A cell's items are the channels it holds.
            Some(b) => {
                let c = mean.len();
                let holds = |item: usize| {
                    source
                        .cell_channels(item / c)
                        .is_none_or(|own| own.contains(&(item % c)))
                };
                (
                    b.items(train).into_iter().filter(|&it| holds(it)).collect(),
                    None,
                )
            }
            None => (train.to_vec(), ChannelSets::of(source, train)),
        };
        if let Some(s) = &sets {
            tracing::info!(
                "cells by their channels (each step's batch from one set): {}",
                s.describe(&cfg.data.channel_names)
            );
        }
        Self { bag, items, sets }
    }

    /// Steps per epoch on each rank.
    pub fn iters_per_epoch(&self, world: usize, batch: usize) -> usize {
        match &self.sets {
            Some(s) => s.iters_per_epoch(world, batch),
            None => iters_per_epoch(self.items.len(), world, batch),
        }
    }
}

/// A loaded batch and the model's crops of it, on the training device.
pub type PreparedBatch = (LoadedBatch, Vec<Tensor>);

/// The training input of one run: what the epochs draw from and how an item becomes crops.
pub struct TrainingData {
    source: SharedSource,
    train: TrainItems,
    input: TrainInput,
    prep: PreprocessOptions,
    /// Corrupt images skipped this epoch (`data.on_corrupt: skip`).
    corrupt_skipped: Arc<AtomicU64>,
    pool: BufferPool,
    device: tch::Device,
}

impl TrainingData {
    pub fn new(
        cfg: &Config,
        source: SharedSource,
        train: TrainItems,
        channels: &[usize],
        (mean, std): (&[f32], &[f32]),
        device: tch::Device,
    ) -> Result<Self, TrainError> {
        if let Some(w) =
            site_window_warning(&cfg.data, source.as_ref(), cfg.train.batch_size_per_gpu)
        {
            tracing::warn!("{w}");
        }
        let (augment_mean, augment_std) = match &train.bag {
            Some(_) => BagOfChannels::augment_mean_std(),
            None => (mean.to_vec(), std.to_vec()),
        };
        let augment = MultiCropAugment::new(MultiCropConfig {
            global_crops_scale: cfg.augment.global_crops_scale,
            local_crops_scale: cfg.augment.local_crops_scale,
            global_size: cfg.augment.global_crop_size,
            local_size: cfg.augment.local_crop_size,
            local_crops_number: cfg.augment.local_crops_number,
            mean: augment_mean,
            std: augment_std,
            ops: AugmentOps::from(&cfg.augment),
        })
        .map_err(TrainError::Augment)?;
        Ok(Self {
            source,
            train,
            input: TrainInput::new(Arc::new(augment), cfg.augment.augment_on, cfg.run.seed),
            prep: PreprocessOptions {
                selected_channels: Some(channels.to_vec()),
                center_crop: cfg.data.center_crop,
            },
            corrupt_skipped: Arc::new(AtomicU64::new(0)),
            // Enough sets for every batch in flight: 2 per worker prefetched, one prepared
            // ahead, one in the step, one being handed back.
            pool: BufferPool::new(2 * cfg.data.num_workers.max(1) + 3),
            device,
        })
    }

    /// Batches `start_batch..` of this rank's share of `epoch`, each with its crops made one
    /// step ahead on their own thread (with `augment_on: device`, the augmentation too).
    pub fn epoch(
        &self,
        cfg: &Config,
        shape: &RunShape,
        epoch: usize,
        start_batch: usize,
    ) -> Result<Ahead<PreparedBatch, LoadError>, TrainError> {
        let order = match &self.train.sets {
            Some(sets) => sets.epoch_order(
                cfg.run.seed,
                epoch as u64,
                shape.rank,
                shape.world,
                shape.batch,
            ),
            None => configured_epoch_order(
                &cfg.data,
                self.source.as_ref(),
                &self.train.items,
                cfg.run.seed,
                epoch as u64,
                shape.rank,
                shape.world,
            )?,
        };
        // A resumed epoch starts at `start_batch`: announce only what will be read.
        let ahead_items = &order[(start_batch * shape.batch).min(order.len())..];
        match &self.train.bag {
            Some(b) => self.source.will_read(&b.images_of(ahead_items)),
            None => self.source.will_read(ahead_items),
        }
        let skip_corrupt =
            (cfg.data.on_corrupt == OnCorrupt::Skip).then(|| self.corrupt_skipped.clone());
        let images = training_image_fn(
            self.source.clone(),
            self.prep.clone(),
            cfg.file_channels(),
            cfg.data.channel_names.clone(),
            skip_corrupt,
        );
        let images = match &self.train.bag {
            Some(b) => b.image_fn(images),
            None => images,
        };
        let sample = self.input.samples(images, epoch as u64, &order)?;
        let workers = cfg.data.num_workers.max(1);
        let loader = EpochLoader::new(
            order,
            shape.batch,
            workers,
            2 * workers,
            start_batch,
            sample,
            self.pool.clone(),
        );
        let (input, device, bag) = (self.input.clone(), self.device, self.train.bag.clone());
        Ok(ahead(loader, move |loaded| -> Result<_, LoadError> {
            let b = loaded?;
            if b.indices.is_empty() {
                return Ok((b, Vec::new()));
            }
            let crops = input
                .crops(&b, epoch as u64, device)
                .map_err(LoadError::Crops)?;
            let crops = match &bag {
                Some(bag) => bag.normalise(&b.indices, crops),
                None => crops,
            };
            Ok((b, crops))
        }))
    }

    /// The model channels (positions among the trained channels) a batch's cells hold, where
    /// cells bring their own and the batch is one set's ([`ChannelSets`]); `None` otherwise.
    pub fn batch_channels(&self, batch: &LoadedBatch) -> Option<Vec<usize>> {
        self.train.sets.as_ref()?;
        let own = self.source.cell_channels(*batch.indices.first()?)?;
        let trained = self.prep.selected_channels.as_deref()?;
        Some(
            trained
                .iter()
                .enumerate()
                .filter(|(_, c)| own.contains(c))
                .map(|(m, _)| m)
                .collect(),
        )
    }

    /// Hands a stepped batch's tensors back to the loader's pool.
    ///
    /// # Safety
    /// The step that used the batch has finished (backward, optimizer, EMA) and kept no
    /// handle on its crops; see [`BufferPool::put`].
    pub unsafe fn recycle(&self, (batch, crops): PreparedBatch) {
        drop(crops);
        let LoadedBatch { crops, buffers, .. } = batch;
        drop(crops);
        // SAFETY: the model's crops and the batch's views are dropped just above, and the
        // caller vouches for the rest.
        unsafe { self.pool.put(buffers) };
    }

    /// Says what the source fetched this epoch and how many corrupt images were skipped, and
    /// starts the count again. Every rank reports its own (each reads only its own samples).
    pub fn report_epoch(&self, epoch: usize) {
        if let Some(r) = self.source.report() {
            tracing::info!("epoch {epoch}: {r}");
        }
        let skipped = self.corrupt_skipped.swap(0, Ordering::Relaxed);
        if skipped > 0 {
            tracing::info!(
                "epoch {epoch}: skipped {skipped} corrupt image(s) (data.on_corrupt: skip)"
            );
        }
    }

    pub fn describe(&self) -> String {
        self.source.describe()
    }
}

/// What a loader worker reads for one dataset index during training: the TIFF, its channel
/// count checked, channels selected / cropped / min–max scaled into the caller's buffer
/// (a constant channel or a NaN pixel is guarded and named once per process, see
/// [`crate::data::quality`]; scDINO dropped such an image). [`TrainInput`] augments it. With
/// `data.on_corrupt: skip` (a counter given), an undecodable image is dropped and counted
/// too. The file bytes and the decoded image live in per-thread buffers, so a worker
/// allocates nothing per sample (for uncompressed TIFFs from files or shards).
pub fn training_image_fn(
    source: SharedSource,
    prep: PreprocessOptions,
    file_channels: usize,
    channel_names: Vec<String>,
    skip_corrupt: Option<Arc<AtomicU64>>,
) -> Arc<ImageFn> {
    thread_local! {
        static READ: std::cell::RefCell<(Vec<u8>, ImageChw, ImageChw)> = Default::default();
    }
    // A cell with its own channels is preprocessed as it is (all of its channels).
    let own_prep = PreprocessOptions {
        selected_channels: None,
        center_crop: prep.center_crop,
    };
    Arc::new(move |i: usize, out: &mut ImageChw| {
        READ.with(|buffers| {
            let (bytes, raw, own_image) = &mut *buffers.borrow_mut();
            match source.read_into(i, bytes, raw) {
                Ok(()) => {}
                Err(e) if e.is_corrupt_image() && skip_corrupt.is_some() => {
                    if let Some(n) = &skip_corrupt {
                        n.fetch_add(1, Ordering::Relaxed);
                    }
                    tracing::warn!("skipping corrupt image (data.on_corrupt: skip): {e}");
                    return Ok(false);
                }
                Err(e) => return Err(e.into()),
            }
            let own = source.cell_channels(i);
            let expected = own.map_or(file_channels, <[usize]>::len);
            if raw.channels != expected {
                return Err(LoadError::ChannelCount {
                    path: source.index().samples[i].path.clone(),
                    found: raw.channels,
                    expected,
                });
            }
            let notes = match own {
                None => preprocess_into(raw, &prep, out)?,
                Some(own) => {
                    let notes = preprocess_into(raw, &own_prep, own_image)?;
                    let selected = prep.selected_channels.as_deref();
                    spread_own_channels(own_image, own, (selected, file_channels), out);
                    notes
                }
            };
            if notes.first_constant_channel.is_some() || notes.nonfinite_pixels > 0 {
                let path = &source.index().samples[i].path;
                if let Some(k) = notes.first_constant_channel {
                    let channel = match own {
                        Some(own) => own[k],
                        None => prep.selected_channels.as_ref().map_or(k, |sel| sel[k]),
                    };
                    quality::constant_channel(channel, &channel_names, path);
                }
                if notes.nonfinite_pixels > 0 {
                    quality::nonfinite_pixels(notes.nonfinite_pixels, path);
                }
            }
            Ok(true)
        })
    })
}

/// A cell read with its own channels (`image`: channel `k` is `data.channel_names[own[k]]`),
/// laid out as the model's input: channel `j` of `out` is file channel `selected[j]` (every
/// one of the `file_channels` when `None`), zero where the cell lacks it. The zero planes are never seen by the
/// model: `bag` takes only a cell's own channels as items and `tokens` trains each batch on
/// the channels its cells share.
fn spread_own_channels(
    image: &ImageChw,
    own: &[usize],
    (selected, file_channels): (Option<&[usize]>, usize),
    out: &mut ImageChw,
) {
    let channels = selected.map_or(file_channels, <[usize]>::len);
    let plane = image.height * image.width;
    out.channels = channels;
    out.height = image.height;
    out.width = image.width;
    out.data.clear();
    out.data.resize(channels * plane, 0.0);
    for (j, dst) in out.data.chunks_exact_mut(plane.max(1)).enumerate() {
        let file_channel = selected.map_or(j, |sel| sel[j]);
        if let Some(k) = own.iter().position(|&c| c == file_channel) {
            dst.copy_from_slice(&image.data[k * plane..(k + 1) * plane]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc_count::allocations_in;
    use crate::augment::MultiCropConfig;
    use crate::data::shards::{pack, LocalShardStore, PackOptions, ShardSource};
    use crate::data::synth::{generate, SynthOptions};
    use crate::data::{ImageSource, LocalSource, PreprocessOptions, SharedSource};
    use crate::train::input::AugmentedSamples;
    use crate::train::loader::Samples;
    use std::path::Path;

    fn dataset(dir: &Path) -> SharedSource {
        generate(&SynthOptions {
            out: dir.to_path_buf(),
            seed: 5,
            classes: 2,
            per_class: 4,
            size: 50,
            channels: 5,
            donors: 1,
        })
        .unwrap();
        Arc::new(LocalSource::open(&dir.join("Training"), 0).unwrap())
    }

    // The allocation tests of `train::input`, kept here because they build the training
    // images with this module's `training_image_fn` (input.rs importing it back would close
    // an import cycle).

    /// After one pass has grown the thread's buffers, reading, decoding, preprocessing and
    /// augmenting every sample again allocates nothing.
    fn assert_no_allocation_per_sample(source: SharedSource) {
        let augment = Arc::new(
            MultiCropAugment::new(MultiCropConfig {
                global_crops_scale: (0.4, 1.0),
                local_crops_scale: (0.05, 0.4),
                global_size: 32,
                local_size: 16,
                local_crops_number: 4,
                mean: vec![0.5; 3],
                std: vec![0.25; 3],
                ops: Default::default(),
            })
            .unwrap(),
        );
        let prep = PreprocessOptions {
            selected_channels: Some(vec![0, 2, 4]),
            center_crop: 40,
        };
        let images = training_image_fn(source.clone(), prep, 5, Vec::new(), None);
        let samples = AugmentedSamples::new(images, augment.clone(), 7, 1);
        let mut bufs: Vec<Vec<f32>> = (0..augment.num_crops())
            .map(|k| vec![0.0; augment.crop_len(k)])
            .collect();
        let mut out: Vec<&mut [f32]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let n = source.index().len();
        for i in 0..n {
            assert!(samples.write(i, &mut out).unwrap());
        }
        let (kept, allocations) = allocations_in(|| {
            (0..n)
                .filter(|&i| samples.write(i, &mut out).unwrap())
                .count()
        });
        assert_eq!(kept, n);
        assert_eq!(allocations, 0, "{}", source.describe());
        // The counter does count: the one-off read path allocates.
        let (_, one_off) = allocations_in(|| source.read(0).unwrap());
        assert!(one_off > 0);
    }

    #[test]
    fn training_samples_from_files_allocate_nothing_per_sample() {
        let dir = tempfile::tempdir().unwrap();
        assert_no_allocation_per_sample(dataset(dir.path()));
    }

    #[test]
    fn training_samples_from_packed_shards_allocate_nothing_per_sample() {
        let dir = tempfile::tempdir().unwrap();
        let files = dataset(dir.path());
        let packed = dir.path().join("packed");
        pack(
            files.as_ref(),
            0,
            &PackOptions {
                out: packed.clone(),
                max_shard_bytes: 64 << 10,
                max_shard_samples: 0,
                shuffle: true,
                seed: 1,
            },
            &mut |_| {},
        )
        .unwrap();
        let store = Arc::new(LocalShardStore::new(&packed));
        let shards = ShardSource::open(store, 0).unwrap();
        assert!(shards.describe().contains("shards"));
        assert_no_allocation_per_sample(Arc::new(shards));
    }
}
