//! Where the cells are: an object table's centres joined to the sites, or the centres of
//! mass of each site's label image.
use super::files::Files;
use super::table::{key_text, whole_number};
use super::{FieldLayout, ScreenError, Site, PLATE, SITE, WELL};
use std::borrow::Cow;
use std::collections::HashMap;

/// One cell: the site it is in, its object number and its centre (X = column, Y = row,
/// 0-based pixels, as CellProfiler's `Location_Center_X/Y`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cell {
    pub site: usize,
    pub object: u64,
    pub x: f64,
    pub y: f64,
}

/// A CellProfiler object table (`Nuclei.csv`, or any table with one row per object).
#[derive(Debug, Clone)]
pub struct ObjectTable {
    /// A path or store URL of a CSV (optionally `.gz`).
    pub address: String,
    /// The centre columns; `None` = `Nuclei_Location_Center_X/Y`, else `Location_Center_X/Y`
    /// (CellProfiler's per-object export), whichever the table has.
    pub center: Option<(String, String)>,
}

const CENTERS: [(&str, &str); 2] = [
    ("Nuclei_Location_Center_X", "Nuclei_Location_Center_Y"),
    ("Location_Center_X", "Location_Center_Y"),
];

/// Which of an object table's columns a screen reads, and where they are among the values
/// [`scan_table`](super::table::scan_table) hands over: the centre's X and Y, then the site
/// keys (or `ImageNumber`), then `ObjectNumber` where the table has it.
struct Columns<'a> {
    x: String,
    y: String,
    /// The `Metadata_*` keys joining a row to its site; empty = joined by `ImageNumber`.
    keys: Vec<&'static str>,
    /// The sites by their values of `keys`.
    by_key: HashMap<Vec<Cow<'a, str>>, usize>,
    object: bool,
    /// Positions in the header, in the order above.
    positions: Vec<usize>,
}

impl<'a> Columns<'a> {
    fn of(
        table: &ObjectTable,
        header: &[String],
        sites: &'a [Site],
        address: &str,
    ) -> Result<Self, ScreenError> {
        let col = |name: &str| header.iter().position(|h| h == name);
        let (x, y) = match &table.center {
            Some((x, y)) => (x.clone(), y.clone()),
            None => CENTERS
                .iter()
                .find(|(x, y)| col(x).is_some() && col(y).is_some())
                .map(|(x, y)| (x.to_string(), y.to_string()))
                .unwrap_or_else(|| (CENTERS[0].0.into(), CENTERS[0].1.into())),
        };
        let need = |name: &str| {
            col(name).ok_or_else(|| {
                ScreenError::table(
                    address,
                    format!("no `{name}` column (the header is: {})", header.join(",")),
                )
            })
        };
        let mut positions = vec![need(&x)?, need(&y)?];
        let keys: Vec<&'static str> = [PLATE, WELL, SITE]
            .into_iter()
            .filter(|k| col(k).is_some() && sites.first().is_some_and(|s| s.get(k).is_some()))
            .collect();
        positions.extend(keys.iter().filter_map(|k| col(k)));
        if keys.is_empty() {
            positions.push(need("ImageNumber").map_err(|_| {
                ScreenError::table(
                    address,
                    "no column to join the objects to the sites: the table needs Metadata_Plate/Well/Site or ImageNumber",
                )
            })?);
        }
        let object = col("ObjectNumber");
        positions.extend(object);
        let by_key = sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let key = keys.iter().map(|k| key_text(s.get(k).unwrap_or("")));
                (key.collect(), i)
            })
            .collect();
        Ok(Self {
            x,
            y,
            keys,
            by_key,
            object: object.is_some(),
            positions,
        })
    }
}

