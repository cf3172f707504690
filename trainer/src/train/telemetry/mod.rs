//! Where the epoch loop's numbers go: the progress line a person reads ([`progress`]),
//! TensorBoard scalars, the Prometheus textfile and scDINO's `log.txt`, all fed once per
//! logged window ([`throughput`]). Only rank 0 writes (every rank computes the same global
//! values); on other ranks every call is a no-op.
pub mod progress;
pub mod throughput;

use super::collapse::TeacherSnapshot;
use super::flops::Utilisation;
use super::loss_terms::TermValues;
use super::train_error::TrainError;
use crate::gpu::GpuSample;
use crate::layout::ModelLayout;
use crate::monitoring::{Metric, PromTextfile, TensorBoardWriter};
use std::io::Write;
use std::path::{Path, PathBuf};

/// The values of one logged step.
pub struct StepRecord<'a> {
    pub iteration: usize,
    pub epoch: usize,
    /// The total loss; `terms` its parts.
    pub loss: f64,
    pub terms: &'a TermValues,
    pub lr: f64,
    pub weight_decay: f64,
    pub momentum: f64,
    pub teacher_temp: f64,
    pub images_per_second: f64,
    pub data_wait_seconds: f64,
    pub teacher: &'a TeacherSnapshot,
    /// Achieved FLOP/s and MFU of this rank over the window (see [`super::flops`]).
    pub utilisation: Utilisation,
    /// NVML's reading of this rank's GPU (absent on CPU and without a driver).
    pub gpu: Option<GpuSample>,
}

pub struct Telemetry {
    sinks: Option<Sinks>,
}

struct Sinks {
    tb: TensorBoardWriter,
    prom: PromTextfile,
    log: PathBuf,
    run_label: String,
    rank: usize,
}

impl Telemetry {
    pub fn new(rank: usize, files: &ModelLayout, run_label: &str) -> Result<Self, TrainError> {
        if rank != 0 {
            return Ok(Self { sinks: None });
        }
        Ok(Self {
            sinks: Some(Sinks {
                tb: TensorBoardWriter::create(&files.tensorboard())?,
                prom: PromTextfile::new(files.metrics_prom()),
                log: files.log(),
                run_label: run_label.to_string(),
                rank,
            }),
        })
    }

    /// TensorBoard scalars at `iteration` and a rewrite of the Prometheus textfile.
    pub fn step(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        let Some(s) = &mut self.sinks else {
            return Ok(());
        };
        s.scalars(r)?;
        let metrics = s.gauges(r);
        s.prom.write(&metrics)?;
        Ok(())
    }

    /// The end of an epoch: scDINO's `log.txt` line (appended and synced) and the epoch's
    /// mean loss in TensorBoard.
    pub fn epoch(
        &mut self,
        finished: usize,
        line: &serde_json::Value,
        mean_loss: f64,
    ) -> Result<(), TrainError> {
        let Some(s) = &mut self.sinks else {
            return Ok(());
        };
        append_line(&s.log, &line.to_string())?;
        s.tb.add_scalars(finished as i64, &[("epoch/loss", mean_loss as f32)])?;
        s.tb.flush()?;
        Ok(())
    }

    /// Before the loop returns early (stop signal, step limit, collapse).
    pub fn flush(&mut self) -> Result<(), TrainError> {
        if let Some(s) = &mut self.sinks {
            s.tb.flush()?;
        }
        Ok(())
    }
}

