//! What the GPU itself reports, for the progress line and the metrics: its name (which picks
//! the peak for MFU from [`peak_tflops`]), utilisation and memory, read through NVML. NVML
//! is the driver's library (`libnvidia-ml.so.1`), loaded at run time: a machine without the
//! NVIDIA driver (CPU nodes, CI, this trainer's CPU build) simply has no monitor.
use crate::config::Precision;
use nvml_wrapper::Nvml;

/// Peak dense TFLOP/s of one GPU at the training precision, from the vendor's data sheets
/// (tensor cores without sparsity for bf16/fp16; plain FP32 for fp32, since PyTorch and this
/// trainer do not let matmuls fall back to TF32). `name` is what NVML or `nvidia-smi`
/// reports. None for a GPU the table does not know (set `train.peak_tflops`) or a precision
/// it has no tensor cores for.
///
/// The pattern, so that no model is taken for another: the vendor prefix (`NVIDIA `,
/// `Tesla `) is dropped, the rest is split at spaces and hyphens, and the first word is the
/// model, compared whole ("L40S" is not "L4", "A10G" is not "A10"); the form factor of the
/// H100/H200/V100 comes from a later word (`PCIe`, `NVL`; SXM otherwise).
pub fn peak_tflops(name: &str, precision: Precision) -> Option<f64> {
    let upper = name.trim().to_ascii_uppercase();
    let rest = ["NVIDIA ", "TESLA "]
        .iter()
        .find_map(|p| upper.strip_prefix(p))
        .unwrap_or(&upper);
    let mut words = rest.split([' ', '-']).filter(|w| !w.is_empty());
    let model = words.next()?;
    let variant = |v: &str| rest.split([' ', '-']).any(|w| w == v);
    let (pcie, nvl) = (variant("PCIE"), variant("NVL"));
    // (fp32, bf16, fp16); bf16 None where the GPU has no bf16 tensor cores.
    let (fp32, bf16, fp16): (f64, Option<f64>, f64) = match model {
        // NVML: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H100 NVL",
        // "NVIDIA H200", "NVIDIA H200 NVL".
        "H100" | "H200" if nvl => (60.0, Some(835.0), 835.0),
        "H100" | "H200" if pcie => (51.0, Some(756.0), 756.0),
        "H100" | "H200" => (67.0, Some(989.0), 989.0),
        // "NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100-PCIE-40GB",
        // "NVIDIA A100 80GB PCIe": one peak for all.
        "A100" => (19.5, Some(312.0), 312.0),
        "A10" => (31.2, Some(125.0), 125.0),
        "L4" => (30.3, Some(121.0), 121.0),
        "L40" => (90.5, Some(181.0), 181.0),
        "L40S" => (91.6, Some(362.0), 362.0),
        "T4" => (8.1, None, 65.0),
        // "Tesla V100-SXM2-16GB", "Tesla V100-PCIE-32GB", "Tesla V100S-PCIE-32GB".
        "V100" if pcie => (14.0, None, 112.0),
        "V100" => (15.7, None, 125.0),
        "V100S" => (16.4, None, 130.0),
        // The A10G (AWS g5) has no public vendor data sheet: no peak is guessed for it.
        _ => return None,
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
            ("NVIDIA A100-SXM4-40GB", Fp16, Some(312.0)),
            ("NVIDIA A100-PCIE-40GB", Fp32, Some(19.5)),
            ("NVIDIA A100 80GB PCIe", Bf16, Some(312.0)),
            ("NVIDIA A10", Bf16, Some(125.0)),
            ("NVIDIA L4", Bf16, Some(121.0)),
            ("NVIDIA L4", Fp32, Some(30.3)),
            ("NVIDIA L40", Bf16, Some(181.0)),
            ("NVIDIA L40S", Bf16, Some(362.0)),
            ("NVIDIA L40S", Fp32, Some(91.6)),
            ("Tesla T4", Fp16, Some(65.0)),
            ("Tesla T4", Bf16, None),
            ("Tesla V100-SXM2-16GB", Fp16, Some(125.0)),
            ("Tesla V100-SXM2-32GB", Fp32, Some(15.7)),
            ("Tesla V100-PCIE-32GB", Fp16, Some(112.0)),
            ("Tesla V100S-PCIE-32GB", Fp16, Some(130.0)),
            ("  NVIDIA L4\n", Bf16, Some(121.0)),
        ];
        for (name, p, want) in cases {
            assert_eq!(peak_tflops(name, p), want, "{name} {p:?}");
        }
    }

    /// Names that contain a known model's name but are another GPU get no peak (FLOP/s
    /// without MFU), never a neighbour's.
    #[test]
    fn near_misses_get_no_peak() {
        for name in [
            "NVIDIA A10G",
            "NVIDIA A100X",
            "NVIDIA A40",
            "NVIDIA L40G",
            "NVIDIA L4S",
            "NVIDIA H800",
            "NVIDIA H100X",
            "NVIDIA GeForce RTX 4090",
            "NVIDIA RTX A6000",
            "NVIDIA RTX 6000 Ada Generation",
            "Tesla T40",
            "Tesla V1000",
            "NVIDIA",
            "",
        ] {
            for p in [Fp32, Bf16, Fp16] {
                assert_eq!(peak_tflops(name, p), None, "{name:?} {p:?}");
            }
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
