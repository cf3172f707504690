//! A synthetic screen as CellProfiler-based pipelines store one, built from the per-cell
//! synthetic set so that every cell cut from it can be compared with the image it came from.
//!
//! The per-cell set (`cells/Training/<class>/…`) is written first; its images are then pasted
//! into fields of view on a zero background, one class per well (row = plate, column =
//! class), on a grid with a gap of at
//! least one cell between boxes. Written beside them:
//!
//! * `images/<plate>/r<row>c<col>f<site>-ch<k>.tiff`: one 16-bit TIFF per site and channel;
//! * `labels/<plate>/r<row>c<col>f<site>-nuclei.tiff`: a label image per site, each cell's
//!   whole box holding its object number (so its centre of mass is the box centre);
//! * `load_data.csv`: CellProfiler's LoadData table (`Metadata_Plate/Well/Site`,
//!   `Metadata_Treatment`, `FileName_<Ch>`/`PathName_<Ch>`, `ObjectsFileName_Nuclei`/
//!   `ObjectsPathName_Nuclei`, `ImageNumber`);
//! * `Nuclei.csv`: the object table (`ImageNumber`, `ObjectNumber`, `Metadata_*`,
//!   `Nuclei_Location_Center_X/Y` = the box's centre of mass);
//! * `cells.csv`: which per-cell TIFF each object is, for tests.
//!
//! A `box_size` equal to the cell size cuts every cell back out exactly. The pasting
//! ([`paste_sites`]) is shared with the OME-Zarr writer ([`super::synth_zarr`]), which writes
//! the same sites as plates.
use crate::data::chw::Chw;
use crate::data::synth::{generate, SynthOptions};
use crate::data::tiff_reader::{read_tiff, write_tiff_u16_chunky};
use crate::data::{build_index, DataError};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// What [`generate_screen`] writes.
#[derive(Debug, Clone)]
pub struct ScreenSynthOptions {
    pub cells: SynthOptions,
    /// Plates; each has one well per class.
    pub plates: usize,
    /// Cells per site (the last site of a well may hold fewer).
    pub per_site: usize,
}

/// What [`generate_screen`] wrote.
#[derive(Debug, Clone)]
pub struct ScreenSynthSummary {
    pub load_data: PathBuf,
    pub objects: PathBuf,
    pub cells_csv: PathBuf,
    pub channel_names: Vec<String>,
    pub sites: usize,
    pub cells: usize,
    /// Side of each cell's box: the `box_size` that cuts the cells back out.
    pub cell_size: usize,
}

/// Writes the per-cell set under `out/cells` and the screen made of its training images
/// under `out` (see the module doc). Every class's images are shared out among the plates.
pub fn generate_screen(opts: &ScreenSynthOptions) -> Result<ScreenSynthSummary, DataError> {
    let out = opts.cells.out.clone();
    let mut load_data =
        String::from("ImageNumber,Metadata_Plate,Metadata_Well,Metadata_Site,Metadata_Treatment");
    let mut tables = Tables {
        load_data: String::new(),
        objects: String::from(
            "ImageNumber,ObjectNumber,Metadata_Plate,Metadata_Well,Metadata_Site,Nuclei_Location_Center_X,Nuclei_Location_Center_Y\n",
        ),
        cells_csv: String::from(CELLS_CSV_HEADER),
    };
    let mut image_number = 0usize;
    let pasted = paste_sites(opts, |site| {
        image_number += 1;
        write_site(&out, image_number, site, &mut tables)
    })?;
    for ch in &pasted.channel_names {
        write!(load_data, ",FileName_{ch},PathName_{ch}").ok();
    }
    load_data.push_str(",ObjectsFileName_Nuclei,ObjectsPathName_Nuclei\n");
    load_data.push_str(&tables.load_data);
    let write = |name: &str, text: &str| write_text(&out.join(name), text);
    Ok(ScreenSynthSummary {
        load_data: write("load_data.csv", &load_data)?,
        objects: write("Nuclei.csv", &tables.objects)?,
        cells_csv: write("cells.csv", &tables.cells_csv)?,
        channel_names: pasted.channel_names,
        sites: image_number,
        cells: pasted.cells,
        cell_size: pasted.cell_size,
    })
}