impl Sinks {
    /// The step's TensorBoard scalars.
    fn scalars(&mut self, r: &StepRecord) -> Result<(), TrainError> {
        let t = r.teacher;
        self.tb.add_scalars(
            r.iteration as i64,
            &[
                ("train/loss", r.loss as f32),
                ("train/lr", r.lr as f32),
                ("train/wd", r.weight_decay as f32),
                ("train/momentum", r.momentum as f32),
                ("train/teacher_temp", r.teacher_temp as f32),
                ("train/images_per_second", r.images_per_second as f32),
                ("train/data_wait_seconds", r.data_wait_seconds as f32),
                ("train/teacher_entropy", t.teacher_entropy as f32),
                ("train/student_teacher_kl", t.kl as f32),
                ("train/prototypes_in_use", t.prototypes_in_use as f32),
                (
                    "train/tflops_per_second",
                    (r.utilisation.flops_per_second / 1e12) as f32,
                ),
            ],
        )?;
        if let Some(mfu) = r.utilisation.mfu {
            self.tb
                .add_scalars(r.iteration as i64, &[("train/mfu", mfu as f32)])?;
        }
        if r.terms.split() {
            let tags: Vec<(String, f32)> = r
                .terms
                .iter()
                .map(|(info, v)| (format!("train/{}_loss", info.name), v as f32))
                .collect();
            let scalars: Vec<(&str, f32)> = tags.iter().map(|(t, v)| (t.as_str(), *v)).collect();
            self.tb.add_scalars(r.iteration as i64, &scalars)?;
        }
        if let Some(g) = r.gpu {
            self.tb.add_scalars(
                r.iteration as i64,
                &[
                    ("gpu/utilization_percent", g.utilization_percent as f32),
                    ("gpu/memory_used_bytes", g.memory_used_bytes as f32),
                ],
            )?;
        }
        Ok(())
    }

    /// The step's Prometheus gauges, labelled with the run and the rank.
    fn gauges(&self, r: &StepRecord) -> Vec<Metric> {
        let t = r.teacher;
        let m = |name: &str, help: &str, v: f64| {
            Metric::gauge(name, help, v)
                .label("run", &self.run_label)
                .label("rank", self.rank.to_string())
        };
        let mut metrics = vec![m(
            "scdino_train_loss",
            "total loss of the last iteration",
            r.loss,
        )];
        metrics.extend(
            r.terms
                .iter()
                .map(|(info, v)| m(&format!("scdino_train_{}_loss", info.name), info.help, v)),
        );
        metrics.extend([
            m("scdino_train_lr", "learning rate", r.lr),
            m("scdino_train_epoch", "current epoch", r.epoch as f64),
            m(
                "scdino_train_iteration",
                "global iteration done",
                r.iteration as f64,
            ),
            m(
                "scdino_train_images_per_second",
                "training throughput over the last window",
                r.images_per_second,
            ),
            m(
                "scdino_train_data_wait_seconds",
                "time spent waiting for the loader in the last window",
                r.data_wait_seconds,
            ),
            m(
                "scdino_train_teacher_entropy",
                "mean entropy (nats) of the centred, sharpened teacher output",
                t.teacher_entropy,
            ),
            m(
                "scdino_train_student_teacher_kl",
                "mean KL(teacher || student) of the last iteration",
                t.kl,
            ),
            m(
                "scdino_train_prototypes_in_use",
                "distinct teacher argmax prototypes in the last global batch",
                t.prototypes_in_use as f64,
            ),
            m(
                "scdino_train_flops_per_second",
                "model FLOP/s of this rank over the last window (matrix products, analytic count)",
                r.utilisation.flops_per_second,
            ),
        ]);
        if let Some(mfu) = r.utilisation.mfu {
            metrics.push(m(
                "scdino_train_mfu",
                "model FLOPs utilisation: achieved FLOP/s over train.peak_tflops",
                mfu,
            ));
        }
        if let Some(g) = r.gpu {
            metrics.push(m(
                "scdino_gpu_utilization_percent",
                "percent of the last NVML sample period in which a kernel ran on this rank's GPU",
                g.utilization_percent,
            ));
            metrics.push(m(
                "scdino_gpu_memory_used_bytes",
                "memory in use on this rank's GPU (NVML)",
                g.memory_used_bytes,
            ));
            metrics.push(m(
                "scdino_gpu_memory_total_bytes",
                "memory of this rank's GPU (NVML)",
                g.memory_total_bytes,
            ));
        }
        metrics
    }
}

fn append_line(path: &Path, line: &str) -> Result<(), TrainError> {
    let io = |source| TrainError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io)?;
    writeln!(f, "{line}").map_err(io)?;
    f.sync_data().map_err(io)
}
