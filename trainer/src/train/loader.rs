//! Batches for one epoch, decoded and augmented on worker threads, delivered in sampler order.
//!
//! Workers take whole batches from a job queue (at most `prefetch` batches ahead of the
//! consumer, which bounds memory); results are re-ordered by batch number, so the stream is
//! identical whatever the thread timing. Each sample's randomness must come from its own
//! (seed, epoch, index), never from shared state; the [`Samples`] implementation guarantees
//! that.
//!
//! A worker allocates the batch tensors once per batch and every sample writes its outputs
//! straight into its slot of them: no per-sample output buffers, no second copy into the
//! batch and no third one into a tensor (at 5×224²×2 + 5×96²×8 floats, 3.5 MB per sample,
//! those copies and their page faults cost as much as a third of the augmentation).
use crate::augment::AugmentError;
use crate::cpu_values::values_mut;
use crate::data::{DataError, ImageChw};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tch::{Device, Kind, Tensor};

/// What a worker makes of one dataset index.
pub trait Samples: Send + Sync {
    /// Shape `[C, H, W]` of each of a sample's outputs; the same for every sample.
    fn shapes(&self) -> &[[usize; 3]];

    /// Writes sample `i`'s outputs into `out[k]` (`C·H·W` values of `shapes()[k]` each).
    /// `Ok(false)`: the image is dropped (e.g. NaN after min–max) and the batch shrinks, as
    /// in scDINO's collate function; `out` may then hold anything.
    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, LoadError>;
}

/// Turns one dataset index into its outputs (`None`: dropped). The closure form of
/// [`Samples`], for tests and simple callers; it costs one extra copy per sample.
pub type SampleFn = dyn Fn(usize) -> Result<Option<Vec<ImageChw>>, LoadError> + Send + Sync;

/// Why the loader could not deliver a batch; each variant names the file or sample.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// Reading, decoding or scaling an image (the error names the file).
    #[error(transparent)]
    Data(#[from] DataError),
    #[error("{} has {found} channels but data.channel_names lists {expected}", path.display())]
    ChannelCount {
        path: PathBuf,
        found: usize,
        expected: usize,
    },
    #[error("sample {index}: {source}")]
    Augment {
        index: usize,
        #[source]
        source: AugmentError,
    },
    /// A sample whose shape does not fit the batch (names both shapes and the remedy).
    #[error("sample {index}: {detail}")]
    Shape { index: usize, detail: String },
    /// Batched (device) augmentation of a whole batch.
    #[error("making the batch's crops: {0}")]
    Crops(AugmentError),
    #[error("no usable image in this epoch's samples")]
    NoUsableImage,
    #[error("loader workers stopped")]
    WorkersStopped,
}

/// A [`SampleFn`] with its (fixed) output shapes.
pub struct FnSamples {
    shapes: Vec<[usize; 3]>,
    f: Arc<SampleFn>,
}

impl FnSamples {
    pub fn new(shapes: Vec<[usize; 3]>, f: Arc<SampleFn>) -> Self {
        Self { shapes, f }
    }
}

impl Samples for FnSamples {
    fn shapes(&self) -> &[[usize; 3]] {
        &self.shapes
    }

    fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, LoadError> {
        let Some(views) = (self.f)(i)? else {
            return Ok(false);
        };
        if views.len() != out.len() {
            return Err(LoadError::Shape {
                index: i,
                detail: format!("{} outputs, expected {}", views.len(), out.len()),
            });
        }
        for (k, (v, o)) in views.iter().zip(out.iter_mut()).enumerate() {
            if [v.channels, v.height, v.width] != self.shapes[k] {
                return Err(LoadError::Shape {
                    index: i,
                    detail: format!(
                        "output {k} is {}×{}×{}, expected {:?}",
                        v.channels, v.height, v.width, self.shapes[k]
                    ),
                });
            }
            o.copy_from_slice(&v.data);
        }
        Ok(true)
    }
}

/// Batch tensors handed back by the consumer for reuse. Without it every batch allocates
/// ~100 MB of fresh tensors (2×224² + 8×96² crops of 5 channels × 32 samples), which the
/// kernel maps, zero-fills page by page and unmaps again: 15–20 % of the loader's CPU time
/// in `perf` (page faults, `clear_page`). A pooled buffer is reused only for a batch of the
/// same shape.
#[derive(Clone)]
pub struct BufferPool {
    free: Arc<Mutex<Vec<Vec<Tensor>>>>,
    cap: usize,
}

