//! Per-iteration schedules, computed up front exactly as scDINO's `utils.cosine_scheduler` and
//! its teacher-temperature warm-up (numpy semantics, so values match to the last bit or ulp).

/// `np.linspace(start, stop, num)` (endpoint included), with numpy's arithmetic:
/// `i·step + start`, the last element set to `stop`.
pub fn linspace(start: f64, stop: f64, num: usize) -> Vec<f64> {
    match num {
        0 => vec![],
        1 => vec![start],
        _ => {
            let step = (stop - start) / (num - 1) as f64;
            let mut v: Vec<f64> = (0..num).map(|i| i as f64 * step + start).collect();
            v[num - 1] = stop;
            v
        }
    }
}

/// scDINO's `cosine_scheduler(base, final, epochs, niter_per_ep, warmup_epochs,
/// start_warmup_value)`: a linear warm-up to `base`, then a half cosine to `final`.
/// Length `epochs · niter_per_ep`.
pub fn cosine_schedule(
    base: f64,
    final_value: f64,
    epochs: usize,
    niter_per_ep: usize,
    warmup_epochs: usize,
    start_warmup_value: f64,
) -> Vec<f64> {
    let warmup_iters = warmup_epochs * niter_per_ep;
    let total = epochs * niter_per_ep;
    let mut schedule = if warmup_epochs > 0 {
        linspace(start_warmup_value, base, warmup_iters)
    } else {
        vec![]
    };
    let rest = total.saturating_sub(warmup_iters);
    schedule.extend((0..rest).map(|i| {
        final_value
            + 0.5
                * (base - final_value)
                * (1.0 + (std::f64::consts::PI * i as f64 / rest as f64).cos())
    }));
    schedule
}

/// Teacher temperature per epoch: linear warm-up over `warmup_epochs`, then constant.
pub fn teacher_temp_schedule(
    warmup_temp: f64,
    temp: f64,
    warmup_epochs: usize,
    epochs: usize,
) -> Vec<f64> {
    let mut s = linspace(warmup_temp, temp, warmup_epochs);
    s.extend(std::iter::repeat_n(
        temp,
        epochs.saturating_sub(warmup_epochs),
    ));
    s
}

/// The three per-iteration schedules of a run.
#[derive(Debug, Clone)]
pub struct Schedules {
    pub lr: Vec<f64>,
    pub weight_decay: Vec<f64>,
    pub momentum: Vec<f64>,
    pub iters_per_epoch: usize,
}

impl Schedules {
    /// `peak_lr` is already scaled to the global batch (scDINO: `lr · batch · world / 256`).
    pub fn new(cfg: &crate::config::TrainSection, peak_lr: f64, iters_per_epoch: usize) -> Self {
        let e = cfg.epochs;
        Self {
            lr: cosine_schedule(
                peak_lr,
                cfg.min_lr,
                e,
                iters_per_epoch,
                cfg.warmup_epochs,
                0.0,
            ),
            weight_decay: cosine_schedule(
                cfg.weight_decay,
                cfg.weight_decay_end,
                e,
                iters_per_epoch,
                0,
                0.0,
            ),
            momentum: cosine_schedule(cfg.momentum_teacher, 1.0, e, iters_per_epoch, 0, 0.0),
            iters_per_epoch,
        }
    }
}

/// scDINO's linear scaling rule: the configured lr is for a global batch of 256.
pub fn scaled_lr(lr: f64, batch_per_process: usize, world_size: usize) -> f64 {
    lr * (batch_per_process * world_size) as f64 / 256.0
}

/// The peak lr for a global batch under `rule` (`train.lr_scaling`); the configured lr is for
/// a global batch of 256 either way.
pub fn scale_lr(
    rule: crate::config::LrScaling,
    lr: f64,
    batch_per_process: usize,
    world_size: usize,
) -> f64 {
    match rule {
        crate::config::LrScaling::Linear => scaled_lr(lr, batch_per_process, world_size),
        crate::config::LrScaling::Sqrt => {
            lr * ((batch_per_process * world_size) as f64 / 256.0).sqrt()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linspace_endpoints_and_spacing() {
        assert_eq!(linspace(0.0, 1.0, 5), vec![0.0, 0.25, 0.5, 0.75, 1.0]);
        assert_eq!(linspace(3.0, 9.0, 1), vec![3.0]);
        assert!(linspace(0.0, 1.0, 0).is_empty());
    }

    #[test]
    fn cosine_warmup_peak_and_end() {
        let s = cosine_schedule(1.0, 0.0, 4, 10, 1, 0.0);
        assert_eq!(s.len(), 40);
        assert_eq!(s[0], 0.0);
        assert_eq!(s[9], 1.0);
        assert_eq!(s[10], 1.0);
        assert!(s[39] > 0.0 && s[39] < 0.01);
        // The published run: lr 5e-4 with 8×30 images peaks at 4.6875e-4.
        assert_eq!(scaled_lr(5e-4, 30, 8), 4.6875e-4);
    }

    #[test]
    fn sqrt_scaling_is_the_square_root_of_the_batch_ratio() {
        use crate::config::LrScaling;
        assert_eq!(scale_lr(LrScaling::Linear, 5e-4, 30, 8), 4.6875e-4);
        assert_eq!(scale_lr(LrScaling::Sqrt, 1e-3, 64, 16), 2e-3);
        assert_eq!(scale_lr(LrScaling::Sqrt, 1e-3, 16, 4), 5e-4);
    }
}
