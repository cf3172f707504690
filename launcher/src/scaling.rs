//! `launcher scaling`: the scaling table of the DDP tutorials, measured. The same short
//! training (the user's trainer config, `--max-steps S`, a fresh output folder per size) runs
//! at every size with the config's per-task batch, one job after the other (`afterany`, so the
//! sizes never share the machines); throughput comes from rank 0's per-step progress lines.
//! Efficiency = per-task throughput at N tasks / per-task throughput at the smallest size.
use crate::cluster::{Cluster, Runtime};
use crate::container_view::{self, HostPaths};
use crate::render::{context, Allocation, Dependency, Job, Manifest, Rendered, Shape};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One allocation size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Size {
    pub nodes: u32,
    pub tasks_per_node: u32,
}

impl Size {
    pub fn tasks(&self) -> u32 {
        self.nodes * self.tasks_per_node
    }

    fn name(&self) -> String {
        format!("scaling-{}x{}", self.nodes, self.tasks_per_node)
    }
}

/// Every `nodes × tasks_per_node` combination, smallest first.
pub fn sizes(nodes: &[u32], tasks_per_node: &[u32]) -> anyhow::Result<Vec<Size>> {
    anyhow::ensure!(
        !nodes.is_empty() && !tasks_per_node.is_empty(),
        "--nodes and --tasks-per-node need at least one value"
    );
    anyhow::ensure!(
        nodes.iter().chain(tasks_per_node).all(|&n| n >= 1),
        "--nodes and --tasks-per-node values must be at least 1"
    );
    let mut v: Vec<Size> = nodes
        .iter()
        .flat_map(|&n| {
            tasks_per_node.iter().map(move |&t| Size {
                nodes: n,
                tasks_per_node: t,
            })
        })
        .collect();
    v.sort_by_key(|s| (s.tasks(), s.nodes));
    v.dedup();
    Ok(v)
}

/// The trainer steps each size runs (the first two are warm-up and not timed).
pub const MIN_STEPS: u64 = 5;

/// One job per size, each with its own config (output under `<out>/runs/<size>`, a progress
/// line every step) written into the render folder.
pub fn render(
    cluster: &Cluster,
    host: &HostPaths,
    sizes: &[Size],
    steps: u64,
) -> anyhow::Result<Rendered> {
    anyhow::ensure!(
        steps >= MIN_STEPS,
        "--steps must be at least {MIN_STEPS} (two are warm-up)"
    );
    let (base, config_dir) = match cluster.runtime {
        Runtime::Host => (
            scdino_config::Config::from_yaml(
                host.trainer_text,
                &host.trainer_config.display().to_string(),
            )?,
            host.out.to_path_buf(),
        ),
        Runtime::Pyxis => (
            container_view::map_config(cluster, host)?.config,
            container_view::container_dir(cluster, host.out, "the render folder")?,
        ),
    };
    let log_dir = crate::render::log_dir(cluster, host.out)?;
    let ctx = context(cluster, host.cwd)?;
    let mut jobs = Vec::new();
    let mut scripts = Vec::new();
    let mut files = Vec::new();
    let mut prev: Option<String> = None;
    for (i, size) in sizes.iter().enumerate() {
        let name = size.name();
        let cfg = base.edit(&format!("{name} (scaling)"), |s| {
            s.run.output_dir = config_dir.join("runs").join(&name);
            s.train.log_every = 1;
        })?;
        let config_file = format!("{name}.yaml");
        files.push((
            config_file.clone(),
            format!(
                "# Written by launcher scaling from {}: a fresh output folder per size and a\n# progress line every step.\n{}",
                host.trainer_config.display(),
                cfg.to_yaml()
            ),
        ));
        let shape = Shape {
            distributed: Some(Allocation {
                nodes: size.nodes,
                tasks_per_node: size.tasks_per_node,
                gpus_per_node: cluster.slurm.gpus_per_node,
            }),
            one_gpu: false,
            preemptible: false,
            array: None,
        };
        let mut args = vec![
            vec!["train".to_string()],
            vec![
                "--config".to_string(),
                config_dir.join(&config_file).display().to_string(),
            ],
            vec!["--max-steps".to_string(), steps.to_string()],
        ];
        // As the pipeline's training jobs: `training.threads` per rank.
        if let Some(t) = cluster.training.threads {
            args.push(vec!["--threads".to_string(), t.to_string()]);
        }
        let log = log_dir.join(format!("{name}-%j.out"));
        let script = format!("{:02}-{name}.sbatch", i + 1);
        scripts.push((
            script.clone(),
            ctx.job_script(&name, "scaling", shape, &args, &log, None),
        ));
        jobs.push(Job {
            name: name.clone(),
            stage: "scaling".into(),
            script,
            log,
            after: prev
                .iter()
                .map(|p| Dependency {
                    job: p.clone(),
                    kind: "afterany".into(),
                })
                .collect(),
            job_id: None,
            finished_earlier: false,
        });
        prev = Some(name);
    }
    Ok(Rendered {
        manifest: Manifest {
            launcher_version: env!("CARGO_PKG_VERSION").into(),
            cluster_file: None,
            trainer_config: Some(host.trainer_config.to_path_buf()),
            runtime: cluster.runtime,
            log_dir,
            jobs,
        },
        scripts,
        files,
        warnings: vec![],
    })
}