impl BufferPool {
    /// Keeps at most `cap` sets of batch tensors (0: never reuses).
    pub fn new(cap: usize) -> Self {
        Self {
            free: Arc::new(Mutex::new(Vec::new())),
            cap,
        }
    }

    /// Hands a batch's [`LoadedBatch::buffers`] back for reuse.
    ///
    /// # Safety
    /// Nothing may use these tensors' storage afterwards: every other handle to it (the
    /// batch's `crops`, views, tensors of a step that used them) must be gone. Workers write
    /// into pooled storage through raw pointers, as into freshly allocated tensors.
    pub unsafe fn put(&self, buffers: Vec<Tensor>) {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        if free.len() < self.cap && !buffers.is_empty() {
            free.push(buffers);
        }
    }

    /// Tensors `[n, C, H, W]` for `shapes`: a pooled set of exactly these sizes, else new.
    fn take(&self, shapes: &[[usize; 3]], n: i64) -> Vec<Tensor> {
        let want: Vec<Vec<i64>> = shapes
            .iter()
            .map(|&[c, h, w]| vec![n, c as i64, h as i64, w as i64])
            .collect();
        {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            let fits = |set: &Vec<Tensor>| {
                set.len() == want.len() && set.iter().zip(&want).all(|(t, w)| t.size() == *w)
            };
            if let Some(i) = free.iter().position(fits) {
                return free.swap_remove(i);
            }
        }
        want.iter()
            .map(|size| Tensor::empty(size.as_slice(), (Kind::Float, Device::Cpu)))
            .collect()
    }
}

/// One collated batch: output k of every kept sample, stacked.
pub struct LoadedBatch {
    pub batch_no: usize,
    /// One `[B, C, H, W]` tensor per output of [`Samples::shapes`] (with CPU augmentation:
    /// `[global1, global2, local...]`).
    pub crops: Vec<Tensor>,
    /// Dataset indices of the kept samples, in batch order.
    pub indices: Vec<usize>,
    pub dropped: usize,
    /// Time the consumer waited for this batch (0 when it was already prefetched).
    pub wait: Duration,
    /// The full-size tensors `crops` view, to hand back with [`BufferPool::put`] once the
    /// step is done with them (dropping them is fine too).
    pub buffers: Vec<Tensor>,
}

struct RawBatch {
    crops: Vec<Tensor>,
    buffers: Vec<Tensor>,
    indices: Vec<usize>,
    dropped: usize,
}

pub struct EpochLoader {
    jobs: Option<Sender<usize>>,
    results: Receiver<(usize, Result<RawBatch, LoadError>)>,
    pending: HashMap<usize, Result<RawBatch, LoadError>>,
    next: usize,
    next_job: usize,
    batches: usize,
}

impl EpochLoader {
    /// Delivers batches `start_batch..` of `order` (earlier ones are skipped, for resuming
    /// mid-epoch), in batch tensors taken from `pool` (see [`BufferPool`]; `BufferPool::new(0)`
    /// never reuses).
    pub fn new(
        order: Vec<usize>,
        batch_size: usize,
        workers: usize,
        prefetch: usize,
        start_batch: usize,
        samples: Arc<dyn Samples>,
        pool: BufferPool,
    ) -> Self {
        let batches = order.len().div_ceil(batch_size);
        let order = Arc::new(order);
        let (job_tx, job_rx) = channel::<usize>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (res_tx, res_rx) = channel();
        for _ in 0..workers.max(1) {
            let (job_rx, res_tx, order, samples, pool) = (
                job_rx.clone(),
                res_tx.clone(),
                order.clone(),
                samples.clone(),
                pool.clone(),
            );
            std::thread::spawn(move || loop {
                let job = match job_rx.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => return,
                };
                let Ok(b) = job else { return };
                let end = ((b + 1) * batch_size).min(order.len());
                let result = collate(&order[b * batch_size..end], samples.as_ref(), &pool);
                if res_tx.send((b, result)).is_err() {
                    return;
                }
            });
        }
        let mut loader = Self {
            jobs: Some(job_tx),
            results: res_rx,
            pending: HashMap::new(),
            next: start_batch,
            next_job: start_batch,
            batches,
        };
        for _ in 0..prefetch.max(1) {
            loader.queue_next_job();
        }
        loader
    }

    pub fn len(&self) -> usize {
        self.batches
    }

    pub fn is_empty(&self) -> bool {
        self.batches == 0
    }

    fn queue_next_job(&mut self) {
        if self.next_job < self.batches {
            if let Some(tx) = &self.jobs {
                let _ = tx.send(self.next_job);
            }
            self.next_job += 1;
        }
    }
}

