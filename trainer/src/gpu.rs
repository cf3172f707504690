//! What the GPU itself reports, for the progress line and the metrics: its name (which picks
//! the peak for MFU from [`peak_tflops`]), utilisation and memory, read through NVML. NVML
//! is the driver's library (`libnvidia-ml.so.1`), loaded at run time: a machine without the
//! NVIDIA driver (CPU nodes, CI, this trainer's CPU build) simply has no monitor.
use crate::config::Precision;
use nvml_wrapper::Nvml;

/// Peak dense TFLOP/s of one GPU at the training precision, from the vendor's data sheets
/// (tensor cores without sparsity for bf16/fp16; plain FP32 for fp32, since PyTorch and this
/// trainer do not let matmuls fall back to TF32). `name` is what NVML or `nvidia-smi`
/// reports. None for an unknown GPU (set `train.peak_tflops`) or an unsupported precision.
pub fn peak_tflops(name: &str, precision: Precision) -> Option<f64> {
    let n = name.to_ascii_uppercase();
    let has = |s: &str| n.contains(s);
    // (fp32, bf16, fp16); bf16 None where the GPU has no bf16 tensor cores.
    let (fp32, bf16, fp16): (f64, Option<f64>, f64) = if has("H200") || has("H100") {
        if has("NVL") {
            (60.0, Some(835.0), 835.0)
        } else if has("PCIE") {
            (51.0, Some(756.0), 756.0)
        } else {
            // SXM (NVML: "NVIDIA H100 80GB HBM3", "NVIDIA H200").
            (67.0, Some(989.0), 989.0)
        }
    } else if has("A100") {
        (19.5, Some(312.0), 312.0)
    } else if has(" L4") || n.ends_with("L4") {
        (30.3, Some(121.0), 121.0)
    } else if has("T4") {
        (8.1, None, 65.0)
    } else if has("V100") {
        if has("PCIE") {
            (14.0, None, 112.0)
        } else {
            (15.7, None, 125.0)
        }
    } else {
        return None;
    };
    match precision {
        Precision::Fp32 => Some(fp32),
        Precision::Bf16 => bf16,
        Precision::Fp16 => Some(fp16),
    }
}

/// The peak MFU is measured against: `train.peak_tflops` when set, else the table's peak for
/// the GPU NVML names (said once at start, as is a GPU the table does not know), else none.
pub fn mfu_peak(
    configured: Option<f64>,
    gpu: Option<&GpuMonitor>,
    precision: Precision,
) -> Option<f64> {
    if configured.is_some() {
        return configured;
    }
    let g = gpu?;
    let peak = peak_tflops(g.name(), precision);
    match peak {
        Some(p) => tracing::info!(
            "MFU against {p} TFLOP/s, the {precision:?} peak of the {} (train.peak_tflops overrides)",
            g.name()
        ),
        None => tracing::info!(
            "no {precision:?} peak known for the {}: set train.peak_tflops for MFU",
            g.name()
        ),
    }
    peak
}

/// One reading of the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuSample {
    /// Percent of the last sample period in which a kernel ran.
    pub utilization_percent: f64,
    pub memory_used_bytes: f64,
    pub memory_total_bytes: f64,
}

/// The NVML handle of the GPU this process trains on.
pub struct GpuMonitor {
    nvml: Nvml,
    index: u32,
    name: String,
}

impl GpuMonitor {
    /// The GPU behind CUDA device `cuda_index` of this process, or None without a driver.
    /// NVML counts every GPU of the node while CUDA counts only `CUDA_VISIBLE_DEVICES`, so the
    /// index is mapped through that list (indices or `GPU-…` UUIDs).
    pub fn open(cuda_index: usize) -> Option<Self> {
        let nvml = Nvml::builder()
            .lib_path(std::ffi::OsStr::new("libnvidia-ml.so.1"))
            .init()
            .ok()?;
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let index = match visible
            .as_deref()
            .and_then(|v| v.split(',').nth(cuda_index))
            .map(str::trim)
        {
            Some(uuid) if uuid.starts_with("GPU-") => {
                nvml.device_by_uuid(uuid).ok()?.index().ok()?
            }
            Some(i) => i.parse().ok()?,
            None => u32::try_from(cuda_index).ok()?,
        };
        let name = nvml.device_by_index(index).ok()?.name().ok()?;
        Some(Self { nvml, index, name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Utilisation and memory now; None if the driver stops answering.
    pub fn sample(&self) -> Option<GpuSample> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        let util = d.utilization_rates().ok()?;
        let mem = d.memory_info().ok()?;
        Some(GpuSample {
            utilization_percent: f64::from(util.gpu),
            memory_used_bytes: mem.used as f64,
            memory_total_bytes: mem.total as f64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Precision::*;

    #[test]
    fn peaks_follow_the_names_nvml_reports() {
        let cases = [
            ("NVIDIA H100 80GB HBM3", Bf16, Some(989.0)),
            ("NVIDIA H100 80GB HBM3", Fp32, Some(67.0)),
            ("NVIDIA H100 PCIe", Fp16, Some(756.0)),
            ("NVIDIA H100 NVL", Bf16, Some(835.0)),
            ("NVIDIA H200", Bf16, Some(989.0)),
            ("NVIDIA H200 NVL", Bf16, Some(835.0)),
            ("NVIDIA A100-SXM4-80GB", Bf16, Some(312.0)),
            ("NVIDIA A100-PCIE-40GB", Fp32, Some(19.5)),
            ("NVIDIA L4", Bf16, Some(121.0)),
            ("Tesla T4", Fp16, Some(65.0)),
            ("Tesla T4", Bf16, None),
            ("Tesla V100-SXM2-16GB", Fp16, Some(125.0)),
            ("NVIDIA GeForce RTX 4090", Bf16, None),
        ];
        for (name, p, want) in cases {
            assert_eq!(peak_tflops(name, p), want, "{name} {p:?}");
        }
    }

    #[test]
    fn the_configured_peak_wins_and_no_gpu_gives_none() {
        assert_eq!(mfu_peak(Some(42.0), None, Bf16), Some(42.0));
        assert_eq!(mfu_peak(None, None, Bf16), None);
    }

    /// This machine has no NVIDIA driver: the monitor is absent, quietly. (On a GPU machine
    /// it names the GPU.)
    #[test]
    fn without_a_driver_there_is_no_monitor() {
        let driver = std::path::Path::new("/proc/driver/nvidia").exists();
        match GpuMonitor::open(0) {
            None => assert!(!driver, "NVML failed to load next to a driver"),
            Some(m) => assert!(driver && !m.name().is_empty()),
        }
    }
}