/// What one size's log says.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    /// Rank 0's images/s of each step, in order.
    pub per_step: Vec<f64>,
    pub peak_lr: Option<f64>,
    pub batch_per_task: Option<u64>,
}

/// Reads rank 0's progress lines (`... imgs/s: X ...`, with or without the rank prefix of
/// a distributed run) and the lr line
/// (`... global batch G (W x B): peak lr L`).
pub fn parse_log(log: &str) -> Measured {
    let number_after = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        rest.split_whitespace()
            .next()?
            .trim_end_matches(',')
            .parse()
            .ok()
    };
    let mut m = Measured {
        per_step: Vec::new(),
        peak_lr: None,
        batch_per_task: None,
    };
    for line in log.lines().map(scdino_base::log::without_rank_prefix) {
        if line.starts_with("Epoch: [") && line.contains("imgs/s: ") {
            if let Some(v) = number_after(line, "imgs/s: ") {
                m.per_step.push(v);
            }
        } else if line.starts_with("lr: ") && line.contains("peak lr ") {
            m.peak_lr = number_after(line, "peak lr ");
            m.batch_per_task = line
                .split(" x ")
                .nth(1)
                .and_then(|r| r.split(')').next())
                .and_then(|b| b.trim().parse().ok());
        }
    }
    m
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Row {
    pub nodes: u32,
    pub tasks_per_node: u32,
    pub tasks: u32,
    pub global_batch: u64,
    pub peak_lr: f64,
    /// All tasks together (rank 0's rate × tasks: data-parallel steps are synchronous).
    pub images_per_second: f64,
    pub images_per_second_per_task: f64,
    /// Per-task throughput against the smallest size's.
    pub scaling_efficiency: f64,
    pub timed_steps: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Report {
    pub kind: String,
    pub steps: u64,
    pub rows: Vec<Row>,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The table from each size's measurements (sizes in order, smallest first).
pub fn report(steps: u64, measured: &[(Size, Measured)]) -> anyhow::Result<Report> {
    let mut rows = Vec::new();
    for (size, m) in measured {
        anyhow::ensure!(
            m.per_step.len() >= 3,
            "{}: only {} progress lines in the log (at least 3 needed; the first two are warm-up)",
            size.name(),
            m.per_step.len()
        );
        let mut timed = m.per_step[2..].to_vec();
        let per_task = median(&mut timed);
        let batch = m.batch_per_task.unwrap_or(0);
        rows.push(Row {
            nodes: size.nodes,
            tasks_per_node: size.tasks_per_node,
            tasks: size.tasks(),
            global_batch: batch * u64::from(size.tasks()),
            peak_lr: m.peak_lr.unwrap_or(f64::NAN),
            images_per_second: per_task * f64::from(size.tasks()),
            images_per_second_per_task: per_task,
            scaling_efficiency: 0.0,
            timed_steps: timed.len(),
        });
    }
    let base = rows
        .first()
        .map(|r| r.images_per_second_per_task)
        .unwrap_or(0.0);
    for r in &mut rows {
        r.scaling_efficiency = r.images_per_second_per_task / base;
    }
    Ok(Report {
        kind: "scdino.scaling".into(),
        steps,
        rows,
    })
}

pub fn markdown(r: &Report) -> String {
    let mut o = format!(
        "# Scaling efficiency\n\n{} training steps per size (median of the steps after two warm-up steps), per-task batch fixed, peak lr scaled by the trainer's rule.\n\n| nodes | tasks/node | tasks | global batch | peak lr | images/s | images/s per task | efficiency |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        r.steps
    );
    for x in &r.rows {
        o.push_str(&format!(
            "| {} | {} | {} | {} | {:.3e} | {:.1} | {:.2} | {:.1} % |\n",
            x.nodes,
            x.tasks_per_node,
            x.tasks,
            x.global_batch,
            x.peak_lr,
            x.images_per_second,
            x.images_per_second_per_task,
            100.0 * x.scaling_efficiency
        ));
    }
    o
}

static FONT: &[u8] = include_bytes!("../../trainer/assets/DejaVuSans.ttf");

/// Images/s against tasks, with the ideal line (the smallest size's per-task rate × tasks).
pub fn png(r: &Report) -> anyhow::Result<Vec<u8>> {
    use plotters::prelude::*;
    static FONT_ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    FONT_ONCE.get_or_init(|| {
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    });
    let (w, h) = (720u32, 480u32);
    let mut buf = vec![255u8; (w * h * 3) as usize];
    {
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
        let max_tasks = r.rows.iter().map(|x| x.tasks).max().unwrap_or(1) as f64;
        let base = r.rows.first().map_or(0.0, |x| x.images_per_second_per_task);
        let max_y = r
            .rows
            .iter()
            .map(|x| x.images_per_second)
            .fold(base * max_tasks, f64::max)
            * 1.1;
        let mut chart = ChartBuilder::on(&root)
            .caption("Training throughput by number of tasks", ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..max_tasks * 1.1, 0f64..max_y.max(1e-9))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("tasks")
            .y_desc("images/s")
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .draw_series(LineSeries::new(
                [(0.0, 0.0), (max_tasks, base * max_tasks)],
                BLACK.mix(0.4),
            ))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label("ideal (linear)")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.mix(0.4)));
        let pts: Vec<(f64, f64)> = r
            .rows
            .iter()
            .map(|x| (f64::from(x.tasks), x.images_per_second))
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), BLUE.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .label("measured")
            .legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLUE));
        chart
            .draw_series(pts.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_series_labels()
            .border_style(BLACK)
            .background_style(WHITE)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    use image::ImageEncoder;
    let mut out = Vec::new();
    image::codecs::png::PngEncoder::new(&mut out).write_image(
        &buf,
        w,
        h,
        image::ExtendedColorType::Rgb8,
    )?;
    Ok(out)
}