fn collate(
    indices: &[usize],
    samples: &dyn Samples,
    pool: &BufferPool,
) -> Result<RawBatch, LoadError> {
    let shapes = samples.shapes();
    let n = indices.len() as i64;
    let lens: Vec<usize> = shapes.iter().map(|[c, h, w]| c * h * w).collect();
    let mut buffers = pool.take(shapes, n);
    let mut kept = Vec::with_capacity(indices.len());
    let mut dropped = 0;
    {
        // Every sample slot's output slices, slot-major, built once per batch (not per
        // sample): slot s's outputs are `slots[s*k..(s+1)*k]`.
        let k = shapes.len();
        let mut per_output: Vec<std::slice::ChunksExactMut<'_, f32>> = buffers
            .iter_mut()
            .zip(&lens)
            .map(|(t, &l)| values_mut(t).chunks_exact_mut(l.max(1)))
            .collect();
        let mut slots: Vec<&mut [f32]> = Vec::with_capacity(indices.len() * k);
        for _ in indices {
            for (chunks, &l) in per_output.iter_mut().zip(&lens) {
                slots.push(if l == 0 {
                    &mut []
                } else {
                    chunks.next().expect("one chunk per slot")
                });
            }
        }
        for &i in indices {
            let slot = kept.len();
            if samples.write(i, &mut slots[slot * k..(slot + 1) * k])? {
                kept.push(i);
            } else {
                dropped += 1;
            }
        }
    }
    // Kept samples fill the leading slots; with drops the tail is unused.
    let crops = buffers
        .iter()
        .map(|t| {
            if dropped > 0 {
                t.narrow(0, 0, kept.len() as i64)
            } else {
                t.shallow_clone()
            }
        })
        .collect();
    Ok(RawBatch {
        crops,
        buffers,
        indices: kept,
        dropped,
    })
}

impl Iterator for EpochLoader {
    type Item = Result<LoadedBatch, LoadError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.batches {
            return None;
        }
        let start = Instant::now();
        let raw = loop {
            if let Some(r) = self.pending.remove(&self.next) {
                break r;
            }
            match self.results.recv() {
                Ok((b, r)) => {
                    self.pending.insert(b, r);
                }
                Err(_) => return Some(Err(LoadError::WorkersStopped)),
            }
        };
        let wait = start.elapsed();
        let batch_no = self.next;
        self.next += 1;
        self.queue_next_job();
        Some(raw.map(|raw| LoadedBatch {
            batch_no,
            crops: raw.crops,
            buffers: raw.buffers,
            indices: raw.indices,
            dropped: raw.dropped,
            wait,
        }))
    }
}

