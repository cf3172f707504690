//! Throughput between two logged steps. Logging every step would cost collectives and file
//! writes, so the loop sums the images and loader waits of the steps in between and reports
//! their rates once per `train.log_every`: images/s, FLOP/s and MFU (from the analytic step
//! count, see [`crate::train::flops`]) and NVML's view of the GPU.
use crate::config::Config;
use crate::gpu::{GpuMonitor, GpuSample};
use crate::train::flops::{step_flops, Utilisation};
use std::time::{Duration, Instant};

/// The steps since the last logged one.
pub struct LogWindow {
    since: Instant,
    images: usize,
    data_wait_seconds: f64,
}

impl LogWindow {
    pub fn start() -> Self {
        Self {
            since: Instant::now(),
            images: 0,
            data_wait_seconds: 0.0,
        }
    }

    /// One step of `images` images, whose batch the loop waited `wait` for.
    pub fn add(&mut self, images: usize, wait: Duration) {
        self.images += images;
        self.data_wait_seconds += wait.as_secs_f64();
    }
}

/// What one window measured.
#[derive(Debug, Clone, Copy)]
pub struct WindowRates {
    pub images_per_second: f64,
    /// Loader waits summed over the window.
    pub data_wait_seconds: f64,
    /// Wall time per step.
    pub step_seconds: f64,
    pub utilisation: Utilisation,
    pub gpu: Option<GpuSample>,
}

/// Turns windows into rates for one run's model, precision and device.
pub struct ThroughputMeter {
    /// FLOPs grow linearly with the batch, so a window's work is this times its images.
    flops_per_image: f64,
    peak_tflops: Option<f64>,
    gpu: Option<GpuMonitor>,
    batch: usize,
}

impl ThroughputMeter {
    pub fn new(cfg: &Config, channels: usize, device: tch::Device) -> Self {
        let gpu = match device {
            tch::Device::Cuda(i) => GpuMonitor::open(i),
            _ => None,
        };
        Self {
            flops_per_image: step_flops(cfg, channels, 1).total(),
            peak_tflops: crate::gpu::mfu_peak(
                cfg.train.peak_tflops,
                gpu.as_ref(),
                cfg.train.precision,
            ),
            gpu,
            batch: cfg.train.batch_size_per_gpu,
        }
    }

    /// The rates of `window` up to now (and a GPU reading taken now).
    pub fn rates(&self, window: &LogWindow) -> WindowRates {
        let secs = window.since.elapsed().as_secs_f64().max(1e-9);
        let images = window.images as f64;
        WindowRates {
            images_per_second: images / secs,
            data_wait_seconds: window.data_wait_seconds,
            step_seconds: secs / (images / self.batch as f64).max(1.0),
            utilisation: Utilisation::measure(self.flops_per_image, images, secs, self.peak_tflops),
            gpu: self.gpu.as_ref().and_then(|g| g.sample()),
        }
    }
}