/// The cells an object table lists. A row belongs to the site with the same
/// `Metadata_Plate`/`Metadata_Well`/`Metadata_Site` values (those of the three both the table
/// and the sites have), or else the same `ImageNumber` (`image_numbers[i]` of site `i`).
/// `ObjectNumber` numbers the cells (their order in the site where the table has none). The
/// table is streamed, its other columns never held: what stays is the cells.
pub fn from_table(
    table: &ObjectTable,
    files: &Files,
    sites: &[Site],
    image_numbers: &[u64],
) -> Result<Vec<Cell>, ScreenError> {
    let address = table.address.as_str();
    let columns = std::cell::OnceCell::new();
    let by_number: HashMap<u64, usize> = image_numbers
        .iter()
        .enumerate()
        .map(|(i, &n)| (n, i))
        .collect();
    let mut per_site = vec![0u64; sites.len()];
    // Each cell with the row listing it, to name both rows of an object listed twice.
    let mut listed: Vec<(Cell, usize)> = vec![];
    super::table::scan_table(
        files,
        address,
        |header| {
            let c = Columns::of(table, header, sites, address)?;
            let positions = c.positions.clone();
            let _ = columns.set(c);
            Ok(positions)
        },
        |row, v| {
            let c = columns
                .get()
                .ok_or_else(|| ScreenError::row(address, row, "a row before the header"))?;
            let err = |reason: String| ScreenError::row(address, row, reason);
            let site = if c.keys.is_empty() {
                let number = whole_number(v[2])
                    .ok_or_else(|| err(format!("ImageNumber {:?} is not a whole number", v[2])))?;
                *by_number.get(&number).ok_or_else(|| {
                    err(format!(
                        "ImageNumber {number} is no site of the image table"
                    ))
                })?
            } else {
                let key: Vec<Cow<str>> =
                    v[2..2 + c.keys.len()].iter().map(|k| key_text(k)).collect();
                *c.by_key.get(&key).ok_or_else(|| {
                    err(format!(
                        "{} = {key:?} is no site of the image table",
                        c.keys.join("/")
                    ))
                })?
            };
            let coord = |value: &str, name: &str| -> Result<f64, ScreenError> {
                value
                    .trim()
                    .parse::<f64>()
                    .ok()
                    .filter(|v| v.is_finite())
                    .ok_or_else(|| err(format!("{name} {value:?} is not a finite number")))
            };
            let (x, y) = (coord(v[0], &c.x)?, coord(v[1], &c.y)?);
            per_site[site] += 1;
            let object = match c.object {
                true => {
                    let o = v[v.len() - 1];
                    whole_number(o)
                        .ok_or_else(|| err(format!("ObjectNumber {o:?} is not a whole number")))?
                }
                false => per_site[site],
            };
            listed.push((Cell { site, object, x, y }, row));
            Ok(())
        },
    )?;
    // Stable: an object's rows stay in table order, so the first repeat of each object listed
    // more than once is its second row; the error names the earliest such repeat.
    listed.sort_by_key(|(c, _)| (c.site, c.object));
    let repeat = listed
        .chunk_by(|(a, _), (b, _)| (a.site, a.object) == (b.site, b.object))
        .filter(|rows| rows.len() > 1)
        .map(|rows| (rows[1].1, rows[0].1, rows[0].0))
        .min_by_key(|(row, _, _)| *row);
    if let Some((row, first, cell)) = repeat {
        return Err(ScreenError::row(
            address,
            row,
            format!(
                "object {} of site {} is listed again (first in row {first})",
                cell.object, sites[cell.site].name
            ),
        ));
    }
    Ok(listed.into_iter().map(|(c, _)| c).collect())
}

/// The cells of every site's label image, one per label, at its centre of mass.
pub fn from_labels(layout: &dyn FieldLayout) -> Result<Vec<Cell>, ScreenError> {
    let mut cells = vec![];
    for (site, s) in layout.sites().iter().enumerate() {
        let labels = layout.read_labels(site)?.ok_or_else(|| ScreenError::Site {
            site: s.name.clone(),
            reason: "no label image (name one, or an object table)".into(),
        })?;
        cells.extend(super::labels::centroids(&labels).into_iter().map(|c| Cell {
            site,
            object: c.label.into(),
            x: c.x,
            y: c.y,
        }));
    }
    Ok(cells)
}
