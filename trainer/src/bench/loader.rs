//! `trainer bench loader`: the input pipeline's throughput (TIFF → min–max → multi-crop →
//! batch tensors) without a model, as wall-clock images/s and images per CPU-second (peer:
//! bench/loader_peer.py).
use super::{invalid, process_cpu_seconds, BenchError};
use crate::augment::{MultiCropAugment, MultiCropConfig};
use crate::config::{AugmentOn, DatasetLocation};
use crate::data::mean_std;
use crate::data::{open_source, LocalSource, PreprocessOptions, SharedSource};
use crate::train::input::TrainInput;
use crate::train::loader::{BufferPool, EpochLoader, LoadedBatch};
use crate::train::run::training_image_fn;
use crate::train::sampler::{configured_epoch_order, epoch_order};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;
use tch::Device;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoaderPath {
    /// Workers decode, min–max scale and run the full multi-crop augmentation.
    Cpu,
    /// Workers decode and min–max scale; the batched tensor augmentation runs on the
    /// consumer thread (on the CPU here, with `--threads` libtorch threads).
    Device,
    /// Workers decode and min–max scale only: the CPU cost of the device path when the
    /// augmentation runs on a GPU.
    Read,
    /// The CPU augmentation kernels alone, on this thread: `--batch` decoded images
    /// augmented over and over into reused buffers (no I/O, no allocation, no batching).
    Kernels,
}

/// What `trainer bench loader` measures (its flags).
#[derive(Debug, Clone, clap::Args)]
pub struct LoaderOptions {
    /// ImageFolder root of TIFFs (e.g. the `Training/` folder `trainer synth` writes).
    #[arg(long, conflicts_with = "config", required_unless_present = "config")]
    pub data: Option<PathBuf>,
    /// Read through the data source of this config instead (`data.dataset_dir`: folder,
    /// packed shards, s3:// with or without `data.cache.dir`, store settings from `data.object_store`),
    /// opened with `trainer::data::open_source`.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Read every image of the timed order once (with `--threads` readers) before the
    /// loader starts: a warm node-local cache, i.e. the second epoch of an s3:// + cache run.
    #[arg(long)]
    pub warm: bool,
    /// Allocate fresh batch tensors for every batch instead of reusing handed-back ones
    /// (what the loader did before the buffer pool; for measuring it).
    #[arg(long)]
    pub no_buffer_reuse: bool,
    #[arg(long, value_enum, default_value = "cpu")]
    pub path: LoaderPath,
    /// Loader worker threads (and libtorch threads for `--path device`).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Batches timed after the warm-up ones (at most the dataset's batches minus warm-up).
    #[arg(long, default_value_t = 16)]
    pub batches: usize,
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    #[arg(long, default_value_t = 8)]
    pub local_crops: usize,
    #[arg(long, default_value_t = 224)]
    pub global_size: usize,
    #[arg(long, default_value_t = 96)]
    pub local_size: usize,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

impl LoaderOptions {
    /// The dataset (`--config` or `--data`, holding at least `need` images unless only the
    /// kernels are timed), its channel count, and training's multi-crop augmentation with the
    /// dataset's mean/std.
    fn source_and_augment(&self, need: usize) -> Result<LoaderInput, BenchError> {
        let (source, name, data): (SharedSource, DatasetLocation, _) =
            match (&self.config, &self.data) {
                (Some(c), _) => {
                    let cfg = crate::train::init_layout::load_config(c)?;
                    let name = cfg.data.dataset_dir.clone();
                    (open_source(&cfg.data)?, name, Some(cfg.data.clone()))
                }
                (None, Some(d)) => (
                    Arc::new(LocalSource::open(d, 0)?) as SharedSource,
                    DatasetLocation::Local(d.clone()),
                    None,
                ),
                (None, None) => return Err(invalid("give --data DIR or --config FILE")),
            };
        let index = source.index();
        if index.len() < need && self.path != LoaderPath::Kernels {
            return Err(invalid(format!(
                "{name} holds {} images; {} batches of {} need {need} (make more with `trainer synth --per-class N`)",
                index.len(),
                self.warmup + self.batches,
                self.batch
            )));
        }
        let ms = mean_std::compute(source.as_ref(), 0.1, 0, self.threads)?;
        let channels = ms.mean.len();
        let all: Vec<usize> = (0..channels).collect();
        let (mean, std) = ms.select(&all, &[]);
        let augment = Arc::new(MultiCropAugment::new(MultiCropConfig {
            global_crops_scale: (0.4, 1.0),
            local_crops_scale: (0.05, 0.4),
            global_size: self.global_size,
            local_size: self.local_size,
            local_crops_number: self.local_crops,
            mean,
            std,
            ops: Default::default(),
        })?);
        Ok(LoaderInput {
            source,
            channels,
            augment,
            data,
        })
    }

