//! The registry of screen layouts: the one place that knows every kind, turning
//! `data.screen` into a [`ScreenSource`].
use super::cell_source::{CropOptions, ScreenSource};
use super::chammi::{Chammi, ChammiOptions};
use super::crop::Border;
use super::files::Files;
use super::loaddata::{LoadData, LoadDataOptions};
use super::objects::Cell;
use super::objects::{self, ObjectTable};
use super::{FieldLayout, ScreenError};
use crate::config::{CellChannels, DataSection, ScreenBorder, ScreenLayout, ScreenSection};
use std::path::PathBuf;
use std::sync::Arc;

/// Opens the screen `data` names (`data.screen` must be set), lists its cells and logs what
/// was left out.
pub fn open_screen(
    data: &DataSection,
    screen: &ScreenSection,
) -> Result<ScreenSource, ScreenError> {
    let address = data.dataset_dir.to_string();
    let files = Arc::new(Files::new(&data.object_store));
    let (layout, image_numbers): (Arc<dyn FieldLayout>, Vec<u64>) = match screen.layout {
        ScreenLayout::LoadData => {
            let opts = LoadDataOptions {
                channels: data.channel_names.clone(),
                labels: screen.labels.clone(),
                illumination: screen.illumination,
            };
            let table = LoadData::open(&address, &opts, files.clone())?;
            let numbers = table.image_numbers().to_vec();
            (Arc::new(table), numbers)
        }
        ScreenLayout::OmeZarr => {
            let plate = super::ome_zarr::OmeZarrPlate::open(
                &data.dataset_dir,
                &data.object_store,
                &data.channel_names,
                screen.labels.as_deref(),
            )?;
            // Object tables join an OME-Zarr plate's sites by plate/well/site; the site order
            // stands in for CellProfiler's ImageNumber.
            let numbers = (1..=plate.sites().len() as u64).collect();
            (Arc::new(plate), numbers)
        }
        ScreenLayout::Chammi => {
            let opts = ChammiOptions {
                channels: data.channel_names.clone(),
                image_root: screen.image_root.clone(),
                dataset_column: screen.dataset_column.clone(),
                datasets: screen.datasets.clone(),
                rows: screen.rows.clone(),
                dataset_channels: screen.dataset_channels.clone(),
                own_channels: screen.cell_channels == CellChannels::Own,
            };
            let table = Chammi::open(&address, &opts, files.clone())?;
            let numbers = (1..=table.sites().len() as u64).collect();
            (Arc::new(table), numbers)
        }
    };
    let cells = match &screen.objects {
        _ if layout.cells_are_sites() => objects_of_whole_sites(&*layout, screen, &address)?,
        Some(objects) => {
            let table = ObjectTable {
                address: objects.clone(),
                center: screen
                    .center_columns
                    .as_ref()
                    .map(|c| (c[0].clone(), c[1].clone())),
            };
            objects::from_table(&table, &files, layout.sites(), &image_numbers)?
        }
        None => objects::from_labels(&*layout)?,
    };
    let opts = CropOptions {
        box_size: screen.box_size,
        border: match screen.border {
            ScreenBorder::Skip => Border::Skip,
            ScreenBorder::Pad => Border::Pad,
        },
        mask_objects: screen.mask_objects,
        label_column: screen.label_column.clone(),
        site_cache: screen.site_cache,
        split_by: screen.split_by.clone(),
    };
    let source = ScreenSource::new(layout, cells, opts, &PathBuf::from(&address))?;
    if source.skipped().at_border > 0 {
        tracing::warn!(
            "{address}: {} cells left out because their {}-px box reaches outside the site \
             (data.screen.border: pad keeps them, zero-padded)",
            source.skipped().at_border,
            screen.box_size
        );
    }
    Ok(source)
}

/// One cell per site, the whole site, for layouts whose sites are cells; the keys that place
/// cells in sites are refused (validation refuses them too; this guards other callers).
fn objects_of_whole_sites(
    layout: &dyn FieldLayout,
    screen: &ScreenSection,
    address: &str,
) -> Result<Vec<Cell>, ScreenError> {
    if screen.objects.is_some() || screen.labels.is_some() || screen.mask_objects {
        return Err(ScreenError::table(
            address,
            "each image of this layout is one whole cell: data.screen.objects, labels and \
             mask_objects do not apply",
        ));
    }
    Ok((0..layout.sites().len())
        .map(|site| Cell {
            site,
            object: 1,
            x: 0.0,
            y: 0.0,
        })
        .collect())
}
