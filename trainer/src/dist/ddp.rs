//! Data parallelism: every rank holds the full model; gradients are averaged across ranks
//! after backward, in buckets of about 25 MB (one flat all-reduce each), and the initial
//! parameters are broadcast from rank 0 so all ranks start identical.
//!
//! Today the buckets are reduced after backward has finished; overlapping them with backward
//! through gradient hooks is the next step (see the distributed issue).
use super::group::{DistError, ProcessGroup, ReduceOp};
use super::Collective;
use tch::{nn, Tensor};

pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;

pub struct Ddp {
    pub group: ProcessGroup,
    pub bucket_bytes: usize,
}

impl Ddp {
    pub fn new(group: ProcessGroup) -> Self {
        Self {
            group,
            bucket_bytes: BUCKET_BYTES,
        }
    }

    /// Overwrites every variable of `vs` (sorted by name) with rank 0's values.
    pub fn broadcast_parameters(&mut self, vs: &nn::VarStore) -> Result<(), DistError> {
        let mut vars: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        tch::no_grad(|| {
            for (_, mut t) in vars {
                self.group.broadcast(&mut t, 0)?;
            }
            Ok(())
        })
    }
}

impl Collective for Ddp {
    fn world_size(&self) -> usize {
        self.group.world
    }

    fn all_reduce_sum(&mut self, t: &mut Tensor) -> Result<(), DistError> {
        self.group
            .all_reduce(std::slice::from_mut(t), ReduceOp::Sum)
    }

    fn average_gradients(&mut self, grads: &mut [Tensor]) -> Result<(), DistError> {
        let world = self.group.world as f64;
        let defined: Vec<&mut Tensor> = grads.iter_mut().filter(|g| g.defined()).collect();
        let mut bucket: Vec<&mut Tensor> = Vec::new();
        let mut bytes = 0;
        let flush =
            |bucket: &mut Vec<&mut Tensor>, group: &mut ProcessGroup| -> Result<(), DistError> {
                if bucket.is_empty() {
                    return Ok(());
                }
                tch::no_grad(|| {
                    let flats: Vec<Tensor> = bucket.iter().map(|g| g.flatten(0, -1)).collect();
                    let mut flat = Tensor::cat(&flats, 0);
                    group.all_reduce(std::slice::from_mut(&mut flat), ReduceOp::Sum)?;
                    let flat = flat / world;
                    let mut offset = 0;
                    for g in bucket.iter_mut() {
                        let n = g.numel() as i64;
                        g.copy_(&flat.narrow(0, offset, n).view_as(g));
                        offset += n;
                    }
                    Ok::<(), DistError>(())
                })?;
                bucket.clear();
                Ok(())
            };
        for g in defined {
            bytes += g.numel() * g.kind().elt_size_in_bytes();
            bucket.push(g);
            if bytes >= self.bucket_bytes {
                flush(&mut bucket, &mut self.group)?;
                bytes = 0;
            }
        }
        flush(&mut bucket, &mut self.group)
    }
}