    /// Times the batches; returns the JSON line `trainer bench loader` prints.
    pub fn run(&self) -> Result<serde_json::Value, BenchError> {
        if self.batches == 0 || self.threads == 0 {
            return Err(invalid("--batches and --threads must be at least 1"));
        }
        tch::set_num_threads(if self.path == LoaderPath::Device {
            self.threads as i32
        } else {
            1
        });
        let need = (self.warmup + self.batches) * self.batch;
        let LoaderInput {
            source,
            channels,
            augment,
            data,
        } = self.source_and_augment(need)?;
        let index = source.index();
        let all: Vec<usize> = (0..channels).collect();
        let prep = PreprocessOptions {
            selected_channels: Some(all),
            center_crop: 0,
        };
        let epoch = 0u64;
        let on = match self.path {
            LoaderPath::Cpu => AugmentOn::Cpu,
            LoaderPath::Device | LoaderPath::Read | LoaderPath::Kernels => AugmentOn::Device,
        };
        if self.path == LoaderPath::Kernels {
            return self.kernels(&source, &prep, &augment);
        }
        let input = TrainInput::new(augment, on, self.seed);
        let samples: Vec<usize> = (0..index.len()).collect();
        // A config's `data.order` (e.g. `sites` for a screen) is training's order.
        let mut order = match &data {
            Some(d) => {
                configured_epoch_order(d, source.as_ref(), &samples, self.seed, epoch, 0, 1)?
            }
            None => epoch_order(&samples, self.seed, epoch, 0, 1),
        };
        order.truncate(need);
        if self.warm {
            warm_read(&source, &order, self.threads)?;
        }
        source.will_read(&order);
        // What mean/std (and `--warm`) fetched, so that `source` counts the loader's reads.
        let before = source.report();
        let images = training_image_fn(source.clone(), prep, channels, Vec::new(), None);
        let samples = input.samples(images, epoch, &order)?;
        let pool = BufferPool::new(if self.no_buffer_reuse {
            0
        } else {
            2 * self.threads + 2
        });
        let loader = EpochLoader::new(
            order,
            self.batch,
            self.threads,
            2 * self.threads,
            0,
            samples,
            pool.clone(),
        );
        let (mut t0, mut cpu0, mut images_timed, mut checksum) =
            (Instant::now(), process_cpu_seconds()?, 0usize, 0.0f64);
        for (n, loaded) in loader.enumerate() {
            let b = loaded?;
            let crops = if self.path == LoaderPath::Device {
                input.crops(&b, epoch, Device::Cpu)?
            } else {
                b.crops.iter().map(|c| c.shallow_clone()).collect()
            };
            // One value per batch keeps the work observable without costing a pass.
            checksum += crops[crops.len() - 1].double_value(&[0, 0, 0, 0]);
            if n + 1 == self.warmup {
                (t0, cpu0) = (Instant::now(), process_cpu_seconds()?);
            } else if n >= self.warmup {
                images_timed += b.indices.len();
            }
            drop(crops);
            let LoadedBatch { crops, buffers, .. } = b;
            drop(crops);
            // SAFETY: the crops (and the device path's outputs) are dropped just above.
            unsafe { pool.put(buffers) };
        }
        let wall = t0.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds()? - cpu0;
        let path = format!("{:?}", self.path).to_lowercase();
        let mut report = self.timing_report(&path, self.threads, images_timed, wall, cpu);
        for (key, value) in [
            ("batch", serde_json::json!(self.batch)),
            ("batches", serde_json::json!(self.batches)),
            ("checksum", serde_json::json!(checksum)),
            ("source_before", serde_json::json!(before)),
            ("source", serde_json::json!(source.report())),
        ] {
            report.insert(key.into(), value);
        }
        Ok(report.into())
    }