/// The header of `cells.csv`: which per-cell TIFF each object of each site is.
pub(super) const CELLS_CSV_HEADER: &str =
    "Metadata_Plate,Metadata_Well,Metadata_Site,ObjectNumber,path\n";

/// Writes `text` to `path` atomically and returns the path.
pub(super) fn write_text(path: &Path, text: &str) -> Result<PathBuf, DataError> {
    scdino_base::fs::write_atomic(path, text.as_bytes()).map_err(DataError::writing(path))?;
    Ok(path.to_path_buf())
}

/// What [`paste_sites`] made, beside the sites it handed out.
pub(super) struct Pasted {
    pub channel_names: Vec<String>,
    pub cells: usize,
    pub cell_size: usize,
}

/// One cell pasted into a site.
pub(super) struct PastedCell<'a> {
    /// 1-based, the value of the cell's box in the label image.
    pub object: usize,
    /// The centre of mass of its box, in pixels.
    pub x: f64,
    pub y: f64,
    /// The per-cell TIFF it was pasted from.
    pub path: &'a Path,
}

/// One site of the screen: its place, its pixels and its cells.
pub(super) struct PastedSite<'a> {
    /// `P1`, `P2`, ...
    pub plate: &'a str,
    /// Plate row and column, 1-based (row = plate, column = class).
    pub row: usize,
    pub col: usize,
    /// 0-based index of the site within its well.
    pub index: usize,
    pub treatment: &'a str,
    /// The channel names, in the order of `planes`.
    pub channels: &'a [String],
    /// Side of the square site in pixels.
    pub side: usize,
    /// One `side`×`side` plane per channel.
    pub planes: Vec<Vec<u16>>,
    /// Each cell's box holding its object number, 0 elsewhere.
    pub labels: Vec<u16>,
    pub cells: Vec<PastedCell<'a>>,
}

impl PastedSite<'_> {
    /// The well as CellProfiler names it, e.g. `A01`.
    pub fn well(&self) -> String {
        format!("{}{:02}", row_name(self.row), self.col)
    }
}

/// The letter of plate row `row` (1-based).
pub(super) fn row_name(row: usize) -> char {
    (b'A' + (row - 1) as u8) as char
}

