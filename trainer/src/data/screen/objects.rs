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

/// The cells an object table lists. A row belongs to the site with the same
/// `Metadata_Plate`/`Metadata_Well`/`Metadata_Site` values (those of the three both the table
/// and the sites have), or else the same `ImageNumber` (`image_numbers[i]` of site `i`).
/// `ObjectNumber` numbers the cells (their order in the site where the table has none).
pub fn from_table(
    table: &ObjectTable,
    files: &Files,
    sites: &[Site],
    image_numbers: &[u64],
) -> Result<Vec<Cell>, ScreenError> {
    let address = table.address.as_str();
    let csv = super::table::read_table(files, address)?;
    let col = |name: &str| csv.header.iter().position(|h| h == name);
    let (cx, cy) = match &table.center {
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
                format!(
                    "no `{name}` column (the header is: {})",
                    csv.header.join(",")
                ),
            )
        })
    };
    let (xi, yi) = (need(&cx)?, need(&cy)?);
    let keys: Vec<&str> = [PLATE, WELL, SITE]
        .into_iter()
        .filter(|k| col(k).is_some() && sites.first().is_some_and(|s| s.get(k).is_some()))
        .collect();
    let key_cols: Vec<usize> = keys.iter().filter_map(|k| col(k)).collect();
    let by_key: HashMap<Vec<Cow<str>>, usize> = sites
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let key = keys.iter().map(|k| key_text(s.get(k).unwrap_or("")));
            (key.collect(), i)
        })
        .collect();
    let by_number: HashMap<u64, usize> = image_numbers
        .iter()
        .enumerate()
        .map(|(i, &n)| (n, i))
        .collect();
    let number_col = if keys.is_empty() {
        Some(need("ImageNumber").map_err(|_| {
            ScreenError::table(
                address,
                "no column to join the objects to the sites: the table needs Metadata_Plate/Well/Site or ImageNumber",
            )
        })?)
    } else {
        None
    };
    let object_col = col("ObjectNumber");
    let mut per_site: HashMap<usize, u64> = HashMap::new();
    let mut seen: HashMap<(usize, u64), usize> = HashMap::new();
    let mut cells = Vec::with_capacity(csv.rows.len());
    for (row, (_, f)) in csv.rows.iter().enumerate() {
        let row = row + 1;
        let err = |reason: String| ScreenError::row(address, row, reason);
        let site = match number_col {
            Some(n) => {
                let number = whole_number(&f[n])
                    .ok_or_else(|| err(format!("ImageNumber {:?} is not a whole number", f[n])))?;
                *by_number.get(&number).ok_or_else(|| {
                    err(format!(
                        "ImageNumber {number} is no site of the image table"
                    ))
                })?
            }
            None => {
                let key: Vec<Cow<str>> = key_cols.iter().map(|&i| key_text(&f[i])).collect();
                *by_key.get(&key).ok_or_else(|| {
                    err(format!(
                        "{} = {key:?} is no site of the image table",
                        keys.join("/")
                    ))
                })?
            }
        };
        let coord = |i: usize, name: &str| -> Result<f64, ScreenError> {
            f[i].trim()
                .parse::<f64>()
                .ok()
                .filter(|v| v.is_finite())
                .ok_or_else(|| err(format!("{name} {:?} is not a finite number", f[i])))
        };
        let (x, y) = (coord(xi, &cx)?, coord(yi, &cy)?);
        let counter = per_site.entry(site).or_default();
        *counter += 1;
        let object = match object_col {
            Some(o) => whole_number(&f[o])
                .ok_or_else(|| err(format!("ObjectNumber {:?} is not a whole number", f[o])))?,
            None => *counter,
        };
        if let Some(first) = seen.insert((site, object), row) {
            return Err(err(format!(
                "object {object} of site {} is listed again (first in row {first})",
                sites[site].name
            )));
        }
        cells.push(Cell { site, object, x, y });
    }
    cells.sort_by_key(|c| (c.site, c.object));
    Ok(cells)
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