/// Writes `scaling.md`, `scaling.json` and `scaling.png` into `out`; their paths.
pub fn write(r: &Report, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let md = out.join("scaling.md");
    let json = out.join("scaling.json");
    let png_path = out.join("scaling.png");
    crate::fsutil::write_atomic(&md, markdown(r).as_bytes())?;
    crate::fsutil::write_atomic(&json, (serde_json::to_string_pretty(r)? + "\n").as_bytes())?;
    crate::fsutil::write_atomic(&png_path, &png(r)?)?;
    Ok(vec![md, json, png_path])
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = "[launcher] scaling-1x2 job 5 restart 0 on n1, master n1:61005
[rank 0/2 local 0 n1] training on Cpu
[rank 0/2 local 0 n1] lr: 0.005 per 256 images, Linear scaling to the global batch 32 (2 x 16): peak lr 6.25e-4
[rank 0/2 local 0 n1] Epoch: [0/3]  [1/7]  loss: 4.9 (4.9)  lr: 1e-4  wd: 0.04  imgs/s: 2.0  data: 0.1s  step: 8.0s
Epoch: [0/3]  [2/7]  loss: 4.9 (4.9)  lr: 1e-4  wd: 0.04  imgs/s: 7.0  data: 0.0s  step: 2.3s
Epoch: [0/3]  [3/7]  loss: 4.9 (4.9)  lr: 1e-4  wd: 0.04  imgs/s: 8.0  data: 0.0s  step: 2.0s
Epoch: [0/3]  [4/7]  loss: 4.9 (4.9)  lr: 1e-4  wd: 0.04  imgs/s: 10.0  data: 0.0s  step: 1.6s
Epoch: [0/3]  [5/7]  loss: 4.9 (4.9)  lr: 1e-4  wd: 0.04  imgs/s: 9.0  data: 0.0s  step: 1.8s
";

    #[test]
    fn logs_give_throughput_lr_and_batch() {
        let m = parse_log(LOG);
        assert_eq!(m.per_step, [2.0, 7.0, 8.0, 10.0, 9.0]);
        assert_eq!(m.peak_lr, Some(6.25e-4));
        assert_eq!(m.batch_per_task, Some(16));
    }

    #[test]
    fn efficiency_is_per_task_throughput_against_the_smallest_size() {
        let one = Measured {
            per_step: vec![1.0, 5.0, 10.0, 10.0, 10.0],
            peak_lr: Some(3.125e-4),
            batch_per_task: Some(16),
        };
        let two = parse_log(LOG);
        let s1 = Size {
            nodes: 1,
            tasks_per_node: 1,
        };
        let s2 = Size {
            nodes: 1,
            tasks_per_node: 2,
        };
        let r = report(5, &[(s1, one), (s2, two)]).unwrap();
        assert_eq!(r.rows[0].scaling_efficiency, 1.0);
        assert_eq!(r.rows[1].images_per_second_per_task, 9.0);
        assert_eq!(r.rows[1].images_per_second, 18.0);
        assert_eq!(r.rows[1].global_batch, 32);
        assert!((r.rows[1].scaling_efficiency - 0.9).abs() < 1e-12);
        let md = markdown(&r);
        assert!(
            md.contains("| 1 | 2 | 2 | 32 | 6.250e-4 | 18.0 | 9.00 | 90.0 % |"),
            "{md}"
        );
        let png = png(&r).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let short = Measured {
            per_step: vec![1.0, 2.0],
            peak_lr: None,
            batch_per_task: None,
        };
        assert!(report(5, &[(s1, short)]).is_err());
    }

    #[test]
    fn sizes_are_the_product_smallest_first() {
        let s = sizes(&[2, 1], &[2, 1]).unwrap();
        let t: Vec<(u32, u32)> = s.iter().map(|s| (s.nodes, s.tasks_per_node)).collect();
        assert_eq!(t, [(1, 1), (1, 2), (2, 1), (2, 2)]);
        assert!(sizes(&[0], &[1]).is_err());
    }
}
