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
//! A `box_size` equal to the cell size cuts every cell back out exactly.
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
    if opts.plates == 0 || opts.per_site == 0 {
        return Err(DataError::InvalidArgument(
            "a synthetic screen needs at least one plate and one cell per site".into(),
        ));
    }
    let out = opts.cells.out.clone();
    let cells_opts = SynthOptions {
        out: out.join("cells"),
        ..opts.cells.clone()
    };
    let summary = generate(&cells_opts)?;
    let index = build_index(&summary.training_dir, 0)?;
    let size = opts.cells.size;
    let channels = summary.channel_names.clone();
    // A grid of g×g slots per site, each a cell plus a cell-wide gap.
    let grid = (opts.per_site as f64).sqrt().ceil() as usize;
    let side = grid * 2 * size + size;
    let geometry = SiteGeometry {
        size,
        grid,
        side,
        channels: channels.len(),
    };
    let mut load_data =
        String::from("ImageNumber,Metadata_Plate,Metadata_Well,Metadata_Site,Metadata_Treatment");
    for ch in &channels {
        write!(load_data, ",FileName_{ch},PathName_{ch}").ok();
    }
    load_data.push_str(",ObjectsFileName_Nuclei,ObjectsPathName_Nuclei\n");
    let objects = String::from(
        "ImageNumber,ObjectNumber,Metadata_Plate,Metadata_Well,Metadata_Site,Nuclei_Location_Center_X,Nuclei_Location_Center_Y\n",
    );
    let cells_csv = String::from("Metadata_Plate,Metadata_Well,Metadata_Site,ObjectNumber,path\n");
    let mut tables = Tables {
        load_data,
        objects,
        cells_csv,
    };
    let (mut image_number, mut total_cells) = (0usize, 0usize);
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
            // Row = plate, column = class: each class has a well of its own on every plate.
            let (row, col) = (plate % 16 + 1, class_index % 24 + 1);
            let well = format!("{}{:02}", (b'A' + (row - 1) as u8) as char, col);
            for (site, site_cells) in mine.chunks(opts.per_site).enumerate() {
                image_number += 1;
                let place = SitePlace {
                    image_number,
                    plate: &plate_name,
                    well: &well,
                    row,
                    col,
                    site: site + 1,
                    treatment: class,
                };
                total_cells += write_site(&out, &place, site_cells, &geometry, &mut tables)?;
            }
        }
    }
    let write = |name: &str, text: &str| -> Result<PathBuf, DataError> {
        let path = out.join(name);
        scdino_base::fs::write_atomic(&path, text.as_bytes()).map_err(DataError::writing(&path))?;
        Ok(path)
    };
    Ok(ScreenSynthSummary {
        load_data: write("load_data.csv", &tables.load_data)?,
        objects: write("Nuclei.csv", &tables.objects)?,
        cells_csv: write("cells.csv", &tables.cells_csv)?,
        channel_names: channels,
        sites: image_number,
        cells: total_cells,
        cell_size: size,
    })
}

/// The three tables a synthetic screen writes, grown a site at a time.
struct Tables {
    load_data: String,
    objects: String,
    cells_csv: String,
}

/// Where the cells of a site go: `grid`×`grid` slots of `size`-pixel cells, each with a
/// cell-wide gap, in a site `side` pixels square of `channels` channels.
struct SiteGeometry {
    size: usize,
    grid: usize,
    side: usize,
    channels: usize,
}

/// A site's place in the screen and its table values.
struct SitePlace<'a> {
    image_number: usize,
    plate: &'a str,
    well: &'a str,
    row: usize,
    col: usize,
    site: usize,
    treatment: &'a str,
}

/// Pastes `cells` into one site (a TIFF per channel and a label image under `out`) and adds
/// its rows to the tables; returns how many cells it holds.
fn write_site(
    out: &Path,
    place: &SitePlace<'_>,
    cells: &[&Path],
    g: &SiteGeometry,
    tables: &mut Tables,
) -> Result<usize, DataError> {
    let SitePlace {
        image_number,
        plate: plate_name,
        well,
        row,
        col,
        site: site_no,
        treatment: class,
    } = *place;
    let (size, grid, side) = (g.size, g.grid, g.side);
    let stem = format!("r{row:02}c{col:02}f{site_no:02}");
    let images_dir = out.join("images").join(plate_name);
    let labels_dir = out.join("labels").join(plate_name);
    for d in [&images_dir, &labels_dir] {
        std::fs::create_dir_all(d).map_err(|e| DataError::io(d, "creating", e))?;
    }
    let mut planes = vec![vec![0u16; side * side]; g.channels];
    let mut labels = vec![0u16; side * side];
    for (k, path) in cells.iter().enumerate() {
        let img = read_tiff(path)?;
        let (y0, x0) = (size + (k / grid) * 2 * size, size + (k % grid) * 2 * size);
        for (c, plane) in planes.iter_mut().enumerate() {
            for y in 0..size {
                for x in 0..size {
                    plane[(y0 + y) * side + x0 + x] = img.get(c, y, x) as u16;
                }
            }
        }
        let object = k + 1;
        for y in 0..size {
            labels[(y0 + y) * side + x0..(y0 + y) * side + x0 + size].fill(object as u16);
        }
        let centre = |o: usize| o as f64 + (size as f64 - 1.0) / 2.0;
        writeln!(
            tables.objects,
            "{image_number},{object},{plate_name},{well},{site_no},{},{}",
            centre(x0),
            centre(y0)
        )
        .ok();
        writeln!(
            tables.cells_csv,
            "{plate_name},{well},{site_no},{object},{}",
            path.display()
        )
        .ok();
    }
    write!(
        tables.load_data,
        "{image_number},{plate_name},{well},{site_no},{class}"
    )
    .ok();
    for (c, plane) in planes.into_iter().enumerate() {
        let name = format!("{stem}-ch{}.tiff", c + 1);
        write_tiff_u16_chunky(&images_dir.join(&name), &Chw::new(1, side, side, plane)?)?;
        write!(tables.load_data, ",{name},images/{plate_name}").ok();
    }
    let name = format!("{stem}-nuclei.tiff");
    write_tiff_u16_chunky(&labels_dir.join(&name), &Chw::new(1, side, side, labels)?)?;
    writeln!(tables.load_data, ",{name},labels/{plate_name}").ok();
    Ok(cells.len())
}