    /// The keys every loader report holds (bench/loader.sh reads them by name, beside the
    /// peer's): what ran, on how many threads, and images per wall and per CPU second.
    fn timing_report(
        &self,
        path: &str,
        threads: usize,
        images: usize,
        wall: f64,
        cpu: f64,
    ) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        serde_json::Map::from_iter([
            ("impl".into(), json!("rust")),
            ("bench".into(), json!("loader")),
            ("path".into(), json!(path)),
            ("threads".into(), json!(threads)),
            ("images".into(), json!(images)),
            (
                "crops".into(),
                json!([self.global_size, self.local_size, self.local_crops]),
            ),
            ("wall_s".into(), json!(wall)),
            ("cpu_s".into(), json!(cpu)),
            ("imgs_per_s".into(), json!(images as f64 / wall)),
            (
                "imgs_per_cpu_s".into(),
                json!(images as f64 / cpu.max(1e-9)),
            ),
        ])
    }
}

/// What `trainer bench loader` reads: the source, its channel count, training's multi-crop
/// augmentation with its mean/std, and the config's data section when `--config` gave one.
struct LoaderInput {
    source: SharedSource,
    channels: usize,
    augment: Arc<MultiCropAugment>,
    data: Option<crate::config::DataSection>,
}

/// Reads (and decodes) `order` once with `threads` readers: fills a node-local cache.
fn warm_read(source: &SharedSource, order: &[usize], threads: usize) -> Result<(), BenchError> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let next = AtomicUsize::new(0);
    source.will_read(order);
    std::thread::scope(|s| -> Result<(), BenchError> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), BenchError> {
                    while let Some(&i) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                        source.read(i)?;
                    }
                    Ok(())
                })
            })
            .collect();
        for w in workers {
            w.join().map_err(|_| BenchError::ReaderPanicked)??;
        }
        Ok(())
    })
}

impl LoaderOptions {
    fn kernels(
        &self,
        source: &SharedSource,
        prep: &PreprocessOptions,
        augment: &MultiCropAugment,
    ) -> Result<serde_json::Value, BenchError> {
        let images = training_image_fn(
            source.clone(),
            prep.clone(),
            augment.channels(),
            Vec::new(),
            None,
        );
        let mut imgs = Vec::new();
        for i in 0..self.batch {
            let mut img = crate::data::ImageChw::default();
            if images(i, &mut img)? {
                imgs.push(img);
            }
        }
        let mut bufs: Vec<Vec<f32>> = (0..augment.num_crops())
            .map(|k| vec![0.0; augment.crop_len(k)])
            .collect();
        let mut run = |n: usize, epoch: u64| -> Result<usize, BenchError> {
            let mut done = 0;
            for it in 0..n {
                for (i, img) in imgs.iter().enumerate() {
                    let mut out: Vec<&mut [f32]> =
                        bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
                    let key = crate::augment::SampleKey::new(
                        self.seed,
                        epoch,
                        (it * imgs.len() + i) as u64,
                    );
                    augment.apply_into(img, key, &mut out)?;
                    done += 1;
                }
            }
            Ok(done)
        };
        run(self.warmup, 1)?;
        let (t0, cpu0) = (Instant::now(), process_cpu_seconds()?);
        let images_timed = run(self.batches, 0)?;
        let wall = t0.elapsed().as_secs_f64();
        let cpu = process_cpu_seconds()? - cpu0;
        let mut report = self.timing_report("kernels", 1, images_timed, wall, cpu);
        report.insert("checksum".into(), serde_json::json!(bufs[0][0]));
        Ok(report.into())
    }
}