/// Writes the per-cell set under `out/cells`, then pastes its training images into sites
/// (one class per well, row = plate, column = class, `per_site` cells a site on a grid with a
/// cell-wide gap) and hands each site to `each`, plate by plate within each class.
pub(super) fn paste_sites(
    opts: &ScreenSynthOptions,
    mut each: impl FnMut(&PastedSite<'_>) -> Result<(), DataError>,
) -> Result<Pasted, DataError> {
    if opts.plates == 0 || opts.per_site == 0 {
        return Err(DataError::InvalidArgument(
            "a synthetic screen needs at least one plate and one cell per site".into(),
        ));
    }
    let cells_opts = SynthOptions {
        out: opts.cells.out.join("cells"),
        ..opts.cells.clone()
    };
    let summary = generate(&cells_opts)?;
    let index = build_index(&summary.training_dir, 0)?;
    let size = opts.cells.size;
    let channels = summary.channel_names.len();
    // A grid of g×g slots per site, each a cell plus a cell-wide gap.
    let grid = (opts.per_site as f64).sqrt().ceil() as usize;
    let side = grid * 2 * size + size;
    let mut total = 0usize;
    for (class_index, class) in index.classes.iter().enumerate() {
        let members: Vec<&Path> = index
            .samples
            .iter()
            .filter(|s| s.class_index == class_index)
            .map(|s| s.path.as_path())
            .collect();
        for plate in 0..opts.plates {
            let plate_name = format!("P{}", plate + 1);
            let mine: Vec<&Path> = members
                .iter()
                .copied()
                .skip(plate)
                .step_by(opts.plates)
                .collect();
            for (index, site_cells) in mine.chunks(opts.per_site).enumerate() {
                let mut site = PastedSite {
                    plate: &plate_name,
                    row: plate % 16 + 1,
                    col: class_index % 24 + 1,
                    index,
                    treatment: class,
                    channels: &summary.channel_names,
                    side,
                    planes: vec![vec![0u16; side * side]; channels],
                    labels: vec![0u16; side * side],
                    cells: Vec::with_capacity(site_cells.len()),
                };
                for (k, path) in site_cells.iter().enumerate() {
                    let (y0, x0) = (size + (k / grid) * 2 * size, size + (k % grid) * 2 * size);
                    paste(&mut site, path, y0, x0, size, k + 1)?;
                }
                total += site.cells.len();
                each(&site)?;
            }
        }
    }
    Ok(Pasted {
        channel_names: summary.channel_names,
        cells: total,
        cell_size: size,
    })
}

/// Pastes the `size`-pixel cell at `path` into `site` at (`y0`, `x0`) as object `object`.
fn paste<'a>(
    site: &mut PastedSite<'a>,
    path: &'a Path,
    y0: usize,
    x0: usize,
    size: usize,
    object: usize,
) -> Result<(), DataError> {
    let img = read_tiff(path)?;
    let side = site.side;
    for (c, plane) in site.planes.iter_mut().enumerate() {
        for y in 0..size {
            for x in 0..size {
                plane[(y0 + y) * side + x0 + x] = img.get(c, y, x) as u16;
            }
        }
    }
    for y in 0..size {
        site.labels[(y0 + y) * side + x0..(y0 + y) * side + x0 + size].fill(object as u16);
    }
    let centre = |o: usize| o as f64 + (size as f64 - 1.0) / 2.0;
    site.cells.push(PastedCell {
        object,
        x: centre(x0),
        y: centre(y0),
        path,
    });
    Ok(())
}

/// The three tables a synthetic screen writes, grown a site at a time.
struct Tables {
    /// The rows of `load_data.csv` (its header needs the channel names, known at the end).
    load_data: String,
    objects: String,
    cells_csv: String,
}

/// Writes one site as TIFFs (a TIFF per channel and a label image under `out`) and adds its
/// rows to the tables.
fn write_site(
    out: &Path,
    image_number: usize,
    site: &PastedSite<'_>,
    tables: &mut Tables,
) -> Result<(), DataError> {
    let (plate_name, well, site_no) = (site.plate, site.well(), site.index + 1);
    let stem = format!("r{:02}c{:02}f{site_no:02}", site.row, site.col);
    let images_dir = out.join("images").join(plate_name);
    let labels_dir = out.join("labels").join(plate_name);
    for d in [&images_dir, &labels_dir] {
        std::fs::create_dir_all(d).map_err(|e| DataError::io(d, "creating", e))?;
    }
    for cell in &site.cells {
        writeln!(
            tables.objects,
            "{image_number},{},{plate_name},{well},{site_no},{},{}",
            cell.object, cell.x, cell.y
        )
        .ok();
        writeln!(
            tables.cells_csv,
            "{plate_name},{well},{site_no},{},{}",
            cell.object,
            cell.path.display()
        )
        .ok();
    }
    write!(
        tables.load_data,
        "{image_number},{plate_name},{well},{site_no},{}",
        site.treatment
    )
    .ok();
    let side = site.side;
    for (c, plane) in site.planes.iter().enumerate() {
        let name = format!("{stem}-ch{}.tiff", c + 1);
        write_tiff_u16_chunky(
            &images_dir.join(&name),
            &Chw::new(1, side, side, plane.clone())?,
        )?;
        write!(tables.load_data, ",{name},images/{plate_name}").ok();
    }
    let name = format!("{stem}-nuclei.tiff");
    write_tiff_u16_chunky(
        &labels_dir.join(&name),
        &Chw::new(1, side, side, site.labels.clone())?,
    )?;
    writeln!(tables.load_data, ",{name},labels/{plate_name}").ok();
    Ok(())
}