impl Drop for EpochLoader {
    fn drop(&mut self) {
        // Closing the job queue lets idle workers exit; busy ones exit after their batch.
        self.jobs = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Chw;

    /// A sample function whose output depends only on the index, slow for some indices so
    /// that workers finish out of order.
    fn sample_fn() -> Arc<dyn Samples> {
        let f: Arc<SampleFn> = Arc::new(|i: usize| {
            if i % 7 == 3 {
                return Ok(None); // dropped, as a NaN image would be
            }
            if i.is_multiple_of(3) {
                std::thread::sleep(Duration::from_millis(3));
            }
            let img =
                |side: usize| Chw::new(2, side, side, vec![i as f32; 2 * side * side]).unwrap();
            Ok(Some(vec![img(4), img(4), img(2)]))
        });
        Arc::new(FnSamples::new(vec![[2, 4, 4], [2, 4, 4], [2, 2, 2]], f))
    }

    fn collect(workers: usize, start: usize) -> Vec<(usize, Vec<usize>, Vec<Vec<f32>>)> {
        let order: Vec<usize> = (0..40).rev().collect();
        EpochLoader::new(order, 6, workers, 3, start, sample_fn(), BufferPool::new(0))
            .map(|b| {
                let b = b.unwrap();
                let data = b
                    .crops
                    .iter()
                    .map(|c| Vec::<f32>::try_from(c.flatten(0, -1)).unwrap())
                    .collect();
                (b.batch_no, b.indices, data)
            })
            .collect()
    }

    #[test]
    fn batches_are_identical_whatever_the_worker_count() {
        let one = collect(1, 0);
        assert_eq!(one.len(), 7);
        assert_eq!(
            one[0].1,
            vec![39, 37, 36, 35, 34],
            "38 (=3 mod 7) is dropped"
        );
        for workers in [2, 4, 8] {
            assert_eq!(collect(workers, 0), one, "{workers} workers");
        }
        // Resuming at batch 4 yields exactly the tail.
        assert_eq!(collect(3, 4), one[4..].to_vec());
    }

    #[test]
    fn sample_errors_surface() {
        let f: Arc<SampleFn> = Arc::new(|i: usize| {
            if i == 5 {
                Err(LoadError::ChannelCount {
                    path: "bad.tiff".into(),
                    found: 2,
                    expected: 3,
                })
            } else {
                Ok(None)
            }
        });
        let samples = Arc::new(FnSamples::new(vec![[1, 1, 1]], f));
        let results: Vec<_> =
            EpochLoader::new((0..10).collect(), 4, 2, 2, 0, samples, BufferPool::new(0)).collect();
        assert!(results[1]
            .as_ref()
            .err()
            .is_some_and(|e| e.to_string().contains("bad.tiff has 2 channels")));
    }

    /// Writes its index into every value; drops multiples of 5. Allocates nothing.
    struct Constant;

    impl Samples for Constant {
        fn shapes(&self) -> &[[usize; 3]] {
            &[[2, 8, 8], [2, 8, 8], [2, 4, 4], [2, 4, 4]]
        }

        fn write(&self, i: usize, out: &mut [&mut [f32]]) -> Result<bool, LoadError> {
            for o in out.iter_mut() {
                o.fill(i as f32);
            }
            Ok(!i.is_multiple_of(5))
        }
    }

    #[test]
    fn collating_allocates_per_batch_not_per_sample() {
        let count = |n: usize| {
            let indices: Vec<usize> = (1..=n).collect();
            let (b, allocations) = crate::alloc_count::allocations_in(|| {
                collate(&indices, &Constant, &BufferPool::new(0)).unwrap()
            });
            assert_eq!(b.indices.len() + b.dropped, n);
            let first: Vec<f32> = Vec::try_from(b.crops[2].get(0).flatten(0, -1)).unwrap();
            assert!(first.iter().all(|&v| v == 1.0));
            allocations
        };
        // Both batches drop some samples (multiples of 5), so both take the same branches.
        let (small, large) = (count(5), count(64));
        assert_eq!(small, large, "allocations grow with the batch size");
    }

    #[test]
    fn pooled_buffers_are_reused_and_give_the_same_batches() {
        let order: Vec<usize> = (0..40).rev().collect();
        let plain = collect(2, 0);
        let pool = BufferPool::new(8);
        let mut seen_ptrs = std::collections::HashSet::new();
        let mut reused = 0;
        let mut pooled = vec![];
        for b in EpochLoader::new(order, 6, 2, 3, 0, sample_fn(), pool.clone()) {
            let b = b.unwrap();
            let data: Vec<Vec<f32>> = b
                .crops
                .iter()
                .map(|c| Vec::<f32>::try_from(c.flatten(0, -1)).unwrap())
                .collect();
            pooled.push((b.batch_no, b.indices.clone(), data));
            let ptr = b.buffers[0].data_ptr() as usize;
            if !seen_ptrs.insert(ptr) {
                reused += 1;
            }
            let LoadedBatch { crops, buffers, .. } = b;
            drop(crops);
            // SAFETY: the batch's views were dropped and the data copied out above.
            unsafe { pool.put(buffers) };
        }
        assert_eq!(pooled, plain);
        assert!(reused > 0, "no buffer was reused");
        // A set of other sizes (the last, smaller batch) is never handed out for a full one.
        let shapes = [[2usize, 4, 4], [2, 4, 4], [2, 2, 2]];
        let small = pool.take(&shapes, 2);
        assert_eq!(small[0].size(), vec![2, 2, 4, 4]);
        let full = pool.take(&shapes, 6);
        assert_eq!(full[0].size(), vec![6, 2, 4, 4]);
    }
}
