//! What a person reads while a run trains: scDINO's `Epoch: [e/E] [b/N] loss: …` line, as one
//! structured `trainer::progress` event (so JSON logs carry every number as a field too), and
//! on a terminal a progress bar under it. Only rank 0 prints: the other ranks' lines would
//! repeat its global values.
use super::StepRecord;

/// Progress for a person at a terminal; plain lines for Slurm logs and pipes. The lines are
/// the same either way (printed above the bar on a terminal).
pub struct Progress {
    bar: Option<indicatif::ProgressBar>,
    /// Ranks other than 0 stay silent (their lines would repeat rank 0's global values).
    quiet: bool,
}

impl Progress {
    /// The bar of `epoch` (of `epochs`), `done` of its `niter` batches already behind it.
    pub fn new(epoch: usize, epochs: usize, niter: usize, done: usize, shown: bool) -> Self {
        use std::io::IsTerminal;
        if !shown {
            return Self {
                bar: None,
                quiet: true,
            };
        }
        let text_log = scdino_base::log::current_format() == scdino_base::log::LogFormat::Text;
        if !text_log || !std::io::stderr().is_terminal() {
            return Self {
                bar: None,
                quiet: false,
            };
        }
        let bar = indicatif::ProgressBar::new(niter as u64);
        let style = indicatif::ProgressStyle::with_template(
            "epoch {prefix} [{bar:30}] {pos}/{len} {msg} ({eta} left)",
        )
        .expect("static template")
        .progress_chars("=> ");
        bar.set_style(style);
        bar.set_prefix(format!("{epoch}/{epochs}"));
        bar.set_position(done as u64);
        crate::logging::show_bar(Some(bar.clone()));
        Self {
            bar: Some(bar),
            quiet: false,
        }
    }

    pub fn step(&self, loss: f64) {
        if let Some(b) = &self.bar {
            b.inc(1);
            b.set_message(format!("loss {loss:.4}"));
        }
    }

    /// Logs `line` if this rank prints progress lines (they go above the bar, through
    /// `logging::show_bar`).
    pub fn line(&self, line: &ProgressLine) {
        if !self.quiet {
            line.log();
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            crate::logging::show_bar(None);
            b.finish_and_clear();
        }
    }
}

/// One logged step as the progress line shows it: the step's record and where it stands in
/// its epoch.
pub struct ProgressLine<'a> {
    pub record: &'a StepRecord<'a>,
    /// `train.epochs`.
    pub epochs: usize,
    /// Batches of this epoch done, this one included, of `niter`.
    pub done_in_epoch: usize,
    pub niter: usize,
    /// The epoch's running mean loss (scDINO's MetricLogger global average).
    pub mean_loss: f64,
    /// Wall time per step over the logged window.
    pub step_seconds: f64,
}

impl ProgressLine<'_> {
    fn log(&self) {
        let r = self.record;
        let teacher = r.teacher;
        let utilisation = r.utilisation;
        let mfu = utilisation
            .mfu
            .map(|m| format!("  MFU: {:.1}%", 100.0 * m))
            .unwrap_or_default();
        let gpu_text = r
            .gpu
            .map(|g| {
                format!(
                    "  GPU: {:.0}% {:.1}/{:.1} GB",
                    g.utilization_percent,
                    g.memory_used_bytes / 1e9,
                    g.memory_total_bytes / 1e9
                )
            })
            .unwrap_or_default();
        // The stabilisers' terms, when on: the DINO term is what the teacher entropy and KL
        // are read against.
        let terms = r.terms;
        let mut terms_text = String::new();
        if terms.split() {
            let shown: Vec<String> = terms
                .iter()
                .map(|(info, v)| format!("{} {v:.4}", info.label))
                .collect();
            terms_text = format!(" = {}", shown.join(" + "));
        }
        let (epoch, done_in_epoch, niter) = (r.epoch, self.done_in_epoch, self.niter);
        let imgs_per_s = r.images_per_second;
        tracing::info!(
            target: "trainer::progress",
            epoch,
            iteration = r.iteration,
            loss = r.loss,
            // tracing's fields are named at compile time: a new term's JSON field goes here.
            dino_loss = terms.get("dino"),
            koleo_loss = terms.get("koleo"),
            ibot_loss = terms.get("ibot"),
            channel_dino_loss = terms.get("channel_dino"),
            channel_diversity_loss = terms.get("channel_diversity"),
            token_diversity_loss = terms.get("token_diversity"),
            lr = r.lr,
            weight_decay = r.weight_decay,
            images_per_second = imgs_per_s,
            teacher_entropy = teacher.teacher_entropy,
            kl = teacher.kl,
            prototypes = teacher.prototypes_in_use,
            flops_per_second = utilisation.flops_per_second,
            mfu = utilisation.mfu,
            gpu_utilization_percent = r.gpu.map(|g| g.utilization_percent),
            gpu_memory_used_bytes = r.gpu.map(|g| g.memory_used_bytes),
            "{}",
            format_args!(
                "Epoch: [{epoch}/{}]  [{done_in_epoch}/{niter}]  loss: {:.6} ({:.6}){terms_text}  lr: {:.6e}  wd: {:.6}  imgs/s: {imgs_per_s:.1}  data: {:.3}s  step: {:.3}s  teacher H: {:.3}  KL: {:.3}  prototypes: {}/{}  TFLOP/s: {:.3}{mfu}{gpu_text}",
                self.epochs,
                r.loss,
                self.mean_loss,
                r.lr,
                r.weight_decay,
                r.data_wait_seconds,
                self.step_seconds,
                teacher.teacher_entropy,
                teacher.kl,
                teacher.prototypes_in_use,
                teacher.out_dim,
                utilisation.flops_per_second / 1e12,
            )
        );
    }
}
