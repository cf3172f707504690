//! Batches for one epoch, decoded and augmented on worker threads, delivered in sampler order.
//!
//! Workers take whole batches from a job queue (at most `prefetch` batches ahead of the
//! consumer, which bounds memory); results are re-ordered by batch number, so the stream is
//! identical whatever the thread timing. Each sample's randomness must come from its own
//! (seed, epoch, index), never from shared state; the sample function guarantees that.
use crate::data::ImageChw;
use std::collections::HashMap;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tch::Tensor;

/// Turns one dataset index into its crops (`None`: the image is dropped, e.g. NaN after
/// min–max, and the batch shrinks, as in scDINO's collate function).
pub type SampleFn = dyn Fn(usize) -> Result<Option<Vec<ImageChw>>, String> + Send + Sync;

/// One collated batch: crop k of every kept sample, stacked.
pub struct LoadedBatch {
    pub batch_no: usize,
    /// `[global1, global2, local...]`, each `[B, C, S, S]`.
    pub crops: Vec<Tensor>,
    /// Dataset indices of the kept samples, in batch order.
    pub indices: Vec<usize>,
    pub dropped: usize,
    /// Time the consumer waited for this batch (0 when it was already prefetched).
    pub wait: Duration,
}

struct RawBatch {
    crops: Vec<(Vec<f32>, [i64; 3])>,
    indices: Vec<usize>,
    dropped: usize,
}

pub struct EpochLoader {
    jobs: Option<Sender<usize>>,
    results: Receiver<(usize, Result<RawBatch, String>)>,
    pending: HashMap<usize, Result<RawBatch, String>>,
    next: usize,
    next_job: usize,
    batches: usize,
}

impl EpochLoader {
    /// Delivers batches `start_batch..` of `order` (earlier ones are skipped, for resuming
    /// mid-epoch).
    pub fn new(
        order: Vec<usize>,
        batch_size: usize,
        workers: usize,
        prefetch: usize,
        start_batch: usize,
        sample: Arc<SampleFn>,
    ) -> Self {
        let batches = order.len().div_ceil(batch_size);
        let order = Arc::new(order);
        let (job_tx, job_rx) = channel::<usize>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let (res_tx, res_rx) = channel();
        for _ in 0..workers.max(1) {
            let (job_rx, res_tx, order, sample) = (
                job_rx.clone(),
                res_tx.clone(),
                order.clone(),
                sample.clone(),
            );
            std::thread::spawn(move || loop {
                let job = match job_rx.lock() {
                    Ok(rx) => rx.recv(),
                    Err(_) => return,
                };
                let Ok(b) = job else { return };
                let end = ((b + 1) * batch_size).min(order.len());
                let result = collate(&order[b * batch_size..end], sample.as_ref());
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

fn collate(indices: &[usize], sample: &SampleFn) -> Result<RawBatch, String> {
    let mut crops: Vec<(Vec<f32>, [i64; 3])> = Vec::new();
    let mut kept = Vec::with_capacity(indices.len());
    let mut dropped = 0;
    for &i in indices {
        let Some(views) = sample(i)? else {
            dropped += 1;
            continue;
        };
        if crops.is_empty() {
            crops = views
                .iter()
                .map(|v| {
                    let shape = [v.channels as i64, v.height as i64, v.width as i64];
                    (Vec::with_capacity(v.data.len() * indices.len()), shape)
                })
                .collect();
        }
        for ((buf, _), v) in crops.iter_mut().zip(&views) {
            buf.extend_from_slice(&v.data);
        }
        kept.push(i);
    }
    Ok(RawBatch {
        crops,
        indices: kept,
        dropped,
    })
}

impl Iterator for EpochLoader {
    type Item = Result<LoadedBatch, String>;

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
                Err(_) => return Some(Err("loader workers stopped".into())),
            }
        };
        let wait = start.elapsed();
        let batch_no = self.next;
        self.next += 1;
        self.queue_next_job();
        Some(raw.map(|raw| {
            let b = raw.indices.len() as i64;
            LoadedBatch {
                batch_no,
                crops: raw
                    .crops
                    .iter()
                    .map(|(data, [c, h, w])| Tensor::from_slice(data).reshape([b, *c, *h, *w]))
                    .collect(),
                indices: raw.indices,
                dropped: raw.dropped,
                wait,
            }
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
    fn sample_fn() -> Arc<SampleFn> {
        Arc::new(|i: usize| {
            if i % 7 == 3 {
                return Ok(None); // dropped, as a NaN image would be
            }
            if i.is_multiple_of(3) {
                std::thread::sleep(Duration::from_millis(3));
            }
            let img =
                |side: usize| Chw::new(2, side, side, vec![i as f32; 2 * side * side]).unwrap();
            Ok(Some(vec![img(4), img(4), img(2)]))
        })
    }

    fn collect(workers: usize, start: usize) -> Vec<(usize, Vec<usize>, Vec<Vec<f32>>)> {
        let order: Vec<usize> = (0..40).rev().collect();
        EpochLoader::new(order, 6, workers, 3, start, sample_fn())
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
                Err("bad.tiff: truncated".into())
            } else {
                Ok(None)
            }
        });
        let results: Vec<_> = EpochLoader::new((0..10).collect(), 4, 2, 2, 0, f).collect();
        assert!(results[1]
            .as_ref()
            .err()
            .is_some_and(|e| e.contains("bad.tiff")));
    }
}
