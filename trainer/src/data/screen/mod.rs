//! Screens as the field stores them: fields of view (sites) with a segmentation, read as
//! single cells without a conversion script.
//!
//! A screen layout (CellProfiler's LoadData table of per-channel TIFFs, an OME-Zarr plate,
//! ...) answers one question, [`FieldLayout`]: which sites there are, with their metadata,
//! and what a site's pixels (or a region of them) and labels are. Everything that turns
//! sites into cells is shared: [`objects`] places cells from an object table or a label
//! image, [`crop`] cuts a box around each centre, and [`cell_source::ScreenSource`] serves the
//! cells to every consumer as an [`ImageSource`](super::ImageSource), so mean/std, training,
//! `data pack`, features and embed read a screen like any other dataset.
//!
//! A new layout is one file here implementing [`FieldLayout`] and one line in
//! [`open::open_screen`]. A layout whose files are single cells already (CHAMMI's tiled
//! crops) says so with [`FieldLayout::cells_are_sites`]: each site is then one cell.

pub mod cell_source;
pub mod chammi;
pub mod crop;
pub mod files;
pub mod labels;
pub mod loaddata;
pub mod npy;
pub mod objects;
pub mod ome_zarr;
pub mod open;
pub mod ranged_object;
pub mod screen_error;
pub mod site_order;
pub mod synth;
pub mod synth_zarr;
pub mod table;
mod zarr_ranges;

pub use screen_error::ScreenError;

use super::chw::{Chw, ImageChw};

/// The metadata columns every site carries (CellProfiler's names), first and in this order.
pub const PLATE: &str = "Metadata_Plate";
pub const WELL: &str = "Metadata_Well";
pub const SITE: &str = "Metadata_Site";
/// The columns each cell adds to its site's metadata.
pub const OBJECT_NUMBER: &str = "Metadata_ObjectNumber";
pub const CENTER_X: &str = "Metadata_Center_X";
pub const CENTER_Y: &str = "Metadata_Center_Y";

/// One field of view.
#[derive(Debug, Clone, PartialEq)]
pub struct Site {
    /// Names the site in errors and in each cell's id, e.g. `P1/A01/1`.
    pub name: String,
    /// `Metadata_*` columns as text (name, value), [`PLATE`], [`WELL`] and [`SITE`] first
    /// when the layout knows them.
    pub metadata: Vec<(String, String)>,
}

impl Site {
    /// The value of metadata column `name`, if the site has it.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.metadata
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A rectangle of a site in pixels; it may reach outside the site (negative origin, or past
/// the far edge), where the pixels read as zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub y0: i64,
    pub x0: i64,
    pub height: usize,
    pub width: usize,
}

/// A label image: 0 is background, every other value one object (cellpose, StarDist,
/// CellProfiler's label exports, an OME-Zarr plate's `labels/<name>`).
pub type Labels = Chw<u32>;

/// Where a screen's pixels are. Implementations read the selected channels only, in the
/// order the user named them, and return raw intensities as `f32` (illumination correction,
/// where the layout has it, already applied).
pub trait FieldLayout: Send + Sync {
    /// Every site, in a fixed order (the order cells are listed in).
    fn sites(&self) -> &[Site];

    /// The names of the channels [`Self::read_site`] returns, in order.
    fn channels(&self) -> &[String];

    /// The selected channels of site `site`, C×H×W.
    fn read_site(&self, site: usize) -> Result<ImageChw, ScreenError>;

    /// For layouts whose sites hold different channels (CHAMMI's datasets under
    /// `cell_channels: own`): the positions in [`Self::channels`] of the channels site `site`
    /// holds, ascending, which are the channels [`Self::read_site`] returns, in that order;
    /// `None` = every channel.
    fn site_channels(&self, _site: usize) -> Option<&[usize]> {
        None
    }

    /// The pixels of `region` of site `site`, C×`region.height`×`region.width`, zero outside
    /// the site. Layouts stored in chunks read only the chunks the region touches; the
    /// default cuts it from [`Self::read_site`].
    fn read_region(&self, site: usize, region: Region) -> Result<ImageChw, ScreenError> {
        let whole = self.read_site(site)?;
        Ok(crop::cut(&whole, region))
    }

    /// The label image of site `site`, for layouts that store one with the site (OME-Zarr
    /// `labels/`); `None` when the layout has none (labels then come from elsewhere).
    fn read_labels(&self, _site: usize) -> Result<Option<Labels>, ScreenError> {
        Ok(None)
    }

    /// Height and width of site `site`. Layouts whose metadata says it answer without reading
    /// pixels; the default reads the site.
    fn site_shape(&self, site: usize) -> Result<(usize, usize), ScreenError> {
        let s = self.read_site(site)?;
        Ok((s.height, s.width))
    }

    /// True for layouts stored in chunks, where [`Self::read_region`] reads less than the
    /// site: cells are then read region by region instead of from whole cached sites.
    fn reads_regions(&self) -> bool {
        false
    }

    /// True for layouts whose every site is one whole cell (CHAMMI's tiled crops): there is
    /// no segmentation to place cells, each site is served as it is (its own size), and
    /// `box_size`, `border` and the cell's object number and centre do not apply.
    fn cells_are_sites(&self) -> bool {
        false
    }

    /// One line for logs: what is read and from where.
    fn describe(&self) -> String;
}
