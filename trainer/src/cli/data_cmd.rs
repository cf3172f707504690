use anyhow::{Context, Result};
use clap::Args;
use std::path::PathBuf;
use trainer::data::{generate_synthetic, SynthOptions};
use trainer::probe::forward_probe;

/// `trainer synth`: the embedded demo data.
#[derive(Debug, Args)]
pub struct SynthArgs {
    /// Output folder; receives `Training/` and `Test/`.
    #[arg(long)]
    out: PathBuf,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of classes (at most 8).
    #[arg(long, default_value_t = 8)]
    classes: usize,
    /// Training images per class.
    #[arg(long, default_value_t = 64)]
    per_class: usize,
    /// Image side in pixels.
    #[arg(long, default_value_t = 50)]
    size: usize,
    #[arg(long, default_value_t = 5)]
    channels: usize,
    /// Test donors (`Test/DonorNN/Control/<class>/`).
    #[arg(long, default_value_t = 2)]
    donors: usize,
    /// `cells`: one TIFF per cell in class folders; `fov`: a screen as CellProfiler stores
    /// one (a 16-bit TIFF per site and channel, a LoadData table, an object table `Nuclei.csv`
    /// and a label image per site), made of the `cells` set it writes under `OUT/cells`;
    /// `ome-zarr`: the same screen as OME-Zarr HCS plates (`OUT/P1.zarr`, ..., NGFF 0.5: wells
    /// of fields, channels named in `omero`, a label image `labels/nuclei` per field) with an
    /// object table per plate (`OUT/P1_Nuclei.csv`).
    #[arg(long, value_enum, default_value_t = SynthLayout::Cells)]
    layout: SynthLayout,
    /// `--layout fov`/`ome-zarr`: plates (each with one well per class).
    #[arg(long, default_value_t = 2)]
    plates: usize,
    /// `--layout fov`/`ome-zarr`: cells per site.
    #[arg(long, default_value_t = 9)]
    per_site: usize,
    /// `--layout ome-zarr`: side of the fields' square chunks in pixels (one channel each).
    #[arg(long, default_value_t = 64)]
    chunk: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SynthLayout {
    Cells,
    Fov,
    OmeZarr,
}

impl SynthArgs {
    pub fn run(self) -> Result<()> {
        let opts = SynthOptions {
            out: self.out.clone(),
            seed: self.seed,
            classes: self.classes,
            per_class: self.per_class,
            size: self.size,
            channels: self.channels,
            donors: self.donors,
        };
        if self.layout == SynthLayout::OmeZarr {
            return self.ome_zarr(opts);
        }
        if self.layout == SynthLayout::Fov {
            use trainer::data::screen::synth::{generate_screen, ScreenSynthOptions};
            let s = generate_screen(&ScreenSynthOptions {
                cells: opts.clone(),
                plates: self.plates,
                per_site: self.per_site,
            })
            .with_context(|| format!("writing a synthetic screen to {}", opts.out.display()))?;
            println!(
                "wrote a screen of {} cells in {} sites: {} (LoadData), {} (objects); channels: {}; \
                 cells are {}×{} px (data.screen.box_size: {} cuts them back out)",
                s.cells,
                s.sites,
                s.load_data.display(),
                s.objects.display(),
                s.channel_names.join(", "),
                s.cell_size,
                s.cell_size,
                s.cell_size
            );
            return Ok(());
        }
        let s = generate_synthetic(&opts)
            .with_context(|| format!("writing synthetic data to {}", opts.out.display()))?;
        println!(
            "wrote {} training images to {} and {} test images to {} ({} classes: {}; channels: {})",
            s.train_images,
            s.training_dir.display(),
            s.test_images,
            s.test_dir.display(),
            s.classes.len(),
            s.classes.join(", "),
            s.channel_names.join(", ")
        );
        Ok(())
    }
}

impl SynthArgs {
    /// `--layout ome-zarr`: the plates, and the `data` keys that train from the first.
    fn ome_zarr(&self, opts: SynthOptions) -> Result<()> {
        use trainer::data::screen::synth::ScreenSynthOptions;
        use trainer::data::screen::synth_zarr::{generate_ome_zarr, LABELS};
        let s = generate_ome_zarr(
            &ScreenSynthOptions {
                cells: opts.clone(),
                plates: self.plates,
                per_site: self.per_site,
            },
            self.chunk,
        )
        .with_context(|| format!("writing synthetic plates to {}", opts.out.display()))?;
        let list = |p: &[PathBuf]| {
            p.iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "wrote {} cells in {} fields of {} plate(s): {} (objects: {}); channels: {}; \
             to train from a plate: data.dataset_dir: {}, data.screen: {{layout: ome_zarr, \
             labels: {LABELS}, box_size: {}, label_column: Metadata_Well}}",
            s.cells,
            s.sites,
            s.plates.len(),
            list(&s.plates),
            list(&s.objects),
            s.channel_names.join(", "),
            s.plates[0].display(),
            s.cell_size
        );
        Ok(())
    }
}

/// `trainer forward`: one multi-crop batch of real data through student and teacher.
#[derive(Debug, Args)]
pub struct ForwardArgs {
    #[command(flatten)]
    config: super::ConfigArg,
    /// Index into data.channel_combinations.
    #[arg(long, default_value_t = 0)]
    combination: usize,
    /// Images in the batch (default: train.batch_size_per_gpu).
    #[arg(long)]
    images: Option<usize>,
    /// Threads for libtorch (default: its own choice).
    #[arg(long)]
    threads: Option<i32>,
}

impl ForwardArgs {
    pub fn run(self) -> Result<()> {
        if let Some(t) = self.threads {
            tch::set_num_threads(t);
        }
        let path = self.config.path()?;
        let cfg = trainer::train::init_layout::load_config(&path)?;
        let report = forward_probe(&cfg, self.combination, self.images)
            .with_context(|| format!("forward probe of {}", path.display()))?;
        println!("{}", serde_json::to_string_pretty(&report)?);
        Ok(())
    }
}
